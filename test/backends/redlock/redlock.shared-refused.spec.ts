import { afterAll, beforeAll, describe, expect, it } from '@jest/globals';
import { Controller, Get, Injectable, type Type } from '@nestjs/common';
import { Test } from '@nestjs/testing';
import 'reflect-metadata';
import { DistributedLockModule } from '../../../lib/distributed-lock.module.js';
import { InvalidLockOptionsError } from '../../../lib/lock.errors.js';
import { LockService } from '../../../lib/lock.service.js';
import { Locked } from '../../../lib/locked.decorator.js';
import { RedlockMasters } from './redlock-masters.js';

@Injectable()
class Catalog {
  @Locked('catalog', { mode: 'shared' })
  async read(): Promise<string> {
    return 'prices';
  }
}

@Controller('exports')
class Exports {
  @Locked('export:<tenantId>', { permits: 3 })
  @Get(':tenantId')
  async run(tenantId: string): Promise<string> {
    return tenantId;
  }
}

@Injectable()
class Orders {
  @Locked('order:<id>')
  async pay(id: string): Promise<string> {
    return id;
  }
}

/**
 * Redlock holds exclusive locks only: a semaphore's count is not bounded by majorities of
 * independent masters (docs/redlock.md). A @Locked method that asks for a shared lock or permits
 * fails start-up; a using()/acquire() call that asks for them is refused before any master is
 * asked, and exclusive locks keep working.
 */
describe('redlock backend: shared locks and semaphores are refused', () => {
  let masters: RedlockMasters;

  beforeAll(async () => {
    masters = await RedlockMasters.start(3);
  }, 30_000);

  afterAll(() => masters.stop());

  async function start(providers: Type[], controllers: Type[] = []) {
    const backend = masters.backend();
    const moduleRef = await Test.createTestingModule({
      imports: [DistributedLockModule.forRoot({ backend })],
      providers,
      controllers,
    }).compile();
    const init = moduleRef.init().then(
      () => undefined,
      (error: unknown) => error,
    );
    return { moduleRef, backend, error: await init };
  }

  it.each([
    [
      "mode: 'shared' (a provider)",
      Catalog,
      [],
      'mode',
      "@Locked on Catalog.read: mode: 'shared' on catalog: the redlock backend holds exclusive locks only",
    ],
    [
      'permits (a controller)',
      Orders,
      [Exports],
      'permits',
      '@Locked on Exports.run: permits: 3 on export:<tenantId>: the redlock backend holds exclusive locks only',
    ],
  ] as const)('fails start-up for a @Locked method that asks for %s', async (_, provider, controllers, option, message) => {
    const { moduleRef, backend, error } = await start([provider], [...controllers]);
    try {
      expect(error).toBeInstanceOf(InvalidLockOptionsError);
      expect((error as InvalidLockOptionsError).option).toBe(option);
      expect((error as Error).message).toContain(message);
      expect((error as Error).message).toContain('docs/shared-locks.md');
    } finally {
      await moduleRef.close().catch(() => undefined);
      await backend.close();
    }
  });

  it('refuses shared and permits calls before asking any master, and keeps exclusive locks', async () => {
    const { moduleRef, backend, error } = await start([Orders]);
    try {
      expect(error).toBeUndefined();
      const locks = moduleRef.get(LockService);
      let ran = false;
      for (const options of [{ mode: 'shared' as const }, { permits: 2 }]) {
        const refused = await locks
          .using(
            'export:t1',
            async () => {
              ran = true;
            },
            options,
          )
          .catch((e: unknown) => e);
        expect(refused).toBeInstanceOf(InvalidLockOptionsError);
        expect((refused as Error).message).toMatch(/on lock:export:t1: the redlock backend holds exclusive locks only/);
      }
      expect(ran).toBe(false);
      expect(await masters.keyCounts()).toEqual([0, 0, 0]);
      expect(await moduleRef.get(Orders).pay('o1')).toBe('o1');
      const handle = await locks.acquire('export:t1');
      expect(handle.mode).toBe('exclusive');
      await handle.release();
    } finally {
      await moduleRef.close();
      await backend.close();
      masters.disconnect();
      await masters.flush();
    }
  });
});
