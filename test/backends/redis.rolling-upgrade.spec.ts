import { describe, expect, it } from '@jest/globals';
import { readFileSync } from 'node:fs';
import { resolve } from 'node:path';
import { RedisLockBackend } from '../../lib/backends/redis/redis.backend.js';
import { lockKeyLayout } from '../../lib/backends/redis/redis.keys.js';
import { useRedisServer } from '../support/redis-fixture.js';

/** The Lua scripts of the release before who holds was stored, as its processes send them. */
const PREVIOUS = JSON.parse(readFileSync(resolve(import.meta.dirname, '../fixtures/redis-scripts-before-identity.json'), 'utf8')) as Record<
  'ACQUIRE' | 'RELEASE',
  string
>;

const fixture = useRedisServer();

/** A process of that release on the same Redis: its keys, arguments and scripts. */
function previousRelease() {
  const id = 'previous-process';
  return {
    async acquire(key: string, owner: string, willWait: boolean): Promise<unknown> {
      const { lock, fence, line, records } = lockKeyLayout(key);
      return fixture.admin.eval(PREVIOUS.ACQUIRE, 4, lock, fence, line, records, owner, 30_000, `30000 ${willWait ? 1 : 0} ${id}`);
    },
    async release(key: string, owner: string): Promise<unknown> {
      const { lock, fence, line, records, holders } = lockKeyLayout(key);
      return fixture.admin.eval(PREVIOUS.RELEASE, 5, lock, fence, line, records, holders, owner, `PUBLISH 30000 ${id} 0`);
    },
  };
}

const holder = { instance: 'web-1', site: 'Orders.pay' };

describe('Redis: who holds, next to processes of the release before it', () => {
  it('they wait in the same line and take the key from a holder of this release, and back', async () => {
    const b = new RedisLockBackend(fixture.server.url);
    fixture.cleanup(() => b.close());
    const old = previousRelease();
    expect((await b.tryAcquire(['k'], 'new-owner', 30_000, { holder })).acquired).toBe(true);
    expect(await old.acquire('k', 'old-owner', true)).toEqual([0, expect.any(Number), expect.any(Number)]);
    // Its place in line, without a name: it stored none.
    expect((await b.inspect('k'))?.waiters).toEqual([{ owner: 'old-owner', waitingSince: expect.any(Number) }]);

    await b.release(['k'], 'new-owner');
    const handed = await b.inspect('k');
    expect(handed).toMatchObject({ owner: 'old-owner', holders: [{ owner: 'old-owner', acquiredAt: expect.any(Number) }] });
    expect(handed?.holders?.[0].instance).toBeUndefined();

    // This release waits behind it, named; its release hands the key over without writing who.
    expect(await b.tryAcquire(['k'], 'new-waiter', 30_000, { holder })).toMatchObject({ acquired: false });
    expect((await b.inspect('k'))?.waiters).toEqual([{ owner: 'new-waiter', waitingSince: expect.any(Number), ...holder }]);
    expect(await old.release('k', 'old-owner')).toBe(1);
    const back = await b.inspect('k');
    expect(back?.owner).toBe('new-waiter');
    // The holder string still names the previous holder: not shown for this one.
    expect(back?.holders?.[0].instance).toBeUndefined();
    expect(await b.release(['k'], 'new-waiter')).toBe(true);

    // The usual case of that release on a key with a holder string left behind.
    expect(await old.acquire('k', 'old-2', false)).toEqual(expect.any(Number));
    expect((await b.inspect('k'))?.holders).toEqual([{ owner: 'old-2', ttlMs: expect.any(Number), fencingToken: expect.any(Number) }]);
    expect(await old.release('k', 'old-2')).toBe(1);
    expect(await b.inspect('k')).toBeUndefined();
  });
});
