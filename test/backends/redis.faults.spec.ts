import { describe, expect, it, jest } from '@jest/globals';
import { Logger } from '@nestjs/common';
import { Redis } from 'ioredis';
import { execFile, fork } from 'node:child_process';
import { once } from 'node:events';
import { resolve } from 'node:path';
import { promisify } from 'node:util';
import { LockBackendError, LockLostError, LockService, RedisLockBackend } from '../../lib/index.js';
// @ts-expect-error: a plain ESM fixture shared with the child processes, without types.
import { fencedWrite } from '../fixtures/fenced-store.mjs';
import { useRedisServer } from '../support/redis-fixture.js';
import { RedisServer } from '../support/redis-server.js';
import { runningTimeClock } from '../support/running-time.clock.js';
import { Holder } from '../support/lock-holder-process.js';

const fixtures = resolve(import.meta.dirname, '../fixtures');
const write = fencedWrite as (redis: Redis, key: string, token: number, value: string) => Promise<boolean>;

describe('Redis backend under faults, with real processes', () => {
  const fixture = useRedisServer();

  function service(connection: ConstructorParameters<typeof RedisLockBackend>[0] = fixture.server.url): LockService {
    const locks = new LockService(new RedisLockBackend(connection), { keyPrefix: 'fault:' });
    fixture.cleanup(() => locks.onApplicationShutdown());
    return locks;
  }

  it('another process acquires within the ttl after the holder is SIGKILLed', async () => {
    const ttl = 1_500;
    const holder = await Holder.start('redis-lock-holder.mjs', fixture.server.url, 'killed', ttl);
    fixture.cleanup(() => holder.kill());
    const locks = service();
    expect(await locks.tryAcquire('killed')).toBeUndefined();
    await holder.kill();
    const killedAt = Date.now();
    const handle = await locks.acquire('killed', { wait: 10_000 });
    // The waiter retries when the holder's lease is due to end (Redis told it the PTTL).
    expect(Date.now() - killedAt).toBeLessThan(ttl + 1_500);
    expect(handle.fencingToken).toBeGreaterThan((await holder.next('acquired')).token!);
  });

  it('a holder paused past its ttl loses: its signal fires, the next holder has a larger token, its late write is rejected', async () => {
    const holder = await Holder.start('redis-lock-holder.mjs', fixture.server.url, 'paused', 1_000);
    fixture.cleanup(() => holder.kill());
    const stale = (await holder.next('acquired')).token!;
    holder.child.kill('SIGSTOP'); // as in a long GC pause: the process does nothing, not even extend
    fixture.cleanup(() => holder.child.kill('SIGCONT'));

    const locks = service();
    const handle = await locks.acquire('paused', { wait: 10_000 });
    expect(handle.fencingToken).toBeGreaterThan(stale);
    expect(await write(fixture.admin, 'fault:store', handle.fencingToken!, 'new holder')).toBe(true);

    holder.child.kill('SIGCONT');
    const lost = await holder.next('lost');
    expect(lost).toMatchObject({ name: 'LockLostError' });
    expect(['expired', 'taken']).toContain(lost.reason);
    holder.child.send({ type: 'write' });
    expect(await holder.next('wrote')).toMatchObject({ accepted: false, aborted: true });
    expect(await fixture.admin.hget('fault:store', 'value')).toBe('new holder');
    // Its lost lease was released by compare-and-delete: the new holder's lock is untouched.
    expect((await locks.inspect('paused'))?.heldHere).toBe(true);
    holder.child.send({ type: 'release' });
    await holder.next('released');
    expect(handle.isHeld).toBe(true);
  });

  it('while redis-server is down, acquire fails with LockBackendError within its wait; after a restart it works again', async () => {
    const warn = jest.spyOn(Logger.prototype, 'warn').mockImplementation(() => undefined);
    fixture.cleanup(() => warn.mockRestore());
    const locks = service();
    const yours = new Redis(fixture.server.port, '127.0.0.1'); // a client with ioredis defaults: retries 20 times
    fixture.cleanup(() => yours.disconnect());
    const theirs = service(yours);
    const before = await locks.acquire('restart', { autoExtend: false });
    const beforeToken = before.fencingToken!;
    await before.release();
    await theirs.acquire('restart-2').then((h) => h.release());

    await fixture.server.kill();
    const clock = runningTimeClock(0);
    fixture.cleanup(() => clock.stop());
    for (const [who, s] of [
      ['created client', locks],
      ['your client', theirs],
    ] as const) {
      const started = clock.now();
      const error = await s.acquire('restart', { wait: 1_000 }).catch((e: unknown) => e);
      expect([who, error]).toEqual([who, expect.any(LockBackendError)]);
      expect((error as Error).message).toMatch(/acquire of fault:restart failed/);
      // Never hangs: at most one commandTimeout (2 s) past the wait, on the time this process
      // could run (a loaded machine took 6.3 s of real time).
      expect(clock.now() - started).toBeLessThan(6_000);
    }

    await fixture.server.restart(); // same port, empty, scripts forgotten
    const after = await locks.acquire('restart', { wait: 10_000 });
    // Tokens come from the server clock: still increasing after a restart without persistence.
    expect(after.fencingToken).toBeGreaterThan(beforeToken);
    await after.release();
    const yoursAfter = await theirs.acquire('restart', { wait: 10_000 });
    expect(yoursAfter.isHeld).toBe(true);
  });

  it('a holder whose Redis stops answering loses its lock with a backend-error reason when the lease runs out', async () => {
    const warn = jest.spyOn(Logger.prototype, 'warn').mockImplementation(() => undefined);
    fixture.cleanup(() => warn.mockRestore());
    const locks = service();
    const handle = await locks.acquire('frozen', { ttl: 900 });
    fixture.server.pause();
    fixture.cleanup(() => fixture.server.resume());
    const reason = await new Promise<unknown>((resolve) => handle.signal.addEventListener('abort', () => resolve(handle.signal.reason)));
    expect(reason).toBeInstanceOf(LockLostError);
    expect((reason as LockLostError).reason).toBe('backend-error');
    expect(warn).toHaveBeenCalledWith(expect.stringMatching(/Lock lost on fault:frozen: the backend could not be reached/));
    const clock = runningTimeClock(0);
    fixture.cleanup(() => clock.stop());
    const started = clock.now();
    const error = await locks.acquire('other', { wait: 500 }).catch((e: unknown) => e);
    expect(error).toBeInstanceOf(LockBackendError);
    expect((error as Error).message).toMatch(/did not answer within 2000 ms/);
    expect(clock.now() - started).toBeLessThan(6_000);
    fixture.server.resume();
  });

  it('an app whose Redis died while it held and waited for a lock closes and exits at once: the waiter gives up, no timer stays', async () => {
    const doomed = await RedisServer.start();
    const app = fork(resolve(fixtures, 'redis-app-shutdown.mjs'), [doomed.url], { stdio: ['ignore', 'pipe', 'inherit', 'ipc'] });
    try {
      let output = '';
      app.stdout!.on('data', (chunk: Buffer) => (output += chunk.toString()));
      const exited = once(app, 'exit');
      const [ready] = (await Promise.race([once(app, 'message'), exited])) as [unknown];
      expect(ready).toBe('holding');
      await doomed.stop();
      app.send('close');
      const [code] = (await exited) as [number];
      expect(code).toBe(0);
      const { exitMs } = JSON.parse(output.trim()) as { exitMs: number };
      // ioredis's default (2 s per connection to wait for a close that never comes) failed this.
      expect(exitMs).toBeLessThan(1_500);
    } finally {
      app.kill();
      await doomed.stop();
    }
  });

  it('an app whose Redis is unreachable at start-up fails with a clear error and exits', async () => {
    const dead = await RedisServer.start();
    const url = dead.url;
    await dead.stop();
    const started = Date.now();
    const { stdout } = await promisify(execFile)(process.execPath, [resolve(fixtures, 'redis-app-startup.mjs'), url], { timeout: 20_000 });
    const result = JSON.parse(stdout.trim().split('\n').pop()!) as { name: string; message: string };
    expect(result.name).toBe('LockBackendError');
    expect(result.message).toMatch(/Lock backend 'redis' failed: acquire of lock:job failed: .*ECONNREFUSED/);
    // Exits on its own once the app is closed: no reconnect timer keeps it alive.
    expect(Date.now() - started).toBeLessThan(15_000);
  });
});
