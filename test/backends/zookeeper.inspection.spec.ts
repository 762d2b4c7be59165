import { describe, expect, it } from '@jest/globals';
import { fork, type ChildProcess } from 'node:child_process';
import { resolve } from 'node:path';
// @ts-expect-error: node-zookeeper-client ships no types; the test only passes it to the fixture.
import zookeeper from 'node-zookeeper-client';
import { InvalidLockOptionsError } from '../../lib/lock.errors.js';
import { ZooKeeperLockBackend } from '../../lib/backends/zookeeper/zookeeper.backend.js';
import { LockService } from '../../lib/lock.service.js';
// @ts-expect-error: a plain ESM fixture shared with the child processes, without types.
import { connectedClient } from '../fixtures/zookeeper-fenced-store.mjs';
import { previousRelease } from '../support/previous-release.js';
import { eventually, until } from '../support/wait.js';
import { useZooKeeper } from '../support/zookeeper-fixture.js';

/**
 * Who holds and waits on ZooKeeper (each node's data), where the conformance suite cannot see it:
 * when a waiter went in, a permit caller's mark, nodes of the release before who holds (no data, or
 * its mark), and a process of that release waiting, taking and handing back beside this one.
 */
const fixture = useZooKeeper();

function backend(): ZooKeeperLockBackend {
  const created = new ZooKeeperLockBackend(fixture.connectionString, { root: fixture.root, sessionTimeout: 4_000 });
  fixture.cleanup(() => created.close());
  return created;
}

const a = { instance: 'web-1', site: 'Orders.pay' };
const b = { instance: 'web-2', site: 'Refunds.issue' };
const c = { instance: 'worker-3' };

/** A raw client of the test's own, for nodes as another release makes them. */
async function raw(): Promise<(method: string, ...args: unknown[]) => Promise<unknown[]>> {
  const client = await connectedClient(zookeeper, fixture.connectionString);
  fixture.cleanup(() => client.close());
  return (method, ...args) =>
    new Promise((resolve, reject) =>
      client[method](...args, (error: unknown, ...results: unknown[]) => (error ? reject(error) : resolve(results))),
    );
}

describe('ZooKeeper: who holds and waits', () => {
  it('a waiter that goes in keeps its name, and tells when it went in, not when it joined the line', async () => {
    const one = backend();
    const two = backend();
    expect((await one.tryAcquire(['k'], 'owner-a', 30_000, { holder: a })).acquired).toBe(true);
    expect((await two.tryAcquire(['k'], 'owner-b', 30_000, { holder: b })).acquired).toBe(false);
    const [waiter] = (await one.inspect('k'))!.waiters!;
    expect(waiter).toEqual({ owner: 'owner-b', ...b, waitingSince: expect.any(Number) });
    // Apart on the server's clock, which counts in ms.
    await until(async () => Date.now() > waiter.waitingSince! + 50, 5_000, 'time to pass');
    await one.release(['k'], 'owner-a');
    const released = Date.now();
    expect((await two.tryAcquire(['k'], 'owner-b', 30_000, { holder: b })).acquired).toBe(true);
    const state = (await one.inspect('k'))!;
    expect(state.holders).toEqual([
      { owner: 'owner-b', ...b, ttlMs: expect.any(Number), fencingToken: expect.any(Number), acquiredAt: expect.any(Number) },
    ]);
    expect(state.holders![0].acquiredAt).toBeGreaterThan(waiter.waitingSince! + 40);
    expect(state.holders![0].acquiredAt).toBeGreaterThanOrEqual(released - 1_000);
    expect(state.waiters).toEqual([]);
  });

  it('a permit caller in on one key while it waits for another keeps its name there when it marks its node for the one behind', async () => {
    const one = backend();
    const two = backend();
    // owner-a holds both permits of x and 'y'; owner-b gets a permit of x at once and waits for y.
    expect((await one.tryAcquire(['y'], 'owner-a', 30_000, { holder: a })).acquired).toBe(true);
    expect((await two.tryAcquire(['x', 'y'], 'owner-b', 30_000, { holder: b, limits: [2, 1] })).acquired).toBe(false);
    // A permit caller right behind it on x: owner-b marks its node on x (it is in there).
    expect((await one.tryAcquire(['x'], 'owner-c', 30_000, { holder: c, limits: [2] })).acquired).toBe(true);
    expect((await two.tryAcquire(['x', 'y'], 'owner-b', 30_000, { holder: b, limits: [2, 1] })).acquired).toBe(false);
    const x = (await one.inspect('x'))!;
    expect(x.limit).toBe(2);
    expect(x.holders!.map(({ owner, instance, site }) => ({ owner, instance, site }))).toEqual([
      { owner: 'owner-b', ...b },
      { owner: 'owner-c', ...c, site: undefined },
    ]);
  });

  it('a caller of the backend that passes names longer than LockService allows is refused before anything is made', async () => {
    const one = backend();
    const tooLong = { instance: '€'.repeat(300), site: 'x' };
    await expect(one.tryAcquire(['k'], 'owner-a', 30_000, { holder: tooLong })).rejects.toThrow(InvalidLockOptionsError);
    await expect(one.tryAcquire(['k'], 'owner-a', 30_000, { holder: tooLong })).rejects.toThrow(
      /zookeeper backend stores an identity \(instance and site\) of at most 769 bytes, got 902/,
    );
    expect(await one.list({ prefix: '', limit: 10 })).toEqual({ keys: [] });
  });

  it("nodes of the release before who holds (no data, or its permit mark 'in') show without a name or a time in", async () => {
    const call = await raw();
    const one = backend();
    // The line of key 'old', as that release makes it: a node without data, then a marked permit node.
    expect((await one.tryAcquire(['old'], 'owner-new', 30_000, { holder: a, limits: [2], willWait: false })).acquired).toBe(true);
    await one.release(['old'], 'owner-new');
    const parent = `${fixture.root}/old`;
    const ephemeralSequential = 3;
    const [first] = (await call('create', `${parent}/owner-old.permits2-`, null, zookeeper.ACL.OPEN_ACL_UNSAFE, ephemeralSequential)) as [
      string,
    ];
    const [second] = (await call('create', `${parent}/owner-mark.permits2-`, null, zookeeper.ACL.OPEN_ACL_UNSAFE, ephemeralSequential)) as [
      string,
    ];
    await call('setData', second, Buffer.from('in'), -1);
    const state = (await one.inspect('old'))!;
    expect(state.holders).toEqual([
      { owner: 'owner-old', ttlMs: expect.any(Number), fencingToken: expect.any(Number) },
      { owner: 'owner-mark', ttlMs: expect.any(Number), fencingToken: expect.any(Number) },
    ]);
    await call('remove', first, -1);
    await call('remove', second, -1);
  });

  it('a process of the release before who holds waits for, takes from and hands back to a process of this one', async () => {
    const locks = new LockService(backend(), { keyPrefix: 'fault:', instance: 'new-1' });
    fixture.cleanup(() => locks.onApplicationShutdown());
    const observer = backend();
    const held = await locks.acquire('k', { site: 'Jobs.run' });
    const messages: { type: string }[] = [];
    const old: ChildProcess = fork(
      resolve(import.meta.dirname, '../fixtures/zookeeper-lock-waiter.mjs'),
      [fixture.connectionString, fixture.root, 'k', '4000', '30000'],
      { env: { ...process.env, LOCK_LIBRARY: previousRelease('release-before-identity').entry }, stdio: 'inherit' },
    );
    old.on('message', (message: { type: string }) => messages.push(message));
    fixture.cleanup(() => old.kill('SIGKILL'));
    await eventually(async () => expect((await observer.inspect('fault:k'))!.waiters).toHaveLength(1), 20_000);
    const [oldWaiter] = (await observer.inspect('fault:k'))!.waiters!;
    expect(oldWaiter.instance).toBeUndefined();
    expect(oldWaiter.waitingSince).toEqual(expect.any(Number));

    await held.release();
    await until(() => messages.some((m) => m.type === 'acquired'), 20_000, 'the older process to take the key');
    const taken = (await observer.inspect('fault:k'))!;
    expect(taken.holders).toEqual([{ owner: taken.owner, ttlMs: expect.any(Number), fencingToken: expect.any(Number) }]);

    // Back to this release: named in line, then as the holder.
    const again = locks.acquire('k', { site: 'Jobs.again' });
    await eventually(async () => expect((await observer.inspect('fault:k'))!.waiters?.map((w) => w.site)).toEqual(['Jobs.again']), 20_000);
    old.send({ type: 'release' });
    const handle = await again;
    expect((await observer.inspect('fault:k'))!.holders).toEqual([
      expect.objectContaining({ instance: 'new-1', site: 'Jobs.again', acquiredAt: expect.any(Number) }),
    ]);
    await handle.release();
    await until(() => messages.some((m) => m.type === 'released'), 20_000, 'the older process to shut down');
  }, 90_000);
});
