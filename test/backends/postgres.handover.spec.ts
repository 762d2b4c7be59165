import { describe, expect, it } from '@jest/globals';
import type { LockBackend } from '../../lib/backends/lock-backend.interface.js';
import { PostgresLockBackend } from '../../lib/backends/postgres/postgres.backend.js';
import type { PostgresLockBackendOptions } from '../../lib/backends/postgres/postgres.options.js';
import { LockService } from '../../lib/lock.service.js';
import { usePostgresServer } from '../support/postgres-fixture.js';
import { until } from '../support/wait.js';

const fixture = usePostgresServer();

/** A backend as one process has it, already listening (as after its first wait). */
async function backend(options: PostgresLockBackendOptions = {}): Promise<PostgresLockBackend> {
  const created = new PostgresLockBackend(fixture.url, { waiterTimeout: 20_000, ...options });
  fixture.cleanup(() => created.close());
  (await created.watch(['warm-up'], () => undefined, 'nobody'))();
  return created;
}

function service(b: LockBackend): LockService {
  const created = new LockService(b, { keyPrefix: '', pollInterval: Math.floor(b.waiterTimeout! * 0.9) });
  fixture.cleanup(() => created.onApplicationShutdown());
  return created;
}

/** The backend, with `onWake` run on each wake-up before the waiter hears it. */
function onWake(b: PostgresLockBackend, hook: (wake: () => void) => void): LockBackend {
  return Object.assign(Object.create(b) as LockBackend, {
    watch: (keys: readonly string[], onRelease: () => void, owner?: string) => b.watch(keys, () => hook(onRelease), owner),
  });
}

async function line(key: string): Promise<string[]> {
  const { rows } = await fixture.admin.query<{ owner: string }>(
    'SELECT owner FROM distributed_locks_waiters WHERE key = $1 ORDER BY place',
    [key],
  );
  return rows.map((r) => r.owner);
}

/**
 * The lease row as PostgreSQL has it, expired or not: the live one when there is one (an expired
 * lease keeps its row, beside the next holder's, until it is released or cleaned up).
 */
async function row(key: string): Promise<{ owner: string; token: number; live: boolean } | undefined> {
  const { rows } = await fixture.admin.query<{ owner: string; fencing_token: string; live: boolean }>(
    'SELECT owner, fencing_token, expires_at > clock_timestamp() AS live FROM distributed_locks WHERE key = $1 ' +
      'ORDER BY live DESC, fencing_token DESC LIMIT 1',
    [key],
  );
  return rows[0] && { owner: rows[0].owner, token: Number(rows[0].fencing_token), live: rows[0].live };
}

function busy(ms: number): void {
  const end = performance.now() + ms;
  while (performance.now() < end);
}

describe('hand-over on release, under attack', () => {
  it('a waiter whose wait is aborted as the hand-over arrives does not keep the lock: the next waiter gets it', async () => {
    const holder = service(await backend());
    const controller = new AbortController();
    const waiterBackend = await backend();
    const waiter = service(onWake(waiterBackend, (wake) => (controller.abort(), wake())));
    const third = service(await backend());
    const held = await holder.acquire('abort', { ttl: 60_000 });
    const aborted = waiter.acquire('abort', { ttl: 60_000, wait: 20_000, signal: controller.signal });
    await until(async () => (await line('abort')).length === 1, 5_000, 'the waiter in line');
    const next = third.acquire('abort', { ttl: 60_000, wait: 20_000 });
    await until(async () => (await line('abort')).length === 2, 5_000, 'the third in line');
    await held.release();
    await expect(aborted).rejects.toThrow();
    // The release handed it the lock; giving up freed it, and the line moved on at once.
    const started = performance.now();
    const handle = await next;
    expect(performance.now() - started).toBeLessThan(5_000);
    expect((await row('abort'))?.owner).not.toBe(undefined);
    expect(await third.backend.inspect('abort')).toMatchObject({ fencingToken: handle.fencingToken });
    expect(handle.fencingToken).toBeGreaterThan(held.fencingToken!);
    await handle.release();
  });

  it('a waiter whose service shuts down as the hand-over arrives does not keep the lock', async () => {
    const holder = service(await backend());
    let shutdown: Promise<void> | undefined;
    let released = false;
    const waiter: LockService = service(
      onWake(await backend(), (wake) => {
        if (released) shutdown ??= waiter.onApplicationShutdown();
        wake();
      }),
    );
    const held = await holder.acquire('down', { ttl: 60_000 });
    const giving = waiter.acquire('down', { ttl: 60_000, wait: 20_000 });
    await until(async () => (await line('down')).length === 1, 5_000, 'the waiter in line');
    released = true;
    await held.release();
    await expect(giving).rejects.toThrow(/shutting down/);
    await shutdown;
    expect(await holder.backend.inspect('down')).toBeUndefined();
  });

  it('a waiter whose service shuts down leaves the line before the backend closes', async () => {
    const holder = service(await backend());
    const waiter = service(await backend());
    const held = await holder.acquire('leave', { ttl: 60_000 });
    const giving = waiter.acquire('leave', { ttl: 60_000, wait: 20_000 });
    await until(async () => (await line('leave')).length === 1, 5_000, 'the waiter in line');
    await waiter.onApplicationShutdown();
    await expect(giving).rejects.toThrow(/shutting down/);
    expect(await line('leave')).toEqual([]);
    await held.release();
  });

  it('a waiter whose wait ran out while its event loop stalled on the hand-over does not keep the lock', async () => {
    const holder = service(await backend());
    const waiter = service(onWake(await backend(), (wake) => (busy(1_200), wake())));
    const held = await holder.acquire('late', { ttl: 60_000 });
    const giving = waiter.acquire('late', { ttl: 60_000, wait: 1_000 });
    await until(async () => (await line('late')).length === 1, 5_000, 'the waiter in line');
    await held.release();
    await expect(giving).rejects.toThrow();
    await until(async () => (await holder.backend.inspect('late')) === undefined, 5_000, 'the handed lock to be freed');
  });

  it('a stall longer than the handed lease: the lock went to another, and the waiter does not believe it holds it', async () => {
    const holderBackend = await backend();
    const thief = await backend();
    let stolen: { acquired: boolean; fencingToken?: number } | undefined;
    // ttl 400: the hand-over's lease (polls far apart, so no attempt of the waiter's is out). While
    // the waiter's process stalls past it, another process takes the key (nobody else is in line),
    // before the waiter looks at its hand-over.
    const waiterBackend = await backend();
    // Only the wake-up of the release: watching can wake it once before (it asked before it watched).
    let released = false;
    const waiter = service(
      onWake(waiterBackend, (wake) => {
        if (!released) return wake();
        busy(1_000);
        void thief.tryAcquire(['stall'], 'thief', 60_000, { willWait: false }).then((r) => ((stolen = r), wake()));
      }),
    );
    expect((await holderBackend.tryAcquire(['stall'], 'holder', 60_000)).acquired).toBe(true);
    const entering = waiter.acquire('stall', { ttl: 400, wait: 3_000 });
    await until(async () => (await line('stall')).length === 1, 5_000, 'the waiter in line');
    released = true;
    await holderBackend.release(['stall'], 'holder');
    await until(() => stolen !== undefined, 5_000, 'the thief');
    expect(stolen?.acquired).toBe(true);
    await expect(entering).rejects.toThrow();
    expect((await row('stall'))?.owner).toBe('thief');
  });

  it('a stall shorter than half the handed lease: the waiter enters, and never believes it holds it longer than PostgreSQL does', async () => {
    const holderBackend = await backend();
    const waiterBackend = await backend({ waiterTimeout: 2_000 });
    const waiter = service(onWake(waiterBackend, (wake) => (busy(500), wake())));
    expect((await holderBackend.tryAcquire(['short'], 'holder', 60_000)).acquired).toBe(true);
    const entering = waiter.acquire('short', { ttl: 60_000, wait: 10_000, autoExtend: false });
    await until(async () => (await line('short')).length === 1, 5_000, 'the waiter in line');
    await holderBackend.release(['short'], 'holder');
    const handle = await entering;
    const state = await waiterBackend.inspect('short');
    expect(state?.fencingToken).toBe(handle.fencingToken);
    expect(handle.expiresAt.getTime()).toBeLessThanOrEqual(Date.now() + state!.ttlMs + 20);
    await handle.release();
  });

  it('the same hand-over delivered again, after the waiter entered or after it released, gives nobody the lock', async () => {
    const holderBackend = await backend();
    const waiterBackend = await backend();
    expect((await holderBackend.tryAcquire(['dup'], 'holder', 60_000)).acquired).toBe(true);
    expect((await waiterBackend.tryAcquire(['dup'], 'waiter', 60_000)).acquired).toBe(false);
    let woken = 0;
    const stop = await waiterBackend.watch(['dup'], () => woken++, 'waiter');
    fixture.cleanup(stop);
    await holderBackend.release(['dup'], 'holder');
    await until(() => woken === 1, 5_000, 'the hand-over');
    const handed = await row('dup');
    expect(handed?.owner).toBe('waiter');
    const entered = await waiterBackend.tryAcquire(['dup'], 'waiter', 60_000);
    expect(entered).toMatchObject({ acquired: true, fencingToken: handed!.token });
    const payload = `waiter ${handed!.token} 20000`;
    await fixture.admin.query('SELECT pg_notify($1, $2)', [waiterBackend.channel, payload]);
    await until(() => woken === 2, 5_000, 'the duplicate');
    expect(await waiterBackend.release(['dup'], 'waiter')).toBe(true);
    await fixture.admin.query('SELECT pg_notify($1, $2)', [waiterBackend.channel, payload]);
    await until(() => woken === 3, 5_000, 'the duplicate after release');
    // Asking again with the same owner goes to PostgreSQL, which has nothing for it but a free key:
    // the token is a new one, not the stale hand-over's.
    expect((await holderBackend.tryAcquire(['dup'], 'other', 60_000)).acquired).toBe(true);
    expect(await waiterBackend.tryAcquire(['dup'], 'waiter', 60_000)).toMatchObject({ acquired: false });
  });

  it("a hand-over on another backend's channel in the same process does not reach that backend's waiter", async () => {
    const [holderBackend, a, b] = [await backend(), await backend(), await backend()];
    expect((await holderBackend.tryAcquire(['two'], 'holder', 60_000)).acquired).toBe(true);
    expect((await b.tryAcquire(['two'], 'waiter', 60_000)).acquired).toBe(false);
    expect((await a.tryAcquire(['two'], 'other', 60_000)).acquired).toBe(false);
    let heardByA = false;
    const stop = await a.watch(['two'], () => (heardByA = true), 'other');
    fixture.cleanup(stop);
    await fixture.admin.query('SELECT pg_notify($1, $2)', [a.channel, 'waiter 999999999 20000']);
    await fixture.admin.query('SELECT pg_notify($1, $2)', [a.channel, 'other-marker']);
    await until(() => a.watching(), 5_000, 'a to listen');
    expect(await b.tryAcquire(['two'], 'waiter', 60_000)).toMatchObject({ acquired: false });
    expect(heardByA).toBe(false);
  });

  it('a waiter for several keys is not handed one of them: the release only tells it', async () => {
    const [h1, h2, w] = [await backend(), await backend(), await backend()];
    const waiter = service(w);
    expect((await h1.tryAcquire(['m1'], 'h1', 60_000)).acquired).toBe(true);
    expect((await h2.tryAcquire(['m2'], 'h2', 60_000)).acquired).toBe(true);
    const entering = waiter.acquire(['m1', 'm2'], { ttl: 60_000, wait: 10_000 });
    // m1 keeps it out: it stands in m1's line alone, until m1 lets it in.
    await until(async () => (await line('m1')).length === 1, 5_000, "the waiter in m1's line");
    expect(await line('m2')).toEqual([]);
    await h1.release(['m1'], 'h1');
    await until(async () => (await line('m2')).length === 1, 5_000, "the waiter in m2's line too");
    // m2 is still busy: nobody holds m1, and a newcomer does not get it (it stands behind).
    await until(async () => (await row('m1')) === undefined, 5_000, 'm1 to be free');
    expect(await h1.tryAcquire(['m1'], 'newcomer', 60_000, { willWait: false })).toMatchObject({ acquired: false });
    await h2.release(['m2'], 'h2');
    const handle = await entering;
    expect((await row('m1'))?.token).toBe(handle.fencingToken);
    expect((await row('m2'))?.token).toBe(handle.fencingToken);
    await handle.release();
  });

  it('the LISTEN connection drops between the hand-over and its message: the waiter asks, finds the lock its own, with a new token', async () => {
    const holderBackend = await backend();
    const waiterBackend = await backend();
    const waiter = service(waiterBackend);
    expect((await holderBackend.tryAcquire(['drop'], 'holder', 60_000)).acquired).toBe(true);
    const entering = waiter.acquire('drop', { ttl: 60_000, wait: 10_000 });
    await until(async () => (await line('drop')).length === 1, 5_000, 'the waiter in line');
    await fixture.admin.query('SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE query = $1', [
      `LISTEN "${waiterBackend.channel}"`,
    ]);
    await until(() => !waiterBackend.watching(), 5_000, 'the backend to notice');
    await holderBackend.release(['drop'], 'holder');
    const handed = await row('drop');
    const handle = await entering;
    const now = await row('drop');
    expect(now?.owner).toBe(handed?.owner);
    expect(handle.fencingToken).toBe(now?.token);
    expect(handle.fencingToken).toBeGreaterThanOrEqual(handed!.token);
    // The lost message, late: the holder keeps its lock and its token.
    await fixture.admin.query('SELECT pg_notify($1, $2)', [waiterBackend.channel, `${handed!.owner} ${handed!.token} 20000`]);
    await handle.release();
    expect(await row('drop')).toBeUndefined();
  });

  // The hand-over's lease is min(ttl, waiterTimeout); the watchdog makes it the ttl, and without
  // one the acquisition does.
  it('a waiter handed the lock with a lease shorter than its ttl keeps it for its ttl without a watchdog', async () => {
    const holderBackend = await backend();
    const waiterBackend = await backend({ waiterTimeout: 600 });
    const waiter = service(waiterBackend);
    expect((await holderBackend.tryAcquire(['ttl'], 'holder', 60_000)).acquired).toBe(true);
    const entering = waiter.acquire('ttl', { ttl: 10_000, wait: 5_000, autoExtend: false });
    await until(async () => (await line('ttl')).length === 1, 5_000, 'the waiter in line');
    await holderBackend.release(['ttl'], 'holder');
    const handle = await entering;
    const state = await waiterBackend.inspect('ttl');
    expect(state?.ttlMs).toBeGreaterThan(5_000);
    expect(handle.expiresAt.getTime() - Date.now()).toBeGreaterThan(5_000);
    await handle.release();
  });
});
