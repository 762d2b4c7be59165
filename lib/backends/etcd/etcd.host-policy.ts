import { performance } from 'node:perf_hooks';
import type { IOptions } from 'etcd3';
import { redactUrl } from '../../option-value.js';

type FaultHandling = NonNullable<IOptions['faultHandling']>;
type Policy = NonNullable<FaultHandling['global']>;
type Backoff = NonNullable<FaultHandling['watchBackoff']>;

/**
 * How long a member that failed a call is passed over, while another one is not. Longer than a
 * lease's retry of a failed extension (a third of what is left of it): with one second, a holder
 * cut off from one member could pick it again at each retry and lose a lock the others would
 * have kept.
 */
const PASS_OVER_MS = 5_000;

const neverAborted = new AbortController().signal;

/**
 * The client-wide policy of the client the backend creates: one try per call. etcd3's default
 * retries a failed call up to three times, and a transaction whose answer was lost may have been
 * applied: the service retries within its wait instead, with an attempt that reads its own state
 * first.
 */
export function noRetries(): Policy {
  return { execute: (fn: (context: { signal: AbortSignal }) => unknown) => fn({ signal: neverAborted }) } as unknown as Policy;
}

/**
 * The per-member policy of the client the backend creates. etcd3 picks a member at random for
 * each call and moves on to the next when a member's policy refuses the call without trying it.
 * A member whose last call failed on the network or timed out is refused for five seconds
 * while another member is not, so a member that is down, paused or cut off costs a few calls, not one
 * call in three. With every member failing, each one is tried.
 */
export function hostPolicies(isRecoverable: (error: Error) => boolean): (host: string) => Policy {
  const failedUntil = new Map<string, number>();
  const hosts: string[] = [];
  const passedOver = (host: string, now: number) => (failedUntil.get(host) ?? 0) > now;
  return (host) => {
    hosts.push(host);
    return {
      async execute(fn: (context: { signal: AbortSignal }) => Promise<unknown>) {
        const now = performance.now();
        if (passedOver(host, now) && hosts.some((other) => other !== host && !passedOver(other, now))) {
          // The host as your client names it, which may be anything: never a password in a message.
          throw new Error(`etcd member ${redactUrl(host)} failed its last call less than ${PASS_OVER_MS} ms ago; another member is tried`);
        }
        try {
          const result = await fn({ signal: neverAborted });
          failedUntil.delete(host);
          return result;
        } catch (error) {
          if (error instanceof Error && isRecoverable(error)) failedUntil.set(host, performance.now() + PASS_OVER_MS);
          throw error;
        }
      },
    } as unknown as Policy;
  };
}

/**
 * How soon etcd3 opens a watch stream again after it dropped: 100 ms, doubling up to a second.
 * Its default grows to 30 s, for which a waiter would sit while its turn may have come.
 */
export function watchBackoff(): Backoff {
  const after = (duration: number) => ({ duration, next: () => after(Math.min(duration * 2, 1_000)) });
  return { next: () => after(100) } as unknown as Backoff;
}
