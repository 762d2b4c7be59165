import { afterEach, beforeEach, describe, expect, it } from '@jest/globals';
import { Injectable } from '@nestjs/common';
import { Test, type TestingModule } from '@nestjs/testing';
import { DistributedLockModule, Locked, LockService } from 'nest-distributed-lock';
import { recordLocks, type LockRecorder } from 'nest-distributed-lock/testing';

@Injectable()
export class Orders {
  constructor(private readonly locks: LockService) {}

  @Locked('order:<orderId>')
  async pay(orderId: number) {
    return { orderId, token: this.locks.current()?.fencingToken };
  }

  // Both accounts, in one global order: no deadlock between two opposite transfers.
  @Locked(['account:<from>', 'account:<to>'])
  async transfer(from: number, to: number) {
    return this.pay(from); // another key, taken inside the held ones
  }
}

describe('Orders', () => {
  let moduleRef: TestingModule;
  let recorder: LockRecorder;

  beforeEach(async () => {
    moduleRef = await Test.createTestingModule({
      imports: [DistributedLockModule.forRoot()], // in-memory: no server, real lock semantics
      providers: [Orders],
    }).compile();
    await moduleRef.init(); // binds @Locked methods to the module's LockService
    recorder = recordLocks(moduleRef.get(LockService));
  });

  afterEach(() => moduleRef.close()); // releases anything a failed test left held

  it('pays under the order lock, with a fencing token', async () => {
    await expect(moduleRef.get(Orders).pay(42)).resolves.toEqual({ orderId: 42, token: expect.any(Number) });
    expect(recorder.locked).toEqual(['order:42']);
  });

  it('locks both accounts, sorted, then the order', async () => {
    await moduleRef.get(Orders).transfer(9, 3);
    expect(recorder.locked).toEqual(['account:3', 'account:9', 'order:9']);
    expect(await moduleRef.get(LockService).isLocked('account:3')).toBe(false); // released after
  });
});
