import { describe, expect, it } from '@jest/globals';
import type { LockBackend } from '../../lib/backends/lock-backend.interface.js';
import { ZooKeeperLockBackend } from '../../lib/backends/zookeeper/zookeeper.backend.js';
import { nodeZooKeeperClients, type ZooKeeperClient, type ZooKeeperMulti } from '../../lib/backends/zookeeper/zookeeper.client.js';
import { LockService } from '../../lib/lock.service.js';
import type { LockHandle } from '../../lib/lock.handle.js';
// @ts-expect-error: node-zookeeper-client ships no types; the test only passes it to the fixture.
import zookeeper from 'node-zookeeper-client';
// @ts-expect-error: a plain ESM fixture shared with the child processes, without types.
import { connectedClient } from '../fixtures/zookeeper-fenced-store.mjs';
import { until } from '../support/wait.js';
import { tappedClients } from '../support/zookeeper-client-tap.js';
import { useZooKeeper } from '../support/zookeeper-fixture.js';

const fixture = useZooKeeper();

/** A backend (a session of its own, as another process) that counts its attempts and wake-ups. */
function countingBackend(): { backend: LockBackend; attempts: () => number; failed: () => number; wakes: () => number } {
  const inner = new ZooKeeperLockBackend(fixture.connectionString, { root: fixture.root, sessionTimeout: 4_000 });
  let attempts = 0;
  let wakes = 0;
  let failed = 0;
  const backend: LockBackend = {
    name: inner.name,
    fencing: inner.fencing,
    tryAcquire: async (...args) => {
      attempts++;
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
  return { backend, attempts: () => attempts, failed: () => failed, wakes: () => wakes };
}

/**
 * Backends (sessions of their own, as other processes) that count, per process, the line reads
 * (getChildren), the watches set (exists) on others' nodes, and the writes (multi) they send.
 */
function lookCounting() {
  const reads = [0, 0, 0];
  const watches = [0, 0, 0];
  // Writes that neither create nor delete (the write that marks a node as in, or checks it), held
  // back while `marks.held` is a promise, and counted in `marks.waiting`.
  const marks: { held?: Promise<void>; waiting: number } = { waiting: 0 };
  const backend = (i: number) => {
    const own = new Set<string>();
    return new ZooKeeperLockBackend(
      fixture.connectionString,
      { root: fixture.root, sessionTimeout: 4_000 },
      tappedClients(fixture.connectionString, 4_000, {
        getChildren: (_path, send) => (reads[i]++, send()),
        exists: (path, watcher, send) => (watcher && !own.has(path) && watches[i]++, send()),
        multi: async (ops, send) => {
          if (marks.held && ops.every((op) => op.op === 'set' || op.op === 'check')) {
            marks.waiting++;
            await marks.held;
          }
          const answer = await send();
          for (const path of answer.created) own.add(path);
          return answer;
        },
      }),
    );
  };
  let open = () => undefined as void;
  const holdMarks = () => (marks.held = new Promise<void>((resolve) => (open = resolve)));
  const letMarksThrough = () => ((marks.held = undefined), open());
  return { reads, watches, marks, holdMarks, letMarksThrough, backend };
}

function service(backend: LockBackend): LockService {
  // No polling: only a release can move a waiter.
  const locks = new LockService(backend, { keyPrefix: 'line:', pollInterval: 60_000 });
  fixture.cleanup(() => locks.onApplicationShutdown());
  return locks;
}

/** Long enough for a herd to show: every waiter of a herd would ask ZooKeeper within a few ms. */
const SETTLE_MS = 300;

describe('ZooKeeper lines', () => {
  it('four waiters in four processes: each release wakes exactly one of them, in the order they arrived', async () => {
    const holder = await service(countingBackend().backend).acquire('herd', { ttl: 60_000 });
    const waiters = Array.from({ length: 4 }, () => countingBackend());
    const got: number[] = [];
    const handles: Promise<LockHandle>[] = [];
    for (const [i, waiter] of waiters.entries()) {
      handles.push(
        service(waiter.backend)
          .acquire('herd', { wait: 30_000, ttl: 60_000 })
          .then((handle) => (got.push(i), handle)),
      );
      // Arrival order is the order the requests reached ZooKeeper: one at a time.
      await until(() => waiter.failed() === 1, 10_000, `waiter ${i} to stand in line`);
    }
    let release = () => holder.release();
    for (let turn = 0; turn < 4; turn++) {
      const before = waiters.map((w) => [w.attempts(), w.wakes()]);
      await release();
      await until(() => got.length === turn + 1, 10_000, `waiter ${turn} to get the lock`);
      await new Promise((resolve) => setTimeout(resolve, SETTLE_MS));
      expect(got).toEqual([0, 1, 2, 3].slice(0, turn + 1));
      for (const [i, waiter] of waiters.entries()) {
        // The one whose turn it is was woken once and asked once; nobody else heard of it.
        const woken = i === turn ? 1 : 0;
        expect([waiter.attempts() - before[i][0], waiter.wakes() - before[i][1]]).toEqual([woken, woken]);
      }
      const handle = await handles[turn];
      release = () => handle.release();
    }
    await release();
  }, 60_000);

  it('a waiter just behind the holder takes the key when it goes without reading the line again, also once it moved up', async () => {
    const { reads, watches, backend } = lookCounting();
    const [first, second, third] = [service(backend(0)), service(backend(1)), service(backend(2))];
    const holder = await first.acquire('direct', { ttl: 60_000, site: 'Holder.run' });
    const next = second.acquire('direct', { wait: 20_000, ttl: 60_000, site: 'Next.run' });
    await until(() => watches[1] === 1, 10_000, 'the second to watch the holder');
    const last = third.acquire('direct', { wait: 20_000, ttl: 60_000, site: 'Last.run' });
    await until(() => watches[2] === 1, 10_000, 'the third to watch the second');

    // The second stood just behind the first node of the line: it takes the key as soon as it goes.
    let before = reads[1];
    await holder.release();
    const held = await next;
    expect(reads[1] - before).toBe(0);
    // The second went in (its node written): the third, just behind it, hears of it and knows it is next.
    await until(() => watches[2] === 2, 10_000, 'the third to watch the second again after it went in');
    before = reads[2];
    await held.release();
    const lastHeld = await last;
    expect(reads[2] - before).toBe(0);
    expect(lastHeld.fencingToken).toBeGreaterThan(held.fencingToken!);
    await lastHeld.release();
  });

  it('a waiter just behind the holder enters as the holder goes, before the write that marks it in is answered', async () => {
    const { watches, marks, holdMarks, letMarksThrough, backend } = lookCounting();
    const [first, second] = [service(backend(0)), service(backend(1))];
    const holder = await first.acquire('on-the-event', { ttl: 60_000, site: 'Holder.run' });
    const next = second.acquire('on-the-event', { wait: 20_000, ttl: 60_000, site: 'Next.run' });
    await until(() => watches[1] === 1, 10_000, 'the second to watch the holder');
    holdMarks();
    await holder.release();
    const held = await next;
    expect(held.isHeld).toBe(true);
    // Its write went out, and is still held back: it entered on the deletion's event alone.
    expect(marks.waiting).toBe(1);
    letMarksThrough();
    await held.release();
  });

  it('a waiter whose session was last certified more than half its validity ago writes before it enters', async () => {
    const { watches, marks, holdMarks, letMarksThrough, backend } = lookCounting();
    const [first, second] = [service(backend(0)), service(backend(1))];
    const holder = await first.acquire('certified-late', { ttl: 60_000 });
    // A ttl of 400 ms: the validity of its lock is 400 ms, counted from the write that certifies it.
    let took = false;
    const next = second.acquire('certified-late', { wait: 20_000, ttl: 400, site: 'Next.run' }).then((handle) => ((took = true), handle));
    await until(() => watches[1] === 1, 10_000, 'the second to watch the holder');
    // Its create, the last write of its node, is now more than 200 ms old.
    await new Promise((resolve) => setTimeout(resolve, 300));
    holdMarks();
    await holder.release();
    await until(() => marks.waiting === 1, 10_000, 'its write to go out');
    expect(took).toBe(false);
    letMarksThrough();
    const held = await next;
    expect(held.isHeld).toBe(true);
    await held.release();
  });

  it('a waiter that enters on the event alone holds for its validity counted from its last write, not from the event', async () => {
    const { backend } = lookCounting();
    const [h, w] = [backend(0), backend(1)];
    for (const opened of [h, w]) fixture.cleanup(() => opened.close());
    expect((await h.tryAcquire(['counted'], 'h', 60_000)).acquired).toBe(true);
    let woken = false;
    await w.watch(['counted'], () => (woken = true), 'w');
    // Its create is its last write: it was sent before this answer came.
    expect((await w.tryAcquire(['counted'], 'w', 1_000)).acquired).toBe(false);
    const created = performance.now();
    await new Promise((resolve) => setTimeout(resolve, 200));
    await h.release(['counted'], 'h');
    await until(() => woken, 10_000, 'w to hear that h went');
    const asked = performance.now();
    const result = await w.tryAcquire(['counted'], 'w', 1_000);
    expect(result.acquired).toBe(true);
    // Counted from its own request, the lease ends no later than a ttl after the create was sent.
    expect(asked + (result.acquired ? result.validityMs! : 0)).toBeLessThanOrEqual(created + 1_000);
    await w.release(['counted'], 'w');
  });

  it('a waiter behind one that gives up does not take the key from the holder: it looks again, then takes it when the holder goes', async () => {
    const { reads, watches, backend: counted } = lookCounting();
    const holder = await service(countingBackend().backend).acquire('behind-leaver', { ttl: 60_000 });
    // Its wait leaves room for the second waiter to line up behind it and watch it on a busy
    // machine: giving up before that, it would leave nothing for the second one to look again at.
    const impatient = service(counted(0))
      .acquire('behind-leaver', { wait: 2_000 })
      .catch((e: unknown) => e);
    await until(() => watches[0] === 1, 10_000, 'the first waiter to watch the holder');
    let took = false;
    const patient = service(counted(1))
      .acquire('behind-leaver', { wait: 20_000, ttl: 60_000 })
      .then((handle) => ((took = true), handle));
    await until(() => watches[1] === 1, 10_000, 'the second waiter to watch the first');
    await impatient;
    // It looked at the line again and now watches the holder; it holds nothing while the holder does.
    await until(() => watches[1] === 2 || took, 10_000, 'the second waiter to look again');
    expect(took).toBe(false);
    expect(holder.isHeld).toBe(true);
    const before = reads[1];
    await holder.release();
    const handle = await patient;
    expect(reads[1] - before).toBe(0);
    await handle.release();
  });

  it('a waiter that gives up leaves the line: the one behind it is next', async () => {
    const holder = await service(countingBackend().backend).acquire('give-up', { ttl: 60_000 });
    const [impatient, patient] = [countingBackend(), countingBackend()];
    const giveUp = service(impatient.backend)
      .acquire('give-up', { wait: 500 })
      .catch((e: unknown) => e);
    await until(() => impatient.failed() === 1, 10_000, 'the first waiter to stand in line');
    const next = service(patient.backend).acquire('give-up', { wait: 20_000 });
    await giveUp;
    await holder.release();
    const handle = await next;
    expect(handle.isHeld).toBe(true);
    await handle.release();
  });

  it('a create whose answer came after the command timeout: the next attempt waits for that answer and holds those nodes, made once', async () => {
    // The first multi() of the session is applied at once, but its answer is held back past the
    // command timeout, as on a slow network.
    let held: Promise<unknown> | undefined;
    let late: () => void = () => undefined;
    const clients = nodeZooKeeperClients(fixture.connectionString, 4_000);
    const slowFirstCreate = (): ZooKeeperClient => {
      const client = clients();
      const multi = client.multi.bind(client);
      return Object.assign(Object.create(client) as ZooKeeperClient, {
        connect: client.connect.bind(client),
        multi: (ops: Parameters<ZooKeeperClient['multi']>[0]) => {
          const answer = multi(ops);
          if (held || ops[0]?.op !== 'create') return answer;
          held = answer;
          return new Promise<ZooKeeperMulti>((resolve, reject) => (late = () => answer.then(resolve, reject)));
        },
      });
    };
    const backend = new ZooKeeperLockBackend(fixture.connectionString, { root: fixture.root, commandTimeout: 300 }, slowFirstCreate);
    fixture.cleanup(() => backend.close());
    await expect(backend.tryAcquire(['late'], 'owner-a', 60_000)).rejects.toThrow('did not answer within 300 ms');
    await held;
    // Its node is there. ZooKeeper answers a connection's requests in order, so nothing the next
    // attempt asked could be answered before it: the attempt waits for that answer, then holds.
    const next = backend.tryAcquire(['late'], 'owner-a', 60_000);
    late();
    const won = await next;
    expect(won).toMatchObject({ acquired: true });
    const other = new ZooKeeperLockBackend(fixture.connectionString, { root: fixture.root });
    fixture.cleanup(() => other.close());
    // The very node it holds (a node made again would have another czxid: the lock was free between).
    expect(await other.inspect('late')).toMatchObject({ owner: 'owner-a', fencingToken: won.acquired && won.fencingToken });
    expect(await other.tryAcquire(['late'], 'owner-b', 60_000, { willWait: false })).toEqual({ acquired: false });
    expect(await backend.release(['late'], 'owner-a')).toBe(true);
  });

  it('a lock whose lease ran out loses its nodes no earlier than its ttl after the acquire was sent', async () => {
    // ZooKeeper has no lease of its own: the backend deletes a holder's nodes when its ttl has run
    // out, by a timer. Node fires timers up to about 2 ms before their time as performance.now()
    // counts it, and a deletion before the end of the lease the holder counts from its send time
    // would let another in while the holder still holds by its own count.
    let sent = 0;
    const early: number[] = [];
    const backend = new ZooKeeperLockBackend(
      fixture.connectionString,
      { root: fixture.root, sessionTimeout: 4_000 },
      tappedClients(fixture.connectionString, 4_000, {
        multi: (ops, send) => {
          if (ops.every((op) => op.op === 'remove')) early.push(sent - performance.now());
          return send();
        },
      }),
    );
    fixture.cleanup(() => backend.close());
    for (let i = 0; i < 40; i++) {
      const removals = early.length;
      const ttl = 10 + (i % 7);
      sent = performance.now() + ttl;
      expect((await backend.tryAcquire([`expiry:${i}`], `owner-${i}`, ttl, { willWait: false })).acquired).toBe(true);
      await until(() => early.length > removals, 5_000, 'the expired lock’s nodes to be deleted');
    }
    expect(early.filter((ms) => ms > 0)).toEqual([]);
  });

  it('a key’s parent node goes a few seconds after its line emptied, and comes back when the key is locked again', async () => {
    type Raw = { exists(path: string, callback: (error: Error | null, stat: unknown) => void): void; close(): void };
    const raw = (await connectedClient(zookeeper, fixture.connectionString)) as Raw;
    fixture.cleanup(() => raw.close());
    const exists = (path: string) =>
      new Promise<boolean>((resolve, reject) => raw.exists(path, (e, stat) => (e ? reject(e) : resolve(!!stat))));
    const backend = new ZooKeeperLockBackend(fixture.connectionString, { root: fixture.root });
    fixture.cleanup(() => backend.close());
    const parent = `${fixture.root}/once%3Aorder%3A42`;
    expect(await backend.tryAcquire(['once:order:42'], 'owner-a', 60_000)).toMatchObject({ acquired: true });
    expect(await exists(parent)).toBe(true);
    await backend.release(['once:order:42'], 'owner-a');
    await until(async () => !(await exists(parent)), 15_000, 'the empty parent node to be deleted');
    const again = await backend.tryAcquire(['once:order:42'], 'owner-b', 60_000);
    expect(again).toMatchObject({ acquired: true });
    await backend.release(['once:order:42'], 'owner-b');
  }, 30_000);
});
