import { Logger } from '@nestjs/common';
import type { LockLostError, LockLostReason } from './lock.errors.js';
import type { LockKind } from './lock-mode.js';

/** What every lock event tells about the lock it is about. */
export interface LockEventBase {
  /** Full keys (prefix included), sorted. */
  readonly keys: readonly string[];
  /**
   * The key as a @Locked method declares it (`'order:<id>'`; a key function shows as
   * `Class.method()`; several keys joined by `,`). Bounded: one value per method, not per call.
   * Undefined for LockService calls, whose keys are plain strings.
   */
  readonly template?: string;
  /** For a shared (read) lock, 'shared'; for one of a semaphore's permits, 'permits'. Absent: an exclusive lock. */
  readonly mode?: Exclude<LockKind, 'exclusive'>;
  /** The semaphore's number of permits, when `mode` is 'permits'. */
  readonly permits?: number;
}

/** A call got its lock: a new lease, or a re-entry into one its async context holds. */
export interface LockAcquiredEvent extends LockEventBase {
  /** The token of this acquisition, as `LockHandle.fencingToken` gives it. */
  readonly fencingToken?: number;
  /** From the call to the lock, in milliseconds, the backend's round trips included. */
  readonly waitedMs: number;
  /** The first attempt found the lock held, and this call waited for it. */
  readonly contended: boolean;
  /** It entered a lock its async context already held (`using()`, @Locked): no backend request for those keys. */
  readonly reentrant: boolean;
}

/** A holder let go: its handle's `release()` (`using()` and @Locked call it when the function ends). */
export interface LockReleasedEvent extends LockEventBase {
  /** From the acquisition to the release, in milliseconds. */
  readonly heldMs: number;
  /** A re-entry let go: the outer holder still holds the lock. */
  readonly reentrant: boolean;
}

/** A call did not get its lock: refused at once (`wait: 0`, a full queue) or its wait ran out. */
export interface LockBusyEvent extends LockEventBase {
  readonly waitedMs: number;
  /** It waited (`wait` above 0) and the wait ran out; false for a single attempt or a full queue. */
  readonly timedOut: boolean;
  /** Refused without waiting: this process already had as many waiters as its cap allows. */
  readonly queueFull?: 'perKey' | 'total';
  /** The holder's remaining lease, when the backend told it. */
  readonly retryAfterMs?: number;
}

/** A call's acquisition threw: a backend failure, an aborted wait, shutdown. */
export interface LockFailedEvent extends LockEventBase {
  readonly waitedMs: number;
  readonly error: unknown;
}

/** A lease ended while held (see docs/shutdown-and-lost-locks.md); its holders' signals abort with `error`. */
export interface LockLostEvent extends LockEventBase {
  readonly reason: LockLostReason;
  readonly error: LockLostError;
}

/** A held lease was extended on the backend: by the watchdog, or by `LockHandle.extend()`. */
export interface LockExtendedEvent extends LockEventBase {
  /** The lease now runs this long from when the request went out. */
  readonly ttlMs: number;
  /** Sent by the watchdog (`autoExtend`), not by `extend()`. */
  readonly automatic: boolean;
}

/** Every lock event, by name. */
export interface LockEventMap {
  acquired: LockAcquiredEvent;
  released: LockReleasedEvent;
  busy: LockBusyEvent;
  failed: LockFailedEvent;
  lost: LockLostEvent;
  extended: LockExtendedEvent;
}

export type LockEventName = keyof LockEventMap;
export type LockEventListener<E extends LockEventName> = (event: LockEventMap[E]) => void;

type Listeners = { [E in LockEventName]: readonly LockEventListener<E>[] };

const logger = new Logger('DistributedLock');

/**
 * The lock events of one LockService: `locks.events.on('busy', (event) => ...)` returns the
 * function that unsubscribes. Listeners run synchronously where the event happens, in the
 * caller's async context (an AsyncLocalStorage or OpenTelemetry context is the caller's); an
 * error one throws is logged, never thrown into the lock's caller.
 *
 * With no listener for an event, emitting it costs one array-length check: the payload is built
 * only when someone listens.
 */
export class LockEvents {
  // Replaced, never mutated, on subscribe and unsubscribe: an emission in progress keeps the list it started with.
  private listeners: Listeners = { acquired: [], released: [], busy: [], failed: [], lost: [], extended: [] };

  /** Calls `listener` for each `event` from now on; returns the function that stops it. */
  on<E extends LockEventName>(event: E, listener: LockEventListener<E>): () => void {
    if (!(event in this.listeners)) {
      throw new TypeError(`Unknown lock event '${String(event)}'. Lock events are: ${Object.keys(this.listeners).join(', ')}.`);
    }
    if (typeof listener !== 'function') {
      throw new TypeError(`LockEvents.on('${event}', listener): listener must be a function, got ${typeof listener}.`);
    }
    // Each subscription is its own entry, so subscribing one function twice calls it twice and each unsubscribe removes one.
    const entry: LockEventListener<E> = (payload) => listener(payload);
    this.listeners = { ...this.listeners, [event]: [...this.listeners[event], entry] };
    return () => {
      this.listeners = { ...this.listeners, [event]: this.listeners[event].filter((l) => l !== entry) };
    };
  }

  /** @internal Whether anyone listens to `event`: check it before building a payload. */
  has(event: LockEventName): boolean {
    return this.listeners[event].length !== 0;
  }

  /** @internal */
  emit<E extends LockEventName>(event: E, payload: LockEventMap[E]): void {
    for (const listener of this.listeners[event] as readonly LockEventListener<E>[]) {
      try {
        listener(payload);
      } catch (error) {
        logger.error(`A '${event}' lock event listener threw: ${String(error)}`, error instanceof Error ? error.stack : undefined);
      }
    }
  }
}
