import { performance } from 'node:perf_hooks';
import { withTimeout } from './bounded-wait.js';

/**
 * Requests under way that a shutdown must wait for before it closes what they need: the releases
 * a LockService sent, or a backend's requests and the clean-up their answers start (a release sent
 * again once the store is back, the release of a lock won by an attempt whose caller gave up).
 * Closing a pool or client first would cut them off, and leave their keys held by nobody until the
 * ttl runs out.
 */
export class InFlight {
  private readonly out = new Set<Promise<void>>();

  get size(): number {
    return this.out.size;
  }

  /** Counts `request` until it settles, and returns it: its answer and its failure stay the caller's. */
  track<T>(request: Promise<T>): Promise<T> {
    // One reaction per request: this runs on every statement.
    const untrack = (): void => void this.out.delete(settled);
    const settled: Promise<void> = request.then(untrack, untrack);
    this.out.add(settled);
    return request;
  }

  /**
   * Resolves once nothing is under way, including what was started meanwhile (a late answer's
   * clean-up), or once `boundMs` has passed: a request to a store that never answers must not hold
   * up the shutdown for good.
   */
  async settled(boundMs = Infinity): Promise<void> {
    const deadline = performance.now() + boundMs;
    while (this.out.size > 0) {
      const left = deadline - performance.now();
      if (left <= 0) return;
      const all = Promise.all(this.out);
      await (left === Infinity ? all : withTimeout(all, left));
    }
  }
}
