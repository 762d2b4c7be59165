import { afterAll, afterEach, beforeAll, describe, expect, it } from '@jest/globals';
import type { Redis } from 'ioredis';
import { RedlockLockBackend } from '../../../lib/backends/redlock/redlock.backend.js';
import { LockService } from '../../../lib/lock.service.js';
import { TcpProxy } from '../../support/tcp-proxy.js';
import { until } from '../../support/wait.js';
import { RedlockMasters } from './redlock-masters.js';

/** How far (one way) the releasing process is from the two masters in other zones, in ms. */
const FAR_MS = 300;

/**
 * A hand-over between processes when the releasing process is near one master and far from the
 * others (masters in other zones, Redlock's own use case): the waiter hears the near master's
 * release message first, and its attempt then meets the far masters still holding the key.
 */
describe('redlock backend: hand-over from a releaser far from most masters', () => {
  let masters: RedlockMasters;
  let proxies: TcpProxy[];
  const services: LockService[] = [];

  beforeAll(async () => {
    masters = await RedlockMasters.start(3);
    // The releaser reaches masters 1 and 2 through these; its requests take FAR_MS to arrive.
    proxies = await Promise.all(
      masters.servers.slice(1).map((server) => TcpProxy.start(server.port, { kind: 'delay', ms: FAR_MS, direction: 'up' })),
    );
  }, 30_000);

  afterEach(async () => {
    await Promise.all(services.splice(0).map((service) => service.onApplicationShutdown()));
    masters.disconnect();
    await masters.flush();
  });

  afterAll(async () => {
    await Promise.all(proxies.map((proxy) => proxy.close()));
    await masters.stop();
  });

  function service(clients: Redis[], options: ConstructorParameters<typeof LockService>[1] = {}): LockService {
    const created = new LockService(new RedlockLockBackend({ clients, masterTimeout: 5_000 }), { keyPrefix: '', ...options });
    services.push(created);
    return created;
  }

  const evalshaCalls = async (client: Redis) => Number(/cmdstat_evalsha:calls=(\d+)/.exec(await client.info('commandstats'))?.[1] ?? 0);

  it('the waiter of another process takes the lock once the far masters released it, not at its next poll', async () => {
    const releaserClients = [masters.client(masters.servers[0]), ...proxies.map((proxy) => masters.client({ port: proxy.port } as never))];
    const releaser = service(releaserClients);
    // A waiter that relied on its poll would sleep past its whole wait.
    const waiter = service(masters.connect(), { pollInterval: 600_000 });
    const observer = masters.client(masters.servers[0]);

    const held = await releaser.acquire('far', { ttl: 60_000, autoExtend: false });
    const before = await evalshaCalls(observer);
    let acquiredAt: number | undefined;
    const waiting = waiter.acquire('far', { ttl: 60_000, wait: 10_000 }).then((handle) => {
      acquiredAt = performance.now();
      return handle;
    });
    // Its first attempt, and the one right after it subscribed, were both refused: it now sleeps.
    await until(async () => (await evalshaCalls(observer)) >= before + 2, 10_000, 'the waiter to try twice');

    const releasedAt = performance.now();
    await held.release();
    const handle = await waiting;
    // The lock went over on release, not on the ttl: the masters hold it for the waiter now.
    expect(acquiredAt! - releasedAt).toBeGreaterThan(0);
    expect(await waiter.isLocked('far')).toBe(true);
    await handle.release();
  }, 30_000);
});
