import 'reflect-metadata';
import { afterEach, describe, expect, it } from '@jest/globals';
import { Controller, Injectable, Module, Param, Post, Sse, type INestApplication, type MessageEvent } from '@nestjs/common';
import { FastifyAdapter } from '@nestjs/platform-fastify';
import { Test } from '@nestjs/testing';
import type { AddressInfo } from 'node:net';
import { Observable, of } from 'rxjs';
import {
  DistributedLockModule,
  InvalidLockOptionsError,
  LockNotAcquiredError,
  LockService,
  Locked,
  MemoryLockBackend,
  withLockAbortSignal,
} from '../lib/index.js';
import { AbandonedRequests } from './support/http-clients.js';
import { activeTimers, until } from './support/wait.js';
import { ErrorLog } from './support/error-log.js';

@Injectable()
class Stock {
  sold = 0;

  @Locked('item:<id>')
  async buy(id: string): Promise<{ id: string; sold: number }> {
    return { id, sold: ++this.sold };
  }
}

@Controller('items')
class ItemsController {
  constructor(private readonly stock: Stock) {}

  @Post(':id/buy')
  buy(@Param('id') id: string) {
    return this.stock.buy(id);
  }

  /** A stream that takes the lock when subscribed: its wait ends with the request too. */
  @Sse(':id/feed')
  @Locked('item:<id>')
  feed(@Param('id') id: string): Observable<MessageEvent> {
    this.stock.sold++;
    return of({ data: { id } });
  }
}

@Module({ imports: [DistributedLockModule.forRoot({ ttl: 60_000, wait: 60_000 })], controllers: [ItemsController], providers: [Stock] })
class ShopModule {}

const apps: INestApplication[] = [];
afterEach(async () => {
  await Promise.all(apps.splice(0).map((app) => app.close()));
});

async function start(platform: 'express' | 'fastify'): Promise<{ app: INestApplication; port: number; log: ErrorLog }> {
  const moduleRef = await Test.createTestingModule({ imports: [ShopModule] }).compile();
  const app = platform === 'fastify' ? moduleRef.createNestApplication(new FastifyAdapter()) : moduleRef.createNestApplication();
  const log = new ErrorLog();
  app.useLogger(log);
  apps.push(app);
  await app.listen(0, '127.0.0.1');
  return { app, port: (app.getHttpServer().address() as AddressInfo).port, log };
}

describe.each(['express', 'fastify'] as const)('requests whose client hung up (%s)', (platform) => {
  it('stop waiting for the lock at once, leave the queue, and never run', async () => {
    const { app, port, log } = await start(platform);
    const locks = app.get(LockService);
    const stock = app.get(Stock);
    const holder = await locks.acquire('item:1');

    const clients = new AbandonedRequests(port);
    clients.send('POST', '/items/1/buy', 20);
    await until(() => locks.queue.waiting === 20, 10_000, 'all 20 requests to wait for the lock');
    clients.hangUp();
    await until(() => locks.queue.waiting === 0, 10_000, 'the abandoned requests to stop waiting');

    await holder.release();
    // The lock is free and nobody took it on behalf of a client that left.
    expect(await locks.isLocked('item:1')).toBe(false);
    expect(stock.sold).toBe(0);
    expect(clients.answered).toEqual([]);
    expect(log.errors).toEqual([]);
  });

  it('a request that stays gets the lock as usual once it is free', async () => {
    const { app, port } = await start(platform);
    const locks = app.get(LockService);
    const holder = await locks.acquire('item:2');
    const answer = fetch(`http://127.0.0.1:${port}/items/2/buy`, { method: 'POST' });
    await until(() => locks.queue.waiting === 1, 10_000, 'the request to wait');
    await holder.release();
    const response = await answer;
    expect(response.status).toBe(201);
    expect(await response.json()).toEqual({ id: '2', sold: 1 });
  });

  it('a stream whose client hung up stops waiting too', async () => {
    const { app, port } = await start(platform);
    const locks = app.get(LockService);
    const stock = app.get(Stock);
    const holder = await locks.acquire('item:3');
    const clients = new AbandonedRequests(port);
    clients.send('GET', '/items/3/feed', 3);
    await until(() => locks.queue.waiting === 3, 10_000, 'the streams to wait for the lock');
    clients.hangUp();
    await until(() => locks.queue.waiting === 0, 10_000, 'the abandoned streams to stop waiting');
    await holder.release();
    expect(stock.sold).toBe(0);
  });
});

describe('an abort signal', () => {
  it('ends a using() wait: the call rejects with its reason, fn never runs, nothing is left', async () => {
    const locks = new LockService(new MemoryLockBackend());
    const holder = await locks.acquire('job');
    const timersBefore = activeTimers();
    const controller = new AbortController();
    let ran = false;
    const waiting = locks.using('job', () => (ran = true), { wait: 60_000, signal: controller.signal });
    await until(() => locks.queue.waiting === 1, 5_000, 'the call to wait');
    const reason = new Error('job cancelled');
    controller.abort(reason);
    await expect(waiting).rejects.toBe(reason);
    expect(ran).toBe(false);
    expect(locks.queue.waiting).toBe(0);
    expect(activeTimers()).toBe(timersBefore);
    await holder.release();
    expect(await locks.isLocked('job')).toBe(false);
  });

  it('given through withLockAbortSignal ends every wait started inside, @Locked ones included', async () => {
    const moduleRef = await Test.createTestingModule({ imports: [ShopModule] }).compile();
    const app = moduleRef.createNestApplication();
    apps.push(app);
    await app.init();
    const locks = app.get(LockService);
    const stock = app.get(Stock);
    const holder = await locks.acquire('item:4');
    const controller = new AbortController();
    const calls = withLockAbortSignal(controller.signal, () => [stock.buy('4'), locks.using('item:4', () => 'ran')]);
    await until(() => locks.queue.waiting === 2, 5_000, 'both calls to wait');
    controller.abort();
    const results = await Promise.allSettled(calls);
    expect(results.map((r) => r.status)).toEqual(['rejected', 'rejected']);
    expect((results[0] as PromiseRejectedResult).reason).toMatchObject({ name: 'AbortError' });
    expect(locks.queue.waiting).toBe(0);
    // Outside the scope, waits are not affected.
    await holder.release();
    await expect(stock.buy('4')).resolves.toEqual({ id: '4', sold: 1 });
  });

  it('cannot be fixed on @Locked: start-up says how a decorated method stops waiting instead', async () => {
    @Injectable()
    class Jobs {
      @Locked('job', { signal: new AbortController().signal } as never)
      async run(): Promise<void> {}
    }
    const moduleRef = await Test.createTestingModule({ imports: [DistributedLockModule.forRoot()], providers: [Jobs] }).compile();
    const app = moduleRef.createNestApplication();
    apps.push(app);
    const failure = await app.init().then(
      () => undefined,
      (error: unknown) => error,
    );
    expect(failure).toBeInstanceOf(InvalidLockOptionsError);
    expect(String(failure)).toContain('withLockAbortSignal');
  });
});

describe('caps on waiters', () => {
  it('answer busy at once beyond maxWaitersPerKey and maxWaiters, and free their places when waiters leave', async () => {
    const locks = new LockService(new MemoryLockBackend(), { maxWaitersPerKey: 2, maxWaiters: 3, wait: 60_000 });
    const holders = [await locks.acquire('a'), await locks.acquire('b'), await locks.acquire('c')];
    const waiting = [locks.acquire('a'), locks.acquire(['a', 'b'])];
    await until(() => locks.queue.waiting === 2, 5_000, 'two waiters on a');

    const third = await locks.acquire('a').catch((error: unknown) => error);
    expect(third).toBeInstanceOf(LockNotAcquiredError);
    expect(third).toMatchObject({ queueFull: 'perKey', waitedMs: 0 });
    expect(String(third)).toContain('maxWaitersPerKey');
    // One try without waiting is no waiter: it still gets its honest answer.
    expect(await locks.tryAcquire('a')).toBeUndefined();

    waiting.push(locks.acquire('c'));
    await until(() => locks.queue.waiting === 3, 5_000, 'a third waiter, on c');
    await expect(locks.acquire('d')).rejects.toMatchObject({ queueFull: 'total' });
    expect(await locks.isLocked('d')).toBe(false);

    for (const holder of holders) await holder.release();
    await Promise.all(waiting.map((p) => p.then((handle) => handle.release())));
    expect(locks.queue.waiting).toBe(0);
    // Places are given back: two new waiters fit again.
    const again = await locks.acquire('a');
    const next = [locks.acquire('a'), locks.acquire('a')];
    await until(() => locks.queue.waiting === 2, 5_000, 'two new waiters');
    await again.release();
    await Promise.all(next.map((p) => p.then((handle) => handle.release())));
  });

  it('are checked as options: a cap must be a positive integer', () => {
    expect(() => new LockService(new MemoryLockBackend(), { maxWaitersPerKey: 0 })).toThrow(InvalidLockOptionsError);
    expect(() => new LockService(new MemoryLockBackend(), { maxWaiters: 1.5 })).toThrow(/maxWaiters' must be a positive integer/);
  });
});
