import { describe, expect, it } from '@jest/globals';
import { Redis, type RedisOptions } from 'ioredis';
import { LockBackendError, LockService, RedisLockBackend } from '../../lib/index.js';
import { useRedisServer } from '../support/redis-fixture.js';
import { TcpProxy } from '../support/tcp-proxy.js';
import { nextEvent, until } from '../support/wait.js';

/**
 * Requests whose answers are lost with their connection: Redis applied them, but ioredis fails
 * them (after `maxRetriesPerRequest` reconnection attempts) and never hears how they went. The
 * caller gives up; what it won must not stay held by nobody until its ttl.
 */
describe('Redis backend: requests applied, answers lost with the connection', () => {
  const fixture = useRedisServer();

  /** A client of yours, through a proxy the test cuts, and a LockService on it. */
  async function throughProxy(options: RedisOptions = {}): Promise<{ proxy: TcpProxy; client: Redis; locks: LockService }> {
    const proxy = await TcpProxy.start(fixture.server.port);
    fixture.cleanup(() => proxy.close());
    // No CLIENT SETINFO on connecting: the proxy's drop accepts a connection and closes it at once,
    // and ioredis then throws EPIPE from that command's write, out of any caller's reach.
    const client = new Redis(proxy.port, '127.0.0.1', {
      maxRetriesPerRequest: 1,
      retryStrategy: () => 50,
      disableClientInfo: true,
      disconnectTimeout: 100, // else disconnect() waits 2 s for a socket the proxy already closed
      ...options,
    });
    client.on('error', () => undefined);
    fixture.cleanup(() => client.disconnect());
    const locks = new LockService(new RedisLockBackend(client, { commandTimeout: 300 }), { keyPrefix: '', pollInterval: 100 });
    fixture.cleanup(() => locks.onApplicationShutdown().catch(() => undefined));
    // Redis knows the scripts after this, so the attempts below are answered by EVALSHA alone (a
    // NOSCRIPT answer lost would leave nothing applied).
    const warmUp = await locks.acquire('queued:warm-up', { autoExtend: false });
    await warmUp.extend();
    await warmUp.release();
    return { proxy, client, locks };
  }

  /** Cuts the connection until ioredis has failed what it had queued (its second failed reconnection with maxRetriesPerRequest 1). */
  async function cutUntilFailed(proxy: TcpProxy, client: Redis): Promise<void> {
    proxy.set({ kind: 'drop' });
    let reconnections = 0;
    while (reconnections < 2) {
      await nextEvent(client, 'reconnecting');
      reconnections++;
    }
    // The queue is failed right after the event, in the same close handler.
    await new Promise((resolve) => setImmediate(resolve));
  }

  async function reconnect(proxy: TcpProxy, client: Redis): Promise<void> {
    proxy.set({ kind: 'pass' });
    if (client.status !== 'ready') await nextEvent(client, 'ready');
  }

  it('a tryAcquire whose answer was lost: the lock it won is freed once Redis is reachable again', async () => {
    const { proxy, client, locks } = await throughProxy();
    proxy.set({ kind: 'blackhole-down' }); // applied, unanswered
    const trying = locks.tryAcquire('queued:try', { ttl: 60_000 });
    await until(async () => (await fixture.admin.exists('queued:try')) === 1, 5_000, 'the attempt to be applied');
    // Cut before the caller gives up: what it sends on failing is failed with the rest.
    const cut = cutUntilFailed(proxy, client);
    await expect(trying).rejects.toThrow(LockBackendError);
    await cut;
    await cutUntilFailed(proxy, client);
    await reconnect(proxy, client);
    await until(async () => (await fixture.admin.exists('queued:try')) === 0, 10_000, 'the lock nobody holds to be freed');
    expect(await locks.tryAcquire('queued:try')).toBeDefined();
  });

  it('a tryAcquire whose request a client does not resend (autoResendUnfulfilledCommands: false): the lock it won is freed once Redis is back', async () => {
    // ioredis drops what was on the connection when it reconnects, without settling it: no late answer ever comes.
    const { proxy, client, locks } = await throughProxy({ autoResendUnfulfilledCommands: false });
    proxy.set({ kind: 'blackhole-down' });
    const trying = locks.tryAcquire('queued:not-resent', { ttl: 60_000 });
    await until(async () => (await fixture.admin.exists('queued:not-resent')) === 1, 5_000, 'the attempt to be applied');
    const cut = cutUntilFailed(proxy, client);
    await expect(trying).rejects.toThrow(LockBackendError);
    await cut;
    await cutUntilFailed(proxy, client); // whatever the caller sent on failing is failed too
    await reconnect(proxy, client);
    await until(async () => (await fixture.admin.exists('queued:not-resent')) === 0, 10_000, 'the lock nobody holds to be freed');
  });

  it('a waiter that gave up while Redis was unreachable: the lock its lost request won is freed once Redis is back', async () => {
    const { proxy, client, locks } = await throughProxy();
    proxy.set({ kind: 'blackhole-down' });
    const acquiring = locks.acquire('queued:wait', { ttl: 60_000, wait: 1_500 });
    await until(async () => (await fixture.admin.exists('queued:wait')) === 1, 5_000, 'the attempt to be applied');
    // Cut before the caller gives up: its release to leave the line is failed with the rest.
    const cut = cutUntilFailed(proxy, client);
    await expect(acquiring).rejects.toThrow(LockBackendError);
    await cut;
    // Everything the caller sent is failed by now, release included.
    await cutUntilFailed(proxy, client);
    await reconnect(proxy, client);
    await until(async () => (await fixture.admin.exists('queued:wait')) === 0, 10_000, 'the lock nobody holds to be freed');
  });

  it('a holder whose release failed while Redis was unreachable: the lock is freed once Redis is back, not at the end of its ttl', async () => {
    const { proxy, client, locks } = await throughProxy();
    const handle = await locks.acquire('queued:held', { ttl: 60_000, autoExtend: false });
    proxy.set({ kind: 'drop' });
    await nextEvent(client, 'reconnecting'); // the release waits in the offline queue, not on the old connection
    const releasing = handle.release();
    await cutUntilFailed(proxy, client);
    await expect(releasing).rejects.toThrow(LockBackendError);
    await reconnect(proxy, client);
    await until(async () => (await fixture.admin.exists('queued:held')) === 0, 10_000, 'the released lock to be freed');
  });

  it('an extension applied but unanswered, then the lease lost while Redis was unreachable: the lock is freed once Redis is back', async () => {
    const { proxy, client, locks } = await throughProxy();
    const handle = await locks.acquire('queued:extended', { ttl: 2_000, autoExtend: false });
    proxy.set({ kind: 'blackhole-down' });
    // Redis keeps the lock for a minute from now; the holder, with no answer, counts its 2 s.
    await expect(handle.extend(60_000)).rejects.toThrow(LockBackendError);
    expect(await fixture.admin.pttl('queued:extended')).toBeGreaterThan(2_000);
    proxy.set({ kind: 'drop' });
    await until(() => !handle.isHeld, 10_000, 'the lease to run out');
    // Its release of the lost lease (compare-and-delete) is failed with the rest of the queue.
    await cutUntilFailed(proxy, client);
    await reconnect(proxy, client);
    await until(async () => (await fixture.admin.exists('queued:extended')) === 0, 10_000, 'the lock nobody holds to be freed');
  });
});
