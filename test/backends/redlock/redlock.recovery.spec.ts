import { afterEach, beforeEach, describe, expect, it, jest } from '@jest/globals';
import { Logger } from '@nestjs/common';
import { Redis } from 'ioredis';
import { Socket } from 'node:net';
import { RedlockLockBackend } from '../../../lib/backends/redlock/redlock.backend.js';
import { LockService } from '../../../lib/lock.service.js';
import { until } from '../../support/wait.js';
import { RedlockMasters } from './redlock-masters.js';

/** What a promise settles to, or 'no answer' once `ms` passed: for "does not hang" only. */
function within<T>(promise: Promise<T>, ms: number): Promise<T | 'no answer'> {
  let timer: NodeJS.Timeout | undefined;
  const late = new Promise<'no answer'>((resolve) => (timer = setTimeout(() => resolve('no answer'), ms)));
  return Promise.race([promise, late]).finally(() => clearTimeout(timer));
}

/**
 * How the backend gets back to safety after a fault: a lock left on a bare quorum is repaired,
 * a frozen master costs no more than the answer needs, and nothing waits on it at shutdown.
 */
describe('redlock backend recovering from master faults', () => {
  let masters: RedlockMasters;
  const services: LockService[] = [];
  const backends: RedlockLockBackend[] = [];

  const service = (clients: Redis[], masterTimeout = 2_000) => {
    const created = new LockService(new RedlockLockBackend({ clients, masterTimeout }), { keyPrefix: '' });
    services.push(created);
    return created;
  };
  const extendedOnEveryMaster = (handle: { extend(): Promise<void> }) => async () => {
    await handle.extend();
    return (await masters.keyCounts()).every((n) => n === 1);
  };
  const ready = (clients: Redis[]) => until(() => clients.every((c) => c.status === 'ready'), 10_000, 'clients to reconnect');

  beforeEach(async () => {
    masters = await RedlockMasters.start(3);
  });

  afterEach(async () => {
    jest.restoreAllMocks();
    for (const server of masters.servers) server.resume();
    await Promise.all(services.splice(0).map((s) => s.onApplicationShutdown()));
    await Promise.all(backends.splice(0).map((b) => b.close()));
    await masters.stop();
  });

  it('puts a lock won on a bare quorum back on the masters that missed it at the next extension, so one more empty restart lets nobody in', async () => {
    const warn = jest.spyOn(Logger.prototype, 'warn').mockImplementation(() => undefined);
    // Without the offline queue, A's request never reaches master 2 while it is down.
    const clients = masters.connect({ enableOfflineQueue: false });
    const a = service(clients);
    await masters.servers[2].kill();
    await until(() => clients[2].status !== 'ready', 10_000, 'the client to notice the dead master');
    const first = await a.acquire('job', { ttl: 30_000, autoExtend: false });
    expect(await masters.keyCounts()).toEqual([1, 1, -1]);
    await until(
      () => warn.mock.calls.some(([message]) => /acquire of job won on exactly a quorum \(2 of 3 masters/.test(String(message))),
      5_000,
      'the bare quorum to be logged',
    );

    await masters.servers[2].restart();
    // The extension re-creates the key where it is missing: the lock is whole again (extended
    // until the client has reconnected to the restarted master).
    await until(extendedOnEveryMaster(first), 10_000, 'an extension to put the key on every master');

    await masters.servers[0].restart();
    const clientsB = masters.connect();
    await ready(clientsB);
    expect(await service(clientsB).tryAcquire('job')).toBeUndefined();
    expect(first.isHeld).toBe(true);
    await until(extendedOnEveryMaster(first), 10_000, 'an extension to put the key back on the restarted master');
  });

  it('re-creates a key only where it is free: an extension never takes a master from another owner', async () => {
    const backend = masters.backend();
    backends.push(backend);
    const direct = masters.connect();
    expect((await backend.tryAcquire(['shared'], 'me', 30_000)).acquired).toBe(true);
    await until(async () => (await masters.keyCounts()).every((n) => n === 1), 5_000, 'the key on every master');
    await direct[0].set('shared', 'someone-else', 'PX', 30_000);
    await direct[1].del('shared');
    expect(await backend.extend(['shared'], 'me', 30_000)).toMatchObject({ extended: true });
    expect(await Promise.all(direct.map((client) => client.get('shared')))).toEqual(['someone-else', 'me', 'me']);
  });

  it('answers a refused attempt without waiting for a frozen master, and still cleans up behind it', async () => {
    const direct = masters.connect();
    await direct[0].set('busy', 'someone-else', 'PX', 60_000);
    await direct[1].set('busy', 'someone-else', 'PX', 60_000);
    const backend = new RedlockLockBackend({ clients: masters.connect(), masterTimeout: 60_000 });
    backends.push(backend);
    await backend.inspect('warm-up'); // connections are up before the freeze
    masters.servers[2].pause();
    // Two refusals decide it: the frozen master's answer cannot change the outcome.
    expect(await within(backend.tryAcquire(['busy'], 'me', 60_000), 10_000)).toEqual({ acquired: false });
    expect(await within(backend.tryAcquire(['free'], 'me', 60_000), 10_000)).toMatchObject({ acquired: true });
    expect(await within(backend.release(['free'], 'me'), 10_000)).toBe(true);
    masters.servers[2].resume();
    // The clean-up and the release queued behind the late votes removed what they set.
    await until(async () => (await direct[2].exists('busy', 'free')) === 0, 10_000, 'nothing left on the thawed master');
  });

  it('cleans up a failed attempt without announcing a release to other processes', async () => {
    const direct = masters.connect();
    await direct[0].set('taken', 'someone-else', 'PX', 30_000);
    await direct[1].set('taken', 'someone-else', 'PX', 30_000);
    const listener = masters.client(masters.servers[2]);
    const heard: string[] = [];
    listener.on('message', (_channel: string, message: string) => heard.push(message));
    await listener.subscribe('lock-released:taken');
    const backend = masters.backend();
    backends.push(backend);

    expect(await backend.tryAcquire(['taken'], 'me', 30_000)).toEqual({ acquired: false });
    await until(async () => (await direct[2].exists('taken')) === 0, 5_000, 'the clean-up on master 2');
    // Messages on one connection arrive in order: once this one is here, a clean-up's would be too.
    await direct[2].publish('lock-released:taken', 'marker');
    await until(() => heard.includes('marker'), 5_000, 'the marker message');
    expect(heard).toEqual(['marker']);
  });

  it('subscribes again to a master that was down when a waiter started watching, once it is back', async () => {
    const backend = masters.backend();
    backends.push(backend);
    await masters.servers[2].kill();
    let woken = 0;
    const stop = await backend.watch(['watched'], () => woken++);
    // The clients give up a request after one reconnect: let the SUBSCRIBE to master 2 fail.
    const subscriber = (backend as unknown as { subscriber: { connections: Redis[] } }).subscriber.connections[2];
    let reconnects = 0;
    subscriber.on('reconnecting', () => reconnects++);
    await until(() => reconnects >= 3, 10_000, 'the subscriber to retry master 2');
    await masters.servers[2].restart();
    const [, , direct] = masters.connect();
    // Only master 2 announces this release: it reaches the waiter once that master took the subscription.
    let n = 0;
    await until(
      async () => {
        await direct.publish('lock-released:watched', `owner-${n++}`);
        return woken > 0;
      },
      10_000,
      "master 2's release message",
    );
    stop();
  });

  it('shuts down while a master is frozen: its connections are dropped after masterTimeout, none left open behind', async () => {
    // Every socket the backend opens to the master about to freeze: its own client and its subscriber.
    const frozenPort = masters.servers[1].port;
    const toFrozen: Socket[] = [];
    let capturing = true;
    const connect = Socket.prototype.connect;
    jest.spyOn(Socket.prototype, 'connect').mockImplementation(function (this: Socket, ...args: unknown[]) {
      // net.createConnection() passes its normalized arguments as one array.
      const [first] = args as [unknown];
      const options = (Array.isArray(first) ? first[0] : first) as { port?: number } | undefined;
      if (capturing && options?.port === frozenPort) toFrozen.push(this);
      return (connect as (...a: unknown[]) => Socket).apply(this, args);
    });
    const backend = new RedlockLockBackend({ clients: masters.urls(), masterTimeout: 500 });
    const locks = new LockService(backend, { keyPrefix: '' });
    services.push(locks);
    const handle = await locks.acquire('shutting', { ttl: 30_000 });
    // A waiter, so the backend subscribes on every master too.
    const waiter = locks.acquire('shutting', { wait: 60_000 }).catch((error: unknown) => error);
    await until(() => toFrozen.length >= 2, 5_000, 'a client and a subscriber connected to the master');
    capturing = false; // the test's own connections, below, are not the backend's
    await until(async () => (await masters.keyCounts()).every((n) => n === 1), 5_000, 'the key on every master');
    masters.servers[1].pause();
    expect(await within(locks.onApplicationShutdown(), 15_000)).toBeUndefined();
    expect(handle.isHeld).toBe(false);
    await waiter;
    // A connection merely ended (FIN sent) to a server that never answers stays open, and ioredis
    // keeps a timer to destroy it 2 s later: the process could not exit until then.
    expect(toFrozen.map((socket) => socket.destroyed)).toEqual(toFrozen.map(() => true));
  });
});
