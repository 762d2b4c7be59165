import { afterEach, describe, expect, it } from '@jest/globals';
import { LockLostError, LockService, MemoryLockBackend, type LockBackend, type LockState } from 'nest-distributed-lock';
import { recordLocks, revokeLock } from 'nest-distributed-lock/testing';

const services: LockService[] = [];
function service(options?: ConstructorParameters<typeof LockService>[1], backend?: LockBackend): LockService {
  const locks = new LockService(backend, options);
  services.push(locks);
  return locks;
}

afterEach(async () => {
  await Promise.all(services.splice(0).map((locks) => locks.onApplicationShutdown()));
});

describe('revokeLock', () => {
  it('frees the key at once; the holder learns at its next extension, with reason taken', async () => {
    const locks = service({ ttl: 1_500, keyPrefix: 'shop:' });
    const recorder = recordLocks(locks);
    let holder!: { signal: AbortSignal; isHeld: () => boolean };
    const running = locks.using('order:1', async (lock) => {
      holder = { signal: lock.signal, isHeld: () => lock.isHeld };
      await new Promise((resolve) => lock.signal.addEventListener('abort', resolve));
      lock.throwIfLost();
    });
    await recorder.waitFor('acquired', 'order:1');

    await revokeLock(locks, 'order:1');
    expect(await locks.isLocked('order:1')).toBe(false); // free on the backend
    expect(holder.isHeld()).toBe(true); // not told yet: nothing in the holder changed

    const lost = await recorder.waitFor('lost', 'order:1', { timeoutMs: 5_000 });
    expect(lost.reason).toBe('taken');
    await expect(running).rejects.toMatchObject({ name: 'LockLostError', reason: 'taken' });
    expect(holder.signal.reason).toBeInstanceOf(LockLostError);
  });

  it('another caller may take the key in between; the holder still loses it, never the newcomer', async () => {
    const locks = service({ ttl: 1_500 });
    const recorder = recordLocks(locks);
    const first = await locks.acquire('order:1');
    await revokeLock(locks, 'order:1');
    const second = await locks.acquire('order:1', { wait: 0, ttl: 30_000 });
    await recorder.waitFor('lost', 'order:1', { timeoutMs: 5_000 });
    expect(first.isHeld).toBe(false);
    expect(second.isHeld).toBe(true);
    expect((await locks.inspect('order:1'))?.fencingToken).toBe(second.fencingToken);
    await second.release();
  });

  it('one key of a lock on several: the holder loses the whole lock, and the other key is freed', async () => {
    const locks = service({ ttl: 1_500 });
    const recorder = recordLocks(locks);
    const held = await locks.acquire(['account:1', 'account:2']);
    await revokeLock(locks, 'account:2');
    expect(await locks.isLocked('account:1')).toBe(true);
    const lost = await recorder.waitFor('lost', 'account:1', { timeoutMs: 5_000 });
    expect(lost.keys).toEqual(['lock:account:1', 'lock:account:2']);
    expect(held.isHeld).toBe(false);
    expect(await locks.isLocked('account:1')).toBe(false);
  });

  it('a holder with its handle in hand learns at once from extend()', async () => {
    const locks = service(); // the default ttl: no extension of the watchdog comes for 10 s
    const held = await locks.acquire('order:1');
    await revokeLock(locks, 'order:1');
    await expect(held.extend()).rejects.toMatchObject({ name: 'LockLostError', reason: 'taken' });
    expect(held.isHeld).toBe(false);
  });

  it('a free key is an error that says when to call it', async () => {
    const locks = service();
    await expect(revokeLock(locks, 'order:1')).rejects.toThrow(
      "revokeLock: nobody holds 'order:1' (lock:order:1), so there is nothing to take away. Call it while the holder runs",
    );
  });

  it('a key with several holders: each of them is released by its own owner', async () => {
    // A backend that reports two holders of one key, as one with shared locks does.
    const memory = new MemoryLockBackend();
    const released: [string[], string][] = [];
    const state: LockState = {
      key: 'lock:report',
      owner: 'reader-1',
      ttlMs: 1_000,
      limit: Number.POSITIVE_INFINITY,
      holders: [
        { owner: 'reader-1', ttlMs: 1_000 },
        { owner: 'reader-2', ttlMs: 900 },
      ],
    };
    const backend: LockBackend = {
      name: 'shared-test',
      fencing: true,
      tryAcquire: (keys, owner, ttl) => memory.tryAcquire(keys, owner, ttl),
      extend: (keys, owner, ttl) => memory.extend(keys, owner, ttl),
      inspect: async (key) => (key === state.key ? state : undefined),
      release: async (keys, owner) => {
        released.push([[...keys], owner]);
        return true;
      },
    };
    await revokeLock(service(undefined, backend), 'report');
    expect(released).toEqual([
      [['lock:report'], 'reader-1'],
      [['lock:report'], 'reader-2'],
    ]);
  });
});
