import { afterEach, beforeEach, describe, expect, it } from '@jest/globals';
import type { Redis } from 'ioredis';
import { RedlockLockBackend } from '../../../lib/backends/redlock/redlock.backend.js';
import { RedlockQuorumError } from '../../../lib/backends/redlock/redlock.errors.js';
import { LockBackendError, LockLostError, LockNotAcquiredError } from '../../../lib/lock.errors.js';
import { LockService } from '../../../lib/lock.service.js';
import { until } from '../../support/wait.js';
import { RedlockMasters } from './redlock-masters.js';

/**
 * Real redis-servers killed, frozen and restarted under the backend. Each client set below is
 * what another process would open; the cross-process case is the stress test's.
 */
describe('redlock backend under master failures', () => {
  let masters: RedlockMasters;
  const services: LockService[] = [];

  // Generous per-master timeout: on a loaded test machine 250 ms can pass without a dead master.
  function service(
    clients: Redis[] = masters.connect(),
    options: ConstructorParameters<typeof LockService>[1] = {},
    masterTimeout = 2_000,
  ): LockService {
    const created = new LockService(new RedlockLockBackend({ clients, masterTimeout }), { keyPrefix: '', ...options });
    services.push(created);
    return created;
  }

  const ready = (clients: Redis[]) => until(() => clients.every((c) => c.status === 'ready'), 10_000, 'clients to reconnect');
  const noticed = (clients: Redis[]) =>
    until(() => clients.every((c) => c.status !== 'ready'), 10_000, 'clients to notice the dead master');

  beforeEach(async () => {
    masters = await RedlockMasters.start(3);
  });

  afterEach(async () => {
    for (const server of masters.servers) server.resume();
    await Promise.all(services.splice(0).map((s) => s.onApplicationShutdown()));
    await masters.stop();
  });

  describe('a: one of three masters killed', () => {
    it('still acquires, excludes, extends and wakes waiters', async () => {
      const clientsA = masters.connect();
      const clientsB = masters.connect();
      const [a, b] = [service(clientsA, { pollInterval: 60_000 }), service(clientsB, { pollInterval: 60_000 })];
      const early = await a.acquire('held-through', { ttl: 400 });

      await masters.servers[1].kill();
      await noticed([clientsA[1], clientsB[1]]);

      // The watchdog keeps extending on the two survivors, past several ttls.
      await until(() => early.expiresAt.getTime() > Date.now() + 300, 5_000, 'an extension after the kill');
      expect(early.signal.aborted).toBe(false);
      // Held by another owner is "not acquired", not a backend error, with one master down.
      expect(await b.tryAcquire('held-through')).toBeUndefined();
      const waiting = b.acquire('held-through', { wait: 20_000 });
      await early.release();
      // Neither the 60 s poll nor a ttl: the release message from a survivor woke it.
      await (await waiting).release();

      let value = 0;
      let inside = 0;
      let maxInside = 0;
      await Promise.all(
        Array.from({ length: 20 }, (_, i) =>
          (i % 2 ? a : b).using(
            'counter',
            async () => {
              maxInside = Math.max(maxInside, ++inside);
              const read = value;
              await new Promise((resolve) => setImmediate(resolve));
              value = read + 1;
              inside--;
            },
            { wait: 20_000 },
          ),
        ),
      );
      expect(maxInside).toBe(1);
      expect(value).toBe(20);
      expect(await masters.keyCounts()).toEqual([0, -1, 0]);
    });

    it('counts a key held elsewhere plus a dead master as busy, not as a backend failure', async () => {
      const [direct] = masters.connect();
      await direct.set('busy', 'someone-else', 'PX', 30_000);
      await masters.servers[1].kill();
      const clients = masters.connect();
      await until(() => clients[1].status !== 'ready' && clients[0].status === 'ready' && clients[2].status === 'ready', 10_000);
      const backend = new RedlockLockBackend({ clients, masterTimeout: 2_000 });
      // Master 0 refuses, master 1 is gone, master 2 says yes: the owner on master 0 (and maybe
      // on the dead one) could still hold a quorum, so this is contention.
      expect(await backend.tryAcquire(['busy'], 'me', 30_000)).toEqual({ acquired: false });
      // ...and the key it set on master 2 was taken back.
      expect(await masters.keyCounts()).toEqual([1, -1, 0]);
      await backend.close();
    });
  });

  describe('b: two of three masters lost', () => {
    it('fails with a clear no-quorum error within the wait, and leaves nothing on the survivor', async () => {
      const clients = masters.connect();
      const a = service(clients);
      await Promise.all([masters.servers[0].kill(), masters.servers[2].kill()]);
      await noticed([clients[0], clients[2]]);

      const started = Date.now();
      const error = await a.acquire(['order:1', 'order:2'], { wait: 1_000 }).catch((e: unknown) => e);
      const took = Date.now() - started;
      expect(error).toBeInstanceOf(RedlockQuorumError);
      expect(error).toBeInstanceOf(LockBackendError);
      expect(error).not.toBeInstanceOf(LockNotAcquiredError);
      expect((error as Error).message).toMatch(/no quorum for acquire of order:1, order:2: 1 of 3 masters answered, 2 needed/);
      expect(took).toBeGreaterThanOrEqual(900);
      expect(took).toBeLessThan(10_000); // never hangs
      expect(await masters.keyCounts()).toEqual([-1, 0, -1]);

      // One attempt, no wait: the same error at once.
      await expect(a.tryAcquire('order:3')).rejects.toBeInstanceOf(RedlockQuorumError);
      expect(await masters.keyCounts()).toEqual([-1, 0, -1]);
    });

    it('times out frozen masters (SIGSTOP) instead of hanging on them', async () => {
      const a = service(masters.connect(), {}, 250);
      await a.isLocked('warm-up'); // connections are up before the freeze
      masters.servers[0].pause();
      masters.servers[1].pause();
      const started = Date.now();
      const error = await a.acquire('frozen', { wait: 500 }).catch((e: unknown) => e);
      expect(error).toBeInstanceOf(RedlockQuorumError);
      expect((error as Error).message).toMatch(/no answer within 250 ms/);
      expect(Date.now() - started).toBeLessThan(10_000);
      // Thawed, the queued clean-up has run behind the late acquire: nothing is left anywhere.
      masters.servers[0].resume();
      masters.servers[1].resume();
      await until(async () => (await masters.keyCounts()).every((n) => n === 0), 10_000, 'no key left on any master');
    });

    it("fires the holder's signal when extensions cannot reach a quorum", async () => {
      const a = service();
      const handle = await a.acquire('losing', { ttl: 600 });
      await Promise.all([masters.servers[0].kill(), masters.servers[1].kill()]);
      const reason = await new Promise<unknown>((resolve) => handle.signal.addEventListener('abort', () => resolve(handle.signal.reason)));
      expect(reason).toBeInstanceOf(LockLostError);
      expect((reason as LockLostError).reason).toBe('backend-error');
      expect((reason as LockLostError).cause).toBeInstanceOf(RedlockQuorumError);
    });
  });

  describe('c: a master restarted without persistence while a lock is held', () => {
    it('when the holder had every master: one empty restart does not let anyone else in', async () => {
      const clients = masters.connect();
      const a = service(clients);
      const holder = await a.acquire('job', { ttl: 30_000, autoExtend: false });
      // The acquire returns once a quorum answered. If master 0 had not answered yet, ioredis would
      // resend the request after the restart and set the key there again: wait for all three.
      await until(async () => (await masters.keyCounts()).every((n) => n === 1), 5_000, 'the key on every master');
      await masters.servers[0].restart();
      const clientsB = masters.connect();
      await ready([...clients, ...clientsB]);
      expect(await service(clientsB).tryAcquire('job')).toBeUndefined();
      // Two of three still know the owner; its extension puts the key back on the restarted master
      // once B's failed attempt took back what it set there.
      await until(
        async () => {
          await holder.extend();
          return (await masters.keyCounts()).every((n) => n === 1);
        },
        10_000,
        'the key back on the restarted master',
      );
    });

    it('when the holder had a bare quorum: an empty restart lets a second owner in, and the first learns it only at its next extension', async () => {
      // Without the offline queue, A's request never reaches master 2 while it is down. (With it,
      // ioredis delivers the request when master 2 is back, which happens to add to A's lock.)
      const clients = masters.connect({ enableOfflineQueue: false });
      const a = service(clients);
      // Master 2 is down while A acquires: A holds masters 0 and 1, a bare quorum.
      await masters.servers[2].kill();
      await noticed([clients[2]]);
      const first = await a.acquire('job', { ttl: 30_000, autoExtend: false });
      expect(await masters.keyCounts()).toEqual([1, 1, -1]);
      // Master 2 comes back (empty), then master 0 restarts without persistence: A's key is now
      // only on master 1.
      await masters.servers[2].restart();
      await masters.servers[0].restart();
      await ready(clients);

      const clientsB = masters.connect();
      await ready(clientsB);
      const second = await service(clientsB).tryAcquire('job');
      // The outcome Redlock allows here: B wins masters 0 and 2, a quorum, while A still holds.
      expect(second).toBeDefined();
      expect(first.isHeld).toBe(true);
      expect(second!.isHeld).toBe(true);
      expect(first.fencingToken).toBeUndefined(); // nothing storage could use to tell them apart

      // A's next extension finds two of three masters refusing: it learns it lost the lock.
      const lost = await first.extend().catch((e: unknown) => e);
      expect(lost).toBeInstanceOf(LockLostError);
      expect((lost as LockLostError).reason).toBe('taken');
      expect(first.signal.aborted).toBe(true);
      expect(second!.isHeld).toBe(true);
      await second!.release();
    });

    it('with quorum n/2 + 2 (4 of 5) the same restart keeps a second owner out, and the holder repairs its lock', async () => {
      await masters.stop();
      masters = await RedlockMasters.start(5);
      const strict = (clients: Redis[]) => {
        const created = new LockService(new RedlockLockBackend({ clients, quorum: 4, masterTimeout: 2_000 }), { keyPrefix: '' });
        services.push(created);
        return created;
      };
      const clients = masters.connect();
      await masters.servers[4].kill();
      await noticed([clients[4]]);
      const first = await strict(clients).acquire('job', { ttl: 30_000, autoExtend: false });
      await masters.servers[4].restart();
      await masters.servers[0].restart();
      const clientsB = masters.connect();
      await ready([...clients, ...clientsB]);
      // B could win masters 0 and 4 only: 2 of the 4 it needs.
      expect(await strict(clientsB).tryAcquire('job')).toBeUndefined();
      // A keeps 3 of 5, below its quorum; once B took back what it set, A's extension re-creates
      // the key on the two empty masters.
      await until(async () => (await masters.keyCounts()).join() === '0,1,1,1,0', 5_000, "B's clean-up");
      await first.extend();
      await until(async () => (await masters.keyCounts()).every((n) => n === 1), 5_000, 'the key on every master');
    });
  });
});
