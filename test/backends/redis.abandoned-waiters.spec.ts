import 'reflect-metadata';
import { describe, expect, it } from '@jest/globals';
import { Controller, Injectable, Module, Param, Post } from '@nestjs/common';
import { Test } from '@nestjs/testing';
import type { AddressInfo } from 'node:net';
import { DistributedLockModule, LockService, Locked, RedisLockBackend } from '../../lib/index.js';
import { AbandonedRequests } from '../support/http-clients.js';
import { useRedisServer } from '../support/redis-fixture.js';
import { until } from '../support/wait.js';

const fixture = useRedisServer();

@Injectable()
class Stock {
  sold = 0;

  @Locked('item:<id>')
  async buy(id: string): Promise<{ id: string }> {
    this.sold++;
    return { id };
  }
}

@Controller('items')
class ItemsController {
  constructor(private readonly stock: Stock) {}

  @Post(':id/buy')
  buy(@Param('id') id: string) {
    return this.stock.buy(id);
  }
}

describe('requests whose client hung up, on Redis', () => {
  it('leave the line in Redis, and nobody takes the lock for them', async () => {
    @Module({
      imports: [DistributedLockModule.forRoot({ backend: new RedisLockBackend(fixture.server.url), ttl: 60_000, wait: 60_000 })],
      controllers: [ItemsController],
      providers: [Stock],
    })
    class ShopModule {}
    const app = (await Test.createTestingModule({ imports: [ShopModule] }).compile()).createNestApplication();
    fixture.cleanup(() => app.close());
    await app.listen(0, '127.0.0.1');
    const locks = app.get(LockService);
    // Another instance holds the lock.
    const other = new LockService(new RedisLockBackend(fixture.server.url), { ttl: 60_000 });
    fixture.cleanup(() => other.onApplicationShutdown());
    const holder = await other.acquire('item:1');

    const clients = new AbandonedRequests((app.getHttpServer().address() as AddressInfo).port);
    clients.send('POST', '/items/1/buy', 10);
    await until(() => locks.queue.waiting === 10, 10_000, 'the requests to wait');
    await until(async () => (await fixture.admin.zcard('{lock:item:1}:queue')) >= 1, 10_000, 'a waiter in the line in Redis');
    clients.hangUp();

    await until(() => locks.queue.waiting === 0, 10_000, 'the abandoned requests to stop waiting');
    await until(
      async () => (await fixture.admin.zcard('{lock:item:1}:queue')) === 0 && (await fixture.admin.hlen('{lock:item:1}:waiters')) === 0,
      10_000,
      'the line in Redis to be empty',
    );
    await holder.release();
    expect(await fixture.admin.exists('lock:item:1')).toBe(0);
    expect(app.get(Stock).sold).toBe(0);
  });
});
