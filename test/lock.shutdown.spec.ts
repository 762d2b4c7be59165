import { describe, expect, it, jest } from '@jest/globals';
import { Logger } from '@nestjs/common';
import { LockLostError, LockService, MemoryLockBackend, type LockHandle } from '../lib/index.js';

describe('LockService shutdown', () => {
  it('tells every running holder before its lock goes: the signal aborts with "shutdown" and isHeld turns false', async () => {
    jest.spyOn(Logger.prototype, 'warn').mockImplementation(() => undefined);
    const backend = new MemoryLockBackend();
    const handles: LockHandle[] = [];
    // What each holder could see at the moment its keys were deleted.
    const abortedWhenReleased: boolean[] = [];
    const release = backend.release.bind(backend);
    backend.release = async (keys, owner) => {
      abortedWhenReleased.push(...handles.filter((h) => h.keys.some((k) => keys.includes(k))).map((h) => h.signal.aborted));
      return release(keys, owner);
    };
    const locks = new LockService(backend);

    let finish!: () => void;
    const finished = new Promise<void>((resolve) => (finish = resolve));
    let inside!: () => void;
    const entered = new Promise<void>((resolve) => (inside = resolve));
    // A cron job still running when the application shuts down.
    const job = locks.using('cron:nightly', async (lock) => {
      handles.push(lock);
      inside();
      await finished;
      return lock.signal.aborted;
    });
    await entered;
    // A handle held by hand.
    handles.push(await locks.acquire('report'));

    await locks.onApplicationShutdown();

    for (const handle of handles) {
      expect(handle.isHeld).toBe(false);
      expect(handle.signal.aborted).toBe(true);
      expect(handle.signal.reason).toBeInstanceOf(LockLostError);
      expect((handle.signal.reason as LockLostError).reason).toBe('shutdown');
      expect(() => handle.throwIfLost()).toThrow(/shutting down/);
    }
    expect(abortedWhenReleased).toEqual([true, true]);
    finish();
    expect(await job).toBe(true);
    jest.restoreAllMocks();
  });

  it('a holder told of shutdown can still call release() without an error, and extend() says why it cannot', async () => {
    jest.spyOn(Logger.prototype, 'warn').mockImplementation(() => undefined);
    const locks = new LockService();
    const handle = await locks.acquire('job');
    await locks.onApplicationShutdown();
    await expect(handle.release()).resolves.toBeUndefined();
    await expect(handle.extend()).rejects.toMatchObject({ name: 'LockLostError', reason: 'shutdown' });
    jest.restoreAllMocks();
  });

  it('says what happened and what to do', () => {
    const error = new LockLostError(['lock:cron'], 'shutdown');
    expect(error.message).toBe(
      'Lock lost on lock:cron: the application is shutting down and released this lock while its holder still ran. ' +
        'Stop the work now: another instance may take the lock. To let work finish under the lock, stop starting ' +
        'new work and wait for running work in beforeApplicationShutdown or onModuleDestroy, which Nest calls before this.',
    );
  });
});
