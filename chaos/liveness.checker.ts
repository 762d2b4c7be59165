import type { Hold, Window } from './history.checker.js';
import type { HistoryEvent } from './history.js';

/** A key that callers wanted and nobody held, yet nobody got, past the bound after the faults that could block it. */
export interface BlockedKey {
  key: string;
  /** The stretch during which the key was wanted, held by nobody, and not acquired. */
  from: number;
  to: number;
  /** From when on no fault excused it: the violation lasted `to - since`. */
  since: number;
}

/**
 * After a fault heals, every key must become acquirable within `boundMs` (the ttl plus one
 * election or session timeout of the store): a lock left behind by a holder that died, was cut
 * off or lost it must be freed by then. A key is *blocked* while at least one caller waits for it
 * and no hold of it is live (a hold lasts as the overlap check counts it, and a released minHold
 * lock until its minHold ends). A waiter for several keys keeps its place in each of their lines
 * until it has them all (all-or-nothing, first come first served: docs/redis.md, zookeeper.md),
 * so a free key it waits for is not blocked while it waits: that is its turn. A blocked stretch is excused during its first `boundMs` (a
 * hand-over) and until `boundMs` after each fault that could have blocked it: any fault of the
 * store (a restart, a freeze, a failover), and a fault of a worker that held or waited for the
 * key meanwhile (killed, paused, cut off: what it won may be left on the store). Past that, the
 * key is held by nobody and nobody can take it: a violation.
 */
export function findBlockedKeys(
  events: readonly HistoryEvent[],
  holds: readonly Hold[],
  windows: readonly Window[],
  boundMs: number,
  endOfRun: number,
): BlockedKey[] {
  const waits = waitIntervals(events, windows, endOfRun);
  const keys = new Set([...waits.map((w) => w.key)]);
  const blocked: BlockedKey[] = [];
  for (const key of keys) {
    const keyHolds = holds.filter((h) => h.key === key).map((h) => ({ ...h, end: Math.max(h.end, h.start + (h.minHold ?? 0)) }));
    const keyWaits = waits.filter((w) => w.key === key);
    const turns = keyWaits.filter((w) => w.multi);
    for (const [from, to] of stretches(keyWaits, [...keyHolds, ...turns])) {
      const excuses: [number, number][] = [[from, from + boundMs]];
      for (const w of windows) {
        if (w.start > to || !blocks(w, key, keyHolds, keyWaits)) continue;
        excuses.push([w.start, w.end + boundMs]);
      }
      const since = firstUncovered(from, to, excuses);
      if (since < to) blocked.push({ key, from, to, since });
    }
  }
  return blocked;
}

interface Wait {
  key: string;
  worker: string;
  start: number;
  end: number;
  /** A wait for several keys at once. */
  multi: boolean;
}

/** How long a caller that gave up takes to ask again (its loop's pause, up to 20 ms): still wanted meanwhile. */
const ASK_AGAIN_MS = 50;

/** Each attempt, from when it was asked until it got the lock, failed, or its worker was killed. */
function waitIntervals(events: readonly HistoryEvent[], windows: readonly Window[], endOfRun: number): Wait[] {
  const open = new Map<string, Wait>();
  const waits: Wait[] = [];
  for (const e of events) {
    if (e.type !== 'attempt' && e.type !== 'acquired' && e.type !== 'error') continue;
    const id = `${e.holder} ${e.key}`;
    if (e.type === 'attempt') {
      const wait = { key: e.key, worker: e.worker, start: e.t, end: endOfRun, multi: e.kind === 'multi-key' };
      const killed = windows.find((w) => w.kind === 'kill-worker' && w.target === e.worker && w.end >= e.t);
      if (killed) wait.end = Math.max(e.t, killed.start);
      open.set(id, wait);
      waits.push(wait);
      continue;
    }
    const wait = open.get(id);
    if (!wait) continue;
    open.delete(id);
    wait.end = Math.min(wait.end, e.t + (e.type === 'error' ? ASK_AGAIN_MS : 0));
  }
  return waits;
}

/** The maximal stretches during which some wait is open and no hold is live. */
function stretches(waits: readonly Wait[], holds: readonly { start: number; end: number }[]): [number, number][] {
  const points: [number, number, number][] = [];
  for (const w of waits) points.push([w.start, 1, 0], [w.end, -1, 0]);
  for (const h of holds) points.push([h.start, 0, 1], [h.end, 0, -1]);
  // At one instant, holds begin before waits end: a wait that ends in the lock leaves no gap.
  points.sort((a, b) => a[0] - b[0] || b[2] - a[2] || b[1] - a[1]);
  const found: [number, number][] = [];
  let waiting = 0;
  let holding = 0;
  let since: number | undefined;
  for (const [t, dw, dh] of points) {
    waiting += dw;
    holding += dh;
    const blocked = waiting > 0 && holding === 0;
    if (blocked && since === undefined) since = t;
    if (!blocked && since !== undefined) {
      if (t > since) found.push([since, t]);
      since = undefined;
    }
  }
  return found;
}

/** Whether a fault could have left this key blocked: one of the store, or of a worker that held or waited for it meanwhile. */
function blocks(w: Window, key: string, holds: readonly Hold[], waits: readonly Wait[]): boolean {
  const worker = workerOf(w.target);
  if (worker === undefined) return true;
  const during = (i: { start: number; end: number }) => i.start <= w.end && i.end >= w.start;
  return holds.some((h) => h.worker === worker && during(h)) || waits.some((x) => x.worker === worker && during(x));
}

/** The worker a fault hit (`w1`, `network:w1`, `network:w1/redis-a`), or undefined for a fault of the store. */
function workerOf(target: string): string | undefined {
  const match = /^(?:network:)?([^/:]+)/.exec(target);
  const name = match?.[1];
  return name !== undefined && /^(w\d+|memory)$/.test(name) ? name : undefined;
}

/** The first moment in [from, to] that no excuse covers, or `to`. */
function firstUncovered(from: number, to: number, excuses: [number, number][]): number {
  excuses.sort((a, b) => a[0] - b[0]);
  let covered = from;
  for (const [start, end] of excuses) {
    if (start > covered) break;
    covered = Math.max(covered, end);
  }
  return Math.min(covered, to);
}
