import { afterEach, beforeEach, describe, expect, it } from '@jest/globals';
import type { Redis } from 'ioredis';
import { RedlockLockBackend } from '../../../lib/backends/redlock/redlock.backend.js';
import { LockBackendError } from '../../../lib/lock.errors.js';
import { LockService } from '../../../lib/lock.service.js';
import { TcpProxy } from '../../support/tcp-proxy.js';
import { nextEvent, until } from '../../support/wait.js';
import { RedlockMasters } from './redlock-masters.js';

/**
 * Releases that ioredis failed while the masters were unreachable (it fails what it queued after
 * `maxRetriesPerRequest` reconnection attempts): what they were to free must not stay held by
 * nobody until its ttl.
 */
describe('redlock backend: releases failed while the masters were unreachable', () => {
  let masters: RedlockMasters;
  let proxies: TcpProxy[] = [];
  let locks: LockService | undefined;

  beforeEach(async () => {
    masters = await RedlockMasters.start(3);
    proxies = await Promise.all(masters.servers.map((server) => TcpProxy.start(server.port)));
  });

  afterEach(async () => {
    await locks?.onApplicationShutdown();
    locks = undefined;
    await Promise.all(proxies.map((proxy) => proxy.close()));
    await masters.stop();
  });

  /** Clients of yours through the proxies (maxRetriesPerRequest 1), and a LockService on them. */
  async function throughProxies(): Promise<{ clients: Redis[]; service: LockService }> {
    // No CLIENT SETINFO on connecting: the proxy's drop accepts a connection and closes it at once,
    // and ioredis then throws EPIPE from that command's write, out of any caller's reach.
    const clients = proxies.map((proxy) => masters.client({ port: proxy.port } as never, { disableClientInfo: true }));
    await until(() => clients.every((c) => c.status === 'ready'), 10_000, 'the clients to connect');
    locks = new LockService(new RedlockLockBackend({ clients, masterTimeout: 2_000 }), { keyPrefix: '' });
    return { clients, service: locks };
  }

  /** Cuts every connection until ioredis has failed what it queued (its second failed reconnection). */
  async function cutUntilFailed(clients: Redis[]): Promise<void> {
    for (const proxy of proxies) proxy.set({ kind: 'drop' });
    await Promise.all(
      clients.map(async (client) => {
        for (let reconnections = 0; reconnections < 2; reconnections++) await nextEvent(client, 'reconnecting');
      }),
    );
    await new Promise((resolve) => setImmediate(resolve));
  }

  it('a holder whose release failed: the lock is freed on every master once they are reachable again', async () => {
    const { clients, service } = await throughProxies();
    const handle = await service.acquire('queued:redlock', { ttl: 60_000, autoExtend: false });
    expect(await masters.keyCounts()).toEqual([1, 1, 1]);
    for (const proxy of proxies) proxy.set({ kind: 'drop' });
    await Promise.all(clients.map((client) => nextEvent(client, 'reconnecting'))); // the release waits in the offline queues
    const releasing = handle.release();
    await cutUntilFailed(clients);
    await expect(releasing).rejects.toThrow(LockBackendError);
    for (const proxy of proxies) proxy.set({ kind: 'pass' });
    await until(() => clients.every((c) => c.status === 'ready'), 10_000, 'the clients to reconnect');
    await until(async () => (await masters.keyCounts()).every((n) => n === 0), 10_000, 'the released lock to be freed');
  });
});
