import { afterAll, afterEach, beforeAll, beforeEach, describe, expect, it } from '@jest/globals';
import { Injectable, Module } from '@nestjs/common';
import { Test } from '@nestjs/testing';
import type { Redis } from 'ioredis';
import 'reflect-metadata';
import { RedlockLockBackend } from '../../../lib/backends/redlock/redlock.backend.js';
import { DistributedLockModule } from '../../../lib/distributed-lock.module.js';
import { LockService } from '../../../lib/lock.service.js';
import { Locked } from '../../../lib/locked.decorator.js';
import { until } from '../../support/wait.js';
import { RedlockMasters } from './redlock-masters.js';

/** How the backend drives the redlock package: one quorum round per call, ours the rest. */
describe('redlock backend', () => {
  let masters: RedlockMasters;
  let direct: Redis[];
  let backend: RedlockLockBackend;

  beforeAll(async () => {
    masters = await RedlockMasters.start(3);
  }, 30_000);

  afterAll(() => masters.stop());

  beforeEach(() => {
    direct = masters.connect();
    backend = masters.backend();
  });

  afterEach(async () => {
    await backend.close();
    masters.disconnect();
    await masters.flush();
  });

  const scriptCalls = () =>
    Promise.all(
      direct.map(async (client) => {
        const stats = await client.info('commandstats');
        const calls = (name: string) => Number(new RegExp(`cmdstat_${name}:calls=(\\d+)`).exec(stats)?.[1] ?? 0);
        return calls('evalsha');
      }),
    );

  it('makes one request per master for a busy key: no retries inside the package', async () => {
    await backend.release(['warm'], 'nobody'); // loads the scripts
    expect((await backend.tryAcquire(['warm'], 'w', 1_000)).acquired).toBe(true);
    // A won round returns at a majority: let the last master's vote land before counting.
    await until(
      async () => (await Promise.all(direct.map((client) => client.exists('warm')))).every((n) => n === 1),
      5_000,
      'every master to take the warm-up lock',
    );
    await Promise.all(direct.map((client) => client.set('busy', 'someone-else', 'PX', 30_000)));
    const before = await scriptCalls();
    expect(await backend.tryAcquire(['busy'], 'me', 30_000)).toEqual({ acquired: false });
    const after = await scriptCalls();
    expect(after.map((n, i) => n - before[i])).toEqual([1, 1, 1]);
  });

  it('takes back what it set on a minority when the quorum says no', async () => {
    await direct[0].set('split', 'someone-else', 'PX', 30_000);
    await direct[1].set('split', 'someone-else', 'PX', 30_000);
    expect(await backend.tryAcquire(['split'], 'me', 30_000)).toEqual({ acquired: false });
    await until(async () => (await direct[2].exists('split')) === 0, 5_000, 'the clean-up on master 2');
  });

  it('reports the validity Redlock allows: the ttl less the clock drift, counted from the request', async () => {
    const result = await backend.tryAcquire(['valid'], 'me', 10_000);
    expect(result.acquired).toBe(true);
    // driftFactor 0.01 of 10 000 ms, plus 2 ms for Redis expiry precision.
    expect(result.acquired && result.validityMs).toBeCloseTo(10_000 - 100 - 2, 6);
    const extended = await backend.extend(['valid'], 'me', 20_000);
    expect(extended.extended && extended.validityMs).toBeCloseTo(20_000 - 200 - 2, 6);

    const service = new LockService(backend, { keyPrefix: '' });
    const sentBefore = Date.now();
    const handle = await service.acquire('handle', { ttl: 10_000, autoExtend: false });
    expect(handle.expiresAt.getTime()).toBeLessThanOrEqual(Date.now() + 10_000 - 102 + 1);
    expect(handle.expiresAt.getTime()).toBeGreaterThanOrEqual(sentBefore + 10_000 - 102 - 1_000);
    expect(handle.fencingToken).toBeUndefined();
    await handle.release();
  });

  it('inspects a lock as held only where a quorum holds it', async () => {
    expect((await backend.tryAcquire(['seen'], 'me', 30_000)).acquired).toBe(true);
    await direct[0].pexpire('seen', 5_000);
    const state = await backend.inspect('seen');
    expect(state?.owner).toBe('me');
    expect(state?.fencingToken).toBeUndefined();
    // The lock lasts while two of three masters keep it: the second-longest remaining lease.
    expect(state!.ttlMs).toBeGreaterThan(5_000);
    expect(state!.ttlMs).toBeLessThanOrEqual(30_000);

    await direct[0].set('minority', 'stray', 'PX', 30_000);
    expect(await backend.inspect('minority')).toBeUndefined();
  });

  it('releases what it holds even where the key already expired on some masters', async () => {
    expect((await backend.tryAcquire(['partly', 'gone'], 'me', 30_000)).acquired).toBe(true);
    await direct[0].del('partly', 'gone');
    await direct[1].del('partly');
    expect(await backend.release(['partly', 'gone'], 'me')).toBe(true);
    expect(await masters.keyCounts()).toEqual([0, 0, 0]);
    expect(await backend.release(['partly', 'gone'], 'me')).toBe(false);
  });

  it('takes a release message, which any client of a master can publish, for a wake-up only', async () => {
    expect((await backend.tryAcquire(['woken'], 'holder', 30_000)).acquired).toBe(true);
    let woken = 0;
    const stop = await backend.watch(['woken'], () => woken++);
    await Promise.all(direct.map((client) => client.publish('lock-released:woken', 'forged')));
    await until(() => woken === 1, 5_000, 'the forged message to wake the waiter');
    stop();
    // The woken waiter asks the masters again: they still say another owner holds the key.
    expect(await backend.tryAcquire(['woken'], 'waiter', 30_000)).toEqual({ acquired: false });
  });

  it('runs @Locked in a Nest app built from URLs, and closes the connections it opened on shutdown', async () => {
    @Injectable()
    class Jobs {
      constructor(readonly locks: LockService) {}

      @Locked('job:<name>', { wait: 0 })
      async run(name: string) {
        return { name, held: await this.locks.isLocked(`job:${name}`), token: this.locks.current()!.fencingToken };
      }
    }
    @Module({
      imports: [DistributedLockModule.forRoot({ backend: new RedlockLockBackend({ clients: masters.urls(), masterTimeout: 2_000 }) })],
      providers: [Jobs],
    })
    class AppModule {}

    const connections = async () => Number(/connected_clients:(\d+)/.exec(await direct[0].info('clients'))![1]);
    const before = await connections();
    const app = await Test.createTestingModule({ imports: [AppModule] }).compile();
    await app.init();
    expect(await app.get(Jobs).run('nightly')).toEqual({ name: 'nightly', held: true, token: undefined });
    expect(await connections()).toBeGreaterThan(before);
    await app.close();
    await until(async () => (await connections()) === before, 5_000, 'the connections the backend opened to close');
    expect(await masters.keyCounts()).toEqual([0, 0, 0]);
  });
});
