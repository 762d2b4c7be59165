import { describe, expect, it } from '@jest/globals';
import { Holder } from '../support/lock-holder-process.js';
import { usePostgresServer } from '../support/postgres-fixture.js';
import { EXCLUSIVE, SHARED, sharedCallers } from '../support/postgres-shared-callers.js';
import { until } from '../support/wait.js';

/**
 * Shared (read) locks and semaphores on PostgreSQL, through the backend as LockService drives it:
 * several processes (one backend each), callers that wait in the line and wake on release.
 */
const fixture = usePostgresServer();
const { backend, enter, line } = sharedCallers(fixture);

describe('PostgreSQL backend: shared locks and semaphores', () => {
  it('two writers never hold a key together, nor a writer and a reader', async () => {
    const [a, b] = [await backend(), await backend()];
    expect(await a.tryAcquire(['w'], 'writer-1', 30_000, { limits: [EXCLUSIVE] })).toMatchObject({ acquired: true });
    expect(await b.tryAcquire(['w'], 'writer-2', 30_000, { limits: [EXCLUSIVE], willWait: false })).toMatchObject({ acquired: false });
    expect(await b.tryAcquire(['w'], 'reader-1', 30_000, { limits: [SHARED], willWait: false })).toMatchObject({ acquired: false });
    await a.release(['w'], 'writer-1');
    expect(await b.tryAcquire(['w'], 'reader-1', 30_000, { limits: [SHARED], willWait: false })).toMatchObject({ acquired: true });
    expect(await a.tryAcquire(['w'], 'writer-1', 30_000, { limits: [EXCLUSIVE], willWait: false })).toMatchObject({ acquired: false });
  });

  it('readers hold a key together, each with a token of its own; inspect shows every holder', async () => {
    const [a, b] = [await backend(), await backend()];
    const tokens: number[] = [];
    for (const [i, b_] of [a, b, a, b].entries()) {
      const result = await b_.tryAcquire(['r'], `reader-${i}`, 30_000, { limits: [SHARED] });
      expect(result.acquired).toBe(true);
      tokens.push((result as { fencingToken: number }).fencingToken);
    }
    expect(new Set(tokens).size).toBe(4);
    expect(tokens).toEqual([...tokens].sort((x, y) => x - y));
    const state = await a.inspect('r');
    expect(state).toMatchObject({ key: 'r', limit: SHARED, fencingToken: tokens[3] });
    expect(state?.holders?.map((h) => h.owner)).toEqual(['reader-0', 'reader-1', 'reader-2', 'reader-3']);
    expect(state?.holders?.map((h) => h.fencingToken)).toEqual(tokens);
  });

  it('a writer waits for every reader, is not woken while one remains, and enters with a greater token', async () => {
    const [a, b] = [await backend(), await backend()];
    const readers = [enter(a, 'wr', SHARED), enter(b, 'wr', SHARED)];
    const readerTokens = await Promise.all(readers.map((r) => r.entered));
    const writer = enter(b, 'wr', EXCLUSIVE);
    await until(async () => (await line('wr')) === 1, 5_000, 'the writer in line');
    await readers[0].leave();
    // One reader remains: the release lets nobody in and wakes nobody.
    expect(await line('wr')).toBe(1);
    expect(writer.wakes()).toBe(0);
    await readers[1].leave();
    const token = await writer.entered;
    expect(writer.wakes()).toBe(1);
    expect(token).toBeGreaterThan(Math.max(...readerTokens));
  });

  it('a queued writer blocks later readers, and its release lets every reader behind it in at once', async () => {
    const [a, b, c] = [await backend(), await backend(), await backend()];
    const first = enter(a, 'q', SHARED);
    await first.entered;
    const writer = enter(b, 'q', EXCLUSIVE);
    await until(async () => (await line('q')) === 1, 5_000, 'the writer in line');
    // Only readers hold the key, but a writer stands in line: a later reader queues behind it.
    const late = [];
    for (const b_ of [c, a, c]) {
      late.push(enter(b_, 'q', SHARED));
      await until(async () => (await line('q')) === late.length + 1, 5_000, 'the reader in line');
    }
    expect(late.some((r) => r.inside())).toBe(false);
    await first.leave();
    const writerToken = await writer.entered;
    expect(late.some((r) => r.inside())).toBe(false);
    expect(late.map((r) => r.wakes())).toEqual([0, 0, 0]);
    await writer.leave();
    const lateTokens = await Promise.all(late.map((r) => r.entered));
    // Handed over by that one release, in line order: one wake-up each.
    expect(late.map((r) => r.wakes())).toEqual([1, 1, 1]);
    expect(lateTokens).toEqual([...lateTokens].sort((x, y) => x - y));
    expect(Math.min(...lateTokens)).toBeGreaterThan(writerToken);
    expect(await line('q')).toBe(0);
  });

  it('a waiter that gives up lets in those behind it that can enter now, and only them', async () => {
    const [a, b] = [await backend(), await backend()];
    // Readers behind a writer that gives up: they enter beside the reader that holds.
    const reader = enter(a, 'gone', SHARED);
    await reader.entered;
    const writer = enter(b, 'gone', EXCLUSIVE);
    await until(async () => (await line('gone')) === 1, 5_000, 'the writer in line');
    const behind = enter(a, 'gone', SHARED);
    await until(async () => (await line('gone')) === 2, 5_000, 'the reader behind it');
    await writer.leave();
    await behind.entered;
    expect(behind.wakes()).toBe(1);
    // Readers behind a reader that gives up, while a writer holds: they stay out.
    await reader.leave();
    await behind.leave();
    const holder = enter(b, 'gone', EXCLUSIVE);
    await holder.entered;
    const first = enter(a, 'gone', SHARED);
    await until(async () => (await line('gone')) === 1, 5_000, 'the first reader in line');
    const second = enter(b, 'gone', SHARED);
    await until(async () => (await line('gone')) === 2, 5_000, 'the second reader in line');
    await first.leave();
    expect(await line('gone')).toBe(1);
    expect(second.inside()).toBe(false);
    expect(second.wakes()).toBe(0);
    expect((await a.inspect('gone'))?.owner).toBeDefined();
    expect((await a.inspect('gone'))?.limit).toBeUndefined();
    await holder.leave();
    await second.entered;
  });

  it('a semaphore never has more holders than permits, and a caller for a permit waits its turn', async () => {
    const processes = [await backend(), await backend(), await backend()];
    let inside = 0;
    let most = 0;
    const worker = async (i: number) => {
      for (let round = 0; round < 4; round++) {
        const caller = enter(processes[i % 3], 'sem', 3);
        await caller.entered;
        most = Math.max(most, ++inside);
        await processes[i % 3].inspect('sem'); // a round trip inside, so the others overlap it
        inside--;
        await caller.leave();
      }
    };
    await Promise.all(Array.from({ length: 8 }, (_, i) => worker(i)));
    expect(most).toBeLessThanOrEqual(3);
    // And as the store sees it: three in, the fourth refused.
    for (const owner of ['p1', 'p2', 'p3'])
      expect((await processes[0].tryAcquire(['sem2'], owner, 30_000, { limits: [3] })).acquired).toBe(true);
    expect(await processes[1].tryAcquire(['sem2'], 'p4', 30_000, { limits: [3], willWait: false })).toMatchObject({ acquired: false });
    expect((await processes[1].inspect('sem2'))?.holders).toHaveLength(3);
  });

  it('a queued caller for a permit blocks a later one: nobody passes it', async () => {
    const [a, b] = [await backend(), await backend()];
    const holders = [enter(a, 'fifo', 2), enter(a, 'fifo', 2)];
    await Promise.all(holders.map((h) => h.entered));
    const queued = enter(b, 'fifo', 2);
    await until(async () => (await line('fifo')) === 1, 5_000, 'the first waiter in line');
    const later = enter(a, 'fifo', 2);
    await until(async () => (await line('fifo')) === 2, 5_000, 'the second waiter in line');
    await holders[0].leave();
    await queued.entered;
    expect(later.inside()).toBe(false);
    expect(later.wakes()).toBe(0);
    await holders[1].leave();
    await later.entered;
  });

  it('each holder has its own lease: one that is not extended runs out, the others stay, and its permit comes back', async () => {
    const b = await backend();
    expect((await b.tryAcquire(['lease'], 'short', 400, { limits: [2] })).acquired).toBe(true);
    expect((await b.tryAcquire(['lease'], 'long', 30_000, { limits: [2] })).acquired).toBe(true);
    expect(await b.tryAcquire(['lease'], 'third', 30_000, { limits: [2], willWait: false })).toMatchObject({ acquired: false });
    // Extending one holder does not extend the other.
    await until(
      async () => (await b.extend(['lease'], 'long', 30_000)).extended && (await b.inspect('lease'))!.holders!.length === 1,
      5_000,
      'the short lease to run out',
    );
    expect(await b.extend(['lease'], 'short', 30_000)).toEqual({ extended: false });
    expect((await b.tryAcquire(['lease'], 'third', 30_000, { limits: [2], willWait: false })).acquired).toBe(true);
    expect((await b.inspect('lease'))?.holders?.map((h) => h.owner).sort()).toEqual(['long', 'third']);
  });

  it('tokens increase across modes: every holder has a token greater than every holder that ended before it began', async () => {
    const [a, b] = [await backend(), await backend()];
    const ended: number[] = [];
    const take = async (limit: number) => {
      const caller = enter(a, 'tokens', limit);
      const token = await caller.entered;
      expect(token).toBeGreaterThan(Math.max(0, ...ended));
      return { token, leave: async () => (await caller.leave(), ended.push(token)) };
    };
    const w1 = await take(EXCLUSIVE);
    await w1.leave();
    const [r1, r2] = [await take(SHARED), await take(SHARED)];
    // A writer queued behind the readers is handed the key by the last one's release.
    const w2 = enter(b, 'tokens', EXCLUSIVE);
    await until(async () => (await line('tokens')) === 1, 5_000, 'the writer in line');
    await r1.leave();
    await r2.leave();
    const w2Token = await w2.entered;
    expect(w2Token).toBeGreaterThan(Math.max(...ended));
    const r3 = enter(b, 'tokens', SHARED);
    await until(async () => (await line('tokens')) === 1, 5_000, 'the reader in line');
    await w2.leave();
    ended.push(w2Token);
    expect(await r3.entered).toBeGreaterThan(Math.max(...ended));
  });

  it('callers that disagree on the number of permits get limitMismatch at once, and stay out of the line', async () => {
    const [a, b] = [await backend(), await backend()];
    expect((await a.tryAcquire(['n'], 'three', 30_000, { limits: [3] })).acquired).toBe(true);
    expect(await b.tryAcquire(['n'], 'five', 30_000, { limits: [5] })).toEqual({ acquired: false, limitMismatch: { key: 'n', limit: 3 } });
    expect(await b.tryAcquire(['n'], 'reader', 30_000, { limits: [SHARED] })).toEqual({
      acquired: false,
      limitMismatch: { key: 'n', limit: 3 },
    });
    expect(await line('n')).toBe(0);
    // An exclusive caller is no mismatch: it waits for the permits to be given back.
    expect(await b.tryAcquire(['n'], 'writer', 30_000, { limits: [EXCLUSIVE] })).toMatchObject({ acquired: false });
    expect((await b.tryAcquire(['m'], 'reader', 30_000, { limits: [SHARED] })).acquired).toBe(true);
    expect(await a.tryAcquire(['m'], 'four', 30_000, { limits: [4] })).toEqual({
      acquired: false,
      limitMismatch: { key: 'm', limit: SHARED },
    });
  });

  it('several keys in one call, with a mode per key, all or nothing', async () => {
    const [a, b] = [await backend(), await backend()];
    expect((await a.tryAcquire(['k1', 'k2'], 'mixed-1', 30_000, { limits: [SHARED, EXCLUSIVE] })).acquired).toBe(true);
    expect(await b.tryAcquire(['k1', 'k2'], 'mixed-2', 30_000, { limits: [SHARED, SHARED], willWait: false })).toMatchObject({
      acquired: false,
    });
    expect(await a.inspect('k1')).toMatchObject({ limit: SHARED, holders: [{ owner: 'mixed-1' }] });
    expect((await b.tryAcquire(['k1'], 'mixed-3', 30_000, { limits: [SHARED] })).acquired).toBe(true);
    await a.release(['k1', 'k2'], 'mixed-1');
    expect((await b.tryAcquire(['k1', 'k2'], 'mixed-2', 30_000, { limits: [SHARED, SHARED] })).acquired).toBe(true);
  });

  it('kill -9 of a reader process, and of a permit holder: the writer gets the key once their leases run out', async () => {
    for (const limit of ['shared', '2']) {
      const ttl = 1_500;
      const key = `killed-${limit}`;
      const holder = await Holder.start('postgres-shared-holder.mjs', fixture.url, key, ttl, [limit]);
      fixture.cleanup(() => holder.kill());
      const writer = enter(await backend(), key, EXCLUSIVE);
      await until(async () => (await line(key)) === 1, 5_000, 'the writer in line');
      // The holder extends its lease as the watchdog does: the writer still waits past the ttl.
      const extended = () => holder.messages.filter((m) => m.type === 'extended').length;
      await until(() => extended() >= 4, 10_000, 'four extensions (more than a ttl)');
      expect(writer.inside()).toBe(false);
      await holder.kill();
      const killedAt = Date.now();
      expect(await writer.entered).toBeGreaterThan((await holder.next('acquired')).token!);
      expect(Date.now() - killedAt).toBeLessThan(ttl + 1_500);
      await writer.leave();
    }
  });
});
