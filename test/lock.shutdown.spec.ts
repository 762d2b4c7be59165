import { describe, expect, it, jest } from '@jest/globals';
import { Logger } from '@nestjs/common';
import { LockLostError, LockService, MemoryLockBackend, type LockBackend, type LockHandle } from '../lib/index.js';

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

  /**
   * The in-memory store behind releases answered only when the test says (`answer()`), with what
   * reaches the backend in `calls`; `extend` as given (the store's by default).
   */
  function slowReleases(extend?: LockBackend['extend']): { backend: LockBackend; calls: string[]; answer: () => void } {
    const memory = new MemoryLockBackend();
    const calls: string[] = [];
    let answer!: () => void;
    const answered = new Promise<void>((resolve) => (answer = resolve));
    const backend: LockBackend = {
      name: 'slow-release',
      fencing: true,
      tryAcquire: (keys, owner, ttl) => memory.tryAcquire(keys, owner, ttl),
      extend: extend ?? ((keys, owner, ttl) => memory.extend(keys, owner, ttl)),
      release: async (keys, owner) => {
        calls.push('release sent');
        await answered;
        calls.push('release answered');
        return memory.release(keys, owner);
      },
      inspect: (key) => memory.inspect(key),
      close: async () => void calls.push('close'),
    };
    return { backend, calls, answer };
  }

  it('waits, before closing the backend, for the release of a lock lost just before: it is answered before close()', async () => {
    jest.spyOn(Logger.prototype, 'warn').mockImplementation(() => undefined);
    // The store stops answering extensions: the lease runs out, and the service frees its keys
    // (a late extension the store applied may have kept them).
    const { backend, calls, answer } = slowReleases(async () => {
      throw new Error('no answer');
    });
    const locks = new LockService(backend);
    const handle = await locks.acquire('lost', { ttl: 300 });
    await new Promise<void>((resolve) => handle.signal.addEventListener('abort', () => resolve()));
    expect(calls).toEqual(['release sent']);
    const shuttingDown = locks.onApplicationShutdown();
    // Shutdown has every chance to close the backend before the answer comes.
    await new Promise((resolve) => setImmediate(resolve));
    answer();
    await shuttingDown;
    expect(calls).toEqual(['release sent', 'release answered', 'close']);
    jest.restoreAllMocks();
  });

  it('waits, before closing the backend, for a release its holder sent just before: it is answered before close()', async () => {
    const { backend, calls, answer } = slowReleases();
    const locks = new LockService(backend);
    const handle = await locks.acquire('done', { ttl: 60_000 });
    // A request that finished as the application began to shut down.
    const releasing = handle.release();
    const shuttingDown = locks.onApplicationShutdown();
    await new Promise((resolve) => setImmediate(resolve));
    answer();
    await releasing;
    await shuttingDown;
    expect(calls).toEqual(['release sent', 'release answered', 'close']);
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
