import fc from 'fast-check';
import type { LockBackend } from '../../lib/backends/lock-backend.interface.js';
import type { DistributedLockError as DistributedLockErrorClass } from '../../lib/lock.errors.js';
import type { LockHandle } from '../../lib/lock.handle.js';
import type { Lease } from '../../lib/lock-lease.js';
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
      nested?: { keys: string[]; hold: number; shared?: boolean };
      shared?: boolean;
    }
  | { kind: 'try'; keys: string[]; hold: number; ttl: number; shared?: boolean }
  | { kind: 'abort'; keys: string[]; wait: number; abortAfter: number; hold: number; shared?: boolean }
  | { kind: 'extend'; keys: string[]; hold: number; ttl: number; extendTo: number; shared?: boolean }
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

/**
 * Shared locks and semaphores: keys 'a' and 'b' are read/write locks (a shared op reads), key 's'
 * a semaphore of SEMAPHORE_PERMITS (a shared op takes a permit, any other the whole key). An op
 * takes keys of one family, so every caller of a key agrees on its limit.
 */
const SEMAPHORE_PERMITS = 2;
const sharedKeys: fc.Arbitrary<string[]> = fc.oneof(fc.subarray(['a', 'b'], { minLength: 1, maxLength: 2 }), fc.constant<string[]>(['s']));
const sharedOp: fc.Arbitrary<Op> = fc
  .tuple(op, sharedKeys, fc.boolean(), fc.option(fc.boolean(), { nil: undefined }))
  .map(([o, keys, shared, nestedShared]) => {
    if (o.kind === 'operator') return { ...o, keys };
    const nested = o.kind === 'using' && o.nested ? { ...o.nested, keys, shared: nestedShared ?? shared } : undefined;
    return { ...o, keys, shared, ...(nested && { nested }) } as Op;
  });
export const sharedScenario: fc.Arbitrary<Scenario> = fc.record({
  actors: fc.array(
    fc.record({
      service: fc.integer({ min: 0, max: 1 }),
      start: fc.integer({ min: 0, max: 50 }),
      ops: fc.array(sharedOp, { minLength: 1, maxLength: 4 }),
    }),
    { minLength: 2, maxLength: 5 },
  ),
  faults: fc.array(fault, { maxLength: 30 }),
  shutdownAt: fc.option(fc.integer({ min: 0, max: 400 }), { nil: undefined }),
});

/** The options that ask for the kind an op wants on its keys. */
function kindOptions(keys: readonly string[], shared: boolean | undefined): { mode?: 'shared'; permits?: number } {
  if (!shared) return {};
  return keys.includes('s') ? { permits: SEMAPHORE_PERMITS } : { mode: 'shared' };
}

/** How many holders a key admits for an op's options. */
const limitFor = (options: { mode?: 'shared'; permits?: number }) => options.permits ?? (options.mode ? Infinity : 1);

const sleep = (ms: number) => new Promise<void>((resolve) => setTimeout(resolve, ms));

/**
 * Runs one scenario on fake time against `store` (the truth: who holds what) behind the faults, and
 * returns every broken promise it saw:
 * - a section whose handle says `isHeld` while the store has the key under another owner;
 * - a fencing token not greater than an earlier one of its key;
 * - an error that is not one of the library's typed errors (or the caller's abort reason);
 * - an acquisition that outlived its wait by more than one faulty call and a poll;
 * - anything left behind once everything ended: timers, waiters in a queue, store subscriptions;
 * - with shared locks and semaphores: a writer beside any other holder, more holders than
 *   permits, a token not above every token of the holders that ended before it began, and (with
 *   `fifo`, on a store called without faults) a waiter passed by a later caller of its process
 *   for the same keys that could not hold beside it.
 */
export async function run(
  lib: Library,
  clock: Clock,
  s: Scenario,
  store: LockBackend,
  storeWatchers: () => number,
  { faulty = true, waitBounds = true, fifo = false, attemptsInOrder = false } = {},
): Promise<string[]> {
  const { LockService, DistributedLockError } = lib;
  const violations: string[] = [];
  // Without faults the services call the store itself: for the in-memory backend that is the path
  // whose answers come without a promise, which a wrapper would hide.
  const backend = faulty ? new FaultyBackend(store, s.faults, attemptsInOrder) : store;
  const services = [0, 1].map(() => new LockService(backend, { pollInterval: POLL_MS, keyPrefix: '' }));
  const lastToken = new Map<string, number>();
  for (const service of services) {
    service.events.on('acquired', (event) => {
      if (event.reentrant || event.fencingToken === undefined) return;
      // It began no earlier than its call: a grant answered late (a slow network) may come after
      // a later holder came and went beside it, which shared holders allow.
      const asked = now() - event.waitedMs;
      for (const key of event.keys) {
        const before = (endedHolders.get(key) ?? []).filter((h) => h.at < asked).map((h) => h.token);
        const ended = Math.max(-Infinity, ...before);
        if (!(event.fencingToken > ended) && !toldWithin(key, MAX_TTL_MS))
          violations.push(
            `at ${now()} ms token ${event.fencingToken} on ${key} is not above ${ended}, of a holder that ended before it asked`,
          );
      }
    });
  }
  /** A holder's section ended and its release went out (marked a little late: the rule only gets looser). */
  const ended = (handle: LockHandle | undefined) => {
    for (const lease of handle?.leases ?? [])
      for (const key of lease.keys) {
        if (lease.fencingToken === undefined) continue;
        const list = endedHolders.get(key) ?? [];
        list.push({ token: lease.fencingToken, at: now() });
        endedHolders.set(key, list);
      }
  };
  const seen = new WeakSet<object>();
  const now = () => clock.now();
  /** Per key, the holders that ended (released) so far: their tokens and when they ended. */
  const endedHolders = new Map<string, { token: number; at: number }[]>();
  /** Per key, the leases inside a section now, with how many sections use each (re-entries share one). */
  const inside = new Map<string, Map<Lease, number>>();
  /** Top-level calls that wait (`using` with a wait), in order of arrival, while they wait or hold. */
  interface Waiting {
    service: LockService;
    id: string;
    limit: number;
    arrival: number;
    until: number;
    acquired: boolean;
    label: string;
  }
  const waiters = new Set<Waiting>();
  let arrivals = 0;

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
      for (const key of lease.keys) {
        let leases = inside.get(key);
        if (!leases) inside.set(key, (leases = new Map()));
        leases.set(lease, (leases.get(lease) ?? 0) + 1);
      }
      if (seen.has(lease)) continue;
      seen.add(lease);
      for (const key of lease.keys) {
        const token = lease.fencingToken ?? Number.NaN;
        const last = lastToken.get(key);
        // After an operator deleted the key, a holder that has not heard yet and the next one
        // overlap: the older token may be seen second, as after any loss of the store's data.
        // Shared holders may begin their sections in another order than they got their tokens:
        // for them the rule is the one checked at acquisition (above every holder that ended).
        if (lease.limit === 1 && last !== undefined && !(token > last) && !toldWithin(key, MAX_TTL_MS))
          violations.push(`${label}: token ${token} on ${key} is not above the earlier ${last}`);
        lastToken.set(key, Math.max(token, last ?? token));
      }
    }
    try {
      for (let t = 0; ; t++) {
        for (const lease of handle.leases) {
          for (const key of lease.keys) {
            // The store first: what it says holds from then on, so a handle that still says isHeld
            // after it gave the key away (or let it go) is wrong, whatever the time a store call takes.
            const state = await store.inspect(key);
            const owners = state?.holders?.map((h) => h.owner) ?? (state ? [state.owner] : []);
            if (!owners.includes(lease.owner) && handle.isHeld && !toldWithin(key, ttl)) {
              violations.push(`${label}: at ${now()} ms isHeld on ${key}, which the store has ${state ? 'under other owners' : 'free'}`);
            }
            checkHolders(key, label);
          }
        }
        // Inside its section a handle is held, or its signal told the holder why not: a lock let go
        // under a running holder (a nested scope that released the outer lease) breaks both.
        if (!handle.isHeld && !handle.signal.aborted) violations.push(`${label}: at ${now()} ms not held, and its holder was not told`);
        if (t >= ms) return;
        await sleep(1);
      }
    } finally {
      for (const lease of handle.leases) {
        for (const key of lease.keys) {
          const leases = inside.get(key)!;
          const count = leases.get(lease)! - 1;
          if (count > 0) leases.set(lease, count);
          else leases.delete(lease);
        }
      }
    }
  }

  /** Never a writer beside another holder, never more holders than permits, among sections that believe they hold. */
  function checkHolders(key: string, label: string): void {
    const live = [...(inside.get(key)?.keys() ?? [])].filter((lease) => lease.state === 'held');
    if (live.length < 2 || toldWithin(key, MAX_TTL_MS)) return;
    const least = Math.min(...live.map((lease) => lease.limit));
    if (live.length > least)
      violations.push(
        `${label}: at ${now()} ms ${live.length} holders of ${key} at once, ` +
          (least === 1 ? 'one of them exclusive' : `of ${least} permits`),
      );
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
    const kind = o.kind === 'operator' ? {} : kindOptions(o.keys, o.shared);
    const limit = limitFor(kind);
    // A call that waits, in its process's queue for its keys: no later caller there may pass it.
    const me: Waiting | undefined =
      fifo && o.kind === 'using' && o.wait > 0
        ? { service, id: o.keys.join('\n'), limit, arrival: arrivals++, until: started + o.wait, acquired: false, label }
        : undefined;
    if (me) waiters.add(me);
    const passes = () => {
      if (!me) return;
      me.acquired = true;
      for (const earlier of waiters) {
        if (earlier.acquired || earlier.service !== service || earlier.id !== me.id || earlier.arrival > me.arrival) continue;
        if (now() >= earlier.until) continue;
        // Callers that can hold together may enter in any order; a permit taken while no other is free is a pass.
        const full = [...(inside.get(o.keys[0])?.keys() ?? [])].filter((lease) => lease.state === 'held').length + 1 >= limit;
        if (earlier.limit === 1 || limit === 1 || (limit !== Infinity && full))
          violations.push(`${label}: entered at ${now()} ms while ${earlier.label}, which asked before it, still waited`);
      }
    };
    let outer: LockHandle | undefined;
    try {
      if (o.kind === 'using') {
        await service.using(
          o.keys,
          async (handle) => {
            outer = handle;
            enter();
            passes();
            await hold(handle, o.hold, label, o.ttl);
            if (o.nested) {
              const nested = o.nested;
              await service.using(nested.keys, (inner) => hold(inner, nested.hold, `${label} nested`, o.ttl), {
                wait: o.wait,
                ttl: o.ttl,
                ...kindOptions(nested.keys, nested.shared),
              });
              // The outer scope goes on after the nested one returned: its lock must still be there.
              await hold(handle, nested.hold, `${label} after nested`, o.ttl);
            }
          },
          { wait: o.wait, ttl: o.ttl, autoExtend: o.autoExtend, ...kind },
        );
        ended(outer);
      } else if (o.kind === 'try') {
        const handle = await service.tryAcquire(o.keys, { ttl: o.ttl, ...kind });
        if (handle) {
          enter();
          await hold(handle, o.hold, label, o.ttl);
          await handle.release();
          ended(handle);
        }
      } else if (o.kind === 'abort') {
        const controller = new AbortController();
        const timer = setTimeout(() => controller.abort(reason), o.abortAfter);
        try {
          const handle = await service.acquire(o.keys, { wait: o.wait, signal: controller.signal, ttl: ABORT_TTL_MS, ...kind });
          enter();
          await hold(handle, o.hold, label, ABORT_TTL_MS);
          await handle.release();
          ended(handle);
        } finally {
          clearTimeout(timer);
        }
      } else if (o.kind === 'extend') {
        const handle = await service.acquire(o.keys, { ttl: o.ttl, autoExtend: false, wait: 100, ...kind });
        enter();
        await hold(handle, o.hold / 2, label, o.ttl);
        await handle.extend(o.extendTo).catch((error: unknown) => {
          if (!(error instanceof DistributedLockError)) throw error;
        });
        await hold(handle, o.hold / 2, label, Math.max(o.ttl, o.extendTo));
        await handle.release();
        ended(handle);
      } else {
        await sleep(o.after);
        for (const key of o.keys) {
          const state = await store.inspect(key);
          if (state === undefined) continue;
          const owner = state.owner;
          if (o.action === 'evict') {
            const holders = state.holders?.map((h) => h.owner) ?? [owner];
            // A holder of several keys that loses one loses its whole lock: a store may free its
            // other keys with it (etcd's keys of one lock share one lease), before it hears. So may
            // an extension of it that went unanswered and lands later, finding the key gone. The
            // store says which other keys its holders have, whether they are inside a section,
            // between two, or not yet in their first (the acquire answered, the handle on its way).
            const keysOfHolders: string[] = [];
            for (const other of [...KEYS, 's']) {
              const held = await store.inspect(other);
              const owners = held?.holders?.map((h) => h.owner) ?? (held ? [held.owner] : []);
              if (owners.some((o) => holders.includes(o))) keysOfHolders.push(other);
            }
            for (const evicted of new Set([key, ...keysOfHolders])) evictedAt.set(evicted, now());
            for (const holder of holders) await store.release([key], holder);
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
      ended(outer);
      if (error === reason) return;
      if (!(error instanceof DistributedLockError)) violations.push(`${label}: untyped error ${String(error)}`);
      else if (waitBounds && !entered && now() - started > bound)
        violations.push(`${label}: failed after ${now() - started} ms, beyond its bound of ${bound}`);
    } finally {
      if (me) waiters.delete(me);
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
