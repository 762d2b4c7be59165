import 'reflect-metadata';
import { afterEach, describe, expect, it } from '@jest/globals';
import { Injectable, Module, type DynamicModule, type INestApplication, type Type } from '@nestjs/common';
import { Test } from '@nestjs/testing';
import {
  DistributedLockModule,
  InvalidLockOptionsError,
  LockNotAcquiredError,
  LockService,
  Locked,
  type LockHandle,
} from '../../lib/index.js';
import { until } from '../support/wait.js';

// Nest users import modules per feature: each feature module importing DistributedLockModule must
// still share one lock registry with the others, in a fresh app as a team would build it.

function gate(): { opened: Promise<void>; open: () => void } {
  let open!: () => void;
  const opened = new Promise<void>((resolve) => (open = resolve));
  return { opened, open };
}

@Injectable()
class Orders {
  /** What locks.current() saw inside the @Locked method. */
  seen: LockHandle | undefined;
  constructor(readonly locks: LockService) {}

  @Locked('stock:<id>')
  async reserve(id: number, until: Promise<void>): Promise<void> {
    this.seen = this.locks.current();
    await until;
  }

  /** The same key as reserve(), in the same class, through the service. */
  adjust(id: number): Promise<string> {
    return this.locks.using(`stock:${id}`, () => 'adjusted', { wait: 0 });
  }
}

@Injectable()
class Stock {
  constructor(readonly locks: LockService) {}
  count(id: number): Promise<string> {
    return this.locks.using(`stock:${id}`, () => 'counted', { wait: 0 });
  }
}

function featureModules(lockImport?: () => DynamicModule): { imports: Type[] } {
  @Module({ imports: lockImport ? [lockImport()] : [], providers: [Orders], exports: [Orders] })
  class OrdersModule {}
  @Module({ imports: lockImport ? [lockImport()] : [], providers: [Stock], exports: [Stock] })
  class StockModule {}
  return { imports: [OrdersModule, StockModule] };
}

let app: INestApplication | undefined;
afterEach(async () => {
  await app?.close();
  app = undefined;
});

async function start(root: Type): Promise<INestApplication> {
  const moduleRef = await Test.createTestingModule({ imports: [root] }).compile();
  app = moduleRef.createNestApplication({ logger: false });
  await app.init();
  return app;
}

/** One registry: the same service everywhere, current() inside @Locked, and every path to a key excludes the others. */
async function expectOneRegistry(started: INestApplication): Promise<void> {
  const orders = started.get(Orders);
  const stock = started.get(Stock);
  expect(orders.locks).toBe(stock.locks);
  const { opened, open } = gate();
  const reserving = orders.reserve(1, opened);
  await until(() => orders.seen !== undefined, 5_000, 'the @Locked method to start');
  expect(orders.seen?.keys).toEqual(['lock:stock:1']);
  await expect(orders.adjust(1)).rejects.toBeInstanceOf(LockNotAcquiredError);
  await expect(stock.count(1)).rejects.toBeInstanceOf(LockNotAcquiredError);
  open();
  await reserving;
  await expect(orders.adjust(1)).resolves.toBe('adjusted');
  await expect(stock.count(1)).resolves.toBe('counted');
}

describe('DistributedLockModule imported by several modules of one application', () => {
  it('forRoot() in two feature modules: one LockService, @Locked and using() on one key exclude each other', async () => {
    @Module(featureModules(() => DistributedLockModule.forRoot()))
    class AppModule {}
    await expectOneRegistry(await start(AppModule));
  });

  it('forRootAsync in two feature modules with the same options: one LockService', async () => {
    @Module(featureModules(() => DistributedLockModule.forRootAsync({ useFactory: () => ({ keyPrefix: 'lock:', ttl: 5_000 }) })))
    class AppModule {}
    await expectOneRegistry(await start(AppModule));
  });

  it('forRootAsync with isGlobal in the root module: feature modules share it', async () => {
    const features = featureModules();
    @Module({
      imports: [DistributedLockModule.forRootAsync({ isGlobal: true, useFactory: async () => ({ wait: 2_000 }) }), ...features.imports],
    })
    class AppModule {}
    await expectOneRegistry(await start(AppModule));
  });

  it('different options in two feature modules fail start-up, naming the modules and what to change', async () => {
    @Module({ imports: [DistributedLockModule.forRoot({ keyPrefix: 'orders:' })], providers: [Orders] })
    class OrdersModule {}
    @Module({ imports: [DistributedLockModule.forRoot({ keyPrefix: 'stock:' })], providers: [Stock] })
    class StockModule {}
    @Module({ imports: [OrdersModule, StockModule] })
    class AppModule {}
    const failure = await start(AppModule).catch((error: unknown) => error);
    expect(failure).toBeInstanceOf(InvalidLockOptionsError);
    expect((failure as InvalidLockOptionsError).option).toBe('keyPrefix');
    const message = (failure as Error).message;
    expect(message).toContain('OrdersModule');
    expect(message).toContain('StockModule');
    expect(message).toContain('(keyPrefix)');
    expect(message).toContain('isGlobal: true');
  });
});
