import { afterAll, afterEach, beforeAll, describe, expect, it } from '@jest/globals';
import { Cluster, type ClusterOptions, type Redis } from 'ioredis';
import { RedisLockBackend } from '../../lib/backends/redis/redis.backend.js';
import { keySlot, lockKeyLayout } from '../../lib/backends/redis/redis.keys.js';
import { InvalidLockKeyError, LockBackendError, LockService, type LockHandle } from '../../lib/index.js';
import { describeBackendConformance } from '../conformance/lock-backend.conformance.js';
import { RedisCluster } from '../support/redis-cluster.js';
import { freePort } from '../support/redis-server.js';
import { eventually, until } from '../support/wait.js';

// A real 3-master Redis Cluster: slots, CROSSSLOT checks, MOVED routing and sharded pub/sub are
// the server's, which a fake client cannot show.
let cluster: RedisCluster;
/** Cluster clients the tests passed in: the backend leaves them open, so the test closes them. */
const clients: Cluster[] = [];
const closing: { close(): Promise<void> }[] = [];

beforeAll(async () => {
  cluster = await RedisCluster.start({ masters: 3 });
}, 30_000);

afterAll(async () => {
  for (const client of clients.splice(0)) client.disconnect();
  await cluster?.stop();
});

// Waiters in these tests poll once a minute (only a wake-up lets them in within a test), so they
// must keep their place in Redis's line longer than that: a LockService refuses anything less.
const KEEP_PLACE = { waiterTimeout: 120_000 };

function clusterClient(options: ClusterOptions = {}): Cluster {
  const client = new Cluster(cluster.nodes, options);
  clients.push(client);
  return client;
}

describeBackendConformance('redis cluster', {
  // Each "process" gets its own Cluster client, passed in as users do.
  connect: async () => new RedisLockBackend(clusterClient(), KEEP_PLACE),
  reset: async () => {
    for (const client of clients.splice(0)) client.disconnect();
    await cluster.flushAll();
  },
  // Keys locked together must share a slot on Cluster; the suite's own names do not.
  multiKey: (key) => `{multi}:${key}`,
});

describe('RedisLockBackend on a real Redis Cluster', () => {
  afterEach(async () => {
    await Promise.all(closing.splice(0).map((c) => c.close()));
    for (const client of clients.splice(0)) client.disconnect();
    await cluster.flushAll();
  });

  function backend(client: Cluster | ConstructorParameters<typeof RedisLockBackend>[0] = clusterClient()): RedisLockBackend {
    const created = new RedisLockBackend(client, KEEP_PLACE);
    closing.push(created);
    return created;
  }

  function service(b: RedisLockBackend = backend(), options: ConstructorParameters<typeof LockService>[1] = {}): LockService {
    const created = new LockService(b, { keyPrefix: '', ...options });
    closing.push({ close: () => created.onApplicationShutdown() });
    return created;
  }

  /** One key per master (as stored, after `prefix`), found by asking the cluster where keys live. */
  async function keyPerMaster(stem: string, prefix = ''): Promise<string[]> {
    const byPort = new Map<number, string>();
    for (let i = 0; byPort.size < cluster.servers.length; i++) {
      const key = `${stem}:${i}`;
      const port = await cluster.portOf(prefix + key);
      if (!byPort.has(port)) byPort.set(port, key);
    }
    return [...byPort.values()];
  }

  async function keysInCluster(): Promise<number> {
    const sizes = await Promise.all(cluster.servers.map((s) => cluster.admin(s.port).dbsize()));
    return sizes.reduce((a, b) => a + b, 0);
  }

  /** The sharded channels that wake waiters for `key`, as the node `admin` talks to has them. */
  async function wakeChannels(admin: Redis, key: string): Promise<string[]> {
    return (await admin.call('PUBSUB', 'SHARDCHANNELS', `${lockKeyLayout(key).line}:*`)) as string[];
  }

  /** Releases `holder`; the waiter must get the lock long before its 60 s poll, with a greater token. */
  async function handsOverOnRelease(holder: LockHandle, waiting: Promise<LockHandle>): Promise<void> {
    const releasedAt = Date.now();
    await holder.release();
    const handle = await waiting;
    expect(Date.now() - releasedAt).toBeLessThan(5_000);
    expect(handle.fencingToken).toBeGreaterThan(holder.fencingToken!);
    await handle.release();
  }

  it('locks keys with a common user hash tag together, and refuses keys in different slots at once, leaving nothing behind', async () => {
    const [a, b] = [service(), service()];
    expect(await cluster.slotOf('order:{42}:a')).toBe(await cluster.slotOf('order:{42}:b'));
    const both = await a.acquire(['order:{42}:a', 'order:{42}:b']);
    expect(both.fencingToken).toBeGreaterThan(0);
    expect(await b.tryAcquire('order:{42}:a')).toBeUndefined();
    expect(await b.tryAcquire('order:{42}:b')).toBeUndefined();
    await both.release();
    expect(await b.isLocked('order:{42}:a')).toBe(false);
    expect(await b.isLocked('order:{42}:b')).toBe(false);

    await cluster.flushAll();
    expect(await cluster.slotOf('multi:a')).not.toBe(await cluster.slotOf('multi:b'));
    const started = Date.now();
    const error = await b.acquire(['multi:a', 'multi:b'], { wait: 5_000 }).catch((e: unknown) => e);
    expect(error).toBeInstanceOf(InvalidLockKeyError);
    expect((error as Error).message).toMatch(/cannot be locked together on Redis Cluster: .* different slots/);
    // Refused before any round trip, not after waiting out the 5 s.
    expect(Date.now() - started).toBeLessThan(1_000);
    expect(await keysInCluster()).toBe(0);
    // Nor in the backend: a refused request keeps no place in its process's view of the line.
    const line = (b.backend as unknown as { line: { entries: Map<string, unknown> } }).line;
    expect(line.entries.size).toBe(0);
  });

  it('computes the slot of any key as the server does, braces and all', async () => {
    const alphabet = ['{', '}', 'a', ':', '{}', '}{', 'é', '🔒'];
    let seed = 11;
    const random = () => (seed = (seed * 48271) % 2147483647) / 2147483647;
    const keys = ['foo{}{bar}', '{}a}b', 'a{}}', 'x{{y}}', 'lock:é🔒{}}'];
    for (let i = 0; i < 300; i++)
      keys.push(Array.from({ length: 1 + Math.floor(random() * 8) }, () => alphabet[Math.floor(random() * alphabet.length)]).join(''));
    const pipeline = cluster.admin(cluster.servers[0].port).pipeline();
    for (const key of keys) pipeline.call('CLUSTER', 'KEYSLOT', key);
    const slots = (await pipeline.exec())!.map(([error, slot]) => (error ? error.message : slot));
    expect(keys.map((key) => [key, keySlot(key)])).toEqual(keys.map((key, i) => [key, slots[i]]));
  });

  it.each(['a}b', '{}x', 'x{y', '}{', '{a', 'p:{}:{t}', '{}a}b', 'order:{42}'])(
    'keeps the companions of %s in its slot through acquire, wait, release and extend',
    async (key) => {
      const b = backend();
      const layout = lockKeyLayout(key);
      const slot = await cluster.slotOf(key);
      for (const companion of [layout.fence, layout.line, layout.records]) expect(await cluster.slotOf(companion)).toBe(slot);
      // Each script names all of them; Redis would answer CROSSSLOT if one were elsewhere.
      expect(await b.tryAcquire([key], 'owner-a', 5_000)).toMatchObject({ acquired: true });
      expect(await b.tryAcquire([key], 'owner-b', 5_000)).toMatchObject({ acquired: false });
      const node = cluster.admin(await cluster.portOf(key));
      expect(await node.exists(layout.lock, layout.fence, layout.line, layout.records)).toBe(4);
      expect(await b.extend([key], 'owner-a', 5_000)).toEqual({ extended: true });
      expect(await b.release([key], 'owner-a')).toBe(true);
      expect(await b.tryAcquire([key], 'owner-b', 5_000)).toMatchObject({ acquired: true });
      expect((await b.inspect(key))?.owner).toBe('owner-b');
    },
  );

  it('wakes a waiter on every master by sharded pub/sub, long before its poll', async () => {
    const keys = await keyPerMaster('wake');
    const [a, b] = [service(backend(), { pollInterval: 60_000 }), service(backend(), { pollInterval: 60_000 })];
    for (const key of keys) {
      const holder = await a.acquire(key, { ttl: 60_000 });
      const waiting = b.acquire(key, { wait: 20_000 });
      const node = cluster.admin(await cluster.portOf(key));
      // The waiter is subscribed on the shard that owns the key, by SSUBSCRIBE, not SUBSCRIBE.
      const channels = `${lockKeyLayout(key).line}:*`;
      await until(
        async () => ((await node.call('PUBSUB', 'SHARDCHANNELS', channels)) as string[]).length === 1,
        5_000,
        `SSUBSCRIBE ${key}`,
      );
      expect(await node.call('PUBSUB', 'CHANNELS', '*')).toEqual([]);
      const releasedAt = Date.now();
      await holder.release();
      const handle = await waiting;
      // Neither the ttl nor the poll (60 s each) could have done it.
      expect(Date.now() - releasedAt).toBeLessThan(2_000);
      await handle.release();
    }
  });

  it('after a lock moves to another master while held and waited for, the waiter still hears its release, not its poll', async () => {
    const [key] = await keyPerMaster('moving');
    const [a, b] = [service(backend(), { pollInterval: 60_000 }), service(backend(), { pollInterval: 60_000 })];
    const holder = await a.acquire(key, { ttl: 60_000 });
    const waiting = b.acquire(key, { wait: 30_000 });
    const from = await cluster.portOf(key);
    await until(async () => (await wakeChannels(cluster.admin(from), key)).length === 1, 5_000, `the waiter to subscribe on ${from}`);

    const to = cluster.servers.map((s) => s.port).find((port) => port !== from)!;
    await cluster.moveSlot(await cluster.slotOf(key), to);
    // The lock, its line and its counter moved with the slot; the subscription did not: the old
    // master dropped it (SUNSUBSCRIBE), and the waiter's process subscribes again on the new one.
    expect(await cluster.admin(to).get(key)).toBe(holder.leases[0].owner);
    expect(await wakeChannels(cluster.admin(from), key)).toEqual([]);
    await until(async () => (await wakeChannels(cluster.admin(to), key)).length === 1, 5_000, `the waiter to subscribe again on ${to}`);
    await handsOverOnRelease(holder, waiting);
  }, 30_000);

  it('after a failover to a replica that has the lock, the holder keeps it, and a waiter across the failover gets it on release, not at its poll', async () => {
    // A cluster of its own: this one loses a master.
    const failing = await RedisCluster.start({ masters: 3 });
    const own: Cluster[] = [];
    const services: LockService[] = [];
    const connect = () => {
      const client = new Cluster(failing.nodes);
      own.push(client);
      const created = new LockService(new RedisLockBackend(client, KEEP_PLACE), { keyPrefix: '', pollInterval: 60_000 });
      services.push(created);
      return created;
    };
    try {
      const key = 'failover:1';
      const master = await failing.portOf(key);
      const replica = await failing.addReplica(master);
      const [a, b] = [connect(), connect()];
      const holder = await a.acquire(key, { ttl: 60_000 });
      // Replication is asynchronous: this test is about what happens after a failover, not about
      // a lock lost in it (the Sentinel failover test shows that), so the replica must have it.
      // (WAIT alone does not show it: it can time out while the new replica still syncs.)
      const replicaAdmin = failing.admin(replica.port);
      await replicaAdmin.call('READONLY');
      await until(async () => (await replicaAdmin.get(key)) !== null, 30_000, 'the replica to have the lock');
      const waiting = b.acquire(key, { wait: 40_000 });
      await until(async () => (await wakeChannels(failing.admin(master), key)).length === 1, 5_000, 'the waiter to subscribe');

      await failing.servers.find((s) => s.port === master)!.kill();
      await failing.promote(replica.port);
      // The holder's client finds the new master, where its lock still is.
      await until(
        async () => (await a.inspect(key).catch(() => undefined))?.heldHere === true,
        20_000,
        'the holder to reach the new master',
      );
      // The waiter's process subscribes again there (its old shard is gone with the old master).
      await until(
        async () => (await wakeChannels(failing.admin(replica.port), key)).length === 1,
        20_000,
        'the waiter to subscribe on the new master',
      );
      await handsOverOnRelease(holder, waiting);
    } finally {
      await Promise.all(services.map((s) => s.onApplicationShutdown()));
      for (const client of own) client.disconnect();
      await failing.stop();
    }
  }, 90_000);

  it('excludes and hands out strictly increasing fencing tokens on keys spread over all masters', async () => {
    const keys = await keyPerMaster('spread');
    expect(new Set(await Promise.all(keys.map((k) => cluster.portOf(k)))).size).toBe(3);
    const [a, b] = [service(), service()];
    const tokens = new Map<string, number[]>(keys.map((k) => [k, []]));
    const values = new Map<string, number>(keys.map((k) => [k, 0]));
    const inside = new Map<string, number>(keys.map((k) => [k, 0]));
    let maxInside = 0;
    await Promise.all(
      keys.flatMap((key) =>
        Array.from({ length: 10 }, (_, i) =>
          (async () => {
            for (let r = 0; r < 3; r++) {
              await (i % 2 ? a : b).using(
                key,
                async (lock) => {
                  tokens.get(key)!.push(lock.fencingToken!);
                  inside.set(key, inside.get(key)! + 1);
                  maxInside = Math.max(maxInside, inside.get(key)!);
                  const read = values.get(key)!;
                  await new Promise((resolve) => setImmediate(resolve));
                  values.set(key, read + 1);
                  inside.set(key, inside.get(key)! - 1);
                },
                { wait: 20_000 },
              );
            }
          })(),
        ),
      ),
    );
    expect(maxInside).toBe(1);
    for (const key of keys) {
      expect(values.get(key)).toBe(30);
      const list = tokens.get(key)!;
      // Pushed inside the critical section, so in order of acquisition.
      for (let i = 1; i < list.length; i++) expect(list[i]).toBeGreaterThan(list[i - 1]);
    }

    // Locked together, the token is above the last of each key.
    const [x, y] = ['fence:{t}:x', 'fence:{t}:y'];
    const tx = await a.acquire(x);
    await tx.release();
    const ty = await a.acquire(y);
    await ty.release();
    const both = await b.acquire([x, y]);
    expect(both.fencingToken).toBeGreaterThan(Math.max(tx.fencingToken!, ty.fencingToken!));
    await both.release();
  });

  it('respects the Cluster client keyPrefix in slots, companions and wake-up channels', async () => {
    const client = clusterClient({ keyPrefix: 'app:' });
    const [a, b] = [service(backend(client), { pollInterval: 60_000 }), service(backend(client), { pollInterval: 60_000 })];
    for (const key of ['x{y', 'plain']) {
      const holder = await a.acquire(key, { ttl: 60_000 });
      const layout = lockKeyLayout(key, 'app:');
      const node = cluster.admin(await cluster.portOf(`app:${key}`));
      expect(await node.exists(`app:${layout.lock}`, `app:${layout.fence}`)).toBe(2);
      const waiting = b.acquire(key, { wait: 20_000 });
      await until(
        async () => ((await node.call('PUBSUB', 'SHARDCHANNELS', `app:${layout.line}:*`)) as string[]).length === 1,
        5_000,
        'SSUBSCRIBE',
      );
      await holder.release();
      await (await waiting).release();
    }
    const both = await a.acquire(['order:{9}:a', 'order:{9}:b']);
    await both.release();
  });

  it('fails an acquire with a clear LockBackendError within its wait when no node answers, not a hang', async () => {
    const service = new LockService(
      new RedisLockBackend({ clusterNodes: [{ host: '127.0.0.1', port: await freePort() }] }, { commandTimeout: 300 }),
    );
    closing.push({ close: () => service.onApplicationShutdown() });
    const started = Date.now();
    const error = await service.acquire('x', { wait: 500 }).catch((e: unknown) => e);
    expect(Date.now() - started).toBeLessThan(3_000);
    expect(error).toBeInstanceOf(LockBackendError);
    expect((error as Error).message).toMatch(
      /acquire of lock:x failed: Redis did not answer within 300 ms .*\? Connection to Redis is '\w+'/,
    );
    expect((error as Error).message).not.toMatch(/\.\.|\?\./);
  });

  it('creates its own Cluster client from { clusterNodes }, and on shutdown releases, then closes every connection', async () => {
    for (const client of clients.splice(0)) client.disconnect();
    await until(async () => (await cluster.clientCounts()).every((n) => n === 0), 5_000, 'earlier test clients to go');
    const created = () =>
      service(new RedisLockBackend({ clusterNodes: cluster.nodes }, KEEP_PLACE), { keyPrefix: 'lock:', pollInterval: 60_000 });
    const [holder, waiter] = [created(), created()];
    const keys = await keyPerMaster('created', 'lock:');
    for (const key of keys) {
      const held = await holder.acquire(key, { ttl: 60_000 });
      const waiting = waiter.acquire(key, { wait: 20_000 });
      const node = cluster.admin(await cluster.portOf(`lock:${key}`));
      const channels = `${lockKeyLayout(`lock:${key}`).line}:*`;
      await until(async () => ((await node.call('PUBSUB', 'SHARDCHANNELS', channels)) as string[]).length === 1, 5_000, 'SSUBSCRIBE');
      await held.release();
      await (await waiting).release();
    }
    const last = await holder.acquire(keys[0], { ttl: 60_000 });
    await Promise.all([holder.onApplicationShutdown(), waiter.onApplicationShutdown()]);
    expect(last.isHeld).toBe(false);
    expect(await cluster.admin(await cluster.portOf(`lock:${keys[0]}`)).exists(`lock:${keys[0]}`)).toBe(0);
    // Command and sharded-subscriber connections, on every master: all gone.
    await eventually(async () => expect(await cluster.clientCounts()).toEqual([0, 0, 0]), 5_000);
  });
});
