import { describe, expect, it, jest } from '@jest/globals';
import { Logger } from '@nestjs/common';
import { execFile } from 'node:child_process';
import { resolve } from 'node:path';
import { promisify } from 'node:util';
import type pg from 'pg';
import {
  LockBackendError,
  LockLostError,
  LockNotAcquiredError,
  LockService,
  PostgresLockBackend,
  type LockHandle,
} from '../../lib/index.js';
// @ts-expect-error: a plain ESM fixture shared with the child processes, without types.
import { fencedWrite } from '../fixtures/postgres-fenced-store.mjs';
import { usePostgresServer } from '../support/postgres-fixture.js';
import { freePort } from '../support/redis-server.js';
import { Holder } from '../support/lock-holder-process.js';
import { TcpProxy } from '../support/tcp-proxy.js';
import { until } from '../support/wait.js';

const fixtures = resolve(import.meta.dirname, '../fixtures');
const write = fencedWrite as (pool: pg.Pool, token: number, value: string) => Promise<boolean>;

// synchronous_commit on: a commit the server acknowledged survives its crash, as in production.
const fixture = usePostgresServer({ durable: true });

function service(connection: ConstructorParameters<typeof PostgresLockBackend>[0] = fixture.url): LockService {
  const locks = new LockService(new PostgresLockBackend(connection), { keyPrefix: 'fault:' });
  fixture.cleanup(() => locks.onApplicationShutdown());
  return locks;
}

/** A proxy in front of the file's server, closed after the test. */
async function proxied(): Promise<TcpProxy> {
  const proxy = await TcpProxy.start(fixture.server.port);
  fixture.cleanup(() => proxy.close());
  return proxy;
}

/** The file's database through `proxy`. */
function through(proxy: TcpProxy): string {
  const url = new URL(fixture.url);
  url.port = String(proxy.port);
  return url.toString();
}

function quietWarnings(): void {
  const warn = jest.spyOn(Logger.prototype, 'warn').mockImplementation(() => undefined);
  fixture.cleanup(() => warn.mockRestore());
}

describe('PostgreSQL backend under faults, with real processes', () => {
  it('another process acquires within the ttl after the holder is SIGKILLed', async () => {
    const ttl = 1_500;
    const holder = await Holder.start('postgres-lock-holder.mjs', fixture.url, 'killed', ttl);
    fixture.cleanup(() => holder.kill());
    const locks = service();
    expect(await locks.tryAcquire('killed')).toBeUndefined();
    await holder.kill();
    const killedAt = Date.now();
    const handle = await locks.acquire('killed', { wait: 10_000 });
    // The waiter retries when the holder's lease is due to end (PostgreSQL told it how long).
    expect(Date.now() - killedAt).toBeLessThan(ttl + 1_500);
    expect(handle.fencingToken).toBeGreaterThan((await holder.next('acquired')).token!);
  });

  it('a holder paused past its ttl loses: its signal fires, the next holder has a larger token, its late write is rejected', async () => {
    await fixture.admin.query('CREATE TABLE IF NOT EXISTS fenced (id int PRIMARY KEY, token bigint NOT NULL, value text NOT NULL)');
    const holder = await Holder.start('postgres-lock-holder.mjs', fixture.url, 'paused', 1_000);
    fixture.cleanup(() => holder.kill());
    const stale = (await holder.next('acquired')).token!;
    holder.child.kill('SIGSTOP'); // as in a long GC pause: the process does nothing, not even extend
    fixture.cleanup(() => holder.child.kill('SIGCONT'));

    const locks = service();
    const handle = await locks.acquire('paused', { wait: 10_000 });
    expect(handle.fencingToken).toBeGreaterThan(stale);
    expect(await write(fixture.admin, handle.fencingToken!, 'new holder')).toBe(true);

    holder.child.kill('SIGCONT');
    const lost = await holder.next('lost');
    expect(lost).toMatchObject({ name: 'LockLostError' });
    expect(['expired', 'taken']).toContain(lost.reason);
    holder.child.send({ type: 'write' });
    expect(await holder.next('wrote')).toMatchObject({ accepted: false, aborted: true });
    expect((await fixture.admin.query('SELECT value FROM fenced WHERE id = 1')).rows[0].value).toBe('new holder');
    // Its lost lease was released by compare-and-delete: the new holder's lock is untouched.
    expect((await locks.inspect('paused'))?.heldHere).toBe(true);
    holder.child.send({ type: 'release' });
    await holder.next('released');
    expect(handle.isHeld).toBe(true);
  });

  it('PostgreSQL crashed and restarted under load: acquires fail with LockBackendError within their wait, then go on with greater tokens', async () => {
    quietWarnings();
    const services = [service(), service()];
    const tokens: number[] = [];
    const failures: unknown[] = [];
    let stop = false;
    // Callers that take turns on one key for the whole test, each acquisition's token in order.
    const load = Array.from({ length: 6 }, (_, i) =>
      (async () => {
        while (!stop) {
          const started = Date.now();
          try {
            await services[i % 2].using('restart', (lock) => void tokens.push(lock.fencingToken!), { wait: 1_000, ttl: 2_000 });
          } catch (error) {
            failures.push(error);
            // Never hangs: at most one commandTimeout (2 s) past the wait.
            expect(Date.now() - started).toBeLessThan(1_000 + 2_000 + 1_000);
            // A call that fails at once (the service shut down after a failed step) must not spin without timers.
            await new Promise((resolve) => setImmediate(resolve));
          }
        }
      })(),
    );
    await until(() => tokens.length >= 50, 10_000, 'acquisitions before the crash');
    await fixture.server.crash();
    const before = tokens.length;
    const backendErrors = () => failures.filter((f) => f instanceof LockBackendError);
    await until(() => backendErrors().length >= 2, 10_000, 'acquisitions to fail while PostgreSQL is down');
    await fixture.server.restart();
    await until(() => tokens.length >= before + 50, 20_000, 'acquisitions after the restart');
    stop = true;
    await Promise.all(load);

    for (const failure of backendErrors()) expect((failure as Error).message).toMatch(/acquire of fault:restart failed/);
    // The others waited out a lease whose holder could not release it while the server was down
    // (the lease survived the crash, as it should, and ran out after the restart).
    for (const failure of failures) if (!(failure instanceof LockBackendError)) expect(failure).toBeInstanceOf(LockNotAcquiredError);
    // Strictly increasing across the crash: the sequence is in the WAL, and committed advances survive.
    for (let i = 1; i < tokens.length; i++) expect(tokens[i]).toBeGreaterThan(tokens[i - 1]);
  });

  it('a holder whose extensions wait behind another transaction loses its lock with a backend-error reason, not a hang', async () => {
    quietWarnings();
    const locks = service();
    const handle = await locks.acquire('stalled', { ttl: 900 });
    // Another transaction takes the lock table for itself: the extensions wait behind it.
    const blocker = await fixture.admin.connect();
    fixture.cleanup(() => blocker.release());
    await blocker.query('BEGIN');
    await blocker.query('LOCK TABLE distributed_locks IN ACCESS EXCLUSIVE MODE');
    fixture.cleanup(() => blocker.query('ROLLBACK'));
    const reason = await new Promise<unknown>((resolve) => handle.signal.addEventListener('abort', () => resolve(handle.signal.reason)));
    expect(reason).toBeInstanceOf(LockLostError);
    expect((reason as LockLostError).reason).toBe('backend-error');
    const started = Date.now();
    const error = await locks.acquire('other', { wait: 500 }).catch((e: unknown) => e);
    expect(error).toBeInstanceOf(LockBackendError);
    expect((error as Error).message).toMatch(/did not answer within 2000 ms/);
    expect(Date.now() - started).toBeLessThan(6_000);
    await blocker.query('ROLLBACK');
    const after = await locks.acquire('other', { wait: 5_000 });
    expect(after.isHeld).toBe(true);
  });

  it('a waiter still hears of a release after its process lost its LISTEN connection', async () => {
    quietWarnings();
    const holder = service();
    const backend = new PostgresLockBackend(fixture.url, { waiterTimeout: 120_000 });
    // Neither the poll nor the holder's ttl could hand it over within the test.
    const waiters = new LockService(backend, { keyPrefix: 'fault:', pollInterval: 60_000 });
    fixture.cleanup(() => waiters.onApplicationShutdown());
    const held = await holder.acquire('relisten', { ttl: 60_000 });
    const waiting = waiters.acquire('relisten', { wait: 30_000 });
    await until(
      async () => backend.watching() && (await fixture.admin.query('SELECT 1 FROM distributed_locks_waiters')).rowCount === 1,
      5_000,
      'the waiter to listen',
    );
    // The connection drops, as on a network failure or when an administrator ends it.
    await fixture.admin.query('SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE query = $1', [`LISTEN "${backend.channel}"`]);
    await until(() => !backend.watching(), 5_000, 'the backend to notice');
    const releasedAt = Date.now();
    await held.release();
    const handle = await waiting;
    expect(Date.now() - releasedAt).toBeLessThan(10_000);
    // The release's message can reach the new LISTEN connection, and let the waiter in, before that
    // connection's own check of itself is answered: listening again follows.
    await until(() => backend.watching(), 5_000, 'the backend to listen again');
    await handle.release();
  });

  it('an acquire that PostgreSQL carried out after it timed out leaves nothing behind once its caller gave up', async () => {
    quietWarnings();
    const url = `${fixture.url}?application_name=late-answer`;
    const backend = new PostgresLockBackend(url, { commandTimeout: 300 });
    const locks = new LockService(backend, { keyPrefix: 'fault:' });
    fixture.cleanup(() => locks.onApplicationShutdown());
    await locks.acquire('warm-up').then((h) => h.release());
    const blocker = await fixture.admin.connect();
    fixture.cleanup(() => blocker.release());
    await blocker.query('BEGIN');
    await blocker.query('LOCK TABLE distributed_locks IN ACCESS EXCLUSIVE MODE');
    // Through the service: it gives up, and its release (queued behind) frees what the late
    // attempts won. Straight on the backend: nobody will release, so the backend frees the late win.
    const error = await locks.acquire('late', { wait: 500 }).catch((e: unknown) => e);
    expect(error).toBeInstanceOf(LockBackendError);
    expect((error as Error).message).toMatch(/did not answer within 300 ms/);
    const direct = await backend.tryAcquire(['fault:late-direct'], 'direct-owner', 60_000).catch((e: unknown) => e);
    expect(direct).toBeInstanceOf(LockBackendError);
    await blocker.query('ROLLBACK');
    await until(
      async () =>
        (await fixture.admin.query(`SELECT 1 FROM pg_stat_activity WHERE application_name = 'late-answer' AND state <> 'idle'`))
          .rowCount === 0,
      5_000,
      'the statements held up to be answered',
    );
    await until(
      async () => (await locks.inspect('late')) === undefined && (await backend.inspect('fault:late-direct')) === undefined,
      5_000,
      'the late acquisitions to be released',
    );
  });

  it('answers lost for as many statements as the pool has connections (a black hole): once the link heals, locks work again and a held lock is freed', async () => {
    quietWarnings();
    const proxy = await proxied();
    const backend = new PostgresLockBackend({ connectionString: through(proxy), max: 4 }, { commandTimeout: 500 });
    const locks = new LockService(backend, { keyPrefix: 'fault:' });
    fixture.cleanup(() => locks.onApplicationShutdown());
    const other = service();
    const held = await locks.acquire('black-hole', { ttl: 60_000, autoExtend: false });
    // Every connection of the pool open, then as many statements carried out with their answers lost.
    await Promise.all(Array.from({ length: 4 }, (_, i) => locks.isLocked(`warm-${i}`)));
    proxy.set({ kind: 'blackhole-down' });
    const lost = await Promise.all(Array.from({ length: 4 }, (_, i) => locks.isLocked(`lost-${i}`).catch((e: unknown) => e)));
    for (const error of lost) expect(error).toBeInstanceOf(LockBackendError);
    proxy.set({ kind: 'pass' });
    // Its release fails while the pool has no connection to give (the caller hears of it); it is
    // kept, and sent again once a statement is answered.
    await expect(held.release()).rejects.toThrow(LockBackendError);
    let after: LockHandle | undefined;
    await until(
      async () => (after = await locks.tryAcquire('after-heal').catch(() => undefined)) !== undefined,
      25_000,
      'a lock to be taken again',
    );
    await after!.release();
    await until(async () => !(await other.isLocked('black-hole')), 5_000, 'the held lock to be freed');
  }, 40_000);

  it('keeps the connections whose statements wait behind a lock on the table (a migration): it opens no more sessions than its pool holds', async () => {
    quietWarnings();
    const backend = new PostgresLockBackend(
      { connectionString: fixture.url, max: 2, application_name: 'pile-up' },
      { commandTimeout: 300 },
    );
    fixture.cleanup(() => backend.close());
    expect(await backend.tryAcquire(['fault:pile-warm-up'], 'warm-up', 1_000, { willWait: false })).toMatchObject({ acquired: true });
    const blocker = await fixture.admin.connect();
    fixture.cleanup(() => blocker.release());
    await blocker.query('BEGIN');
    await blocker.query('LOCK TABLE distributed_locks IN ACCESS EXCLUSIVE MODE');
    const waiting = async () =>
      (
        await fixture.admin.query(
          `SELECT count(*)::int AS n FROM pg_stat_activity WHERE application_name = 'pile-up' AND wait_event_type = 'Lock'`,
        )
      ).rows[0].n as number;
    // Past the time a statement unanswered gives up its connection, callers keep trying.
    let most = 0;
    const endAt = Date.now() + 10_000 + 3_000;
    for (let i = 0; Date.now() < endAt; i++) {
      await backend.tryAcquire([`fault:pile-${i}`], `owner-${i}`, 60_000, { willWait: false }).catch(() => undefined);
      most = Math.max(most, await waiting());
    }
    expect(most).toBe(2);
    await blocker.query('ROLLBACK');
    expect(await backend.tryAcquire(['fault:pile-after'], 'after', 1_000, { willWait: false })).toMatchObject({ acquired: true });
  }, 30_000);

  it('a release on giving up that overtakes its own slow attempt on another connection: the attempt wins later, its answer is lost with its connection, and the key is freed all the same', async () => {
    quietWarnings();
    const proxy = await proxied();
    const backend = new PostgresLockBackend(through(proxy), { commandTimeout: 500 });
    const locks = new LockService(backend, { keyPrefix: 'fault:' });
    fixture.cleanup(() => locks.onApplicationShutdown());
    const other = service();
    await locks.acquire('warm-up').then((h) => h.release());
    // The attempt's request is slow on its way (retransmitted on its connection): 3 s.
    proxy.set({ kind: 'delay', ms: 3_000, direction: 'up' });
    const trying = locks.tryAcquire('overtaken', { ttl: 30_000 }).catch((e: unknown) => e);
    await until(() => proxy.delayed > 0, 2_000, 'the attempt to be on its way');
    proxy.set({ kind: 'pass' });
    // It times out; the caller gives up, and its release goes on another connection, at once,
    // ahead of the attempt: it frees nothing.
    expect(await trying).toBeInstanceOf(LockBackendError);
    await until(() => locks.footprint().requests === 0, 2_000, 'the release on giving up to be answered');
    expect(proxy.delayed).toBeGreaterThan(0);
    // The attempt reaches the server after that release and wins; its answer is lost with its connection.
    proxy.set({ kind: 'blackhole-down' });
    await until(async () => await other.isLocked('overtaken'), 5_000, 'the slow attempt to be carried out');
    proxy.set({ kind: 'drop' });
    proxy.set({ kind: 'pass' });
    // Nobody holds it, and the caller gave up: it is freed well before its 30 s.
    await until(async () => !(await other.isLocked('overtaken')), 10_000, 'the lock nobody holds to be freed');
  });

  it('an app whose PostgreSQL is unreachable at start-up fails with a clear error and exits', async () => {
    const url = `postgres://postgres@127.0.0.1:${await freePort()}/nowhere`;
    const started = Date.now();
    const { stdout } = await promisify(execFile)(process.execPath, [resolve(fixtures, 'postgres-app-startup.mjs'), url], {
      timeout: 20_000,
    });
    const result = JSON.parse(stdout.trim().split('\n').pop()!) as { name: string; message: string };
    expect(result.name).toBe('LockBackendError');
    expect(result.message).toMatch(/Lock backend 'postgres' failed: acquire of lock:job failed: .*ECONNREFUSED/);
    // Exits on its own once the app is closed: no timer or connection keeps it alive.
    expect(Date.now() - started).toBeLessThan(15_000);
  });
});
