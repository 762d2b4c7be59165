import { describe, expect, it } from '@jest/globals';
import fc from 'fast-check';
// @ts-expect-error: node-zookeeper-client ships no types; the test only passes it to the fixture.
import zookeeper from 'node-zookeeper-client';
import { SHARED, type LockBackend } from '../../lib/backends/lock-backend.interface.js';
import { ZooKeeperLockBackend } from '../../lib/backends/zookeeper/zookeeper.backend.js';
import { kindSuffix, lineStanding, parseEntry } from '../../lib/backends/zookeeper/zookeeper.kinds.js';
import { inLineOrder, LinePaths } from '../../lib/backends/zookeeper/zookeeper.line.js';
import type { LockHandle } from '../../lib/lock.handle.js';
import { LockLostError } from '../../lib/lock.errors.js';
import { LockService } from '../../lib/lock.service.js';
// @ts-expect-error: a plain ESM fixture shared with the child processes, without types.
import { connectedClient, fencedWrite } from '../fixtures/zookeeper-fenced-store.mjs';
import { Holder } from '../support/lock-holder-process.js';
import { until } from '../support/wait.js';
import { useZooKeeper } from '../support/zookeeper-fixture.js';

/**
 * Shared locks and semaphores on ZooKeeper: the rule read off a line, wake-ups of permit callers,
 * a reader or permit holder killed with SIGKILL, and a reader's node deleted by an operator. The
 * holder processes load dist/: run `npm run build` first.
 */
const fixture = useZooKeeper();

/** A line entry's name: owner, limit, sequence number. */
const entry = (owner: string, limit: number, sequence: number) => `${owner}${kindSuffix(limit)}-${String(sequence).padStart(10, '0')}`;

describe('ZooKeeper line rule for shared locks and semaphores', () => {
  it('names carry the kind; a name without one is a writer (as every earlier version named it)', () => {
    expect(entry('a', 1, 1)).toBe('a-0000000001');
    expect(parseEntry(entry('a%2Eb-c', SHARED, 2))).toEqual({ owner: 'a.b-c', limit: SHARED });
    expect(parseEntry(entry('a', 7, 3))).toEqual({ owner: 'a', limit: 7 });
    // A kind this version does not know keeps everyone out, as a writer does.
    expect(parseEntry('a.future-0000000004')).toEqual({ owner: 'a', limit: 1 });
    expect(parseEntry('not-an-entry')).toBeUndefined();
    expect(LinePaths.owner(entry('x-y', 3, 5))).toBe('x-y');
  });

  it('a reader waits for the nearest writer ahead, a writer for the node just before it', () => {
    const line = [entry('w1', 1, 1), entry('r1', SHARED, 2), entry('r2', SHARED, 3), entry('w2', 1, 4), entry('r3', SHARED, 5)];
    expect(lineStanding(line, line[0], 1)).toEqual({ in: true, mark: false });
    expect(lineStanding(line, line[1], SHARED)).toEqual({ in: false, waitFor: [line[0]], marks: false });
    expect(lineStanding(line, line[2], SHARED)).toEqual({ in: false, waitFor: [line[0]], marks: false });
    expect(lineStanding(line, line[3], 1)).toEqual({ in: false, waitFor: [line[2]], marks: false });
    expect(lineStanding(line, line[4], SHARED)).toEqual({ in: false, waitFor: [line[3]], marks: false });
    // The writer gone: both readers are in, the second writer still waits for the one before it.
    const next = line.slice(1);
    expect([next[0], next[1]].map((name) => lineStanding(next, name, SHARED))).toEqual([
      { in: true, mark: false },
      { in: true, mark: false },
    ]);
    expect(lineStanding(next, 'gone-0000000009', 1)).toEqual({ gone: true });
  });

  it('the first permit caller behind n holders watches all of them; later ones the one before them, for its mark', () => {
    const line = [1, 2, 3, 4].map((i) => entry(`p${i}`, 2, i));
    expect(lineStanding(line, line[0], 2)).toEqual({ in: true, mark: true });
    expect(lineStanding(line, line[1], 2)).toEqual({ in: true, mark: true });
    expect(lineStanding(line, line[2], 2)).toEqual({ in: false, waitFor: [line[0], line[1]], marks: false });
    expect(lineStanding(line, line[3], 2)).toEqual({ in: false, waitFor: [line[2]], marks: true });
    // Behind a writer: those its going lets in watch it; the one after them waits its turn.
    const behindWriter = [entry('w', 1, 1), ...[2, 3, 4].map((i) => entry(`p${i}`, 2, i))];
    expect(lineStanding(behindWriter, behindWriter[1], 2)).toEqual({ in: false, waitFor: [behindWriter[0]], marks: false });
    expect(lineStanding(behindWriter, behindWriter[2], 2)).toEqual({ in: false, waitFor: [behindWriter[0]], marks: false });
    expect(lineStanding(behindWriter, behindWriter[3], 2)).toEqual({ in: false, waitFor: [behindWriter[2]], marks: true });
  });

  it('refuses a caller whose limit disagrees with a node ahead; a writer disagrees with nobody', () => {
    const line = [entry('a', 3, 1), entry('b', 5, 2), entry('r', SHARED, 3), entry('w', 1, 4)];
    expect(lineStanding(line, line[1], 5)).toEqual({ in: false, mismatch: 3 });
    expect(lineStanding(line, line[2], SHARED)).toEqual({ in: false, mismatch: 3 });
    expect(lineStanding(line, line[3], 1)).toMatchObject({ in: false });
    // The earliest says what the key is: one behind it that disagrees (and will leave) refuses nobody.
    // It counts as a writer until it leaves: those behind it wait for it.
    const stale = [entry('a', 3, 1), entry('b', 5, 2), entry('c', 3, 3)];
    expect(lineStanding(stale, stale[2], 3)).toEqual({ in: false, waitFor: [stale[1]], marks: false });
  });

  it('on any line: who is in is a prefix (nobody passes a waiter), never a writer beside anyone nor more than n, and waiters watch nodes ahead', () => {
    const kind = fc.constantFrom(1, 2, 3, SHARED);
    fc.assert(
      fc.property(fc.array(kind, { maxLength: 12 }), (limits) => {
        const line = limits.map((limit, i) => entry(`o${i}`, limit, i + 1));
        const standings = line.map((name, i) => lineStanding(line, name, limits[i]));
        const inside = standings.flatMap((s, i) => ('in' in s && s.in ? [i] : []));
        const left = standings.flatMap((s, i) => ('in' in s && !s.in && !('mismatch' in s) ? [i] : []));
        // A prefix, less callers that disagree on the limit (they leave at once).
        for (const i of inside) for (let j = 0; j < i; j++) expect(inside.includes(j) || 'mismatch' in standings[j]).toBe(true);
        if (left.length > 0) expect(Math.max(...inside, -1)).toBeLessThan(left[0]);
        const held = inside.map((i) => limits[i]);
        if (held.includes(1)) expect(held).toHaveLength(1);
        for (const limit of held) expect(held.length).toBeLessThanOrEqual(limit);
        for (const i of left) {
          const s = standings[i] as { waitFor: string[] };
          expect(s.waitFor.length).toBeGreaterThan(0);
          for (const name of s.waitFor) {
            expect(line.indexOf(name)).toBeGreaterThanOrEqual(0);
            expect(line.indexOf(name)).toBeLessThan(i);
          }
        }
        // No wake-up missed: whichever node ahead of a waiter goes, if that lets the waiter in, it
        // watched that node, or the one it watches goes in too and marks its node.
        for (const i of left) {
          const s = standings[i] as { waitFor: string[]; marks: boolean };
          for (let j = 0; j < i; j++) {
            const after = line.filter((_, k) => k !== j);
            const now = lineStanding(after, line[i], limits[i]);
            if (!('in' in now && now.in)) continue;
            const watched = s.waitFor.includes(line[j]);
            const relayed = s.marks && s.waitFor.length === 1 && lineStanding(after, s.waitFor[0], limits[line.indexOf(s.waitFor[0])]);
            expect(watched || (relayed && 'in' in relayed && relayed.in && relayed.mark)).toBe(true);
          }
        }
      }),
      { numRuns: 500 },
    );
  });

  it('on any line, nodes leaving in any order: every caller the rule lets in was woken by a node it watched', () => {
    const kind = fc.constantFrom(1, 2, 3, SHARED);
    fc.assert(
      fc.property(fc.array(kind, { maxLength: 10 }), fc.array(fc.nat(), { maxLength: 10 }), (limits, picks) => {
        let line = limits.map((limit, i) => entry(`o${i}`, limit, i + 1));
        const limitOf = new Map(line.map((name, i) => [name, limits[i]]));
        const look = (name: string) => lineStanding(line, name, limitOf.get(name)!);
        // What each caller saw at its last look: it looks again only when a node it watches wakes it.
        const seen = new Map(line.map((name) => [name, look(name)]));
        const inside = (standing: ReturnType<typeof lineStanding> | undefined) => !!standing && 'in' in standing && standing.in;
        for (const pick of picks) {
          if (line.length === 0) break;
          // A caller told of a disagreement leaves first; else any node (a release, or a waiter that gives up).
          const gone = line.find((name) => 'mismatch' in seen.get(name)!) ?? line[pick % line.length];
          line = line.filter((name) => name !== gone);
          const woken = line.filter((name) => (seen.get(name) as { waitFor?: string[] }).waitFor?.includes(gone));
          while (woken.length > 0) {
            const name = woken.shift()!;
            const now = look(name);
            const wasIn = inside(seen.get(name));
            seen.set(name, now);
            if (!wasIn && inside(now) && (now as { mark: boolean }).mark) {
              // Its mark wakes those that watch it for that.
              for (const other of line) {
                const their = seen.get(other) as { waitFor?: string[]; marks?: boolean };
                if (their.marks && their.waitFor?.includes(name)) woken.push(other);
              }
            }
          }
          for (const name of line) if (inside(look(name))) expect(inside(seen.get(name))).toBe(true);
        }
      }),
      { numRuns: 500 },
    );
  });
});

/** A backend (a session of its own, as another process) that counts its attempts and wake-ups. */
function countingBackend(): { backend: LockBackend; failed: () => number; wakes: () => number } {
  const inner = new ZooKeeperLockBackend(fixture.connectionString, { root: fixture.root, sessionTimeout: 4_000 });
  let failed = 0;
  let wakes = 0;
  const backend: LockBackend = {
    name: inner.name,
    fencing: inner.fencing,
    sharedHolders: inner.sharedHolders,
    tryAcquire: async (...args) => {
      const result = await inner.tryAcquire(...args);
      if (!result.acquired) failed++;
      return result;
    },
    extend: (...args) => inner.extend(...args),
    release: (...args) => inner.release(...args),
    inspect: (...args) => inner.inspect(...args),
    watch: (keys, onRelease, owner) => inner.watch(keys, () => (wakes++, onRelease()), owner),
    watching: () => inner.watching(),
    close: () => inner.close(),
  };
  return { backend, failed: () => failed, wakes: () => wakes };
}

function service(backend: LockBackend, options: ConstructorParameters<typeof LockService>[1] = {}): LockService {
  // No polling: only a release can move a waiter.
  const locks = new LockService(backend, { keyPrefix: 'shared:', pollInterval: 60_000, ...options });
  fixture.cleanup(() => locks.onApplicationShutdown());
  return locks;
}

/** Long enough for a herd to show: every waiter of a herd would ask ZooKeeper within a few ms. */
const SETTLE_MS = 300;

describe('ZooKeeper shared locks and semaphores', () => {
  it('wakes a permit waiter whose turn came while the caller ahead of it, in on this key, waits for another key', async () => {
    const open = () => {
      const b = new ZooKeeperLockBackend(fixture.connectionString, { root: fixture.root, sessionTimeout: 4_000 });
      fixture.cleanup(() => b.close());
      return b;
    };
    const [h1b, h2b, wb, bb, cb] = [open(), open(), open(), open(), open()];
    // A writer holds 'sem-other'; two permit holders hold 'sem' (2 permits).
    expect((await wb.tryAcquire(['sem-other'], 'w', 60_000)).acquired).toBe(true);
    expect((await h1b.tryAcquire(['sem'], 'h1', 60_000, { limits: [2] })).acquired).toBe(true);
    expect((await h2b.tryAcquire(['sem'], 'h2', 60_000, { limits: [2] })).acquired).toBe(true);
    // B asks for a permit of 'sem' and for 'sem-other' (its keys in sorted order): it waits in the
    // line of 'sem' (pending in the other's). C asks for a permit of 'sem': it waits behind B.
    expect((await bb.tryAcquire(['sem', 'sem-other'], 'b', 60_000, { limits: [2, 1] })).acquired).toBe(false);
    let bWakes = 0;
    await bb.watch(['sem', 'sem-other'], () => bWakes++, 'b');
    expect((await cb.tryAcquire(['sem'], 'c', 60_000, { limits: [2] })).acquired).toBe(false);
    let cWakes = 0;
    await cb.watch(['sem'], () => cWakes++, 'c');

    // Both permit holders leave; B looks again each time, as the service would when woken: it is
    // in on 'sem' and still waits for 'sem-other'.
    await h1b.release(['sem'], 'h1');
    await until(() => bWakes > 0, 10_000, 'B to be woken by h1');
    expect((await bb.tryAcquire(['sem', 'sem-other'], 'b', 60_000, { limits: [2, 1] })).acquired).toBe(false);
    await h2b.release(['sem'], 'h2');
    await until(() => bWakes > 1, 10_000, 'B to be woken by h2');
    expect((await bb.tryAcquire(['sem', 'sem-other'], 'b', 60_000, { limits: [2, 1] })).acquired).toBe(false);

    // C fits beside B now: it must be woken, not left asleep until its poll.
    await until(() => cWakes > 0, 5_000, 'C to be woken');
    expect((await cb.tryAcquire(['sem'], 'c', 60_000, { limits: [2] })).acquired).toBe(true);
  });

  it('a permit freed by any holder lets in the first waiter; later waiters are not woken by it', async () => {
    // In this order in line: h0, h1, then the waiters.
    const holders: LockHandle[] = [];
    for (let i = 0; i < 2; i++) holders.push(await service(countingBackend().backend).acquire('sem', { permits: 2, ttl: 60_000 }));
    const waiters = Array.from({ length: 3 }, () => countingBackend());
    const got: number[] = [];
    const handles: Promise<LockHandle>[] = [];
    for (const [i, waiter] of waiters.entries()) {
      handles.push(
        service(waiter.backend)
          .acquire('sem', { permits: 2, wait: 30_000, ttl: 60_000 })
          .then((handle) => (got.push(i), handle)),
      );
      // Arrival order is the order the requests reached ZooKeeper: one at a time.
      await until(() => waiter.failed() === 1, 10_000, `waiter ${i} to stand in line`);
    }
    await new Promise((resolve) => setTimeout(resolve, SETTLE_MS));
    // Out of order: the later holder first (a waiter watching only the earliest would sleep on),
    // then the earlier one (the next waiter must have taken its turn at watching the holders),
    // then the first waiter that got in (the last waiter watches more than the one before it).
    const leave = [() => holders[1].release(), () => holders[0].release(), async () => (await handles[0]).release()];
    for (let turn = 0; turn < 3; turn++) {
      const before = waiters.map((w) => w.wakes());
      await leave[turn]();
      await until(() => got.length === turn + 1, 10_000, `waiter ${turn} to get a permit`);
      await new Promise((resolve) => setTimeout(resolve, SETTLE_MS));
      expect(got).toEqual([0, 1, 2].slice(0, turn + 1));
      const woken = waiters.map((w, i) => w.wakes() - before[i]);
      // The one that got in was woken once; the next in line at most once, to watch the holders
      // in its place; nobody behind it.
      expect(woken[turn]).toBe(1);
      for (let i = turn + 2; i < 3; i++) expect(woken[i]).toBe(0);
      for (let i = turn + 1; i < 3; i++) expect(woken[i]).toBeLessThanOrEqual(1);
    }
    for (const handle of [handles[1], handles[2]]) await (await handle).release();
  }, 60_000);

  it('a stream of readers from three processes never passes a queued writer: every reader in while it waits came before it', async () => {
    const readers = [0, 1, 2].map(() => service(countingBackend().backend));
    const entered: { token: number; at: number }[] = [];
    let stop = false;
    const streams = Array.from({ length: 6 }, (_, i) =>
      (async () => {
        while (!stop) {
          await readers[i % 3].using(
            'stream',
            async (handle) => {
              entered.push({ token: handle.fencingToken!, at: performance.now() });
              await new Promise((resolve) => setTimeout(resolve, 5 + (i % 3) * 5));
            },
            { mode: 'shared', wait: 30_000 },
          );
        }
      })(),
    );
    // Readers overlap all the time now: without a line, a writer would never find the key free.
    await until(() => entered.length > 20, 10_000, 'the readers to run');
    const writer = countingBackend();
    const writing = service(writer.backend);
    let queuedAt = performance.now();
    let handle = await writing.acquire('stream', { wait: 20_000 });
    // On a loaded machine the readers may leave a gap: a writer that got in at once proves nothing
    // here, so it leaves and asks again, until it had to wait in line.
    for (let tries = 0; writer.failed() === 0 && tries < 10; tries++) {
      await handle.release();
      queuedAt = performance.now();
      handle = await writing.acquire('stream', { wait: 20_000 });
    }
    const inAt = performance.now();
    stop = true;
    await handle.release();
    await Promise.all(streams);
    expect(writer.failed()).toBeGreaterThan(0);
    // Tokens are creation order in the line: a reader that came after the writer has a greater one.
    const passed = entered.filter((r) => r.at > queuedAt && r.at < inAt && r.token > handle.fencingToken!);
    expect(passed).toEqual([]);
    // And those after it did come in after it.
    expect(entered.some((r) => r.token > handle.fencingToken!)).toBe(true);
  }, 40_000);

  it('a writer paused past its session: readers come in with greater tokens, and its late write is refused by a register the readers recorded', async () => {
    const holder = await Holder.start('zookeeper-lock-holder.mjs', fixture.connectionString, 'paused-rw', 60_000);
    fixture.cleanup(() => holder.kill());
    const stale = (await holder.next('acquired')).token!;
    holder.child.kill('SIGSTOP'); // a long GC pause: no heartbeat, no extension, nothing
    fixture.cleanup(() => holder.child.kill('SIGCONT'));
    const register = (await connectedClient(zookeeper, fixture.connectionString)) as { close(): void };
    fixture.cleanup(() => register.close());
    const readers = [0, 1].map(() =>
      service(new ZooKeeperLockBackend(fixture.connectionString, { root: '/fault', sessionTimeout: 4_000 }), { keyPrefix: 'fault:' }),
    );
    const handles = await Promise.all(readers.map((locks) => locks.acquire('paused-rw', { mode: 'shared', wait: 10_000 })));
    for (const handle of handles) {
      expect(handle.fencingToken).toBeGreaterThan(stale);
      // A reader records the highest token that read (refused only when a greater one already did).
      await fencedWrite(register, '/fenced', handle.fencingToken, 'read');
    }
    holder.child.kill('SIGCONT');
    expect(await holder.next('lost')).toMatchObject({ name: 'LockLostError' });
    holder.child.send({ type: 'write' });
    expect(await holder.next('wrote')).toMatchObject({ accepted: false });
    for (const handle of handles) await handle.release();
  }, 30_000);

  it.each([
    ['a reader', 'shared', SHARED],
    ['a permit holder', '2', 2],
  ] as const)(
    '%s killed with SIGKILL frees its share within its session timeout, however long its ttl',
    async (_, limitText, limit) => {
      // A 60 s ttl: only the session's end can free it.
      const holder = await Holder.start('zookeeper-shared-holder.mjs', fixture.connectionString, 'killed', 60_000, [
        limitText,
        fixture.root,
      ]);
      fixture.cleanup(() => holder.kill());
      const { name: owner, token } = await holder.next('acquired');
      const b = new ZooKeeperLockBackend(fixture.connectionString, { root: fixture.root, sessionTimeout: 4_000 });
      fixture.cleanup(() => b.close());
      expect((await b.tryAcquire(['killed'], 'beside', 60_000, { limits: [limit] })).acquired).toBe(true);
      const owners = async () => (await b.inspect('killed'))?.holders?.map((h) => h.owner).sort();
      expect(await owners()).toEqual(['beside', owner].sort());
      // Alive, it keeps its share past one and a half of its session timeouts.
      await new Promise((resolve) => setTimeout(resolve, 1_500));
      expect(await owners()).toContain(owner);
      // A writer waits for both; killed, the child's share goes with its session.
      expect((await b.tryAcquire(['killed'], 'writer', 60_000, { willWait: false })).acquired).toBe(false);
      await holder.kill();
      const killedAt = Date.now();
      await b.release(['killed'], 'beside');
      const writer = await service(b, { keyPrefix: '' }).acquire('killed', { wait: 10_000, ttl: 60_000 });
      // 1 s session, rounded up to the server's ticks; the rest is margin for a loaded machine.
      expect(Date.now() - killedAt).toBeLessThan(5_000);
      expect(writer.fencingToken).toBeGreaterThan(token!);
      await writer.release();
    },
    30_000,
  );

  it('a reader whose node an operator deletes loses its hold (signal, and its other keys), while the others go on', async () => {
    const [a, b, c] = [0, 1, 2].map(() => service(countingBackend().backend, { keyPrefix: '' }));
    // A reads two keys at once; B reads one of them; C waits to write the other.
    const readerA = await a.acquire(['doc', 'idx'], { mode: 'shared', ttl: 1_000 });
    const readerB = await b.acquire('doc', { mode: 'shared', ttl: 1_000 });
    const writer = c.acquire('idx', { wait: 20_000 });
    const writerDoc = c.acquire('doc', { wait: 20_000 });
    for (const waiting of [writer, writerDoc]) waiting.catch(() => undefined);
    await new Promise((resolve) => setTimeout(resolve, SETTLE_MS));
    type Raw = {
      getChildren(path: string, done: (error: Error | null, names: string[]) => void): void;
      remove(path: string, version: number, done: (error: Error | null) => void): void;
      close(): void;
    };
    const raw = (await connectedClient(zookeeper, fixture.connectionString)) as Raw;
    fixture.cleanup(() => raw.close());
    const parent = `${fixture.root}/doc`;
    const names = await new Promise<string[]>((resolve, reject) => raw.getChildren(parent, (e, n) => (e ? reject(e) : resolve(n))));
    // A came first: the first node of the line is its.
    const nodeOfA = inLineOrder(names)[0];
    expect(nodeOfA).toMatch(/\.read-\d{10}$/);
    await new Promise<void>((resolve, reject) => raw.remove(`${parent}/${nodeOfA}`, -1, (e) => (e ? reject(e) : resolve())));
    // A is told at its next extension (a third of its lease), and its node on 'idx' goes too.
    await until(() => readerA.signal.aborted, 5_000, "reader A's signal");
    expect(readerA.signal.reason).toBeInstanceOf(LockLostError);
    const w = await writer;
    expect(w.isHeld).toBe(true);
    // B still reads 'doc': the writer of 'doc' waits for it, not for A.
    expect(readerB.signal.aborted).toBe(false);
    expect((await b.inspect('doc'))?.holders?.map((h) => h.heldHere)).toEqual([true]);
    await readerB.release();
    await (await writerDoc).release();
    await w.release();
    await readerA.release().catch(() => undefined);
  }, 30_000);
});
