import { describe, expect, it } from '@jest/globals';
import { LockService, RedisLockBackend, type LockHandle } from '../../lib/index.js';
import { useRedisServer } from '../support/redis-fixture.js';
import { until } from '../support/wait.js';

/**
 * Answers that come after the caller stopped waiting for them: a Redis that stalls longer than
 * `commandTimeout` still runs every request queued on the connection once it goes on.
 */
describe('Redis backend: late answers', () => {
  const fixture = useRedisServer();

  function service(options: { commandTimeout?: number; pollInterval?: number } = {}): LockService {
    const backend = new RedisLockBackend(fixture.server.url, { commandTimeout: options.commandTimeout ?? 2_000 });
    const locks = new LockService(backend, { pollInterval: options.pollInterval ?? 100, keyPrefix: '' });
    fixture.cleanup(() => locks.onApplicationShutdown().catch(() => undefined));
    return locks;
  }

  /** Connected, so the stall below is all the timeout sees (on a loaded machine connecting alone can take longer). */
  async function connected(locks: LockService, key: string): Promise<void> {
    await until(
      () =>
        locks.isLocked(key).then(
          () => true,
          () => false,
        ),
      10_000,
      'the first connection',
    );
  }

  it('a late answer to a timed-out acquire never frees the lock a later attempt of the same caller won', async () => {
    const first = service({ commandTimeout: 300, pollInterval: 100 });
    const second = service();
    await connected(first, 'late:k'); // before the stall

    // Redis stalls 1.5 s: the caller's attempts time out one after the other but stay queued on
    // its connection, and all of them run once Redis goes on.
    fixture.server.pause();
    const acquiring = first.acquire('late:k', { wait: 10_000, ttl: 30_000 });
    await new Promise((resolve) => setTimeout(resolve, 1_500)); // the stall itself, not synchronisation
    fixture.server.resume();
    const handle: LockHandle = await acquiring;
    // A lock lost in the test may fail its release: nothing to clean then.
    fixture.cleanup(() => handle.release().catch(() => undefined));

    // Anything the late answers set off was sent before the winning answer came in; a request of
    // the same connection sent now runs after it.
    await first.inspect('late:k');
    expect(await fixture.admin.get('late:k')).toBe(handle.leases[0].owner);
    expect(handle.isHeld).toBe(true);
    expect(await second.tryAcquire('late:k')).toBeUndefined();
  });

  it('a late answer to an acquire that gave up frees the lock it won', async () => {
    const first = service({ commandTimeout: 300 });
    await connected(first, 'late:gave-up');
    fixture.server.pause();
    // One attempt, no waiting: it fails on the timeout while its request still sits in Redis.
    await expect(first.tryAcquire('late:gave-up')).rejects.toThrow(/did not answer/);
    fixture.server.resume();
    await until(async () => (await fixture.admin.exists('late:gave-up')) === 0, 5_000, 'the late lock to be freed');
  });

  it('a release that timed out in its short form, and found someone in line, still hands the lock over once Redis goes on', async () => {
    const holder = new RedisLockBackend(fixture.server.url, { commandTimeout: 300 });
    const waiter = new RedisLockBackend(fixture.server.url);
    fixture.cleanup(() => Promise.all([holder.close(), waiter.close()]));
    expect((await holder.tryAcquire(['late:line'], 'holder', 60_000)).acquired).toBe(true); // nobody in line then
    expect((await waiter.tryAcquire(['late:line'], 'waiter', 60_000)).acquired).toBe(false); // joins the line
    fixture.server.pause();
    // The short form goes out (nothing in this process says anyone waits) and times out.
    await expect(holder.release(['late:line'], 'holder')).rejects.toThrow(/did not answer/);
    fixture.server.resume();
    await until(async () => (await fixture.admin.get('late:line')) === 'waiter', 5_000, 'the lock to be handed to the waiter');
  });

  it('a release that timed out in its short form, and found someone in line, still hands the lock over when close() follows it', async () => {
    const holder = new RedisLockBackend(fixture.server.url, { commandTimeout: 300 });
    const waiter = new RedisLockBackend(fixture.server.url);
    fixture.cleanup(() => Promise.all([holder.close(), waiter.close()]));
    // Its scripts loaded before the stall: a NOSCRIPT fallback would go out later than the call.
    await holder.tryAcquire(['late:warm-up'], 'warm-up', 1_000, { willWait: false });
    await holder.release(['late:warm-up'], 'warm-up');
    expect((await holder.tryAcquire(['late:close-line'], 'holder', 60_000)).acquired).toBe(true);
    expect((await waiter.tryAcquire(['late:close-line'], 'waiter', 60_000)).acquired).toBe(false);
    fixture.server.pause();
    await expect(holder.release(['late:close-line'], 'holder')).rejects.toThrow(/did not answer/);
    // Closed while Redis still stalls: QUIT goes out behind the release, and Redis goes on well
    // within the second close() gives it. The release's answer (-1, someone in line) comes first.
    const closing = holder.close();
    fixture.server.resume();
    await closing;
    expect(await fixture.admin.get('late:close-line')).toBe('waiter');
  });

  it('a late answer to an acquire that gave up frees the lock it won, also when close() was called before it came', async () => {
    const backend = new RedisLockBackend(fixture.server.url, { commandTimeout: 300 });
    fixture.cleanup(() => backend.close());
    // Connected, its scripts loaded, before the stall: a NOSCRIPT fallback would go out later than the call.
    await backend.tryAcquire(['late:warm-up'], 'warm-up', 1_000, { willWait: false });
    await backend.release(['late:warm-up'], 'warm-up');
    fixture.server.pause();
    // No onLateAcquire: the backend frees a late win itself (TryAcquireOptions.onLateAcquire).
    await expect(backend.tryAcquire(['late:closed'], 'late-owner', 60_000, { willWait: false })).rejects.toThrow(/did not answer/);
    const closing = backend.close();
    fixture.server.resume();
    await closing;
    expect(await fixture.admin.get('late:closed')).toBeNull();
  });
});
