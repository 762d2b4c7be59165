import { isObservable, Observable, type Subscription } from 'rxjs';
import { withLockAbortSignal } from './lock-abort-scope.js';
import { runHolding } from './lock-context.js';
import type { LockHandle } from './lock.handle.js';

/** Runs `subscribe` holding the keys anew: the lock service's `run()` with the same keys and options. */
export type Relock = (subscribe: (handle: LockHandle) => Promise<void>) => Promise<unknown>;

/**
 * When a locked function returned an Observable, its work has not happened yet: it happens while
 * someone is subscribed. So the lock taken for the call is handed over to the returned Observable
 * instead of being released, and it is held from the first subscription until that subscription
 * completes, errors or is unsubscribed. The subscriber code runs in the holding async context, so
 * what it calls re-enters the keys.
 *
 * Rules that keep the lock from being held by nobody, or not held at all:
 * - Nobody subscribed by the end of the current event-loop turn (Nest subscribes in the same
 *   turn, after the handler's promise settles; it does not at all when an SSE client left first):
 *   the lock is released then, not kept until its lease runs out.
 * - Any other subscription (a second subscriber, `retry()`, a subscription after that release)
 *   acquires the keys anew, with the same options, before the source is subscribed: a busy lock
 *   errors the subscription with LockNotAcquiredError, or completes it empty with onBusy 'skip'.
 *
 * Returns undefined when `value` is not an Observable.
 */
export function holdWhileSubscribed(
  value: unknown,
  handle: LockHandle,
  release: () => void,
  relock: Relock,
): Observable<unknown> | undefined {
  if (!isObservable(value)) return undefined;
  const source = value;
  let handedOver: LockHandle | undefined = handle;
  const unclaimed = setImmediate(() => {
    if (!handedOver) return;
    handedOver = undefined;
    release();
  });

  return new Observable((subscriber) => {
    const held = handedOver;
    if (held) {
      handedOver = undefined;
      clearImmediate(unclaimed);
      const inner = runHolding(held, () => source.subscribe(subscriber));
      return () => {
        inner.unsubscribe();
        release();
      };
    }

    let inner: Subscription | undefined;
    let done: (() => void) | undefined;
    // Unsubscribed while it waits for the lock: it stops waiting.
    const unsubscribed = new AbortController();
    withLockAbortSignal(unsubscribed.signal, () =>
      relock(
        (): Promise<void> =>
          new Promise((resolve) => {
            // Unsubscribed while it waited for the lock: give the lock back at once.
            if (subscriber.closed) return resolve();
            done = resolve;
            inner = source.subscribe({
              next: (item) => subscriber.next(item),
              error: (error: unknown) => {
                subscriber.error(error);
                resolve();
              },
              complete: () => {
                subscriber.complete();
                resolve();
              },
            });
          }),
      ),
    ).then(
      // Settled without running the body: the lock was busy and onBusy is 'skip'.
      () => subscriber.complete(),
      (error: unknown) => subscriber.error(error),
    );
    return () => {
      inner?.unsubscribe();
      done?.();
      unsubscribed.abort();
    };
  });
}

/**
 * The wrapper of a method declared to return an Observable (`design:returntype`), so that it
 * returns one, as its type says: nothing happens until it is subscribed; each subscription then
 * runs `start` (take the lock, call the method) and subscribes to the Observable it resolved to,
 * which holds the lock as above.
 */
export function lockOnSubscribe(start: () => Promise<unknown>): Observable<unknown> {
  return new Observable((subscriber) => {
    let inner: Subscription | undefined;
    // Unsubscribed while it waits for the lock (an SSE client that left): it stops waiting.
    const unsubscribed = new AbortController();
    withLockAbortSignal(unsubscribed.signal, start).then(
      (result) => {
        // Unsubscribed as the lock came: the lock handed over is released at the end of this turn.
        if (subscriber.closed) return;
        if (isObservable(result)) {
          inner = result.subscribe(subscriber);
          return;
        }
        // undefined: the lock was busy and onBusy is 'skip'.
        if (result !== undefined) subscriber.next(result);
        subscriber.complete();
      },
      (error: unknown) => subscriber.error(error),
    );
    return () => {
      inner?.unsubscribe();
      unsubscribed.abort();
    };
  });
}

/** Whether a `design:returntype` is Observable or a subclass, from whichever copy of rxjs. */
export function isObservableType(type: unknown): boolean {
  const prototype = typeof type === 'function' ? (type.prototype as Record<string, unknown> | undefined) : undefined;
  return typeof prototype?.subscribe === 'function' && typeof prototype.pipe === 'function';
}
