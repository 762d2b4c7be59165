import { afterAll, afterEach, beforeAll, beforeEach, describe, expect, it } from '@jest/globals';
import type { Redis } from 'ioredis';
import { RedlockLockBackend } from '../../../lib/backends/redlock/redlock.backend.js';
import { LockService } from '../../../lib/lock.service.js';
import { ClockShift } from '../../support/clock-shift.js';
import { until } from '../../support/wait.js';
import { RedlockMasters } from './redlock-masters.js';

/** A master whose wall clock jumps forward drops its keys early; extensions put them back. */
describe('redlock backend with a master whose clock jumps', () => {
  let clock: ClockShift;
  let masters: RedlockMasters;
  const services: LockService[] = [];

  const service = (clients: Redis[]) => {
    const created = new LockService(new RedlockLockBackend({ clients, masterTimeout: 2_000 }), { keyPrefix: '' });
    services.push(created);
    return created;
  };
  const ready = (clients: Redis[]) => until(() => clients.every((c) => c.status === 'ready'), 10_000, 'clients to reconnect');

  beforeAll(() => {
    clock = ClockShift.compile();
  });

  afterAll(() => clock.remove());

  beforeEach(async () => {
    clock.set(0);
    // Master 1 runs on the shifted clock.
    masters = await RedlockMasters.start(3, (i) => (i === 1 ? { env: clock.env } : {}));
  });

  afterEach(async () => {
    await Promise.all(services.splice(0).map((s) => s.onApplicationShutdown()));
    await masters.stop();
  });

  it('a lock won while a master was down is repaired there first, so a clock jump on another master lets nobody in', async () => {
    const clients = masters.connect({ enableOfflineQueue: false });
    const a = service(clients);
    await masters.servers[2].kill();
    await until(() => clients[2].status !== 'ready', 10_000, 'the client to notice the dead master');
    const first = await a.acquire('job', { ttl: 20_000, autoExtend: false });
    await masters.servers[2].restart();
    await until(
      async () => {
        await first.extend();
        return (await masters.keyCounts()).every((n) => n === 1);
      },
      10_000,
      'an extension to put the key on the master that came back',
    );

    // Master 1's clock jumps 30 s ahead: its copy of the key expires at once.
    clock.set(30_000);
    const [, direct] = masters.connect();
    await until(async () => (await direct.exists('job')) === 0, 5_000, 'the key to expire on master 1');

    const clientsB = masters.connect();
    await ready(clientsB);
    expect(await service(clientsB).tryAcquire('job')).toBeUndefined();
    expect(first.isHeld).toBe(true);
    // The next extension puts the key back on master 1, by its own (shifted) clock.
    await first.extend();
    await until(async () => (await masters.keyCounts()).every((n) => n === 1), 5_000, 'the key back on master 1');
    expect(await direct.pttl('job')).toBeGreaterThan(10_000);
  });
});
