import { afterEach, beforeEach, describe, expect, it } from '@jest/globals';
import { Injectable } from '@nestjs/common';
import { Test, type TestingModule } from '@nestjs/testing';
import { DistributedLockModule, Locked, LockLostError, LockService } from 'nest-distributed-lock';
import { recordLocks, revokeLock } from 'nest-distributed-lock/testing';

@Injectable()
export class Exports {
  written: string[] = [];

  constructor(private readonly locks: LockService) {}

  // Writes batch after batch; once the lock is lost it stops before the next write.
  @Locked('export:<id>')
  async run(id: string, batches: AsyncIterable<string>) {
    const lock = this.locks.current('export:' + id)!;
    for await (const batch of batches) {
      lock.throwIfLost(); // throws the LockLostError that aborted lock.signal
      this.written.push(batch);
    }
    return this.written.length;
  }
}

describe('Exports when its lock is lost', () => {
  let moduleRef: TestingModule;

  beforeEach(async () => {
    moduleRef = await Test.createTestingModule({
      // A short lease: the watchdog extends it, and would learn of a loss, every ttl/3 (about 330 ms).
      imports: [DistributedLockModule.forRoot({ ttl: 1_000 })],
      providers: [Exports],
    }).compile();
    await moduleRef.init();
  });

  afterEach(() => moduleRef.close());

  it('stops writing once another owner takes the key', async () => {
    const locks = moduleRef.get(LockService);
    const recorder = recordLocks(locks);
    let next!: () => void;
    const secondBatch = new Promise<void>((resolve) => (next = resolve));
    async function* batches() {
      yield 'first';
      await secondBatch;
      yield 'second';
    }

    const running = moduleRef.get(Exports).run('7', batches());
    await recorder.waitFor('acquired', 'export:7');
    await revokeLock(locks, 'export:7'); // as a takeover would: the key is free on the backend
    const lost = await recorder.waitFor('lost', 'export:7'); // at the holder's next extension
    expect(lost.reason).toBe('taken');
    next();

    await expect(running).rejects.toBeInstanceOf(LockLostError);
    expect(moduleRef.get(Exports).written).toEqual(['first']);
  });
});
