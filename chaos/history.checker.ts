import { OVERLAP_ALLOWED_AFTER, type FaultKind, type HistoryEvent } from './history.js';
import { toldCheck } from './holder-told.checker.js';
import { findBlockedKeys, type BlockedKey } from './liveness.checker.js';

/** Two holders of one key at once, in real time. */
export interface Overlap {
  key: string;
  first: string;
  second: string;
  /** When the second holder got it (the history's clock). */
  at: number;
  /** Milliseconds both held it. */
  ms: number;
  /** The fault that allows it (guarantees table), or undefined: a violation. */
  allowedBy?: FaultKind;
  /**
   * When an allowed overlap, the moment by which the first holder must have been told (its
   * signal aborted) and stopped acting; `notTold` when it went on past that without being told.
   */
  tellBy?: number;
  notTold?: boolean;
}

export interface CheckOptions {
  /** Added to each wait before it counts as exceeded: command deadlines and timer lag. */
  waitSlackMs: number;
  /** Fences are not checked on a backend without tokens (Redlock): its writes are unconditional. */
  fencing: boolean;
  /**
   * How long after a failover's new master is announced a client may still lock on the old one:
   * the time to hear the announcement and reconnect. Default 1 000 ms.
   */
  failoverGraceMs?: number;
  /** The run's ttl, for a holder's extension schedule (a third of it). Default 1 000 ms. */
  ttl?: number;
  /**
   * How long a holder may take to learn of a refusal once its extension is due: the request, its
   * answer, a reconnection, timers that run late. Default `waitSlackMs`.
   */
  reactionMs?: number;
  /**
   * How long after a fault healed a key nobody holds must be acquirable again (ttl plus one
   * election or session timeout of the store). Undefined: not checked.
   */
  livenessBoundMs?: number;
}

export interface CheckReport {
  operations: number;
  acquisitions: number;
  acceptedWrites: number;
  refusedWrites: number;
  overlaps: Overlap[];
  /** Accepted writes whose token is below an earlier accepted write's, or equal to one of another holder. */
  staleWrites: number;
  /** Accepted writes that did not build on the value of the write accepted before them. */
  lostUpdates: number;
  /** Writes the register accepted from a worker killed before it logged them (gaps in its sequence). */
  unloggedWrites: number;
  /** Acquisitions asked for after another of the same key was granted, with a token not above it. */
  tokenRegressions: number;
  /** Waits that ended (in the lock or an error) later than their bound, not explained by a pause. */
  slowWaits: number;
  /** Keys wanted and held by nobody, yet not acquired, past the bound after the last fault that could block them. */
  blockedKeys: BlockedKey[];
  errors: Record<string, number>;
  faults: Record<string, number>;
  /** Failovers the store's monitor saw (`failover` events), whoever caused them. */
  failovers: number;
  /** Counts of what the guarantees table does not allow, by kind; all zero for a clean run. */
  violations: Record<string, number>;
}

export interface Hold {
  key: string;
  holder: string;
  worker: string;
  token?: number;
  start: number;
  end: number;
  /** The lease's deadline when acquired, its ttl, whether the watchdog extends it, minHold. */
  deadline: number;
  ttl?: number;
  autoExtend: boolean;
  minHold?: number;
  maxHold?: number;
  /** When its signal aborted (the holder was told it lost the lock). */
  lostAt?: number;
  /** How many holders the key admits: 1 exclusive, n permits, Infinity shared (a reader). */
  limit: number;
}

export interface Window {
  kind: FaultKind;
  target: string;
  start: number;
  end: number;
}

/**
 * Reads a history (any order) and reports what happened and what the guarantees do not allow.
 * Holders of one key overlap when the key's kind does not admit them together: a writer (an
 * exclusive holder) beside anyone, or more holders of a semaphore than its permits. Readers
 * beside readers, and permit holders up to the permits, are what those kinds are for.
 */
export function checkHistory(history: readonly HistoryEvent[], options: CheckOptions): CheckReport {
  const events = [...history].sort((a, b) => a.t - b.t);
  const endOfRun = events.length > 0 ? events[events.length - 1].t : 0;
  const windows = faultWindows(events, endOfRun);
  const failovers = failoverWindows(events, endOfRun, options.failoverGraceMs ?? 1_000);
  const holds = collectHolds(events, windows, endOfRun);
  const told = { ttl: options.ttl ?? 1_000, reactionMs: options.reactionMs ?? options.waitSlackMs };
  const overlaps = findOverlaps(holds, windows, failovers, told);
  const notTold = overlaps.filter((o) => o.notTold).length;
  const blockedKeys =
    options.livenessBoundMs === undefined
      ? []
      : findBlockedKeys(events, holds, [...windows, ...failovers], options.livenessBoundMs, endOfRun);
  const writes = events.filter((e): e is Extract<HistoryEvent, { type: 'write' }> => e.type === 'write');
  const accepted = writes.filter((w) => w.accepted);
  const { staleWrites, lostUpdates, unloggedWrites } = checkRegister(accepted, options.fencing);
  const errors: Record<string, number> = {};
  for (const e of events) if (e.type === 'error') errors[e.error] = (errors[e.error] ?? 0) + 1;
  const faults: Record<string, number> = {};
  for (const w of windows) faults[w.kind] = (faults[w.kind] ?? 0) + 1;
  const tokenRegressions = options.fencing ? countTokenRegressions(events) : 0;
  const slowWaits = countSlowWaits(events, windows, options.waitSlackMs);
  const unexpected = overlaps.filter((o) => o.allowedBy === undefined).length;
  const violations: Record<string, number> = {
    overlap: unexpected,
    'stale-write': staleWrites,
    'token-regression': tokenRegressions,
    'slow-wait': slowWaits,
    'holder-not-told': notTold,
  };
  if (options.livenessBoundMs !== undefined) violations['blocked-key'] = blockedKeys.length;
  // With fencing no update may be lost; without it, one may after an overlap the table allows.
  if (options.fencing || !overlaps.some((o) => o.allowedBy !== undefined)) violations['lost-update'] = lostUpdates;
  return {
    operations: events.filter((e) => e.type === 'attempt').length,
    acquisitions: holds.length,
    acceptedWrites: accepted.length,
    refusedWrites: writes.length - accepted.length,
    overlaps,
    staleWrites,
    lostUpdates,
    unloggedWrites,
    tokenRegressions,
    slowWaits,
    blockedKeys,
    errors,
    faults,
    failovers: failovers.length,
    violations,
  };
}

function faultWindows(events: readonly HistoryEvent[], endOfRun: number): Window[] {
  const open = new Map<string, Window>();
  const windows: Window[] = [];
  for (const e of events) {
    if (e.type !== 'fault') continue;
    const id = `${e.kind}/${e.target}`;
    if (e.phase === 'start') {
      const window = { kind: e.kind, target: e.target, start: e.t, end: endOfRun };
      open.set(id, window);
      windows.push(window);
    } else {
      const window = open.get(id);
      if (window) window.end = e.t;
      open.delete(id);
    }
  }
  return windows;
}

/**
 * The store's failovers (from `failover` events): from the start of one until its new master was
 * announced, plus `graceMs` for clients to hear it and move. Meanwhile one lock may have two
 * holders: the new master lacks what the old one had not replicated yet (replication is
 * asynchronous), and a client still on the old master may lock there until it moves.
 */
function failoverWindows(events: readonly HistoryEvent[], endOfRun: number, graceMs: number): Window[] {
  const open = new Map<string, Window>();
  const windows: Window[] = [];
  for (const e of events) {
    if (e.type !== 'failover') continue;
    if (e.phase === 'start') {
      const window: Window = { kind: 'failover', target: e.server, start: e.t, end: endOfRun };
      open.set(e.server, window);
      windows.push(window);
    } else {
      const window = open.get(e.server);
      if (window) window.end = Math.min(endOfRun, e.t + graceMs);
      open.delete(e.server);
    }
  }
  return windows;
}

/**
 * A hold lasts from `acquired` to whichever comes first of its release and its loss, where a loss
 * counts from the lease's deadline (the holder was told then, whenever its timer ran), and a
 * killed worker's holds end with it. A write sent later than that still belongs to the hold: the
 * holder acted on the lock.
 */
function collectHolds(events: readonly HistoryEvent[], windows: readonly Window[], endOfRun: number): Hold[] {
  // A holder's latest hold, kept after it ends: a late write still extends it.
  const latest = new Map<string, { hold: Hold; ended: boolean; lastWrite: number }>();
  const holds: Hold[] = [];
  for (const e of events) {
    if (e.type === 'acquired') {
      const hold: Hold = {
        key: e.key,
        holder: e.holder,
        worker: e.worker,
        token: e.token,
        start: e.t,
        end: endOfRun,
        deadline: e.deadline,
        ttl: e.ttl,
        autoExtend: e.autoExtend ?? true,
        minHold: e.minHold,
        maxHold: e.maxHold,
        limit: e.mode === 'shared' ? Number.POSITIVE_INFINITY : e.mode === 'permits' ? (e.permits ?? 1) : 1,
      };
      latest.set(`${e.holder} ${e.key}`, { hold, ended: false, lastWrite: e.t });
      holds.push(hold);
      continue;
    }
    if (!('holder' in e)) continue;
    // One holder may hold several keys at once (a multi-key call): a hold is a holder's on one key.
    const entry = latest.get(`${e.holder} ${e.key}`);
    if (!entry) continue;
    if (e.type === 'attempt') {
      latest.delete(`${e.holder} ${e.key}`);
    } else if (e.type === 'write') {
      entry.lastWrite = e.t;
      if (entry.ended) entry.hold.end = Math.max(entry.hold.end, e.t);
    } else if (!entry.ended) {
      entry.ended = true;
      if (e.type === 'lost') entry.hold.lostAt = e.t;
      entry.hold.end = e.type === 'lost' ? Math.min(e.t, Math.max(entry.lastWrite, e.deadline)) : e.t;
    } else if (e.type === 'lost') {
      entry.hold.lostAt ??= e.t;
    }
  }
  for (const { hold, ended } of latest.values()) {
    if (ended) continue;
    // The first kill of its worker not over before the hold began: the worker's last lines may be
    // stamped just after the nemesis stamped the kill (SIGKILL goes out after), and the process is
    // gone by the kill's end.
    const killed = windows.find((w) => w.kind === 'kill-worker' && w.target === hold.worker && w.end >= hold.start);
    if (killed) hold.end = Math.max(hold.start, killed.start);
  }
  return holds;
}

function findOverlaps(
  holds: readonly Hold[],
  windows: readonly Window[],
  failovers: readonly Window[],
  told: { ttl: number; reactionMs: number },
): Overlap[] {
  const overlaps: Overlap[] = [];
  const byKey = new Map<string, Hold[]>();
  for (const hold of holds) byKey.set(hold.key, [...(byKey.get(hold.key) ?? []), hold]);
  for (const list of byKey.values()) {
    list.sort((a, b) => a.start - b.start);
    for (let i = 0; i < list.length; i++) {
      for (let j = i + 1; j < list.length && list[j].start < list[i].end; j++) {
        const [first, second] = [list[i], list[j]];
        if (first.holder === second.holder) continue;
        // Readers together; permit holders are counted below, not paired.
        if (first.limit > 1 && second.limit > 1) continue;
        const ms = Math.min(first.end, second.end) - second.start;
        if (ms <= 0) continue;
        const allowed = allowance(first, second, windows, failovers);
        overlaps.push({
          key: first.key,
          first: first.holder,
          second: second.holder,
          at: second.start,
          ms,
          allowedBy: allowed?.kind,
          ...(allowed && toldCheck(first, second, allowed, told)),
        });
      }
    }
    overlaps.push(...permitOverlaps(list, windows, failovers, told));
  }
  return overlaps;
}

/**
 * A semaphore's holder that began while as many others as its permits held the key (shared and
 * permit holders of one key all share a limit: callers that disagree are refused). Paired with
 * the earliest of those others, for the fault that may allow it. Which holders the store dropped
 * is its choice (those whose permits the fault lost), so the holder that must have been told is
 * whichever of them all learned, or ended, first: with one holder too many, any one of them told
 * in time ends the overlap.
 */
function permitOverlaps(
  list: readonly Hold[],
  windows: readonly Window[],
  failovers: readonly Window[],
  told: { ttl: number; reactionMs: number },
): Overlap[] {
  const overlaps: Overlap[] = [];
  for (const [j, second] of list.entries()) {
    if (second.limit <= 1 || second.limit === Number.POSITIVE_INFINITY) continue;
    const during = list.slice(0, j).filter((h) => h.limit > 1 && h.holder !== second.holder && h.end > second.start);
    if (during.length < second.limit) continue;
    const first = during[0];
    const allowed = allowance(first, second, windows, failovers);
    // The holders beyond the permits are the first ones to learn or end: the last of those must have in time.
    const leaving = [...during, second].sort((a, b) => (a.lostAt ?? a.end) - (b.lostAt ?? b.end));
    const toTell = leaving[during.length - second.limit];
    overlaps.push({
      key: second.key,
      first: first.holder,
      second: second.holder,
      at: second.start,
      ms: Math.min(...during.map((h) => h.end), second.end) - second.start,
      allowedBy: allowed?.kind,
      ...(allowed && toldCheck(toTell, second, allowed, told)),
    });
  }
  return overlaps;
}

/**
 * The fault during the first hold, before the second began, that the guarantees table allows: one
 * of OVERLAP_ALLOWED_AFTER, or a failover of the store (to a replica left behind on purpose, when
 * the nemesis did that).
 */
function allowance(first: Hold, second: Hold, windows: readonly Window[], failovers: readonly Window[]): Window | undefined {
  const during = (w: Window) => w.start <= second.start && w.end >= first.start;
  const ofFirstHolder = (w: Window) => w.target === first.worker;
  const found = windows.find(
    (w) =>
      OVERLAP_ALLOWED_AFTER.has(w.kind) &&
      during(w) &&
      (w.kind === 'pause-worker' || w.kind === 'stall-event-loop' ? ofFirstHolder(w) : true),
  );
  const failover = failovers.find(during);
  if (found || !failover) return found;
  // Named after the fault that left the replica behind, when one did: what the lag cost shows.
  const lagging = windows.some((w) => w.kind === 'failover-lagging-replica' && w.start <= failover.end && w.end >= failover.start);
  return lagging ? { ...failover, kind: 'failover-lagging-replica' } : failover;
}

/**
 * In the register's own order (its sequence numbers): tokens rise, and each write builds on the
 * last. A gap in the sequence is a write whose worker was killed before it could log it: the
 * write after the gap is not compared with the one before.
 */
function checkRegister(
  accepted: readonly Extract<HistoryEvent, { type: 'write' }>[],
  fencing: boolean,
): { staleWrites: number; lostUpdates: number; unloggedWrites: number } {
  let staleWrites = 0;
  let lostUpdates = 0;
  let unloggedWrites = 0;
  const byKey = new Map<string, typeof accepted>();
  for (const w of accepted) byKey.set(w.key, [...(byKey.get(w.key) ?? []), w]);
  for (const list of byKey.values()) {
    const ordered = [...list].sort((a, b) => (a.seq ?? a.t) - (b.seq ?? b.t));
    let highest = -Infinity;
    let highestBy = '';
    let value = 0;
    let seq = 0;
    for (const w of ordered) {
      if (fencing) {
        // A holder writes several times under one lock, with one token; another with it is stale.
        if (w.token === undefined || w.token < highest || (w.token === highest && w.holder !== highestBy)) staleWrites++;
        if (w.token !== undefined && w.token > highest) [highest, highestBy] = [w.token, w.holder];
      }
      const gap = w.seq === undefined ? 0 : w.seq - seq - 1;
      unloggedWrites += gap;
      if (gap === 0 && w.read !== value) lostUpdates++;
      value = w.wrote;
      seq = w.seq ?? seq + 1;
    }
  }
  return { staleWrites, lostUpdates, unloggedWrites };
}

/** An acquisition asked for after another of its key was granted must get a greater token. */
function countTokenRegressions(events: readonly HistoryEvent[]): number {
  const highestGranted = new Map<string, number>();
  const askedAfter = new Map<string, number>();
  let regressions = 0;
  for (const e of events) {
    if (e.type === 'attempt') askedAfter.set(`${e.holder} ${e.key}`, highestGranted.get(e.key) ?? -Infinity);
    if (e.type === 'acquired' && e.token !== undefined) {
      const floor = askedAfter.get(`${e.holder} ${e.key}`) ?? -Infinity;
      if (e.token <= floor) regressions++;
      highestGranted.set(e.key, Math.max(highestGranted.get(e.key) ?? -Infinity, e.token));
    }
  }
  return regressions;
}

/**
 * A wait ends in the lock or in an error within its bound, on the time its process could run,
 * unless that process was paused or killed.
 */
function countSlowWaits(events: readonly HistoryEvent[], windows: readonly Window[], slackMs: number): number {
  const asked = new Map<string, Extract<HistoryEvent, { type: 'attempt' }>>();
  let slow = 0;
  for (const e of events) {
    if (e.type === 'attempt') asked.set(`${e.holder} ${e.key}`, e);
    if (e.type !== 'acquired' && e.type !== 'error') continue;
    const attempt = asked.get(`${e.holder} ${e.key}`);
    if (!attempt) continue;
    asked.delete(`${e.holder} ${e.key}`);
    // A starved process runs its timers late: the library cannot keep a bound on time it did not get.
    if (e.t - attempt.t - (e.stalledMs ?? 0) <= attempt.waitMs + slackMs) continue;
    const paused = windows.some(
      (w) =>
        (w.kind === 'pause-worker' || w.kind === 'stall-event-loop' || w.kind === 'kill-worker') &&
        w.target === attempt.worker &&
        w.start <= e.t &&
        w.end >= attempt.t,
    );
    if (!paused) slow++;
  }
  return slow;
}
