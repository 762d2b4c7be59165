import { afterAll, afterEach, beforeAll, describe, expect, it } from '@jest/globals';
import { Redis } from 'ioredis';
import { RedisLockBackend } from '../../lib/backends/redis/redis.backend.js';
import { LockLostError, LockService } from '../../lib/index.js';
import { describeBackendConformance } from '../conformance/lock-backend.conformance.js';
import { RedisSentinel } from '../support/redis-sentinel.js';
import { TcpProxy, type ProxyMode } from '../support/tcp-proxy.js';
import { eventually, until } from '../support/wait.js';

// A real master and a real sentinel: the client asks the sentinel where the master is, which a
// fake cannot show, nor whether every connection (to the sentinel too) is closed on shutdown.
let setup: RedisSentinel;
// Waiters in these tests poll once a minute (only a wake-up lets them in within a test), so they
// must keep their place in Redis's line longer than that: a LockService refuses anything less.
const KEEP_PLACE = { waiterTimeout: 120_000 };
/** Plain connections to the master and to the sentinel, for inspection. */
let master: Redis;
let sentinel: Redis;

beforeAll(async () => {
  setup = await RedisSentinel.start({ name: 'mymaster' });
  master = new Redis(setup.master.port, '127.0.0.1', { maxRetriesPerRequest: 1 });
  sentinel = new Redis(setup.sentinel.port, '127.0.0.1', { maxRetriesPerRequest: 1 });
}, 20_000);

afterAll(async () => {
  master?.disconnect();
  sentinel?.disconnect();
  await setup?.stop();
});

const viaSentinel = () => ({ sentinels: setup.sentinels, name: setup.name });

describeBackendConformance('redis sentinel', {
  // Each "process" gets a backend that finds the master through the sentinel, and closes its client.
  connect: async () => new RedisLockBackend(viaSentinel(), KEEP_PLACE),
  reset: async () => void (await master.flushall()),
});

/** Connections other than the inspecting one and the sentinel's own links to the master. */
async function clients(admin: Redis): Promise<number> {
  const list = ((await admin.call('CLIENT', 'LIST')) as string).split('\n').filter((line) => line.trim() !== '');
  return list.filter((line) => !/ name=sentinel-/.test(line)).length - 1;
}

describe('RedisLockBackend through a real Sentinel', () => {
  const services: LockService[] = [];
  afterEach(async () => {
    await Promise.all(services.splice(0).map((s) => s.onApplicationShutdown()));
    await master.flushall();
  });

  function service(backend: RedisLockBackend): LockService {
    const created = new LockService(backend, { pollInterval: 60_000 });
    services.push(created);
    return created;
  }

  it('acquires, wakes a waiter on release, and on shutdown releases, then closes its connections to master and sentinel', async () => {
    await until(async () => (await clients(master)) === 0 && (await clients(sentinel)) === 0, 5_000, 'earlier clients to go');
    const [a, b] = [service(new RedisLockBackend(viaSentinel(), KEEP_PLACE)), service(new RedisLockBackend(viaSentinel(), KEEP_PLACE))];
    const first = await a.acquire('order:1', { ttl: 60_000 });
    expect(await master.get('lock:order:1')).toBe((await a.backend.inspect('lock:order:1'))?.owner);
    const waiting = b.acquire('order:1', { wait: 20_000 });
    // Subscribed on the master the sentinel named: the release message reaches it there.
    await until(
      async () => ((await master.call('PUBSUB', 'CHANNELS', 'nest-distributed-lock:*')) as string[]).length === 1,
      5_000,
      'SUBSCRIBE',
    );
    const releasedAt = Date.now();
    await first.release();
    const second = await waiting;
    // Neither the ttl nor the poll (60 s each) could have done it.
    expect(Date.now() - releasedAt).toBeLessThan(2_000);
    expect(second.fencingToken).toBeGreaterThan(first.fencingToken!);

    await Promise.all(services.splice(0).map((s) => s.onApplicationShutdown()));
    expect(second.isHeld).toBe(false);
    expect(await master.exists('lock:order:1')).toBe(0);
    await eventually(async () => expect([await clients(master), await clients(sentinel)]).toEqual([0, 0]), 5_000);
  });

  it('uses a Sentinel client passed in, and leaves it open', async () => {
    const client = new Redis(viaSentinel());
    try {
      const lock = service(new RedisLockBackend(client, KEEP_PLACE));
      await lock.using('job', async (handle) => {
        expect(await master.exists('lock:job')).toBe(1);
        expect(handle.fencingToken).toBeGreaterThan(0);
      });
      await Promise.all(services.splice(0).map((s) => s.onApplicationShutdown()));
      expect(client.status).toBe('ready');
      expect(await client.ping()).toBe('PONG');
    } finally {
      client.disconnect();
    }
  });
});

describe('RedisLockBackend after a Sentinel failover, while the old master still acts as one', () => {
  it('moves to the new master as soon as the sentinel announces it, not when the old master is reconfigured seconds later', async () => {
    const setup = await RedisSentinel.start({ name: 'switch', replica: true, downAfterMs: 5_000 });
    const admins = [setup.master, setup.replica!, setup.sentinel].map((s) => new Redis(s.port, '127.0.0.1', { maxRetriesPerRequest: 1 }));
    const [oldMaster, newMaster, sentinel] = admins;
    const service = new LockService(new RedisLockBackend({ sentinels: setup.sentinels, name: setup.name }, { commandTimeout: 1_000 }));
    try {
      await service.isLocked('warm-up');
      // Refused (NOGOODSLAVE) until the sentinel has heard from the replica itself.
      await until(
        () =>
          sentinel.call('SENTINEL', 'FAILOVER', setup.name).then(
            () => true,
            () => false,
          ),
        10_000,
        'the sentinel to accept a failover',
      );
      await setup.untilMasterIs(setup.replica!.port, 30_000);

      // Sentinel reconfigures the old master as a replica only seconds after the switch: until
      // then it still takes writes from the clients connected to it, while every client that
      // asks the sentinel goes to the new one. A lock taken there and one taken here would both
      // be granted. So the backend must leave it before that.
      let attempt = 0;
      await until(
        async () => {
          if (/role:slave/.test(await oldMaster.info('replication'))) {
            throw new Error('the old master was reconfigured as a replica, and the backend had still not moved to the new master');
          }
          const key = `after-switch-${attempt++}`;
          const handle = await service.tryAcquire(key).catch(() => undefined);
          if (!handle) return false;
          // The service prefixes every key ('lock:' by default).
          const landed = (await newMaster.exists(`lock:${key}`)) === 1;
          await handle.release().catch(() => undefined);
          return landed;
        },
        30_000,
        'a lock taken through the backend to land on the new master',
      );
    } finally {
      await service.onApplicationShutdown();
      for (const admin of admins) admin.disconnect();
      await setup.stop();
    }
  }, 60_000);
});

describe('RedisLockBackend through a Sentinel failover', () => {
  it('after a failover to a replica that never got the lock, a second owner gets it, with a greater fencing token', async () => {
    const failover = await RedisSentinel.start({ name: 'failover', replica: true, downAfterMs: 500 });
    const services: LockService[] = [];
    const connect = () => {
      const created = new LockService(
        new RedisLockBackend({ sentinels: failover.sentinels, name: failover.name }, { commandTimeout: 1_000 }),
        { pollInterval: 200 },
      );
      services.push(created);
      return created;
    };
    const admin = new Redis(failover.master.port, '127.0.0.1', { maxRetriesPerRequest: 1 });
    try {
      const [a, b] = [connect(), connect()];
      await a.isLocked('warm-up');
      // Replication is asynchronous: hold the replica up and queue more on its link than the
      // sockets can carry, so the lock written next is still in the master's buffer when it dies.
      failover.replica!.pause();
      await admin.set('backlog', 'x'.repeat(48 * 1024 * 1024));
      const first = await a.acquire('order:1', { ttl: 60_000, autoExtend: false });
      await failover.master.kill();
      failover.replica!.resume();
      await failover.untilMasterIs(failover.replica!.port, 30_000);

      // The promoted replica never had the lock: a second owner gets it while the first holds.
      const second = await b.acquire('order:1', { ttl: 60_000, wait: 20_000 });
      expect(first.isHeld).toBe(true);
      // Its counter was lost too; the new one starts from the clock, so storage can still tell.
      expect(second.fencingToken).toBeGreaterThan(first.fencingToken!);
      // The first owner learns it at its next extension, once its client found the new master.
      await until(async () => (await a.isLocked('order:1').catch(() => false)) === true, 30_000, 'the first owner to reach the new master');
      const lost = await first.extend().catch((error: unknown) => error);
      expect(lost).toBeInstanceOf(LockLostError);
      expect((lost as LockLostError).reason).toBe('taken');
      // And its process locks again: the failover cost it the lock, not its Redis client.
      const next = await a.tryAcquire('order:2', { ttl: 60_000 });
      expect(next?.isHeld).toBe(true);
      await next!.release();
      await second.release();
    } finally {
      admin.disconnect();
      await Promise.all(services.map((s) => s.onApplicationShutdown()));
      await failover.stop();
    }
  }, 120_000);
});

describe('RedisLockBackend when the master dies while its client waits for a sentinel to answer', () => {
  // The sentinel's answer to "where is the master" comes late (a loaded machine, only by chance
  // and shorter), or never (a request lost on a connection that stays up, a frozen sentinel). Its
  // +switch-master still arrives, on a connection of its own, before that answer: it cancels the
  // reconnection in progress. The client must try again, and not wait for that answer forever.
  it.each([
    ['late', { kind: 'delay', ms: 5_000, direction: 'up' }],
    ['never', { kind: 'blackhole-up' }],
  ] satisfies [string, ProxyMode][])(
    '(it answers %s) still reaches the new master, and its process locks again',
    async (_, mode) => {
      const setup = await RedisSentinel.start({ name: 'announced', replica: true, downAfterMs: 500 });
      // The backend reaches the sentinel through a proxy, which holds the requests back.
      const proxy = await TcpProxy.start(setup.sentinel.port);
      const sentinel = new Redis(setup.sentinel.port, '127.0.0.1', { maxRetriesPerRequest: 1 });
      const service = new LockService(
        new RedisLockBackend({ sentinels: [{ host: '127.0.0.1', port: proxy.port }], name: setup.name }, { commandTimeout: 1_000 }),
        { pollInterval: 200 },
      );
      try {
        await service.isLocked('warm-up');
        // The client's connection to the sentinel that waits for +switch-master.
        await until(async () => / sub=1 /.test((await sentinel.call('CLIENT', 'LIST')) as string), 10_000, 'the failover subscription');
        proxy.set(mode);
        await setup.master.kill();
        await setup.untilMasterIs(setup.replica!.port, 30_000);
        proxy.set({ kind: 'pass' });
        await until(
          async () => (await service.tryAcquire('after-failover').catch(() => undefined))?.isHeld === true,
          30_000,
          'a lock taken through the backend after the failover',
        );
      } finally {
        await service.onApplicationShutdown();
        sentinel.disconnect();
        await proxy.close();
        await setup.stop();
      }
    },
    90_000,
  );
});
