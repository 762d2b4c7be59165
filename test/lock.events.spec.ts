import 'reflect-metadata';
import { afterEach, describe, expect, it, jest } from '@jest/globals';
import { Injectable, Logger } from '@nestjs/common';
import { Test } from '@nestjs/testing';
import {
  DistributedLockModule,
  InvalidLockOptionsError,
  LockBackendError,
  LockEvents,
  LockLostError,
  LockNotAcquiredError,
  LockService,
  Locked,
  type LockBackend,
  type LockEventMap,
  type LockEventName,
} from '../lib/index.js';
import { until } from './support/wait.js';

type Recorded = { [E in LockEventName]: [E, LockEventMap[E]] }[LockEventName];

/** Every event of `locks`, in the order they came. */
function record(locks: LockService): Recorded[] {
  const seen: Recorded[] = [];
  for (const name of ['acquired', 'released', 'busy', 'failed', 'lost', 'extended'] as const) {
    locks.events.on(name, (event) => seen.push([name, event] as Recorded));
  }
  return seen;
}

function stallUntil(at: number): void {
  while (performance.now() <= at) {
    // A synchronous stall, as a long computation or a GC pause makes one.
  }
}

const down: LockBackend = {
  name: 'down',
  fencing: true,
  tryAcquire: async () => {
    throw new Error('ECONNREFUSED');
  },
  extend: async () => ({ extended: false }),
  release: async () => false,
  inspect: async () => undefined,
};

describe('lock events', () => {
  let locks: LockService | undefined;
  afterEach(async () => {
    jest.restoreAllMocks();
    await locks?.onApplicationShutdown();
    locks = undefined;
  });

  it('acquire then release: acquired with the fencing token, then released with the time held', async () => {
    locks = new LockService();
    const seen = record(locks);
    const handle = await locks.acquire(['b', 'a']);
    expect(seen).toEqual([
      [
        'acquired',
        {
          keys: ['lock:a', 'lock:b'],
          template: undefined,
          fencingToken: handle.fencingToken,
          waitedMs: expect.any(Number),
          contended: false,
          reentrant: false,
        },
      ],
    ]);
    await handle.release();
    await handle.release(); // a second release is no event
    expect(seen.slice(1)).toEqual([
      ['released', { keys: ['lock:a', 'lock:b'], template: undefined, heldMs: expect.any(Number), reentrant: false }],
    ]);
    expect(handle.fencingToken).toEqual(expect.any(Number));
  });

  it('a busy lock with wait 0: busy, not timed out, and the caller gets its LockNotAcquiredError after the event', async () => {
    locks = new LockService();
    const holder = await locks.acquire('k', { ttl: 5_000 });
    const seen = record(locks);
    const order: string[] = [];
    locks.events.on('busy', () => order.push('event'));
    await locks.acquire('k', { wait: 0 }).catch((error: unknown) => order.push((error as Error).name));
    expect(await locks.tryAcquire('k')).toBeUndefined();
    expect(order).toEqual(['event', LockNotAcquiredError.name, 'event']);
    const busy = { keys: ['lock:k'], template: undefined, waitedMs: expect.any(Number), timedOut: false, queueFull: undefined };
    expect(seen).toEqual([
      ['busy', { ...busy, retryAfterMs: expect.any(Number) }],
      ['busy', { ...busy, retryAfterMs: expect.any(Number) }],
    ]);
    await holder.release();
  });

  it('a wait that runs out: busy with timedOut, after at least the wait', async () => {
    locks = new LockService(undefined, { pollInterval: 20 });
    const holder = await locks.acquire('k', { ttl: 5_000 });
    const seen = record(locks);
    await expect(locks.acquire('k', { wait: 60 })).rejects.toBeInstanceOf(LockNotAcquiredError);
    expect(seen).toEqual([['busy', expect.objectContaining({ keys: ['lock:k'], timedOut: true, queueFull: undefined })]]);
    expect((seen[0][1] as LockEventMap['busy']).waitedMs).toBeGreaterThanOrEqual(60);
    await holder.release();
  });

  it('a call refused by maxWaitersPerKey: busy with queueFull, not timed out', async () => {
    locks = new LockService(undefined, { maxWaitersPerKey: 1 });
    const holder = await locks.acquire('k', { ttl: 5_000 });
    const waiting = locks.acquire('k', { wait: 5_000 });
    const seen = record(locks);
    await expect(locks.acquire('k', { wait: 5_000 })).rejects.toBeInstanceOf(LockNotAcquiredError);
    expect(seen).toEqual([['busy', expect.objectContaining({ timedOut: false, queueFull: 'perKey' })]]);
    await holder.release();
    await (await waiting).release();
  });

  it('a waiter that gets the lock: the holder released first, then acquired with contended', async () => {
    locks = new LockService();
    const holder = await locks.acquire('k');
    const seen = record(locks);
    const waiter = locks.acquire('k', { wait: 5_000 });
    await holder.release();
    const handle = await waiter;
    expect(seen.map(([name, event]) => [name, 'contended' in event ? event.contended : undefined])).toEqual([
      ['released', undefined],
      ['acquired', true],
    ]);
    expect(handle.fencingToken).toBeGreaterThan(holder.fencingToken!);
    await handle.release();
  });

  it('re-entry: the inner acquisition and release are marked reentrant, inside the outer pair', async () => {
    locks = new LockService();
    const seen = record(locks);
    await locks.using('k', () => locks!.using('k', () => undefined));
    expect(seen.map(([name, event]) => [name, (event as { reentrant: boolean }).reentrant])).toEqual([
      ['acquired', false],
      ['acquired', true],
      ['released', true],
      ['released', false],
    ]);
    const [outer, inner] = seen.map(([, event]) => event as LockEventMap['acquired']);
    expect(inner.fencingToken).toBe(outer.fencingToken);
  });

  it('a lease that ran out while held: lost with reason expired and the error its signal aborts with', async () => {
    locks = new LockService();
    const handle = await locks.acquire('k', { ttl: 100, autoExtend: false });
    const seen = record(locks);
    stallUntil(performance.now() + 100);
    expect(handle.isHeld).toBe(false);
    expect(seen).toEqual([['lost', { keys: ['lock:k'], reason: 'expired', error: handle.signal.reason }]]);
    expect(handle.signal.reason).toBeInstanceOf(LockLostError);
    await handle.release();
    expect(seen.map(([name]) => name)).toEqual(['lost', 'released']);
  });

  it('extended: by extend() (automatic false) and by the watchdog (automatic true)', async () => {
    locks = new LockService();
    const seen = record(locks);
    const manual = await locks.acquire('manual', { autoExtend: false });
    await manual.extend(60_000);
    expect(seen.slice(1)).toEqual([['extended', { keys: ['lock:manual'], ttlMs: 60_000, automatic: false }]]);
    const watched = await locks.acquire('watched', { ttl: 90 });
    await until(
      () => seen.some(([name, event]) => name === 'extended' && event.keys[0] === 'lock:watched'),
      5_000,
      'an automatic extension',
    );
    expect(seen.find(([name, event]) => name === 'extended' && event.keys[0] === 'lock:watched')?.[1]).toEqual({
      keys: ['lock:watched'],
      ttlMs: 90,
      automatic: true,
    });
    await manual.release();
    await watched.release();
  });

  it('failed: a backend error reaches listeners, then the caller', async () => {
    locks = new LockService(down, { pollInterval: 20 });
    const seen = record(locks);
    const error = await locks.acquire('k', { wait: 0 }).catch((e: unknown) => e);
    expect(error).toBeInstanceOf(LockBackendError);
    expect(seen).toEqual([['failed', { keys: ['lock:k'], template: undefined, waitedMs: expect.any(Number), error }]]);
  });

  it('a @Locked method names its lock by its template', async () => {
    @Injectable()
    class Orders {
      @Locked('order:<id>')
      async pay(id: number): Promise<number> {
        return id;
      }
      @Locked((id: number) => `refund:${id}`)
      async refund(id: number): Promise<number> {
        return id;
      }
    }
    const moduleRef = await Test.createTestingModule({ imports: [DistributedLockModule.forRoot()], providers: [Orders] }).compile();
    await moduleRef.init();
    const service = moduleRef.get(LockService);
    const seen = record(service);
    await moduleRef.get(Orders).pay(42);
    await moduleRef.get(Orders).refund(7);
    expect(seen.map(([name, event]) => [name, event.keys, event.template])).toEqual([
      ['acquired', ['lock:order:42'], 'order:<id>'],
      ['released', ['lock:order:42'], 'order:<id>'],
      ['acquired', ['lock:refund:7'], 'Orders.refund()'],
      ['released', ['lock:refund:7'], 'Orders.refund()'],
    ]);
    await moduleRef.close();
  });

  it('a listener that throws is logged; the lock call goes on', async () => {
    locks = new LockService();
    const error = jest.spyOn(Logger.prototype, 'error').mockImplementation(() => undefined);
    locks.events.on('acquired', () => {
      throw new Error('listener bug');
    });
    const handle = await locks.acquire('k');
    expect(handle.isHeld).toBe(true);
    expect(error).toHaveBeenCalledWith(
      expect.stringContaining("'acquired' lock event listener threw: Error: listener bug"),
      expect.any(String),
    );
    await handle.release();
  });

  it('on() returns the unsubscribe; each subscription is its own, so one function subscribed twice runs twice', async () => {
    locks = new LockService();
    const calls: string[] = [];
    const listener = () => calls.push('a');
    const stopFirst = locks.events.on('acquired', listener);
    const stopSecond = locks.events.on('acquired', listener);
    await (await locks.acquire('k')).release();
    stopFirst();
    await (await locks.acquire('k')).release();
    stopSecond();
    await (await locks.acquire('k')).release();
    expect(calls).toEqual(['a', 'a', 'a']);
  });

  it('without listeners, nothing is emitted: no payload is built', async () => {
    locks = new LockService(undefined, { pollInterval: 20 });
    const emit = jest.spyOn(LockEvents.prototype, 'emit');
    const holder = await locks.acquire('k', { ttl: 90 });
    await locks.using('k2', () => locks!.using('k2', () => undefined));
    expect(await locks.tryAcquire('k')).toBeUndefined();
    await holder.extend();
    await holder.release();
    expect(emit).not.toHaveBeenCalled();
    // One listener: only its event is built.
    locks.events.on('busy', () => undefined);
    const again = await locks.acquire('k');
    expect(await locks.tryAcquire('k')).toBeUndefined();
    await again.release();
    expect(emit.mock.calls.map(([name]) => name)).toEqual(['busy']);
  });

  it('refuses an unknown event name or a listener that is not a function, saying which are accepted', () => {
    locks = new LockService();
    expect(() => locks!.events.on('acquire' as LockEventName, () => undefined)).toThrow(
      "Unknown lock event 'acquire'. Lock events are: acquired, released, busy, failed, lost, extended.",
    );
    expect(() => locks!.events.on('busy', 'log' as never)).toThrow('listener must be a function, got string');
  });
});

describe('debug logs', () => {
  let locks: LockService | undefined;
  afterEach(async () => {
    jest.restoreAllMocks();
    await locks?.onApplicationShutdown();
    locks = undefined;
  });

  it('with debugLogs, a refusal, a timed-out wait and a wait that got the lock each log a debug line', async () => {
    const debug = jest.spyOn(Logger.prototype, 'debug').mockImplementation(() => undefined);
    locks = new LockService(undefined, { debugLogs: true, pollInterval: 20 });
    const holder = await locks.acquire('k', { ttl: 5_000 });
    expect(await locks.tryAcquire('k')).toBeUndefined();
    await expect(locks.acquire('k', { wait: 30 })).rejects.toBeInstanceOf(LockNotAcquiredError);
    const waiter = locks.acquire('k', { wait: 5_000 });
    await holder.release();
    await (await waiter).release();
    expect(debug.mock.calls.map(([message]) => String(message))).toEqual([
      expect.stringMatching(
        /^Refused lock:k: held elsewhere, and the call does not wait \(wait: 0\)\. The holder's lease ends in \d+ ms at most\.$/,
      ),
      expect.stringMatching(/^Gave up on lock:k after waiting \d+ ms: held elsewhere all along\./),
      expect.stringMatching(/^Acquired lock:k after waiting \d+ ms: another holder had it\.$/),
    ]);
  });

  it('off by default: no debug line', async () => {
    const debug = jest.spyOn(Logger.prototype, 'debug').mockImplementation(() => undefined);
    locks = new LockService();
    const holder = await locks.acquire('k');
    expect(await locks.tryAcquire('k')).toBeUndefined();
    await holder.release();
    expect(debug).not.toHaveBeenCalled();
  });

  it('refuses a debugLogs or telemetry option of the wrong type', () => {
    expect(() => new LockService(undefined, { debugLogs: 'yes' as never })).toThrow(InvalidLockOptionsError);
    expect(() => new LockService(undefined, { telemetry: 'otel' as never })).toThrow(
      "option 'telemetry' must be true, false or an object { meterProvider?, tracerProvider?, spanKeys? }, got 'otel'",
    );
    expect(() => new LockService(undefined, { telemetry: { spanKey: true } as never })).toThrow(
      "unknown telemetry option 'spanKey'. Accepted: meterProvider, tracerProvider, spanKeys",
    );
  });
});
