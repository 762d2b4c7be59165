import { describe, expect, it, jest } from '@jest/globals';
import { Logger } from '@nestjs/common';
import { Redis } from 'ioredis';
import { execFile, fork } from 'node:child_process';
import { once } from 'node:events';
import { rmSync } from 'node:fs';
import { join, resolve } from 'node:path';
import { promisify } from 'node:util';
import { LockBackendError, LockLostError, LockService, RedisLockBackend, type LockHandle } from '../../lib/index.js';
// @ts-expect-error: a plain ESM fixture shared with the child processes, without types.
import { fencedWrite } from '../fixtures/fenced-store.mjs';
import { useRedisServer } from '../support/redis-fixture.js';
import { RedisServer } from '../support/redis-server.js';
import { runningTimeClock } from '../support/running-time.clock.js';
import { Holder } from '../support/lock-holder-process.js';
import { until } from '../support/wait.js';

const fixtures = resolve(import.meta.dirname, '../fixtures');
/** One caller's time inside a lock: its token, and whether it had been told it lost the lock by the end. */
interface Section {
  who: string;
  token: number;
  start: number;
  end?: number;
  lost?: string;
}

/** Pairs of sections that overlapped, but for a first one that was told it lost its lock, overtaken by a greater token. */
function overlaps(sections: readonly Section[]): string[] {
  const found: string[] = [];
  for (const a of sections) {
    for (const b of sections) {
      if (a === b || b.start < a.start || b.start >= (a.end ?? Number.POSITIVE_INFINITY)) continue;
      if (a.lost === undefined || b.token <= a.token)
        found.push(`${b.who} (token ${b.token}) entered while ${a.who} (token ${a.token}) was inside`);
    }
  }
  return found;
}

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
    expect(result.message).toMatch(
      /Lock backend 'redis' failed: acquire of lock:job failed: .*Redis at 127\.0\.0\.1:\d+ refused the connection/,
    );
    // Exits on its own once the app is closed: no reconnect timer keeps it alive.
    expect(Date.now() - started).toBeLessThan(15_000);
  });

  describe('restarted from an older snapshot around a hand-over inside one process', () => {
    const key = 'snapshot';

    /**
     * A holder and two callers of one process (one first in Redis's line, one queued behind it in
     * the process), and a caller of another process second in Redis's line, all on one key. SAVE
     * before the callers come, or once they stand in line. Each section waits for `inside(who,
     * lock)` before it ends.
     */
    async function lineUp(saveWhen: 'held' | 'lined', inside: (who: string, lock: LockHandle) => Promise<void>) {
      // A restart must not load this test's snapshot in a later test.
      fixture.cleanup(() => rmSync(join(fixture.server.dir, 'dump.rdb'), { force: true }));
      const warn = jest.spyOn(Logger.prototype, 'warn').mockImplementation(() => undefined);
      const log = jest.spyOn(Logger.prototype, 'log').mockImplementation(() => undefined);
      fixture.cleanup(() => {
        warn.mockRestore();
        log.mockRestore();
      });
      const [here, there] = [service(), service()];
      const sections: Section[] = [];
      const section = (locks: LockService, who: string) =>
        locks.using(
          key,
          async (lock) => {
            const entry: Section = { who, token: lock.fencingToken!, start: performance.now() };
            sections.push(entry);
            await inside(who, lock);
            entry.end = performance.now();
            entry.lost = lock.signal.aborted ? (lock.signal.reason as LockLostError).reason : undefined;
          },
          { ttl: 3_000, wait: 20_000 },
        );
      const holder = await here.acquire(key, { ttl: 3_000 });
      if (saveWhen === 'held') await fixture.admin.save();
      const line = () => fixture.admin.zrange(`{fault:${key}}:queue`, 0, -1);
      const callers = [section(here, 'first here')];
      await until(async () => (await line()).length === 1, 5_000, 'the first caller to stand in line');
      callers.push(section(there, 'there'));
      await until(async () => (await line()).length === 2, 5_000, 'the other process to stand in line');
      callers.push(section(here, 'second here'));
      if (saveWhen === 'lined') await fixture.admin.save();
      return { holder, sections, done: Promise.all(callers) };
    }

    /**
     * Tokens after the restart start from the clock: above every token handed out before it (the
     * holder's and the first section's), and rising from one section to the next.
     */
    function expectTokensRiseAfter(holder: LockHandle, sections: readonly Section[]): void {
      const before = Math.max(holder.fencingToken!, sections[0].token);
      for (const later of sections.slice(1)) expect(later.token).toBeGreaterThan(before);
      expect(sections[2].token).toBeGreaterThan(sections[1].token);
    }

    /** Keys left in Redis once every lease that was handed out has run out: none. */
    async function nothingLeft(): Promise<void> {
      await until(async () => (await fixture.admin.dbsize()) === 0, 10_000, 'every key of the lock to expire');
    }

    /** The first caller stays inside until it learns it lost the lock the restart took back. */
    function untilToldFirst(who: string, lock: LockHandle): Promise<void> {
      if (who !== 'first here') return Promise.resolve();
      return new Promise((told) => lock.signal.addEventListener('abort', () => told()));
    }

    it('restarted just after the hand-over: the new holder is told at its next extension, tokens stay above it, every waiter gets its turn', async () => {
      const { holder, sections, done } = await lineUp('lined', untilToldFirst);
      await holder.release();
      // Handed over in the release's own answer: the first caller of this process is inside.
      await until(() => sections.length === 1, 5_000, 'the hand-over inside the process');
      expect(sections[0]).toMatchObject({ who: 'first here' });
      await fixture.server.kill();
      await fixture.server.restart(); // from the snapshot: the holder holds again, both waiters stand in line

      await done;
      expect(sections.map((s) => s.who)).toEqual(['first here', 'there', 'second here']);
      // At its next extension Redis says another owner holds the key.
      expect(sections[0].lost).toBe('taken');
      expect(overlaps(sections)).toEqual([]);
      expectTokensRiseAfter(holder, sections);
      await nothingLeft();
    }, 30_000);

    it('restarted from a snapshot without the line, just after the hand-over: the waiter whose place was lost asks again and gets its turn', async () => {
      const { holder, sections, done } = await lineUp('held', untilToldFirst);
      await holder.release();
      await until(() => sections.length === 1, 5_000, 'the hand-over inside the process');
      await fixture.server.kill();
      await fixture.server.restart(); // the holder holds again; the line, and the places in it, are gone

      await done;
      // The other process's waiter asks again when its connections are back (or at its next poll);
      // the arrival order the lost line kept is gone with it.
      expect(sections[0]).toMatchObject({ who: 'first here', lost: 'taken' });
      expect(sections.map((s) => s.who).sort()).toEqual(['first here', 'second here', 'there']);
      expect(overlaps(sections)).toEqual([]);
      expectTokensRiseAfter(holder, sections);
      await nothingLeft();
    }, 30_000);

    it('restarted while the release that hands the lock over is on its way: one holder at a time, each waiter gets its turn in order', async () => {
      const { holder, sections, done } = await lineUp('lined', () => Promise.resolve());
      // The release reaches Redis, which cannot run it; then Redis dies and comes back from the snapshot.
      fixture.server.pause();
      const releasing = holder.release().catch((error: unknown) => error);
      await fixture.server.kill();
      await fixture.server.restart();
      const released = await releasing;
      // Sent again on the new connection, or failed: then the holder's lease runs out by itself.
      if (released !== undefined) expect(released).toBeInstanceOf(LockBackendError);

      await done;
      expect(sections.map((s) => s.who)).toEqual(['first here', 'there', 'second here']);
      // Nothing was granted after the snapshot: nobody had a lock to lose.
      expect(sections.map((s) => s.lost)).toEqual([undefined, undefined, undefined]);
      expect(overlaps(sections)).toEqual([]);
      for (let i = 1; i < sections.length; i++) expect(sections[i].token).toBeGreaterThan(sections[i - 1].token);
      expect(sections[0].token).toBeGreaterThan(holder.fencingToken!);
      await nothingLeft();
    }, 30_000);
  });
});
