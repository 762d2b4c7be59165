import 'reflect-metadata';
import { describe, expect, it } from '@jest/globals';
import { Controller, Inject, Injectable, Module, Post, UseInterceptors } from '@nestjs/common';
import { Test } from '@nestjs/testing';
import request from 'supertest';
import {
  DistributedLockModule,
  InvalidLockOptionsError,
  LockInterceptor,
  type DistributedLockModuleOptions,
  type DistributedLockOptionsFactory,
  LockBackend,
  LockService,
  Locked,
  MemoryLockBackend,
  type AcquireResult,
  type ExtendResult,
  type LockState,
} from '../lib/index.js';

/** A backend that records the order of release and close, as a Redis client would see them. */
class RecordingBackend extends MemoryLockBackend {
  readonly events: string[] = [];
  override async release(keys: readonly string[], owner: string): Promise<boolean> {
    this.events.push(`release ${keys.join(',')}`);
    return super.release(keys, owner);
  }
  override async close(): Promise<void> {
    this.events.push('close');
  }
}

@Injectable()
class Jobs {
  constructor(readonly locks: LockService) {}
  @Locked('job:<name>')
  async run(name: string) {
    return this.locks.current()!.keys;
  }
}

@Injectable()
class Reports {
  @Locked('job:<name>', { wait: 0 })
  async run(name: string) {
    return name;
  }
}

@Controller('jobs')
class JobsController {
  constructor(private readonly reports: Reports) {}
  @Post('report')
  report() {
    return this.reports.run('report');
  }
}

/** Options from a class, as `useClass` and `useExisting` take them. */
@Injectable()
class LockOptionsFromClass implements DistributedLockOptionsFactory {
  async createDistributedLockOptions(): Promise<DistributedLockModuleOptions> {
    return { keyPrefix: 'from-class:', ttl: 7_000 };
  }
}

/** Busy from the start: whatever status a request gets is the interceptor's doing (or its absence). */
async function statusWhileBusy(module: unknown): Promise<number> {
  const app = (await Test.createTestingModule({ imports: [module as never] }).compile()).createNestApplication({ logger: false });
  await app.init();
  const held = await app.get(LockService).acquire('job:report');
  const { status } = await request(app.getHttpServer()).post('/jobs/report');
  await held.release();
  await app.close();
  return status;
}

describe('DistributedLockModule', () => {
  it('forRoot() with no arguments gives an in-memory LockService and LockBackend', async () => {
    @Module({ imports: [DistributedLockModule.forRoot()], providers: [Jobs] })
    class AppModule {}
    const app = await Test.createTestingModule({ imports: [AppModule] }).compile();
    await app.init();
    expect(app.get(LockBackend)).toBeInstanceOf(MemoryLockBackend);
    expect(app.get(LockService).options).toMatchObject({ keyPrefix: 'lock:', ttl: 30_000, wait: 10_000 });
    expect(await app.get(Jobs).run('report')).toEqual(['lock:job:report']);
    await app.close();
  });

  it('forRootAsync builds options from injected config', async () => {
    const CONFIG = Symbol('config');
    @Module({ providers: [{ provide: CONFIG, useValue: { prefix: 'shop:' } }], exports: [CONFIG] })
    class ConfigModule {}
    @Module({
      imports: [
        DistributedLockModule.forRootAsync({
          imports: [ConfigModule],
          inject: [CONFIG],
          useFactory: async (config: { prefix: string }) => ({ keyPrefix: config.prefix, ttl: 5_000 }),
        }),
      ],
      providers: [Jobs],
    })
    class AppModule {}
    const app = await Test.createTestingModule({ imports: [AppModule] }).compile();
    await app.init();
    expect(app.get(LockService).options.ttl).toBe(5_000);
    expect(await app.get(Jobs).run('x')).toEqual(['shop:job:x']);
    await app.close();
  });

  it('isGlobal makes LockService injectable in modules that do not import it', async () => {
    @Injectable()
    class Consumer {
      constructor(@Inject(LockService) readonly locks: LockService) {}
    }
    @Module({ providers: [Consumer] })
    class FeatureModule {}
    @Module({ imports: [DistributedLockModule.forRoot({ isGlobal: true }), FeatureModule] })
    class AppModule {}
    const app = await Test.createTestingModule({ imports: [AppModule] }).compile();
    expect(app.get(Consumer).locks).toBe(app.get(LockService));
    await app.close();

    @Module({ imports: [DistributedLockModule.forRoot(), FeatureModule] })
    class NotGlobalModule {}
    await expect(Test.createTestingModule({ imports: [NotGlobalModule] }).compile()).rejects.toThrow(/LockService/);
  });

  it('releases held locks on shutdown before it closes the backend', async () => {
    const backend = new RecordingBackend();
    @Module({ imports: [DistributedLockModule.forRoot({ backend })] })
    class AppModule {}
    const app = await Test.createTestingModule({ imports: [AppModule] }).compile();
    await app.init();
    await app.get(LockService).acquire('held-at-shutdown');
    await app.close();
    expect(backend.events).toEqual(['release lock:held-at-shutdown', 'close']);
  });

  it('accepts a user-written backend through the small interface', async () => {
    const store = new Map<string, string>();
    const custom: LockBackend = {
      name: 'custom',
      fencing: false,
      async tryAcquire(keys, owner): Promise<AcquireResult> {
        if (keys.some((k) => store.has(k))) return { acquired: false };
        for (const k of keys) store.set(k, owner);
        return { acquired: true };
      },
      async extend(keys, owner): Promise<ExtendResult> {
        return { extended: keys.every((k) => store.get(k) === owner) };
      },
      async release(keys, owner) {
        const mine = keys.filter((k) => store.get(k) === owner);
        for (const k of mine) store.delete(k);
        return mine.length > 0;
      },
      async inspect(key): Promise<LockState | undefined> {
        const owner = store.get(key);
        return owner === undefined ? undefined : { key, owner, ttlMs: 1 };
      },
    };
    const locks = new LockService(custom, { pollInterval: 20 });
    const first = await locks.acquire('c');
    expect(first.fencingToken).toBeUndefined();
    // No watch(): the waiter polls, and still gets the lock after the release.
    const second = locks.acquire('c', { wait: 2_000 });
    setTimeout(() => void first.release(), 50);
    expect((await second).isHeld).toBe(true);
    await locks.onApplicationShutdown();
    expect(store.size).toBe(0);
  });

  it('forRootAsync takes useClass: Nest creates the class and calls createDistributedLockOptions()', async () => {
    @Module({ imports: [DistributedLockModule.forRootAsync({ useClass: LockOptionsFromClass })], providers: [Jobs] })
    class AppModule {}
    const app = await Test.createTestingModule({ imports: [AppModule] }).compile();
    await app.init();
    expect(app.get(LockService).options).toMatchObject({ keyPrefix: 'from-class:', ttl: 7_000 });
    expect(await app.get(Jobs).run('x')).toEqual(['from-class:job:x']);
    await app.close();
  });

  it('forRootAsync takes useExisting: a provider the imported module already has', async () => {
    @Module({ providers: [LockOptionsFromClass], exports: [LockOptionsFromClass] })
    class LockConfigModule {}
    @Module({
      imports: [DistributedLockModule.forRootAsync({ imports: [LockConfigModule], useExisting: LockOptionsFromClass, isGlobal: true })],
      providers: [Jobs],
    })
    class AppModule {}
    const app = await Test.createTestingModule({ imports: [AppModule] }).compile();
    await app.init();
    expect(app.get(LockService).options.keyPrefix).toBe('from-class:');
    expect(await app.get(Jobs).run('y')).toEqual(['from-class:job:y']);
    await app.close();
  });

  it('maps a busy lock to 409 app-wide, unless interceptor: false; then the app binds LockInterceptor itself', async () => {
    @Module({ imports: [DistributedLockModule.forRoot()], providers: [Reports], controllers: [JobsController] })
    class Default {}
    @Module({ imports: [DistributedLockModule.forRoot({ interceptor: false })], providers: [Reports], controllers: [JobsController] })
    class WithoutInterceptor {}
    @Controller('jobs')
    @UseInterceptors(LockInterceptor)
    class BoundController extends JobsController {}
    @Module({
      imports: [DistributedLockModule.forRootAsync({ interceptor: false, useFactory: () => ({}) })],
      providers: [Reports],
      controllers: [BoundController],
    })
    class BoundByTheApp {}

    expect(await statusWhileBusy(Default)).toBe(409);
    expect(await statusWhileBusy(WithoutInterceptor)).toBe(500);
    expect(await statusWhileBusy(BoundByTheApp)).toBe(409);
  });

  it('refuses a wrong isGlobal, interceptor or retryAfter, and module-shaping options from a factory', async () => {
    expect(() => DistributedLockModule.forRoot({ interceptor: 'no' as never })).toThrow(
      new InvalidLockOptionsError('interceptor', "DistributedLockModule: option 'interceptor' must be true or false, got 'no'."),
    );
    expect(() => DistributedLockModule.forRootAsync({ isGlobal: 1 as never, useFactory: () => ({}) })).toThrow(
      /option 'isGlobal' must be true or false, got 1/,
    );
    expect(() => new LockService(undefined, { retryAfter: -1 })).toThrow(
      /option 'retryAfter' must be a number of milliseconds \(0 or more\) or a function/,
    );

    @Module({ imports: [DistributedLockModule.forRootAsync({ useFactory: () => ({ isGlobal: true }) as DistributedLockModuleOptions })] })
    class FactoryWithExtras {}
    await expect(Test.createTestingModule({ imports: [FactoryWithExtras] }).compile()).rejects.toThrow(
      /option 'isGlobal' shapes the module, so it cannot come from a factory or options class. Pass it to forRootAsync/,
    );
  });
});
