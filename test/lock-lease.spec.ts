import { afterEach, describe, expect, it } from '@jest/globals';
import { LockLostError, LockService, MemoryLockBackend, type ExtendResult } from '../lib/index.js';
import { until } from './support/wait.js';

/** One extend request the backend has received and not answered yet. */
interface HeldRequest {
  ttl: number;
  answer(): void;
}

/**
 * A memory backend whose extensions wait until the test answers them, in the order they were
 * sent, as one Redis connection would: the lease the backend keeps is the last one answered.
 */
class HeldExtensionsBackend extends MemoryLockBackend {
  readonly sent: number[] = [];
  readonly pending: HeldRequest[] = [];

  override extend(keys: readonly string[], owner: string, ttl: number): Promise<ExtendResult> {
    this.sent.push(ttl);
    return new Promise((resolve, reject) => {
      this.pending.push({ ttl, answer: () => super.extend(keys, owner, ttl).then(resolve, reject) });
    });
  }

  answerNext(): void {
    this.pending.shift()!.answer();
  }
}

const nextTurn = () => new Promise((resolve) => setImmediate(resolve));

/**
 * When the backend's lease of 'lock:job' ends, by the wall clock. The clock is read after the
 * answer: read before it, a process paused in between (on a loaded machine) would put the end
 * too early by the pause.
 */
async function endOfLease(backend: MemoryLockBackend): Promise<number> {
  const { ttlMs } = (await backend.inspect('lock:job'))!;
  return Date.now() + ttlMs;
}

describe('Lease extensions', () => {
  let locks: LockService | undefined;
  afterEach(async () => {
    await locks?.onApplicationShutdown();
    locks = undefined;
  });

  it("a manual extend asked while the watchdog's extension is out waits for its answer, then books its own ttl", async () => {
    const backend = new HeldExtensionsBackend();
    locks = new LockService(backend);
    const handle = await locks.acquire('job', { ttl: 1_500 });
    await until(() => backend.pending.length === 1, 5_000, "the watchdog's extension");
    const manual = handle.extend(120_000);
    await nextTurn();
    expect(backend.sent).toEqual([1_500]);

    backend.answerNext();
    await until(() => backend.pending.length === 1, 5_000, 'the manual extension');
    expect(backend.sent).toEqual([1_500, 120_000]);
    backend.answerNext();
    await manual;

    const backendEndsAt = await endOfLease(backend);
    expect(handle.isHeld).toBe(true);
    expect(handle.expiresAt.getTime()).toBeGreaterThan(Date.now() + 60_000);
    // Never later than the backend's own expiry (both clocks count whole milliseconds).
    expect(handle.expiresAt.getTime()).toBeLessThanOrEqual(backendEndsAt + 2);
  });

  it('the watchdog sends nothing while a manual extension is out, and an answer after the deadline revives nothing', async () => {
    const backend = new HeldExtensionsBackend();
    locks = new LockService(backend);
    const handle = await locks.acquire('job', { ttl: 300 });
    const manual = handle.extend(120_000).catch((error: unknown) => error);
    await new Promise((resolve) => handle.signal.addEventListener('abort', resolve));

    // One request only: a watchdog extension sent behind it with the old ttl would leave the
    // backend with 300 ms while the manual extension's answer told the handle two minutes.
    expect(backend.sent).toEqual([120_000]);
    expect((handle.signal.reason as LockLostError).reason).toBe('backend-error');
    backend.answerNext();
    expect(await manual).toBeInstanceOf(LockLostError);
    expect(handle.isHeld).toBe(false);
  });

  it('manual extensions go out one at a time in the order asked, so the last one asked is the lease kept', async () => {
    const backend = new HeldExtensionsBackend();
    locks = new LockService(backend);
    const handle = await locks.acquire('job', { ttl: 60_000, autoExtend: false });
    const both = Promise.all([handle.extend(120_000), handle.extend(30_000)]);
    await nextTurn();
    expect(backend.sent).toEqual([120_000]);
    backend.answerNext();
    await until(() => backend.pending.length === 1, 5_000, 'the second extension');
    backend.answerNext();
    await both;

    expect(backend.sent).toEqual([120_000, 30_000]);
    const backendEndsAt = await endOfLease(backend);
    expect(handle.expiresAt.getTime()).toBeLessThanOrEqual(backendEndsAt + 2);
  });

  it('an extension to a shorter ttl that got no answer but was applied after all never leaves the holder past the store', async () => {
    // The request times out for the caller, then the backend runs it anyway (a stalled Redis works
    // through its backlog): the store's lease is now the shorter one.
    class LateExtendBackend extends MemoryLockBackend {
      applied: Promise<unknown> | undefined;
      override extend(keys: readonly string[], owner: string, ttl: number): Promise<ExtendResult> {
        this.applied = new Promise((resolve) => setTimeout(resolve, 20)).then(() => super.extend(keys, owner, ttl));
        return Promise.reject(new Error('no answer within 10 ms'));
      }
    }
    const backend = new LateExtendBackend();
    locks = new LockService(backend);
    const handle = await locks.acquire('job', { ttl: 60_000, autoExtend: false });
    await expect(handle.extend(1_000)).rejects.toThrow(/extend failed/);
    await backend.applied;
    const backendEndsAt = await endOfLease(backend);
    expect(handle.expiresAt.getTime()).toBeLessThanOrEqual(backendEndsAt + 2);
  });
});
