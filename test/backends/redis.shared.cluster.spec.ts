import { afterAll, afterEach, beforeAll, describe, expect, it } from '@jest/globals';
import { Cluster } from 'ioredis';
import { SHARED } from '../../lib/backends/lock-backend.interface.js';
import { RedisLockBackend } from '../../lib/backends/redis/redis.backend.js';
import { lockKeyLayout } from '../../lib/backends/redis/redis.keys.js';
import { RedisCluster } from '../support/redis-cluster.js';
import { until } from '../support/wait.js';

// Shared locks and semaphores on a real 3-master Redis Cluster: every key of a lock (the marker,
// its holder set, line, records and counter) in one slot, or Redis answers CROSSSLOT; hand-overs to
// several readers by sharded pub/sub.
let cluster: RedisCluster;
const clients: Cluster[] = [];
const closing: RedisLockBackend[] = [];

beforeAll(async () => {
  cluster = await RedisCluster.start({ masters: 3 });
}, 30_000);

afterAll(async () => {
  await cluster?.stop();
});

afterEach(async () => {
  await Promise.all(closing.splice(0).map((b) => b.close()));
  for (const client of clients.splice(0)) client.disconnect();
  await cluster.flushAll();
});

function backend(): RedisLockBackend {
  const client = new Cluster(cluster.nodes);
  clients.push(client);
  const created = new RedisLockBackend(client, { waiterTimeout: 120_000 });
  closing.push(created);
  return created;
}

describe('shared locks and semaphores on a real Redis Cluster', () => {
  it.each(['doc', 'a}b', '{}x', 'order:{42}', 'p:{}:{t}'])('keeps the holder set of %s in its slot, through every step', async (key) => {
    const b = backend();
    const layout = lockKeyLayout(key);
    const slot = await cluster.slotOf(key);
    for (const companion of [layout.fence, layout.line, layout.records, layout.holders]) expect(await cluster.slotOf(companion)).toBe(slot);
    expect(await b.tryAcquire([key], 'r1', 5_000, { limits: [SHARED] })).toMatchObject({ acquired: true });
    expect(await b.tryAcquire([key], 'r2', 5_000, { limits: [SHARED] })).toMatchObject({ acquired: true });
    expect(await b.tryAcquire([key], 'w', 5_000)).toMatchObject({ acquired: false });
    const node = cluster.admin(await cluster.portOf(key));
    expect(await node.exists(layout.lock, layout.fence, layout.line, layout.records, layout.holders)).toBe(5);
    expect(await b.extend([key], 'r1', 5_000)).toEqual({ extended: true });
    expect((await b.inspect(key))?.holders?.map((h) => h.owner).sort()).toEqual(['r1', 'r2']);
    expect(await b.release([key], 'r1')).toBe(true);
    expect(await b.release([key], 'r2')).toBe(true);
    // Handed to the writer in line by the last reader's release.
    expect((await b.inspect(key))?.owner).toBe('w');
  });

  it('a writer on one master hands the key to two readers of another process at once, by sharded pub/sub', async () => {
    const [a, b] = [backend(), backend()];
    expect((await a.tryAcquire(['catalog'], 'writer', 60_000)).acquired).toBe(true);
    const woken: string[] = [];
    const readers = ['r1', 'r2'].map(async (owner) => {
      const stop = await b.watch(['catalog'], () => woken.push(owner), owner);
      expect((await b.tryAcquire(['catalog'], owner, 60_000, { limits: [SHARED] })).acquired).toBe(false);
      return stop;
    });
    const stops = await Promise.all(readers);
    // (A Cluster subscriber wakes every waiter once its subscriptions are ready: only later wake-ups count.)
    const before = woken.length;
    expect(await a.release(['catalog'], 'writer')).toBe(true);
    expect((await a.inspect('catalog'))?.holders?.map((h) => h.owner).sort()).toEqual(['r1', 'r2']);
    await until(() => ['r1', 'r2'].every((owner) => woken.slice(before).includes(owner)), 5_000, 'both readers to be told');
    // Each takes the share handed to it without asking Redis to decide again.
    for (const owner of ['r1', 'r2']) expect((await b.tryAcquire(['catalog'], owner, 60_000, { limits: [SHARED] })).acquired).toBe(true);
    stops.forEach((stop) => stop());
    expect((await a.inspect('catalog'))?.holders?.map((h) => h.owner).sort()).toEqual(['r1', 'r2']);
  });

  it('a semaphore keyed with a hash tag spans keys of one slot, and never admits more than N', async () => {
    const b = backend();
    const keys = ['tenant:{7}:export', 'tenant:{7}:quota'];
    expect((await b.tryAcquire(keys, 'p1', 60_000, { limits: [2, SHARED] })).acquired).toBe(true);
    expect((await b.tryAcquire(keys, 'p2', 60_000, { limits: [2, SHARED] })).acquired).toBe(true);
    expect((await b.tryAcquire(keys, 'p3', 60_000, { limits: [2, SHARED] })).acquired).toBe(false);
    expect((await b.inspect(keys[0]))?.holders).toHaveLength(2);
    expect(await b.release(keys, 'p1')).toBe(true);
    // Told to try again (a multi-key waiter is not handed keys), p3 finds a permit kept for it.
    expect((await b.tryAcquire(['tenant:{7}:export'], 'p4', 60_000, { limits: [2] })).acquired).toBe(false);
    expect((await b.tryAcquire(keys, 'p3', 60_000, { limits: [2, SHARED] })).acquired).toBe(true);
    expect((await b.inspect(keys[0]))?.holders?.map((h) => h.owner).sort()).toEqual(['p2', 'p3']);
  });
});
