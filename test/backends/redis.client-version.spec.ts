import { describe, expect, it } from '@jest/globals';
import { Redis } from 'ioredis';
import { createRequire } from 'node:module';
import { LockService, RedisLockBackend } from '../../lib/index.js';
import { useRedisServer } from '../support/redis-fixture.js';

// Each Jest project runs the Redis files on one ioredis major (jest.config.js maps 'ioredis' to
// it); this shows which major a project really ran, as the backend's own client uses it.
const expectedMajor = (globalThis as { expectedIoredisMajor?: number }).expectedIoredisMajor;
const version = (createRequire(import.meta.url)('ioredis/package.json') as { version: string }).version;

const fixture = useRedisServer();

describe(`the ioredis package the Redis tests run on (${version})`, () => {
  it('is the major this Jest project is configured for', () => {
    expect(expectedMajor).toBeDefined();
    expect(Number(version.split('.')[0])).toBe(expectedMajor);
  });

  it('is the one the backend creates its client from, and that client reports its version', async () => {
    const sent: string[][] = [];
    const sendCommand = Redis.prototype.sendCommand;
    Redis.prototype.sendCommand = function (this: Redis, command, stream) {
      sent.push([command.name, ...command.args.map(String)]);
      return sendCommand.call(this, command, stream);
    };
    const locks = new LockService(new RedisLockBackend(fixture.server.url));
    try {
      const lock = await locks.acquire('version-check');
      await lock.release();
    } finally {
      Redis.prototype.sendCommand = sendCommand;
      await locks.onApplicationShutdown();
    }
    // The acquisition went through this package's Redis class, not another copy of ioredis.
    expect(sent.some(([name]) => name === 'evalsha' || name === 'eval')).toBe(true);
    // On connect the client announces its version to the server (CLIENT SETINFO LIB-VER).
    const announced = sent.find(
      ([name, sub, field]) => name === 'client' && sub?.toUpperCase() === 'SETINFO' && field?.toUpperCase() === 'LIB-VER',
    );
    expect(announced?.[3]).toBe(version);
  });
});
