import 'reflect-metadata';
import { afterEach, describe, expect, it } from '@jest/globals';
import { Injectable } from '@nestjs/common';
import { Test, type TestingModule } from '@nestjs/testing';
import {
  DistributedLockModule,
  InvalidLockOptionsError,
  LockService,
  Locked,
  MAX_IDENTITY_LENGTH,
  MemoryLockBackend,
  type LockBackend,
  type LockInfo,
} from '../lib/index.js';

@Injectable()
class Reports {
  seen: LockInfo | undefined;
  constructor(private readonly locks: LockService) {}

  @Locked('report:<id>')
  async nightly(id: string): Promise<void> {
    this.seen = await this.locks.inspect(`report:${id}`);
  }

  @Locked('report:<id>', { site: 'weekly-report' })
  async weekly(id: string): Promise<void> {
    this.seen = await this.locks.inspect(`report:${id}`);
  }
}

describe('who holds: instance and site', () => {
  let moduleRef: TestingModule | undefined;
  afterEach(async () => {
    await moduleRef?.close();
    moduleRef = undefined;
  });

  it('a @Locked method is stored as Class.method (or its site option), with the module instance', async () => {
    moduleRef = await Test.createTestingModule({
      imports: [DistributedLockModule.forRoot({ instance: 'api-7' })],
      providers: [Reports],
    }).compile();
    await moduleRef.init();
    const reports = moduleRef.get(Reports);
    await reports.nightly('1');
    expect(reports.seen?.holders).toEqual([
      {
        id: expect.any(String),
        ttlMs: expect.any(Number),
        fencingToken: expect.any(Number),
        heldHere: true,
        instance: 'api-7',
        site: 'Reports.nightly',
        acquiredAt: expect.any(Number),
      },
    ]);
    await reports.weekly('1');
    expect(reports.seen?.holders[0].site).toBe('weekly-report');
  });

  it('the instance defaults to hostname:pid, and using() without a site stores none', async () => {
    const locks = new LockService();
    await locks.using('k', async () => {
      const [holder] = (await locks.inspect('k'))!.holders;
      expect(holder.instance).toMatch(new RegExp(`:${process.pid}$`));
      expect(holder.site).toBeUndefined();
    });
  });

  it('refuses an instance or a site that is too long or holds control characters, saying the bound', async () => {
    const long = 'x'.repeat(MAX_IDENTITY_LENGTH + 1);
    expect(() => new LockService(undefined, { instance: long })).toThrow(InvalidLockOptionsError);
    expect(() => new LockService(undefined, { instance: 'a\nb' })).toThrow(
      `option 'instance' must be a string of 1 to ${MAX_IDENTITY_LENGTH} characters without control characters`,
    );
    const locks = new LockService();
    await expect(locks.acquire('k', { site: long })).rejects.toThrow(InvalidLockOptionsError);
    await expect(locks.using('k', () => undefined, { site: '' })).rejects.toThrow(/option 'site' must be a string of 1 to 128/);
    expect(await locks.isLocked('k')).toBe(false);
  });
});

describe('list() options', () => {
  it('refuses a limit outside 1 to 1 000, an unknown option and a cursor it did not make', async () => {
    const locks = new LockService();
    await expect(locks.list({ limit: 0 })).rejects.toThrow(/option 'limit' must be an integer from 1 to 1000, got 0/);
    await expect(locks.list({ limit: 1_001 })).rejects.toThrow(InvalidLockOptionsError);
    await expect(locks.list({ after: 'x' } as never)).rejects.toThrow(/unknown option 'after'/);
    await expect(locks.list({ cursor: '***' })).rejects.toThrow(/cursor '\*\*\*' is not one the memory backend returned/);
  });

  it('names the fix on a backend without list', async () => {
    const memory = new MemoryLockBackend();
    const bare: LockBackend = {
      name: 'custom',
      fencing: false,
      tryAcquire: (...args) => memory.tryAcquire(...args),
      extend: (...args) => memory.extend(...args),
      release: (...args) => memory.release(...args),
      inspect: (...args) => memory.inspect(...args),
    };
    await expect(new LockService(bare).list()).rejects.toThrow(/the custom backend cannot list its keys/);
  });

  it('lists without the keyPrefix, in pages, and a page holds keys as inspect and using take them', async () => {
    const locks = new LockService(undefined, { keyPrefix: 'app:' });
    for (const key of ['b', 'a', 'c']) await locks.acquire(`job:${key}`);
    const first = await locks.list({ prefix: 'job:', limit: 2 });
    expect(first.keys).toEqual(['job:a', 'job:b']);
    const second = await locks.list({ prefix: 'job:', limit: 2, cursor: first.cursor });
    expect(second).toEqual({ keys: ['job:c'] });
    expect((await locks.inspect(second.keys[0]))?.key).toBe('app:job:c');
  });
});
