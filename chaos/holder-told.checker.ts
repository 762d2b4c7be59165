import type { Hold, Window } from './history.checker.js';

/**
 * A fault that lets two holders in (the store forgot the lock, failed over, a clock jumped, the
 * holder was paused) allows the overlap only until the first holder can learn of it: its next
 * extension is refused, or its lease runs out. That is due at most a third of its ttl after the
 * fault healed and the second holder got the lock (the watchdog extends every ttl/3 and retries
 * sooner after a failure), or at its deadline when nothing extends it (`autoExtend: false`), or
 * at once for a paused holder (its deadline passed while it was stopped); plus `reactionMs` for
 * the request, its answer and a reconnection. A first holder still acting after that (inside its
 * section, or writing) without its signal having aborted was never told it lost the lock: a
 * violation whatever the fault.
 */
export function toldCheck(
  first: Hold,
  second: Hold,
  allowed: Window,
  options: { ttl: number; reactionMs: number },
): { tellBy: number; notTold: boolean } {
  const tellBy = mustKnowBy(first, second, allowed, options.ttl) + options.reactionMs;
  const told = first.lostAt !== undefined && first.lostAt <= tellBy;
  return { tellBy, notTold: first.end > tellBy && !told };
}

function mustKnowBy(first: Hold, second: Hold, allowed: Window, runTtl: number): number {
  // Stopped while its deadline passed: the first read of its lock after it resumes says lost.
  if (allowed.kind === 'pause-worker' || allowed.kind === 'stall-event-loop') return allowed.end;
  const from = Math.max(allowed.end, second.start);
  if (!first.autoExtend) return Math.max(from, first.deadline);
  const nextExtension = from + (first.ttl ?? runTtl) / 3;
  // Extended no further once at maxHold: told when the last (shortened) lease ends, within a ttl.
  if (first.maxHold === undefined) return nextExtension;
  return Math.max(nextExtension, Math.min(first.start + first.maxHold, from + (first.ttl ?? runTtl)));
}
