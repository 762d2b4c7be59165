import 'reflect-metadata';
import { describe, expect, it } from '@jest/globals';
import { Inject, Injectable, Module } from '@nestjs/common';
import { Test } from '@nestjs/testing';
import {
  DistributedLockModule,
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
});
