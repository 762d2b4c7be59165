import { afterEach, describe, expect, it } from '@jest/globals';
import { LockService } from 'nest-distributed-lock';
import { recordLocks } from 'nest-distributed-lock/testing';

const services: LockService[] = [];
function service(options?: ConstructorParameters<typeof LockService>[1]): LockService {
  const locks = new LockService(undefined, options);
  services.push(locks);
  return locks;
}

afterEach(async () => {
  await Promise.all(services.splice(0).map((locks) => locks.onApplicationShutdown()));
});

describe('LockRecorder', () => {
  it('records every event in order, named by type', async () => {
    const locks = service();
    const recorder = recordLocks(locks);
    await locks.using('a', () => undefined);
    const held = await locks.acquire('b');
    await locks.tryAcquire('b');
    await held.release();
    expect(recorder.events.map((e) => [e.type, e.keys])).toEqual([
      ['acquired', ['lock:a']],
      ['released', ['lock:a']],
      ['acquired', ['lock:b']],
      ['busy', ['lock:b']],
      ['released', ['lock:b']],
    ]);
  });

  it('locked: the keys of new acquisitions without the keyPrefix, in lock order; re-entries left out', async () => {
    const locks = service({ keyPrefix: 'shop:' });
    const recorder = recordLocks(locks);
    await locks.using(['account:9', 'account:3'], () => locks.using('account:3', () => locks.using('order:1', () => undefined)));
    expect(recorder.locked).toEqual(['account:3', 'account:9', 'order:1']);
    expect(recorder.events.filter((e) => e.type === 'acquired' && e.reentrant)).toHaveLength(1);
  });

  it('busy and lost name their keys without the keyPrefix', async () => {
    const locks = service({ keyPrefix: 'shop:', ttl: 100, autoExtend: false });
    const recorder = recordLocks(locks);
    const held = await locks.acquire('job:nightly');
    await locks.using('job:nightly', () => undefined, { onBusy: 'skip' });
    expect(recorder.busy).toEqual(['job:nightly']);
    await recorder.waitFor('lost', 'job:nightly', { timeoutMs: 5_000 });
    expect(recorder.lost).toEqual(['job:nightly']);
    expect(held.isHeld).toBe(false);
  });

  it('waitFor: an event recorded already, or the next one on that key, never one on another key', async () => {
    const locks = service();
    const recorder = recordLocks(locks);
    await locks.using('a', () => undefined);
    await expect(recorder.waitFor('acquired', 'a', { timeoutMs: 1_000 })).resolves.toMatchObject({ type: 'acquired', keys: ['lock:a'] });

    const onB = recorder.waitFor('released', 'b', { timeoutMs: 5_000 });
    let resolvedEarly = false;
    void onB.then(() => (resolvedEarly = !bReleased));
    let bReleased = false;
    await locks.using('c', () => undefined); // a release on another key
    await locks.using('b', () => {
      bReleased = true;
    });
    await expect(onB).resolves.toMatchObject({ type: 'released', keys: ['lock:b'] });
    expect(resolvedEarly).toBe(false);
  });

  it('waitFor with timeoutMs rejects, saying what it waited for and what was recorded', async () => {
    const locks = service();
    const recorder = recordLocks(locks);
    await locks.using('a', () => undefined);
    await expect(recorder.waitFor('lost', 'a', { timeoutMs: 30 })).rejects.toThrow(
      "No 'lost' lock event on 'a' within 30 ms. Recorded: acquired lock:a; released lock:a.",
    );
  });

  it('clear() forgets; stop() unsubscribes from the service, keeping what it recorded', async () => {
    const locks = service();
    const recorder = recordLocks(locks);
    await locks.using('a', () => undefined);
    recorder.clear();
    expect(recorder.events).toEqual([]);
    await locks.using('b', () => undefined);
    expect(recorder.locked).toEqual(['b']);

    recorder.stop();
    await locks.using('c', () => undefined);
    expect(recorder.locked).toEqual(['b']);
    for (const name of ['acquired', 'released', 'busy', 'failed', 'lost', 'extended'] as const) expect(locks.events.has(name)).toBe(false);
  });

  it('a `using` declaration stops it at the end of the scope', async () => {
    const locks = service();
    {
      using recorder = recordLocks(locks);
      expect(locks.events.has('acquired')).toBe(true);
      void recorder;
    }
    expect(locks.events.has('acquired')).toBe(false);
  });
});
