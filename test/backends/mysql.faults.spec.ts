import { describe, expect, it, jest } from '@jest/globals';
import { Logger } from '@nestjs/common';
import type mysql from 'mysql2/promise';
import { LockBackendError, LockNotAcquiredError, LockService, MysqlLockBackend, type LockHandle } from '../../lib/index.js';
// @ts-expect-error: a plain ESM fixture shared with the child processes, without types.
import { fencedWrite } from '../fixtures/mysql-fenced-store.mjs';
import { useMariadbServer } from '../support/mariadb-fixture.js';
import { Holder } from '../support/lock-holder-process.js';
import { TcpProxy } from '../support/tcp-proxy.js';
import { until } from '../support/wait.js';

const write = fencedWrite as (pool: mysql.Pool, token: number, value: string) => Promise<boolean>;

const fixture = useMariadbServer();

function service(connection: string = fixture.url, options?: ConstructorParameters<typeof MysqlLockBackend>[1]): LockService {
  const locks = new LockService(new MysqlLockBackend(connection, options), { keyPrefix: 'fault:' });
  fixture.cleanup(() => locks.onApplicationShutdown());
  return locks;
}

function quietWarnings(): void {
  const warn = jest.spyOn(Logger.prototype, 'warn').mockImplementation(() => undefined);
  fixture.cleanup(() => warn.mockRestore());
}

/** The file's database through `proxy`. */
function through(proxy: TcpProxy): string {
  const url = new URL(fixture.url);
  url.port = String(proxy.port);
  return url.toString();
}

async function proxy(): Promise<TcpProxy> {
  const started = await TcpProxy.start(fixture.server.port);
  fixture.cleanup(() => started.close());
  return started;
}

describe('MySQL backend under faults, with real processes', () => {
  it('another process acquires within the ttl after the holder is SIGKILLed', async () => {
    const ttl = 1_500;
    const holder = await Holder.start('mysql-lock-holder.mjs', fixture.url, 'killed', ttl);
    fixture.cleanup(() => holder.kill());
    const locks = service();
    expect(await locks.tryAcquire('killed')).toBeUndefined();
    await holder.kill();
    const killedAt = Date.now();
    const handle = await locks.acquire('killed', { wait: 10_000 });
    // The waiter retries when the holder's lease is due to end (the server told it how long).
    expect(Date.now() - killedAt).toBeLessThan(ttl + 1_500);
    expect(handle.fencingToken).toBeGreaterThan((await holder.next('acquired')).token!);
  });

  it('a holder paused past its ttl loses: its signal fires, the next holder has a larger token, its late write is refused', async () => {
    const holder = await Holder.start('mysql-lock-holder.mjs', fixture.url, 'paused', 1_000);
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
    const [[row]] = await fixture.admin.query<mysql.RowDataPacket[]>('SELECT value FROM fenced WHERE id = 1');
    expect(row.value).toBe('new holder');
    // Its lost lease was released by compare-and-delete: the new holder's lock is untouched.
    expect((await locks.inspect('paused'))?.heldHere).toBe(true);
    holder.child.send({ type: 'release' });
    await holder.next('released');
    expect(handle.isHeld).toBe(true);
  });

  it('the server killed (-9) and restarted under load: acquires fail with LockBackendError within their wait, then go on with greater tokens', async () => {
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
            await new Promise((resolve) => setImmediate(resolve));
          }
        }
      })(),
    );
    await until(() => tokens.length >= 50, 10_000, 'acquisitions before the crash');
    await fixture.server.crash();
    const before = tokens.length;
    const backendErrors = () => failures.filter((f) => f instanceof LockBackendError);
    await until(() => backendErrors().length >= 2, 10_000, 'acquisitions to fail while the server is down');
    await fixture.server.restart();
    await until(() => tokens.length >= before + 50, 30_000, 'acquisitions after the restart');
    stop = true;
    await Promise.all(load);

    for (const failure of backendErrors()) expect((failure as Error).message).toMatch(/of fault:restart failed/);
    for (const failure of failures) if (!(failure instanceof LockBackendError)) expect(failure).toBeInstanceOf(LockNotAcquiredError);
    // Strictly increasing across the crash: InnoDB keeps the AUTO_INCREMENT counter in its redo log.
    for (let i = 1; i < tokens.length; i++) expect(tokens[i]).toBeGreaterThan(tokens[i - 1]);
  });

  it('a partition: locks fail within their wait while it lasts; a release that failed is sent again once it heals', async () => {
    quietWarnings();
    const link = await proxy();
    const locks = service(through(link), { commandTimeout: 500 });
    const other = service();
    const handle = await locks.acquire('partition', { ttl: 60_000 });
    link.set({ kind: 'drop' });
    const failed = await locks.acquire('elsewhere', { wait: 300 }).catch((e: unknown) => e);
    expect(failed).toBeInstanceOf(LockBackendError);
    // The release cannot reach the server: the caller hears of it, and the lock stays held, by
    // nobody, until the partition heals.
    await expect(handle.release()).rejects.toThrow(LockBackendError);
    expect(await other.isLocked('partition')).toBe(true);
    link.set({ kind: 'pass' });
    // Any statement answered says the server is back; the kept release goes then.
    await until(async () => (await locks.tryAcquire('after')) !== undefined, 10_000, 'the link to carry statements again');
    await until(async () => !(await other.isLocked('partition')), 5_000, 'the kept release to free the key');
  });

  it('a release kept during a partition is sent again before close() ends the pool: a statement answered just before close() leaves no key behind', async () => {
    quietWarnings();
    const link = await proxy();
    const backend = new MysqlLockBackend(through(link), { commandTimeout: 500 });
    fixture.cleanup(() => backend.close());
    const other = service();
    expect(await backend.tryAcquire(['fault:closing'], 'holder-closing', 60_000)).toMatchObject({ acquired: true });
    link.set({ kind: 'drop' });
    await expect(backend.release(['fault:closing'], 'holder-closing')).rejects.toThrow(LockBackendError);
    link.set({ kind: 'pass' });
    // The first statement answered after the heal sends the kept release again, in the background;
    // the application closes right after it (a shutdown's own last release is such a statement).
    await until(
      () =>
        backend.extend(['fault:other'], 'nobody', 1_000).then(
          () => true,
          () => false,
        ),
      10_000,
      'a statement answered',
    );
    await backend.close();
    expect(await other.isLocked('closing')).toBe(false);
  });

  it('an acquire that timed out and won while close() waited for its connection is freed: no key is left once close() resolves', async () => {
    quietWarnings();
    const link = await proxy();
    const backend = new MysqlLockBackend(through(link), { commandTimeout: 500 });
    fixture.cleanup(() => backend.close());
    const other = service();
    expect(await backend.tryAcquire(['fault:warm-up-close'], 'warm-up', 60_000)).toMatchObject({ acquired: true });
    // Every request now takes 800 ms to reach the server: past the command timeout, not lost.
    link.set({ kind: 'delay', ms: 800, direction: 'up' });
    // No onLateAcquire: the backend frees a late win itself (TryAcquireOptions.onLateAcquire).
    await expect(backend.tryAcquire(['fault:late-close'], 'late-owner', 60_000, { willWait: false })).rejects.toThrow(
      /did not answer within 500 ms/,
    );
    await backend.close();
    expect(await other.isLocked('late-close')).toBe(false);
  });

  it('answers lost for as many statements as the pool has connections (a black hole): once the link heals, locks work again and a held lock is freed', async () => {
    quietWarnings();
    const link = await proxy();
    const locks = new LockService(new MysqlLockBackend({ uri: through(link), connectionLimit: 4 }, { commandTimeout: 500 }), {
      keyPrefix: 'fault:',
    });
    fixture.cleanup(() => locks.onApplicationShutdown());
    const other = service();
    const held = await locks.acquire('black-hole', { ttl: 60_000, autoExtend: false });
    // Every connection of the pool open, then as many statements carried out with their answers lost.
    await Promise.all(Array.from({ length: 4 }, (_, i) => locks.isLocked(`warm-${i}`)));
    link.set({ kind: 'blackhole-down' });
    const lost = await Promise.all(Array.from({ length: 4 }, (_, i) => locks.isLocked(`lost-${i}`).catch((e: unknown) => e)));
    for (const error of lost) expect(error).toBeInstanceOf(LockBackendError);
    link.set({ kind: 'pass' });
    // Its release fails while the pool has no connection to give (the caller hears of it); it is
    // kept, and sent again.
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
    const backend = new MysqlLockBackend({ uri: fixture.url, connectionLimit: 2 }, { commandTimeout: 300 });
    fixture.cleanup(() => backend.close());
    expect(await backend.tryAcquire(['fault:pile-warm-up'], 'warm-up', 1_000, { willWait: false })).toMatchObject({ acquired: true });
    const blocker = await fixture.admin.getConnection();
    fixture.cleanup(async () => {
      await blocker.query('UNLOCK TABLES');
      blocker.release();
    });
    await blocker.query('LOCK TABLES distributed_locks WRITE');
    const waiting = async () => {
      const [[row]] = await fixture.admin.query<mysql.RowDataPacket[]>(
        "SELECT COUNT(*) AS n FROM information_schema.PROCESSLIST WHERE COMMAND = 'Query' AND STATE LIKE 'Waiting for table%'",
      );
      return Number(row.n);
    };
    // Past the time a statement unanswered gives up its connection, callers keep trying.
    let most = 0;
    const endAt = Date.now() + 10_000 + 3_000;
    for (let i = 0; Date.now() < endAt; i++) {
      await backend.tryAcquire([`fault:pile-${i}`], `owner-${i}`, 60_000, { willWait: false }).catch(() => undefined);
      most = Math.max(most, await waiting());
    }
    expect(most).toBe(2);
    await blocker.query('UNLOCK TABLES');
    await until(
      async () =>
        (await backend.tryAcquire(['fault:pile-after'], 'after', 1_000, { willWait: false }).catch(() => undefined))?.acquired === true,
      5_000,
      'a lock to be taken once the table is free',
    );
  }, 30_000);

  it('a release on giving up that overtakes its own slow attempt on another connection: the attempt wins later, its answer is lost with its connection, and the key is freed all the same', async () => {
    quietWarnings();
    const link = await proxy();
    const locks = service(through(link), { commandTimeout: 500 });
    const other = service();
    await locks.acquire('warm-up').then((h) => h.release());
    // The attempt's request is slow on its way (retransmitted on its connection): 3 s.
    link.set({ kind: 'delay', ms: 3_000, direction: 'up' });
    const trying = locks.tryAcquire('overtaken', { ttl: 30_000 }).catch((e: unknown) => e);
    await until(() => link.delayed > 0, 2_000, 'the attempt to be on its way');
    link.set({ kind: 'pass' });
    // It times out; the caller gives up, and its release goes on another connection, at once,
    // ahead of the attempt: it frees nothing.
    expect(await trying).toBeInstanceOf(LockBackendError);
    await until(() => locks.footprint().requests === 0, 2_000, 'the release on giving up to be answered');
    expect(link.delayed).toBeGreaterThan(0);
    // The attempt reaches the server after that release and wins; its answer is lost with its connection.
    link.set({ kind: 'blackhole-down' });
    await until(async () => await other.isLocked('overtaken'), 5_000, 'the slow attempt to be carried out');
    link.set({ kind: 'drop' });
    link.set({ kind: 'pass' });
    // Nobody holds it, and the caller gave up: it is freed well before its 30 s.
    await until(async () => !(await other.isLocked('overtaken')), 10_000, 'the lock nobody holds to be freed');
  });

  it('answers that never come (a black hole): calls fail within commandTimeout, and an acquire the server carried out is released once its caller gave up', async () => {
    quietWarnings();
    const link = await proxy();
    const locks = service(through(link), { commandTimeout: 500 });
    const other = service();
    await locks.acquire('warm-up').then((h) => h.release());
    link.set({ kind: 'blackhole-down' });
    const started = Date.now();
    const error = await locks.acquire('late', { wait: 300 }).catch((e: unknown) => e);
    expect(error).toBeInstanceOf(LockBackendError);
    expect((error as Error).message).toMatch(/did not answer within 500 ms/);
    expect(Date.now() - started).toBeLessThan(3_000);
    // The server took it, and the answer was lost.
    expect(await other.isLocked('late')).toBe(true);
    // Healed, and the app does nothing more: the release its service made on giving up is sent
    // again by itself.
    link.set({ kind: 'pass' });
    await until(async () => !(await other.isLocked('late')), 10_000, 'the late acquisition to be released');
  });
});
