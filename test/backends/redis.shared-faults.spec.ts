import { describe, expect, it } from '@jest/globals';
import { SHARED, type AcquireResult } from '../../lib/backends/lock-backend.interface.js';
import { RedisLockBackend } from '../../lib/backends/redis/redis.backend.js';
import { lockKeyLayout } from '../../lib/backends/redis/redis.keys.js';
import { Holder } from '../support/lock-holder-process.js';
import { useRedisServer } from '../support/redis-fixture.js';
import { until } from '../support/wait.js';

/**
 * Shared holders and permit holders that die, and answers that come late: a share comes back
 * within the holder's ttl, by Redis's clock, and no answer makes a second holder of one owner.
 * The holder processes load dist/: run `npm run build` first.
 */
const fixture = useRedisServer();

function backend(commandTimeout = 2_000): RedisLockBackend {
  const b = new RedisLockBackend(fixture.server.url, { commandTimeout });
  fixture.cleanup(() => b.close());
  return b;
}

/** Tries until it gets in (a poll is enough here: what is measured is when the share came back). */
async function acquire(b: RedisLockBackend, key: string, owner: string, limit: number): Promise<AcquireResult & { acquired: true }> {
  for (;;) {
    const result = await b.tryAcquire([key], owner, 60_000, { limits: [limit] });
    if (result.acquired) return result;
    await new Promise((resolve) => setTimeout(resolve, Math.min(result.retryAfterMs ?? 20, 20)));
  }
}

/** Redis's clock, in ms. */
async function redisNow(): Promise<number> {
  const [seconds, micros] = await fixture.admin.time();
  return Number(seconds) * 1000 + Math.floor(Number(micros) / 1000);
}

async function holders(key: string): Promise<string[]> {
  return (await fixture.admin.zrange(lockKeyLayout(key).holders, 0, -1)).sort();
}

describe('Redis backend: shared holders that die, and late answers', () => {
  it.each([
    ['a reader', 'shared', SHARED],
    ['a permit holder', '2', 2],
  ] as const)('%s killed with SIGKILL frees its share within its ttl; alive, it kept it past the ttl', async (_, limitText, limit) => {
    const ttl = 1_500;
    const holder = await Holder.start('redis-shared-holder.mjs', fixture.server.url, 'killed', ttl, [limitText]);
    fixture.cleanup(() => holder.kill());
    const { name: owner, token } = await holder.next('acquired');
    const b = backend();
    // A permit holder of our own beside it: the key is full, and stays full while the child lives.
    expect((await b.tryAcquire(['killed'], 'beside', 60_000, { limits: [limit] })).acquired).toBe(true);
    expect(await holders('killed')).toEqual(['beside', owner].sort());
    // Alive, it extends its own lease: still in after more than a ttl of Redis's time.
    const since = await redisNow();
    await until(async () => (await redisNow()) > since + ttl * 1.5, 10_000, 'a ttl and a half to pass');
    expect(await holders('killed')).toContain(owner);

    // An exclusive caller waits for both; killed, the child's share is gone within its ttl.
    expect((await b.tryAcquire(['killed'], 'writer', 60_000)).acquired).toBe(false);
    await holder.kill();
    const killedAt = await redisNow();
    await b.release(['killed'], 'beside');
    const writer = await acquire(b, 'killed', 'writer', 1);
    expect((await redisNow()) - killedAt).toBeLessThan(ttl + 1_000);
    expect(writer.fencingToken).toBeGreaterThan(token!);
    expect(await holders('killed')).toEqual([]);
  });

  it('a late answer to a timed-out shared acquire makes no second holder: the owner holds one share', async () => {
    const b = backend(300);
    expect((await b.tryAcquire(['sem'], 'first', 60_000, { limits: [2] })).acquired).toBe(true);
    await b.inspect('sem'); // connected before the stall
    fixture.server.pause();
    // The same owner asks three times; every request times out but stays queued on the connection.
    for (let i = 0; i < 3; i++) {
      await expect(b.tryAcquire(['sem'], 'second', 60_000, { limits: [2], onLateAcquire: () => undefined })).rejects.toThrow(
        /did not answer/,
      );
    }
    fixture.server.resume();
    await until(async () => (await holders('sem')).length === 2, 5_000, 'the late requests to run');
    await b.inspect('sem'); // behind every late request on the same connection
    expect(await holders('sem')).toEqual(['first', 'second']);
    // Full at two: a third owner stays out, and one release makes room for exactly one.
    expect((await b.tryAcquire(['sem'], 'third', 60_000, { limits: [2] })).acquired).toBe(false);
    expect(await b.release(['sem'], 'second')).toBe(true);
    expect(await holders('sem')).toEqual(['first', 'third']);
  });

  it('a late answer to a shared acquire that gave up frees the share it won', async () => {
    const b = backend(300);
    await b.inspect('doc');
    fixture.server.pause();
    await expect(b.tryAcquire(['doc'], 'reader', 60_000, { limits: [SHARED], willWait: false })).rejects.toThrow(/did not answer/);
    fixture.server.resume();
    await until(async () => (await fixture.admin.exists('doc', lockKeyLayout('doc').holders)) === 0, 5_000, 'the late share to be freed');
  });

  it('a shared acquire sent twice (a resend after a reconnect) is one holder with one lease', async () => {
    const b = backend();
    const first = await b.tryAcquire(['doc'], 'reader', 60_000, { limits: [SHARED] });
    const again = await b.tryAcquire(['doc'], 'reader', 60_000, { limits: [SHARED] });
    expect(first.acquired && again.acquired).toBe(true);
    expect(await holders('doc')).toEqual(['reader']);
    expect(await b.release(['doc'], 'reader')).toBe(true);
    expect(await fixture.admin.exists('doc')).toBe(0);
  });
});
