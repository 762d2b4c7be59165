import { describe, expect, it } from '@jest/globals';
import { Injectable } from '@nestjs/common';
import { Test } from '@nestjs/testing';
import { DistributedLockModule, Locked, LockModuleNotImportedError, LockService } from 'nest-distributed-lock';

@Injectable()
class Orders {
  @Locked('order:<id>', { wait: 0 })
  async pay(id: number) {
    return id;
  }
}

const compile = () => Test.createTestingModule({ imports: [DistributedLockModule.forRoot()], providers: [Orders] }).compile();

describe('a testing module', () => {
  it('without init(), a @Locked method says to call it', async () => {
    const moduleRef = await compile();
    const error = await moduleRef
      .get(Orders)
      .pay(1)
      .catch((e: unknown) => e);
    expect(error).toBeInstanceOf(LockModuleNotImportedError);
    expect((error as Error).message).toContain('In a test, call `await moduleRef.init()` after `compile()`');
    await moduleRef.close();
  });

  it('two modules without a backend share no lock', async () => {
    const [one, two] = await Promise.all([compile(), compile()]);
    await Promise.all([one.init(), two.init()]);
    expect(one.get(LockService)).not.toBe(two.get(LockService));
    const held = await one.get(LockService).acquire('order:1');
    await expect(two.get(Orders).pay(1)).resolves.toBe(1);
    await expect(one.get(Orders).pay(1)).rejects.toMatchObject({ name: 'LockNotAcquiredError' });
    await held.release();
    await Promise.all([one.close(), two.close()]);
  });
});
