import { afterEach, describe, expect, it, jest } from '@jest/globals';
import { Logger } from '@nestjs/common';
import { performance } from 'node:perf_hooks';
import { inspect } from 'node:util';
import { LockBackendError, LockLostError, LockService, MemoryLockBackend } from '../lib/index.js';

/** Blocks the event loop until `at` (performance.now() time): no timer or I/O callback can run. */
function stallUntil(at: number): void {
  while (performance.now() <= at) {
    // A synchronous stall, as a long computation or a GC pause makes one.
  }
}

describe('LockHandle', () => {
  let locks: LockService | undefined;
  afterEach(async () => {
    jest.restoreAllMocks();
    await locks?.onApplicationShutdown();
    locks = undefined;
  });

  describe('after the event loop stalled past the lease', () => {
    it('isHeld, a signal read earlier and throwIfLost say "lost" in the same tick (autoExtend off)', async () => {
      locks = new LockService();
      const handle = await locks.acquire('stall', { ttl: 100, autoExtend: false });
      const signal = handle.signal;
      // The deadline counts from before the acquire request left: it is behind us after this.
      stallUntil(performance.now() + 100);

      expect(handle.isHeld).toBe(false);
      expect(signal.aborted).toBe(true);
      expect(signal.reason).toBeInstanceOf(LockLostError);
      expect((signal.reason as LockLostError).reason).toBe('expired');
      expect(() => handle.throwIfLost()).toThrow(signal.reason as LockLostError);
    });

    it('signal, isHeld and throwIfLost say "lost" in the same tick although the watchdog is on', async () => {
      locks = new LockService();
      const handle = await locks.acquire('stall', { ttl: 100 });
      stallUntil(performance.now() + 100);

      expect(handle.signal.aborted).toBe(true);
      expect((handle.signal.reason as LockLostError).reason).toBe('expired');
      expect(handle.isHeld).toBe(false);
      expect(() => handle.throwIfLost()).toThrow(LockLostError);
    });

    it('a section that stalled past its lease does not re-enter it: the nested call acquires anew', async () => {
      locks = new LockService();
      const seen = await locks.using(
        'stall',
        async (outer) => {
          stallUntil(performance.now() + 100);
          const inner = await locks!.using('stall', (lock) => ({ reentrant: lock.reentrant, token: lock.fencingToken }));
          return { outer: outer.fencingToken!, inner };
        },
        { ttl: 50, autoExtend: false },
      );
      expect(seen.inner.reentrant).toBe(false);
      expect(seen.inner.token).toBeGreaterThan(seen.outer);
    });

    it('throwIfLost does nothing while the lease is held', async () => {
      locks = new LockService();
      const handle = await locks.acquire('fine', { ttl: 60_000 });
      expect(() => handle.throwIfLost()).not.toThrow();
      await handle.release();
    });
  });

  describe('when the release at the end of an `await using` block fails', () => {
    function failingRelease(): MemoryLockBackend {
      const backend = new MemoryLockBackend();
      backend.release = async () => {
        throw new Error('connection reset');
      };
      return backend;
    }

    it("keeps the block's result and logs the failure", async () => {
      const warn = jest.spyOn(Logger.prototype, 'warn').mockImplementation(() => undefined);
      const service = (locks = new LockService(failingRelease()));
      const run = async (): Promise<string> => {
        await using lock = await service.acquire('report');
        expect(lock.isHeld).toBe(true);
        return 'result';
      };
      expect(await run()).toBe('result');
      expect(warn).toHaveBeenCalledWith(expect.stringContaining('lock:report'));
    });

    it("passes the block's own error through as itself, not wrapped in SuppressedError", async () => {
      jest.spyOn(Logger.prototype, 'warn').mockImplementation(() => undefined);
      const service = (locks = new LockService(failingRelease()));
      const failure = new Error('card declined');
      const run = async (): Promise<never> => {
        await using lock = await service.acquire('pay');
        void lock;
        throw failure;
      };
      await expect(run()).rejects.toBe(failure);
    });

    it('release() called explicitly still throws LockBackendError', async () => {
      locks = new LockService(failingRelease());
      const handle = await locks.acquire('explicit');
      await expect(handle.release()).rejects.toBeInstanceOf(LockBackendError);
    });
  });

  it('never shows its owner token when logged or serialised', async () => {
    locks = new LockService(new MemoryLockBackend());
    const handle = await locks.acquire('shown');
    const owner = handle.leases[0].owner;
    for (const shown of [
      inspect(handle),
      inspect(handle, { depth: 10, showHidden: true }),
      JSON.stringify(handle),
      String(JSON.stringify({ handle })),
    ]) {
      expect(shown).toContain('lock:shown');
      expect(shown).not.toContain(owner);
    }
    await handle.release();
  });
});
