import { describe, expect, it, jest } from '@jest/globals';
import { Logger } from '@nestjs/common';
// @ts-expect-error: node-zookeeper-client ships no types; the tests only pass it to the fixture.
import zookeeper from 'node-zookeeper-client';
import { ZooKeeperLockBackend } from '../../lib/backends/zookeeper/zookeeper.backend.js';
import type { LockLostError } from '../../lib/lock.errors.js';
import { LockService } from '../../lib/lock.service.js';
// @ts-expect-error: a plain ESM fixture shared with the child processes, without types.
import { connectedClient } from '../fixtures/zookeeper-fenced-store.mjs';
import { until } from '../support/wait.js';
import { useZooKeeper } from '../support/zookeeper-fixture.js';

type Callback<T> = (error: (Error & { getName?(): string }) | null, value: T) => void;
interface RawClient {
  getChildren(path: string, callback: Callback<string[]>): void;
  remove(path: string, version: number, callback: Callback<void>): void;
  close(): void;
}

// tickTime 500: the longest session the server grants is 10 s, which the holders below ask for.
const fixture = useZooKeeper();
const SESSION_MS = 10_000;

function service(): LockService {
  const backend = new ZooKeeperLockBackend(fixture.connectionString, { root: fixture.root, sessionTimeout: SESSION_MS });
  const locks = new LockService(backend, { keyPrefix: '' });
  fixture.cleanup(async () => {
    await locks.onApplicationShutdown();
    await backend.close();
  });
  return locks;
}

function call<T>(send: (callback: Callback<T>) => void): Promise<T> {
  return new Promise((resolve, reject) => send((error, value) => (error ? reject(error) : resolve(value))));
}

/** An operator's session, as zkCli. */
async function operator(): Promise<RawClient> {
  const client = (await connectedClient(zookeeper, fixture.connectionString)) as RawClient;
  fixture.cleanup(() => client.close());
  return client;
}

async function line(client: RawClient, key: string): Promise<string[]> {
  return call<string[]>((cb) => client.getChildren(`${fixture.root}/${key}`, cb)).catch(() => []);
}

function quietWarnings(): void {
  const warn = jest.spyOn(Logger.prototype, 'warn').mockImplementation(() => undefined);
  fixture.cleanup(() => warn.mockRestore());
}

describe('ZooKeeper: one node of a multi-key request deleted by an operator', () => {
  it('a holder of two keys loses one: it is told, and its other key is free at once, not for the rest of its session', async () => {
    quietWarnings();
    const holder = await service().acquire(['left', 'right'], { ttl: 60_000 });
    const lost = new Promise<string>((resolve) =>
      holder.signal.addEventListener('abort', () => resolve((holder.signal.reason as LockLostError).reason), { once: true }),
    );
    const admin = await operator();
    const [node] = await line(admin, 'left');
    await call<void>((cb) => admin.remove(`${fixture.root}/left/${node}`, -1, cb));

    expect(await lost).toBe('taken');
    // Another process gets 'right' while the holder's session lives on (and would for as long as
    // the process runs): it waits for less than half the session timeout.
    const other = await service().acquire('right', { wait: SESSION_MS / 2 });
    expect(other.fencingToken).toBeGreaterThan(holder.fencingToken!);
    await other.release();
    await holder.release();
  }, 60_000);

  it('a waiter for two keys whose node in one line was deleted leaves nothing behind in the other line, and gets the lock', async () => {
    quietWarnings();
    const first = await service().acquire('a', { ttl: 60_000 });
    const waiting = service().acquire(['a', 'b'], { wait: 30_000 });
    const admin = await operator();
    await until(
      async () => (await line(admin, 'a')).length === 2 && (await line(admin, 'b')).length === 1,
      10_000,
      'the waiter in both lines',
    );
    const sorted = (await line(admin, 'a')).sort((x, y) => Number(x.slice(-10)) - Number(y.slice(-10)));
    await call<void>((cb) => admin.remove(`${fixture.root}/a/${sorted[1]}`, -1, cb));
    await first.release();

    const handle = await waiting;
    // One node per line: the waiter's place in 'b' from before went, it does not stand behind it.
    expect(await line(admin, 'b')).toHaveLength(1);
    expect(await line(admin, 'a')).toHaveLength(1);
    await handle.release();
  }, 60_000);
});
