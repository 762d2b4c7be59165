import { afterAll, beforeAll, describe, expect, it } from '@jest/globals';
import { Redis } from 'ioredis';
import { RedisServer } from './redis-server.js';

describe('the test harness redis-server', () => {
  let server: RedisServer;
  beforeAll(async () => {
    server = await RedisServer.start();
  });
  afterAll(async () => {
    await server.stop();
  });

  it('runs on its own port, not 6379, and comes back empty after a restart', async () => {
    expect(server.port).not.toBe(6379);
    const client = new Redis(server.port, '127.0.0.1', { maxRetriesPerRequest: 1, lazyConnect: true });
    await client.connect();
    await client.set('k', 'v');
    expect(await client.get('k')).toBe('v');
    await server.restart();
    expect(server.running).toBe(true);
    await expect(client.get('k')).resolves.toBeNull();
    client.disconnect();
  });
});
