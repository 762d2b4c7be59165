import { afterEach, describe, expect, it, jest } from '@jest/globals';
import { Logger } from '@nestjs/common';
import { createHook } from 'node:async_hooks';
import {
  InvalidLockOptionsError,
  LockBackendError,
  LockLostError,
  LockService,
  MemoryLockBackend,
  type AcquireResult,
  type ExtendResult,
  type LockBackend,
  type LockState,
} from '../lib/index.js';
import { until } from './support/wait.js';

afterEach(() => {
  jest.restoreAllMocks();
});

/** Two instances of an app on one store. */
function instances(options = {}): [LockService, LockService] {
  const backend = new MemoryLockBackend();
  return [new LockService(backend, { wait: 60_000, ...options }), new LockService(backend, { wait: 60_000, ...options })];
}

describe("onBusy: 'skip'", () => {
  it('does not wait: a job another instance runs is skipped at once, however long the module lets others wait', async () => {
    const [a, b] = instances();
    const holder = await a.acquire('job:report');
    let ran = false;
    expect(await b.using('job:report', () => (ran = true), { onBusy: 'skip' })).toBeUndefined();
    expect(ran).toBe(false);
    // The skip came back while the other run still held the lock.
    expect(holder.isHeld).toBe(true);
    await holder.release();
  });

  it('waits when a wait is asked for explicitly', async () => {
    const [a, b] = instances();
    const holder = await a.acquire('job:report');
    const skipped = b.using('job:report', () => 'ran', { onBusy: 'skip', wait: 30_000 });
    await until(() => b.queue.waiting === 1, 5_000, 'the call to wait');
    await holder.release();
    expect(await skipped).toBe('ran');
  });
});

/**
 * The in-memory store behind a connection that can drop requests: the next `failExtends` extend
 * requests fail without reaching the store. Everything else, `immediate` included, is the store's.
 */
class DroppingBackend implements LockBackend {
  readonly name = 'memory';
  readonly fencing = true;
  failExtends = 0;
  readonly extends: number[] = [];
  readonly releases: string[] = [];
  constructor(readonly store = new MemoryLockBackend()) {}
  get immediate() {
    return this.store.immediate;
  }
  tryAcquire(keys: readonly string[], owner: string, ttlMs: number): Promise<AcquireResult> {
    return this.store.tryAcquire(keys, owner, ttlMs);
  }
  async extend(keys: readonly string[], owner: string, ttlMs: number): Promise<ExtendResult> {
    this.extends.push(ttlMs);
    if (this.failExtends > 0) {
      this.failExtends--;
      throw new Error('connection lost');
    }
    return this.store.extend(keys, owner, ttlMs);
  }
  release(keys: readonly string[], owner: string): Promise<boolean> {
    this.releases.push(owner);
    return this.store.release(keys, owner);
  }
  inspect(key: string): Promise<LockState | undefined> {
    return this.store.inspect(key);
  }
  watch(keys: readonly string[], onRelease: () => void): Promise<() => void> {
    return this.store.watch(keys, onRelease);
  }
}

/** Timeouts created while it listens and still pending (neither fired nor cleared), unref'd ones included. */
class TimersCreated {
  private readonly created: { _destroyed?: boolean }[] = [];
  private readonly hook = createHook({
    init: (_id, type, _trigger, timeout) => void (type === 'Timeout' && this.created.push(timeout as { _destroyed?: boolean })),
  }).enable();
  live(): number {
    return this.created.filter((timeout) => !timeout._destroyed).length;
  }
  stop(): void {
    this.hook.disable();
  }
}

/**
 * The in-memory store, whose extension, while `slow`, fails for its caller and is applied when the
 * test says (`land`), as a late request on another pooled connection would be; `failNext` fails
 * that many more outright (the store unreachable). What reaches it is in `calls`.
 */
class LateExtends extends MemoryLockBackend {
  slow = false;
  failNext = 0;
  readonly calls: string[] = [];
  land: () => Promise<unknown> = async () => undefined;
  override async extend(keys: readonly string[], owner: string, ttlMs: number) {
    if (this.slow) {
      this.slow = false;
      this.land = () => super.extend(keys, owner, ttlMs);
      throw new Error('no answer within commandTimeout');
    }
    if (this.failNext > 0) {
      this.failNext--;
      this.calls.push(`extend ${ttlMs} failed`);
      throw new Error('the store is unreachable');
    }
    this.calls.push(`extend ${ttlMs}`);
    return super.extend(keys, owner, ttlMs);
  }
  override async release(keys: readonly string[], owner: string) {
    this.calls.push('release');
    return super.release(keys, owner);
  }
}

describe('minHold', () => {
  it('sends a shortening the store did not get again: the key stays for the rest of minHold, not its old lease', async () => {
    const backend = new DroppingBackend();
    const locks = new LockService(backend);
    const handle = await locks.acquire('job:nightly', { ttl: 60_000, minHold: 2_000 });
    backend.failExtends = 1;
    await expect(handle.release()).rejects.toBeInstanceOf(LockBackendError);
    // The store answers again: the shortening lands, and the key is free once minHold is over.
    await until(async () => ((await backend.inspect('lock:job:nightly'))?.ttlMs ?? 0) <= 2_000, 20_000, 'the lease to be shortened');
    await until(async () => (await backend.inspect('lock:job:nightly')) === undefined, 20_000, 'the key to be free');
    expect(backend.extends.length).toBeGreaterThanOrEqual(2);
    await locks.onApplicationShutdown();
  });

  it('gives the key back when the shortening has not landed by the end of the old lease', async () => {
    const backend = new DroppingBackend();
    const locks = new LockService(backend);
    // minHold longer than the ttl: the watchdog's extensions kept the lease until the release.
    const handle = await locks.acquire('job:longer', { ttl: 1_000, minHold: 60_000 });
    backend.failExtends = Number.POSITIVE_INFINITY;
    await expect(handle.release()).rejects.toBeInstanceOf(LockBackendError);
    // A late extension of the old lease can no longer keep the key: the owner has released it.
    await until(() => backend.releases.length > 0, 20_000, 'a release once the shortening gave up');
    await locks.onApplicationShutdown();
  });

  it('stops sending the shortening again at shutdown: one last try, a release, and no timer left', async () => {
    const backend = new DroppingBackend();
    const locks = new LockService(backend);
    const handle = await locks.acquire('job:stopping', { ttl: 60_000, minHold: 30_000 });
    backend.failExtends = Number.POSITIVE_INFINITY;
    // From here, the timers created (unref'd ones too, which the process's own count leaves out).
    const timers = new TimersCreated();
    try {
      await expect(handle.release()).rejects.toBeInstanceOf(LockBackendError);
      await locks.onApplicationShutdown();
      // Given back before the backend closed, not kept for the old lease's minute.
      expect(await backend.inspect('lock:job:stopping')).toBeUndefined();
      expect(timers.live()).toBe(0);
    } finally {
      timers.stop();
    }
  });

  it('keeps the lock after a fast job until minHold, then lets it run out, without logging a lost lock', async () => {
    const warn = jest.spyOn(Logger.prototype, 'warn');
    const [a, b] = instances();
    expect(await a.using('job:tick', () => 'ran', { onBusy: 'skip', minHold: 400 })).toBe('ran');
    // Another instance whose timer fires a little later finds the job's lock still there.
    expect(await b.using('job:tick', () => 'again', { onBusy: 'skip', minHold: 400 })).toBeUndefined();
    const lease = await b.inspect('job:tick');
    expect(lease?.ttlMs).toBeLessThanOrEqual(400);
    expect(lease?.heldHere).toBe(false);
    await until(async () => !(await b.isLocked('job:tick')), 5_000, 'the kept lock to run out');
    expect(await b.using('job:tick', () => 'next tick', { onBusy: 'skip', minHold: 400 })).toBe('next tick');
    expect(warn).not.toHaveBeenCalled();
  });

  it('is released as usual when the job ran longer than minHold', async () => {
    const [a] = instances();
    const handle = await a.acquire('job:long', { minHold: 50 });
    // The job outlasts its minHold.
    await new Promise((resolve) => setTimeout(resolve, 80));
    await handle.release();
    expect(await a.isLocked('job:long')).toBe(false);
  });

  it('is not stretched to a whole ttl by an extension still out when the job releases (a pool may run it last)', async () => {
    /** A backend whose long extensions travel on a slow connection, as a pool's can. */
    class SlowExtends extends MemoryLockBackend {
      override async extend(keys: readonly string[], owner: string, ttlMs: number) {
        if (ttlMs >= 1_000) await new Promise((resolve) => setTimeout(resolve, 50));
        return super.extend(keys, owner, ttlMs);
      }
    }
    const locks = new LockService(new SlowExtends(), { ttl: 5_000 });
    const handle = await locks.acquire('job:pooled', { minHold: 100 });
    const extending = handle.extend().catch(() => undefined);
    await handle.release();
    await extending;
    expect((await locks.inspect('job:pooled'))?.ttlMs ?? 0).toBeLessThanOrEqual(100);
    await until(async () => !(await locks.isLocked('job:pooled')), 5_000, 'the kept lock to run out at minHold');
  });

  it('is not stretched to a whole ttl by an extension that went unanswered and lands after the shortening: released at the end of minHold', async () => {
    const backend = new LateExtends();
    const locks = new LockService(backend, { ttl: 5_000 });
    const handle = await locks.acquire('job:late-extend', { minHold: 200, autoExtend: false });
    backend.slow = true;
    await expect(handle.extend()).rejects.toThrow(LockBackendError);
    await handle.release();
    expect((await locks.inspect('job:late-extend'))?.ttlMs ?? 0).toBeLessThanOrEqual(200);
    await backend.land();
    expect((await locks.inspect('job:late-extend'))?.ttlMs).toBeGreaterThan(4_000);
    await until(async () => !(await locks.isLocked('job:late-extend')), 2_000, 'the lock to be released at the end of minHold');
  });

  it('sends a release at the end of minHold after an extension in doubt, never one more shortening (a timer may fire a millisecond early)', async () => {
    const ends: string[] = [];
    for (let i = 0; i < 40; i++) {
      const backend = new LateExtends();
      const locks = new LockService(backend, { ttl: 5_000 });
      const handle = await locks.acquire(`job:end-${i}`, { minHold: 30, autoExtend: false });
      backend.slow = true;
      await expect(handle.extend()).rejects.toThrow(LockBackendError);
      await handle.release();
      // The shortening, then what goes out at the end of minHold.
      await until(() => backend.calls.length > 1, 2_000, 'the call at the end of minHold');
      ends.push(backend.calls[1]);
    }
    expect(ends.filter((call) => call !== 'release')).toEqual([]);
  });

  it('releases at the end of minHold after an extension in doubt also when the shortening first failed and was sent again', async () => {
    const backend = new LateExtends();
    const locks = new LockService(backend, { ttl: 5_000 });
    // Long enough that the shortening, sent again after a pause of up to a second, lands within it.
    const handle = await locks.acquire('job:resent', { minHold: 1_800, autoExtend: false });
    backend.slow = true;
    await expect(handle.extend()).rejects.toThrow(LockBackendError);
    backend.failNext = 1;
    await expect(handle.release()).rejects.toThrow(LockBackendError);
    await until(() => backend.calls.some((call) => /^extend \d+$/.test(call)), 3_000, 'the shortening sent again');
    await backend.land();
    await until(async () => !(await locks.isLocked('job:resent')), 3_000, 'the lock to be released at the end of minHold');
  });

  it('is kept at application shutdown too: the lock stays for the rest of minHold', async () => {
    const [a, b] = instances();
    // The store outlives this instance, as a Redis does (closing an in-memory backend empties it).
    a.backend.close = async () => undefined;
    const running = a.using('job:nightly', (lock) => new Promise((resolve) => lock.signal.addEventListener('abort', resolve)), {
      minHold: 60_000,
    });
    await until(() => b.isLocked('job:nightly'), 5_000, 'the job to start');
    await a.onApplicationShutdown();
    await running;
    expect(await b.isLocked('job:nightly')).toBe(true);
    expect((await b.inspect('job:nightly'))!.ttlMs).toBeGreaterThan(30_000);
  });
});

describe('maxHold', () => {
  it('stops extending the lease at maxHold: a hung holder loses the lock (max-hold) and another instance takes it', async () => {
    const [a, b] = instances();
    const handle = await a.acquire('job:hung', { ttl: 300, maxHold: 700 });
    const lost = await new Promise<unknown>((resolve) => handle.signal.addEventListener('abort', () => resolve(handle.signal.reason)));
    expect(lost).toBeInstanceOf(LockLostError);
    expect(lost).toMatchObject({ reason: 'max-hold' });
    expect(String(lost)).toContain('maxHold');
    const next = await b.tryAcquire('job:hung');
    expect(next?.isHeld).toBe(true);
    await next?.release();
  });

  it('below the ttl, is the whole lease: never extended', async () => {
    const [a, b] = instances();
    const handle = await a.acquire('job:short', { ttl: 60_000, maxHold: 200 });
    expect((await b.inspect('job:short'))!.ttlMs).toBeLessThanOrEqual(200);
    await until(async () => !(await b.isLocked('job:short')), 5_000, 'the lease to run out at maxHold');
    expect(handle.isHeld).toBe(false);
  });

  it('stops a manual extend there too: the store keeps the lease no longer, and expiresAt says where it ends', async () => {
    const [a, b] = instances();
    const handle = await a.acquire('job:manual', { ttl: 300, maxHold: 1_000, autoExtend: false });
    await handle.extend(60_000);
    const left = (await b.inspect('job:manual'))!.ttlMs;
    expect(left).toBeLessThanOrEqual(1_000);
    expect(handle.expiresAt.getTime() - Date.now()).toBeLessThanOrEqual(1_000);
    await handle.release();
  });

  it('leaves a job that finishes in time alone: released as usual, nothing logged', async () => {
    const warn = jest.spyOn(Logger.prototype, 'warn');
    const [a] = instances();
    expect(await a.using('job:quick', () => 'done', { ttl: 300, maxHold: 10_000 })).toBe('done');
    expect(await a.isLocked('job:quick')).toBe(false);
    expect(warn).not.toHaveBeenCalled();
  });
});

describe('hold options are checked', () => {
  it('refuses minHold above maxHold, and holds as module options', async () => {
    const [a] = instances();
    await expect(a.using('x', () => 1, { minHold: 500, maxHold: 100 })).rejects.toThrow(/'minHold' \(500 ms\) must not be above 'maxHold'/);
    expect(() => new LockService(new MemoryLockBackend(), { minHold: 10 } as never)).toThrow(InvalidLockOptionsError);
  });
});
