import { afterAll, afterEach, beforeAll, describe, expect, it } from '@jest/globals';
import { Redis } from 'ioredis';
import { LockHealthIndicator, LockService, RedisLockBackend } from '../../lib/index.js';
import { RedisServer } from '../support/redis-server.js';
import { eventually } from '../support/wait.js';
import { RedlockMasters } from './redlock/redlock-masters.js';

const closing: Array<() => unknown> = [];
afterEach(async () => {
  for (const close of closing.splice(0).reverse()) await close();
});

function indicatorOf(service: LockService): LockHealthIndicator {
  closing.push(() => service.onApplicationShutdown());
  return new LockHealthIndicator(service);
}

describe('LockHealthIndicator on Redis', () => {
  let server: RedisServer;
  beforeAll(async () => {
    server = await RedisServer.start();
  });
  afterAll(() => server.stop());

  it("is up with the server's role and the latency", async () => {
    const indicator = indicatorOf(new LockService(new RedisLockBackend(server.url)));
    expect(await indicator.isHealthy('locks')).toEqual({
      locks: { status: 'up', backend: 'redis', role: 'master', latencyMs: expect.any(Number) },
    });
  });

  it('is down when the server stops answering (paused), within the timeout', async () => {
    const indicator = indicatorOf(new LockService(new RedisLockBackend(server.url)));
    await indicator.isHealthy();
    server.pause();
    closing.push(() => server.resume());
    expect(await indicator.isHealthy('locks', { timeout: 300 })).toEqual({
      locks: { status: 'down', backend: 'redis', message: 'the redis backend did not answer within 300 ms' },
    });
    // Up again once it answers; and no command is left in flight when the test ends.
    server.resume();
    await eventually(async () => expect(await indicator.isHealthy()).toMatchObject({ locks: { status: 'up' } }), 10_000);
  });

  it('is down on a replica, which cannot take the locks’ writes', async () => {
    const replica = await RedisServer.start();
    closing.push(() => replica.stop());
    const admin = new Redis(replica.port, '127.0.0.1');
    closing.push(() => admin.disconnect());
    await admin.call('REPLICAOF', '127.0.0.1', String(server.port));
    const indicator = indicatorOf(new LockService(new RedisLockBackend(replica.url)));
    expect(await indicator.isHealthy()).toEqual({
      locks: expect.objectContaining({ status: 'down', role: 'slave', message: expect.stringContaining('locks need a master') }),
    });
  });
});

describe('LockHealthIndicator on Redlock', () => {
  it('reports masters up against the quorum: up while a quorum answers, down below it', async () => {
    const masters = await RedlockMasters.start(3);
    closing.push(() => masters.stop());
    const indicator = indicatorOf(new LockService(masters.backend()));
    expect(await indicator.isHealthy()).toEqual({
      locks: { status: 'up', backend: 'redlock', latencyMs: expect.any(Number), mastersUp: 3, masters: 3, quorum: 2, down: [] },
    });

    await masters.servers[0].kill();
    await eventually(async () => {
      expect(await indicator.isHealthy()).toMatchObject({ locks: { status: 'up', mastersUp: 2, masters: 3, quorum: 2 } });
    }, 10_000);

    await masters.servers[1].kill();
    await eventually(async () => {
      expect(await indicator.isHealthy()).toMatchObject({ locks: { status: 'down', backend: 'redlock' } });
    }, 10_000);
  });
});
