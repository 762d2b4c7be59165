import { afterAll, beforeAll } from '@jest/globals';
import { Redis } from 'ioredis';
import { RedisLockBackend } from '../../lib/backends/redis/redis.backend.js';
import { describeBackendConformance } from '../conformance/lock-backend.conformance.js';
import { RedisServer } from '../support/redis-server.js';

let server: RedisServer;
let admin: Redis;

beforeAll(async () => {
  server = await RedisServer.start();
  admin = new Redis(server.port, '127.0.0.1');
});

afterAll(async () => {
  admin.disconnect();
  await server.stop();
});

describeBackendConformance('redis', {
  // Each "process" gets a backend over a client of its own, created from the URL and closed by it.
  // The suite's wake-up test polls once a minute: its waiters must keep their place that long.
  connect: async () => new RedisLockBackend(server.url, { waiterTimeout: 120_000 }),
  reset: async () => void (await admin.flushall()),
});
