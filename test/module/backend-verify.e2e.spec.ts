import 'reflect-metadata';
import { afterEach, describe, expect, it } from '@jest/globals';
import { Injectable, Module, type INestApplication } from '@nestjs/common';
import { Test } from '@nestjs/testing';
import {
  DistributedLockModule,
  LockBackendError,
  LockService,
  MemoryLockBackend,
  type AcquireResult,
  type ExtendResult,
  type LockBackend,
  type LockState,
} from '../../lib/index.js';

/**
 * A backend of its own, as an application would write one: its leases in a MemoryLockBackend, and
 * a start-up check that says what it was told to (a misconfiguration, or a store not reachable yet).
 */
class CheckedBackend implements LockBackend {
  readonly name = 'checked';
  readonly fencing = true;
  verified = 0;
  private readonly store = new MemoryLockBackend();
  constructor(private readonly check: () => Promise<void>) {}
  async verify(): Promise<void> {
    this.verified++;
    return this.check();
  }
  tryAcquire(keys: readonly string[], owner: string, ttlMs: number): Promise<AcquireResult> {
    return this.store.tryAcquire(keys, owner, ttlMs);
  }
  extend(keys: readonly string[], owner: string, ttlMs: number): Promise<ExtendResult> {
    return this.store.extend(keys, owner, ttlMs);
  }
  release(keys: readonly string[], owner: string): Promise<boolean> {
    return this.store.release(keys, owner);
  }
  inspect(key: string): Promise<LockState | undefined> {
    return this.store.inspect(key);
  }
}

@Injectable()
class Orders {
  constructor(readonly locks: LockService) {}
}

let app: INestApplication | undefined;
afterEach(async () => {
  await app?.close();
  app = undefined;
});

async function start(backend: LockBackend): Promise<INestApplication> {
  @Module({ imports: [DistributedLockModule.forRoot({ backend })], providers: [Orders] })
  class OrdersModule {}
  @Module({ imports: [DistributedLockModule.forRoot({ backend })] })
  class StockModule {}
  @Module({ imports: [OrdersModule, StockModule] })
  class AppModule {}
  const moduleRef = await Test.createTestingModule({ imports: [AppModule] }).compile();
  const created = moduleRef.createNestApplication({ logger: false });
  try {
    await created.init();
  } catch (error) {
    await created.close().catch(() => undefined);
    throw error;
  }
  return (app = created);
}

describe("the backend's start-up check (LockBackend.verify)", () => {
  it('a misconfiguration it finds fails start-up with its message, before the application serves anything', async () => {
    const misconfigured = new LockBackendError('checked', 'the user "app" may not write: grant it write rights', undefined, {
      permanent: true,
    });
    const backend = new CheckedBackend(() => Promise.reject(misconfigured));
    await expect(start(backend)).rejects.toBe(misconfigured);
    expect(backend.verified).toBe(1);
  });

  it('a store not reachable yet does not block start-up: verify resolves, locks work once it is back', async () => {
    const backend = new CheckedBackend(() => Promise.resolve());
    const started = await start(backend);
    expect(backend.verified).toBe(1);
    const locks = started.get(Orders).locks;
    await expect(locks.using('order:1', () => 'done')).resolves.toBe('done');
  });

  it('an error that waiting may heal (not permanent) does not block start-up either', async () => {
    const backend = new CheckedBackend(() => Promise.reject(new LockBackendError('checked', 'connection refused')));
    await start(backend);
    expect(backend.verified).toBe(1);
  });
});
