import fc from 'fast-check';
import type { LockBackend } from '../../lib/backends/lock-backend.interface.js';
import type { DistributedLockError as DistributedLockErrorClass } from '../../lib/lock.errors.js';
import type { LockHandle } from '../../lib/lock.handle.js';
import type { LockService } from '../../lib/lock.service.js';
import { FaultyBackend, MAX_FAULT_MS, type Fault } from './faulty-backend.js';

/**
 * Random programs of two LockServices (two processes) over one store, and the promises they must
 * keep: shared by the model test on fake time (in-memory store) and the one on a real Redis.
 */

/** The library's classes, as the spec loaded them (the fake-time spec loads them after a mock). */
export interface Library {
  LockService: typeof LockService;
  DistributedLockError: typeof DistributedLockErrorClass;
}

/** How time moves: fake time that the test advances, or real time. */
export interface Clock {
  /** Milliseconds on this clock: what waits are bounded on. */
  now(): number;
  /** Resolves true once `work` settled, false if it had not after 20 s of this clock's time. */
  drive(work: Promise<unknown>): Promise<boolean>;
  /** Timers still pending once everything ended (after every lease and wait could have run out). */
  timersLeft(): Promise<number>;
  /** What a wait's bound allows on top for a loaded machine: 0 on fake time. */
  slackMs: number;
}

const KEYS = ['a', 'b', 'c'];
const POLL_MS = 20;
/** The lease of an acquisition that may be aborted mid-wait: short, so an evicted one is told soon. */
const ABORT_TTL_MS = 200;
/** The longest lease a program asks for (an extension's). */
const MAX_TTL_MS = 300;

export type Op =
  | {
      kind: 'using';
      keys: string[];
      hold: number;
      wait: number;
      ttl: number;
      autoExtend: boolean;
      nested?: { keys: string[]; hold: number };
    }
  | { kind: 'try'; keys: string[]; hold: number; ttl: number }
  | { kind: 'abort'; keys: string[]; wait: number; abortAfter: number; hold: number }
  | { kind: 'extend'; keys: string[]; hold: number; ttl: number; extendTo: number }
  /**
   * What another party does to the store while others hold its keys, `after` ms into the op: an
   * operator deletes the keys (as a store that lost its data does), or a second owner tries to
   * extend and release them, which the store must refuse.
   */
  | { kind: 'operator'; keys: string[]; after: number; action: 'evict' | 'intrude' };

export interface Actor {
  service: number;
  start: number;
  ops: Op[];
}

export interface Scenario {
  actors: Actor[];
  faults: Fault[];
  /** When the second service (a second process) shuts down, if it does. */
  shutdownAt?: number;
}

const keys = fc.subarray(KEYS, { minLength: 1, maxLength: 2 });
const op: fc.Arbitrary<Op> = fc.oneof(
  fc.record({
    kind: fc.constant('using' as const),
    keys,
    hold: fc.integer({ min: 0, max: 80 }),
    wait: fc.integer({ min: 0, max: 200 }),
    ttl: fc.integer({ min: 30, max: 200 }),
    autoExtend: fc.boolean(),
    nested: fc.option(fc.record({ keys, hold: fc.integer({ min: 0, max: 30 }) }), { nil: undefined }),
  }),
  fc.record({ kind: fc.constant('try' as const), keys, hold: fc.integer({ min: 0, max: 60 }), ttl: fc.integer({ min: 30, max: 200 }) }),
  fc.record({
    kind: fc.constant('abort' as const),
    keys,
    wait: fc.integer({ min: 1, max: 200 }),
    abortAfter: fc.integer({ min: 0, max: 60 }),
    hold: fc.integer({ min: 0, max: 40 }),
  }),
  fc.record({
    kind: fc.constant('extend' as const),
    keys,
    hold: fc.integer({ min: 0, max: 120 }),
    ttl: fc.integer({ min: 30, max: 100 }),
    extendTo: fc.integer({ min: 30, max: 300 }),
  }),
  fc.record({
    kind: fc.constant('operator' as const),
    keys,
    after: fc.integer({ min: 0, max: 60 }),
    action: fc.constantFrom('evict' as const, 'intrude' as const),
  }),
);
const fault: fc.Arbitrary<Fault> = fc.oneof(
  { weight: 6, arbitrary: fc.constant({ kind: 'ok' as const }) },
  { weight: 1, arbitrary: fc.record({ kind: fc.constant('late' as const), ms: fc.integer({ min: 1, max: MAX_FAULT_MS / 2 }) }) },
  { weight: 1, arbitrary: fc.record({ kind: fc.constant('timeout' as const), ms: fc.integer({ min: 1, max: MAX_FAULT_MS / 2 }) }) },
  { weight: 1, arbitrary: fc.constant({ kind: 'fail' as const }) },
  { weight: 1, arbitrary: fc.constant({ kind: 'twice' as const }) },
);
export const scenario: fc.Arbitrary<Scenario> = fc.record({
  actors: fc.array(
    fc.record({
      service: fc.integer({ min: 0, max: 1 }),
      start: fc.integer({ min: 0, max: 50 }),
      ops: fc.array(op, { minLength: 1, maxLength: 4 }),
    }),
    { minLength: 2, maxLength: 4 },
  ),
  faults: fc.array(fault, { maxLength: 30 }),
  shutdownAt: fc.option(fc.integer({ min: 0, max: 400 }), { nil: undefined }),
});

const sleep = (ms: number) => new Promise<void>((resolve) => setTimeout(resolve, ms));

/**
 * Runs one scenario on fake time against `store` (the truth: who holds what) behind the faults, and
 * returns every broken promise it saw:
 * - a section whose handle says `isHeld` while the store has the key under another owner;
 * - a fencing token not greater than an earlier one of its key;
 * - an error that is not one of the library's typed errors (or the caller's abort reason);
 * - an acquisition that outlived its wait by more than one faulty call and a poll;
 * - anything left behind once everything ended: timers, waiters in a queue, store subscriptions.
 */
export async function run(
  lib: Library,
  clock: Clock,
  s: Scenario,
  store: LockBackend,
  storeWatchers: () => number,
  { faulty = true, waitBounds = true } = {},
): Promise<string[]> {
  const { LockService, DistributedLockError } = lib;
  const violations: string[] = [];
  // Without faults the services call the store itself: for the in-memory backend that is the path
  // whose answers come without a promise, which a wrapper would hide.
  const backend = faulty ? new FaultyBackend(store, s.faults) : store;
  const services = [0, 1].map(() => new LockService(backend, { pollInterval: POLL_MS, keyPrefix: '' }));
  const lastToken = new Map<string, number>();
  const seen = new WeakSet<object>();
  const now = () => clock.now();

  /** When an operator last deleted each key from the store. */
  const evictedAt = new Map<string, number>();
  /**
   * After its key was deleted from the store, a holder may go on believing it holds it until its
   * next extension is refused or its deadline passes: at most its ttl later. Past that, it must
   * have been told (its signal aborted).
   */
  const toldWithin = (key: string, ttl: number) => {
    const evicted = evictedAt.get(key);
    return evicted !== undefined && now() <= evicted + ttl + clock.slackMs;
  };

  async function hold(handle: LockHandle, ms: number, label: string, ttl: number): Promise<void> {
    for (const lease of handle.leases) {
      if (seen.has(lease)) continue;
      seen.add(lease);
      for (const key of lease.keys) {
        const token = lease.fencingToken ?? Number.NaN;
        const last = lastToken.get(key);
        // After an operator deleted the key, a holder that has not heard yet and the next one
        // overlap: the older token may be seen second, as after any loss of the store's data.
        if (last !== undefined && !(token > last) && !toldWithin(key, MAX_TTL_MS))
          violations.push(`${label}: token ${token} on ${key} is not above the earlier ${last}`);
        lastToken.set(key, Math.max(token, last ?? token));
      }
    }
    for (let t = 0; ; t++) {
      for (const lease of handle.leases) {
        for (const key of lease.keys) {
          // The store first: what it says holds from then on, so a handle that still says isHeld
          // after it gave the key away (or let it go) is wrong, whatever the time a store call takes.
          const owner = (await store.inspect(key))?.owner;
          if (owner !== lease.owner && handle.isHeld && !toldWithin(key, ttl)) {
            violations.push(`${label}: at ${now()} ms isHeld on ${key}, which the store has ${owner ? 'under another owner' : 'free'}`);
          }
        }
      }
      // Inside its section a handle is held, or its signal told the holder why not: a lock let go
      // under a running holder (a nested scope that released the outer lease) breaks both.
      if (!handle.isHeld && !handle.signal.aborted) violations.push(`${label}: at ${now()} ms not held, and its holder was not told`);
      if (t >= ms) return;
      await sleep(1);
    }
  }

  async function perform(service: LockService, o: Op, label: string): Promise<void> {
    const started = now();
    const bound = ('wait' in o ? o.wait : 0) + 3 * MAX_FAULT_MS + POLL_MS + clock.slackMs;
    let entered = false;
    const enter = () => {
      entered = true;
      if (waitBounds && now() - started > bound)
        violations.push(`${label}: entered after ${now() - started} ms, beyond its bound of ${bound}`);
    };
    const reason = new Error('caller gave up');
    try {
      if (o.kind === 'using') {
        await service.using(
          o.keys,
          async (handle) => {
            enter();
            await hold(handle, o.hold, label, o.ttl);
            if (o.nested) {
              const nested = o.nested;
              await service.using(nested.keys, (inner) => hold(inner, nested.hold, `${label} nested`, o.ttl), { wait: o.wait, ttl: o.ttl });
              // The outer scope goes on after the nested one returned: its lock must still be there.
              await hold(handle, nested.hold, `${label} after nested`, o.ttl);
            }
          },
          { wait: o.wait, ttl: o.ttl, autoExtend: o.autoExtend },
        );
      } else if (o.kind === 'try') {
        const handle = await service.tryAcquire(o.keys, { ttl: o.ttl });
        if (handle) {
          enter();
          await hold(handle, o.hold, label, o.ttl);
          await handle.release();
        }
      } else if (o.kind === 'abort') {
        const controller = new AbortController();
        const timer = setTimeout(() => controller.abort(reason), o.abortAfter);
        try {
          const handle = await service.acquire(o.keys, { wait: o.wait, signal: controller.signal, ttl: ABORT_TTL_MS });
          enter();
          await hold(handle, o.hold, label, ABORT_TTL_MS);
          await handle.release();
        } finally {
          clearTimeout(timer);
        }
      } else if (o.kind === 'extend') {
        const handle = await service.acquire(o.keys, { ttl: o.ttl, autoExtend: false, wait: 100 });
        enter();
        await hold(handle, o.hold / 2, label, o.ttl);
        await handle.extend(o.extendTo).catch((error: unknown) => {
          if (!(error instanceof DistributedLockError)) throw error;
        });
        await hold(handle, o.hold / 2, label, Math.max(o.ttl, o.extendTo));
        await handle.release();
      } else {
        await sleep(o.after);
        for (const key of o.keys) {
          const owner = (await store.inspect(key))?.owner;
          if (owner === undefined) continue;
          if (o.action === 'evict') {
            evictedAt.set(key, now());
            await store.release([key], owner);
            continue;
          }
          // Another owner's extend and release of a held key: both refused, the key untouched.
          const extended = await store.extend([key], 'intruder', 10_000);
          if (extended.extended) violations.push(`${label}: the store extended ${key} for an owner that does not hold it`);
          if (await store.release([key], 'intruder'))
            violations.push(`${label}: the store released ${key} for an owner that does not hold it`);
        }
      }
    } catch (error) {
      if (error === reason) return;
      if (!(error instanceof DistributedLockError)) violations.push(`${label}: untyped error ${String(error)}`);
      else if (waitBounds && !entered && now() - started > bound)
        violations.push(`${label}: failed after ${now() - started} ms, beyond its bound of ${bound}`);
    }
  }

  const actors = s.actors.map(async (actor, a) => {
    await sleep(actor.start);
    for (const [i, o] of actor.ops.entries())
      await perform(services[actor.service], o, `actor ${a} op ${i} (${o.kind} ${o.keys.join('+')})`);
  });
  if (s.shutdownAt !== undefined) setTimeout(() => void services[1].onApplicationShutdown(), s.shutdownAt);
  if (!(await clock.drive(Promise.all(actors)))) violations.push('the actors had not finished after 20 s');

  await clock.drive(Promise.all(services.map((service) => service.onApplicationShutdown())));
  const timers = await clock.timersLeft();
  if (timers > 0) violations.push(`${timers} timers left`);
  for (const service of services) {
    const queues = (service as unknown as { queue: { queues: Map<string, unknown[]> } }).queue.queues;
    if (queues.size > 0) violations.push(`waiters left in a local queue: ${[...queues.keys()].join(', ')}`);
  }
  if (storeWatchers() > 0) violations.push(`${storeWatchers()} store subscriptions left`);
  return violations;
}
