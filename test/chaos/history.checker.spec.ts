import { describe, expect, it } from '@jest/globals';
import type { HistoryEvent } from '../../chaos/history.js';
import { checkHistory } from '../../chaos/history.checker.js';

const options = { waitSlackMs: 100, fencing: true };

/** One holder's whole section on `key`: asked at `t`, held from t+5 to t+20, one accepted write. */
function section(holder: string, key: string, t: number, token: number, read: number, seq: number): HistoryEvent[] {
  const worker = holder.split('.')[0];
  return [
    { t, type: 'attempt', holder, worker, key, waitMs: 1000 },
    { t: t + 5, type: 'acquired', holder, worker, key, token, deadline: t + 1005 },
    { t: t + 10, type: 'write', holder, worker, key, token, read, wrote: read + 1, accepted: true, seq },
    { t: t + 20, type: 'released', holder, worker, key },
  ];
}

describe('checkHistory', () => {
  it('finds nothing wrong in holders that take turns', () => {
    const history = [
      ...section('w1.0', 'register:a', 0, 10, 0, 1),
      ...section('w2.0', 'register:a', 30, 11, 1, 2),
      ...section('w1.0', 'register:b', 40, 3, 0, 1),
    ];
    const report = checkHistory(history, options);
    expect(report).toMatchObject({ operations: 3, acquisitions: 3, acceptedWrites: 3, refusedWrites: 0, overlaps: [] });
    expect(Object.values(report.violations).every((count) => count === 0)).toBe(true);
  });

  it('reports an accepted write whose token is not above an earlier accepted one', () => {
    const history = [...section('w1.0', 'register:a', 0, 10, 0, 1), ...section('w2.0', 'register:a', 30, 9, 1, 2)];
    const report = checkHistory(history, options);
    expect(report.violations['stale-write']).toBe(1);
    expect(report.violations['token-regression']).toBe(1);
  });

  it('reports a lost update: a write accepted on a value another write had replaced', () => {
    const history = [...section('w1.0', 'register:a', 0, 10, 0, 1), ...section('w2.0', 'register:a', 30, 11, 0, 2)];
    expect(checkHistory(history, options).violations['lost-update']).toBe(1);
  });

  it('does not count a write missing from the history (its worker was killed) as a lost update', () => {
    const history = [...section('w1.0', 'register:a', 0, 10, 0, 1), ...section('w2.0', 'register:a', 30, 12, 2, 3)];
    const report = checkHistory(history, options);
    expect(report).toMatchObject({ lostUpdates: 0, unloggedWrites: 1 });
  });

  it('allows a lost update without fencing only after an overlap the guarantees allow', () => {
    const unfenced = { ...options, fencing: false };
    const overlapping = [...section('w1.0', 'register:a', 0, 10, 0, 1), ...section('w2.0', 'register:a', 10, 11, 0, 2)];
    expect(checkHistory(overlapping, unfenced).violations['lost-update']).toBe(1);
    const paused: HistoryEvent[] = [...overlapping, { t: 6, type: 'fault', kind: 'pause-worker', phase: 'start', target: 'w1' }];
    expect(checkHistory(paused, unfenced).violations).toEqual(expect.not.objectContaining({ 'lost-update': expect.anything() }));
  });

  it('reports two holders at once as a violation when no fault explains it', () => {
    const history = [...section('w1.0', 'register:a', 0, 10, 0, 1), ...section('w2.0', 'register:a', 10, 11, 1, 2)];
    const report = checkHistory(history, options);
    expect(report.overlaps).toEqual([{ key: 'register:a', first: 'w1.0', second: 'w2.0', at: 15, ms: 5, allowedBy: undefined }]);
    expect(report.violations.overlap).toBe(1);
  });

  it('counts two holders at once without a violation when the first was paused past its lease', () => {
    const history: HistoryEvent[] = [
      ...section('w1.0', 'register:a', 0, 10, 0, 1),
      ...section('w2.0', 'register:a', 10, 11, 1, 2),
      { t: 6, type: 'fault', kind: 'pause-worker', phase: 'start', target: 'w1' },
      { t: 18, type: 'fault', kind: 'pause-worker', phase: 'end', target: 'w1' },
    ];
    const report = checkHistory(history, options);
    expect(report.overlaps).toEqual([expect.objectContaining({ first: 'w1.0', second: 'w2.0', allowedBy: 'pause-worker' })]);
    expect(report.violations.overlap).toBe(0);
    expect(report.faults).toEqual({ 'pause-worker': 1 });
  });

  it('allows two holders around a failover the store saw, until its new master was announced and clients had time to move', () => {
    // w1 locks on the old master; the failover starts at 8 and its new master is announced at 12.
    const failover: HistoryEvent[] = [
      { t: 8, type: 'failover', phase: 'start', server: '127.0.0.1:7000' },
      { t: 12, type: 'failover', phase: 'end', server: '127.0.0.1:7000' },
    ];
    const grace = { ...options, failoverGraceMs: 50 };
    const around = [...section('w1.0', 'register:a', 0, 10, 0, 1), ...section('w2.0', 'register:a', 10, 11, 1, 2), ...failover];
    const report = checkHistory(around, grace);
    expect(report.overlaps).toEqual([expect.objectContaining({ first: 'w1.0', second: 'w2.0', allowedBy: 'failover' })]);
    expect(report).toMatchObject({ failovers: 1, faults: {} });
    // Long after the announcement two holders mean a client stayed on the old master: a violation.
    const later = [...section('w1.0', 'register:a', 100, 10, 0, 1), ...section('w2.0', 'register:a', 110, 11, 1, 2), ...failover];
    expect(checkHistory(later, grace).violations.overlap).toBe(1);
  });

  it('does not take a failover the nemesis asked for as one that happened', () => {
    const history: HistoryEvent[] = [
      ...section('w1.0', 'register:a', 0, 10, 0, 1),
      ...section('w2.0', 'register:a', 10, 11, 1, 2),
      { t: 8, type: 'fault', kind: 'failover', phase: 'start', target: 'sentinel' },
      { t: 30, type: 'fault', kind: 'failover', phase: 'end', target: 'sentinel' },
    ];
    const report = checkHistory(history, options);
    expect(report).toMatchObject({ failovers: 0, faults: { failover: 1 } });
    expect(report.violations.overlap).toBe(1);
  });

  it('names a failover to a replica left behind on purpose as such, and allows nothing during the lag before it', () => {
    const lagging: HistoryEvent[] = [
      { t: 2, type: 'fault', kind: 'failover-lagging-replica', phase: 'start', target: 'sentinel' },
      { t: 8, type: 'failover', phase: 'start', server: '127.0.0.1:7000' },
      { t: 12, type: 'failover', phase: 'end', server: '127.0.0.1:7000' },
      { t: 40, type: 'fault', kind: 'failover-lagging-replica', phase: 'end', target: 'sentinel' },
    ];
    const grace = { ...options, failoverGraceMs: 50 };
    const around = [...section('w1.0', 'register:a', 0, 10, 0, 1), ...section('w2.0', 'register:a', 10, 11, 1, 2), ...lagging];
    expect(checkHistory(around, grace).overlaps).toEqual([expect.objectContaining({ allowedBy: 'failover-lagging-replica' })]);
    // Two holders while the replica lags but before the sentinel fails over: the lag alone allows nothing.
    const before = [...section('w1.0', 'register:a', 0, 10, 0, 1), ...section('w2.0', 'register:a', 1, 11, 1, 2), ...lagging];
    expect(checkHistory(before, grace).violations.overlap).toBe(1);
  });

  it('ends a lost hold at its deadline, and extends it to a write sent after that', () => {
    const worker = 'w1';
    const lostAtDeadline: HistoryEvent[] = [
      { t: 0, type: 'attempt', holder: 'w1.0', worker, key: 'k', waitMs: 1000 },
      { t: 1, type: 'acquired', holder: 'w1.0', worker, key: 'k', token: 1, deadline: 50 },
      // The timer that declared the loss ran late; the holder knew from the deadline on.
      { t: 90, type: 'lost', holder: 'w1.0', worker, key: 'k', reason: 'expired', deadline: 50 },
      ...section('w2.0', 'k', 55, 2, 0, 1),
    ];
    expect(checkHistory(lostAtDeadline, options).overlaps).toEqual([]);
    const lateWrite: HistoryEvent[] = [
      ...lostAtDeadline,
      { t: 70, type: 'write', holder: 'w1.0', worker, key: 'k', token: 1, read: 0, wrote: 1, accepted: false },
    ];
    expect(checkHistory(lateWrite, options).violations.overlap).toBe(1);
  });

  it("ends the hold of a killed worker with the kill, even when the worker's last lines are stamped just after it", () => {
    const worker = 'w1';
    const history: HistoryEvent[] = [
      { t: 10, type: 'fault', kind: 'kill-worker', phase: 'start', target: worker },
      // Written by the worker between the nemesis's stamp and the SIGKILL.
      { t: 10.5, type: 'attempt', holder: 'w1.0', worker, key: 'k', waitMs: 1000 },
      { t: 11, type: 'acquired', holder: 'w1.0', worker, key: 'k', token: 1, deadline: 1011 },
      { t: 40, type: 'fault', kind: 'kill-worker', phase: 'end', target: worker },
      ...section('w2.0', 'k', 2000, 2, 0, 1),
    ];
    const report = checkHistory(history, options);
    expect(report.overlaps).toEqual([]);
    expect(report.violations.overlap).toBe(0);
  });

  it('reports a wait that ended later than its bound, and errors by type', () => {
    const worker = 'w1';
    const history: HistoryEvent[] = [
      { t: 0, type: 'attempt', holder: 'w1.0', worker, key: 'k', waitMs: 1000 },
      { t: 1500, type: 'error', holder: 'w1.0', worker, key: 'k', error: 'LockNotAcquiredError', message: 'busy' },
    ];
    const report = checkHistory(history, options);
    expect(report.violations['slow-wait']).toBe(1);
    expect(report.errors).toEqual({ LockNotAcquiredError: 1 });
  });

  it('does not count against a wait the time its process could not run (its timers fired late)', () => {
    const worker = 'w1';
    const starved = (stalledMs: number): HistoryEvent[] => [
      { t: 0, type: 'attempt', holder: 'w1.0', worker, key: 'k', waitMs: 1000 },
      { t: 1500, type: 'error', holder: 'w1.0', worker, key: 'k', error: 'LockNotAcquiredError', message: 'busy', stalledMs },
    ];
    expect(checkHistory(starved(450), options).violations['slow-wait']).toBe(0);
    expect(checkHistory(starved(300), options).violations['slow-wait']).toBe(1);
  });

  it('takes several writes of one holder under one token as its own, and the same token from another holder as stale', () => {
    const worker = 'w1';
    const twice: HistoryEvent[] = [
      ...section('w1.0', 'k', 0, 10, 0, 1),
      { t: 12, type: 'write', holder: 'w1.0', worker, key: 'k', token: 10, read: 1, wrote: 2, accepted: true, seq: 2 },
    ];
    expect(checkHistory(twice, options).violations['stale-write']).toBe(0);
    const reused = [...section('w1.0', 'k', 0, 10, 0, 1), ...section('w2.0', 'k', 30, 10, 1, 2)];
    expect(checkHistory(reused, options).violations['stale-write']).toBe(1);
  });

  it('keeps the holds of one holder on two keys apart (a multi-key call)', () => {
    const both: HistoryEvent[] = ['a', 'b'].flatMap((key): HistoryEvent[] => [
      { t: 0, type: 'attempt', holder: 'w1.0', worker: 'w1', key, waitMs: 1000 },
      { t: 5, type: 'acquired', holder: 'w1.0', worker: 'w1', key, token: 10, deadline: 1005 },
    ]);
    const history: HistoryEvent[] = [
      ...both,
      { t: 50, type: 'released', holder: 'w1.0', worker: 'w1', key: 'a' },
      { t: 50, type: 'released', holder: 'w1.0', worker: 'w1', key: 'b' },
      // Another holder in `a` while the first still holds it: the acquisition of `b` did not end that hold.
      ...section('w2.0', 'a', 10, 11, 0, 1),
    ];
    expect(checkHistory(history, options).overlaps).toEqual([expect.objectContaining({ key: 'a', first: 'w1.0', second: 'w2.0' })]);
  });

  describe('a holder that lost its lock to a fault must be told', () => {
    const told = { ...options, ttl: 300, reactionMs: 100 };
    // The store forgets w1's lock at 20 to 30; w2 gets it at 40. w1's next extension is due by
    // 40 + 300/3 = 140, its answer by 240: w1 must have been told (its signal aborted) by then.
    const lostToRestart = (w1Until: number, lostAt?: number): HistoryEvent[] => [
      { t: 0, type: 'attempt', holder: 'w1.0', worker: 'w1', key: 'k', waitMs: 1000 },
      { t: 5, type: 'acquired', holder: 'w1.0', worker: 'w1', key: 'k', token: 1, deadline: 305 },
      { t: 20, type: 'fault', kind: 'restart-store-empty', phase: 'start', target: 'redis' },
      { t: 30, type: 'fault', kind: 'restart-store-empty', phase: 'end', target: 'redis' },
      { t: 35, type: 'attempt', holder: 'w2.0', worker: 'w2', key: 'k', waitMs: 1000 },
      { t: 40, type: 'acquired', holder: 'w2.0', worker: 'w2', key: 'k', token: 2, deadline: 340 },
      { t: 600, type: 'released', holder: 'w2.0', worker: 'w2', key: 'k' },
      ...(lostAt === undefined
        ? []
        : [{ t: lostAt, type: 'lost', holder: 'w1.0', worker: 'w1', key: 'k', reason: 'taken', deadline: 305 } as const]),
      { t: w1Until, type: 'released', holder: 'w1.0', worker: 'w1', key: 'k' },
    ];

    it('allows the overlap while the holder cannot know yet', () => {
      const report = checkHistory(lostToRestart(200), told);
      expect(report.overlaps).toEqual([expect.objectContaining({ allowedBy: 'restart-store-empty', tellBy: 240, notTold: false })]);
      expect(report.violations['holder-not-told']).toBe(0);
    });

    it('reports a holder still in its section past its next extension without its signal aborted', () => {
      const report = checkHistory(lostToRestart(500), told);
      expect(report.overlaps).toEqual([expect.objectContaining({ allowedBy: 'restart-store-empty', notTold: true })]);
      expect(report.violations['holder-not-told']).toBe(1);
      expect(report.violations.overlap).toBe(0);
    });

    it('of a semaphore one holder too many after a fault: any one of them told in time ends it, whichever the store dropped', () => {
      // Two permits. w1 holds; the snapshot the store restarts from (20 to 30) has w1's permit but
      // not w2's, taken meanwhile; w3 gets the free permit at 40. The store dropped w2, which is
      // told at 150: w1 holds on rightly.
      const permit = { mode: 'permits' as const, permits: 2 };
      const history = (w2LostAt?: number): HistoryEvent[] => [
        { t: 0, type: 'attempt', holder: 'w1.0', worker: 'w1', key: 'p', waitMs: 1000 },
        { t: 5, type: 'acquired', holder: 'w1.0', worker: 'w1', key: 'p', token: 1, deadline: 305, ...permit },
        { t: 10, type: 'attempt', holder: 'w2.0', worker: 'w2', key: 'p', waitMs: 1000 },
        { t: 12, type: 'acquired', holder: 'w2.0', worker: 'w2', key: 'p', token: 2, deadline: 312, ...permit },
        { t: 20, type: 'fault', kind: 'restart-store-snapshot', phase: 'start', target: 'redis' },
        { t: 30, type: 'fault', kind: 'restart-store-snapshot', phase: 'end', target: 'redis' },
        { t: 35, type: 'attempt', holder: 'w3.0', worker: 'w3', key: 'p', waitMs: 1000 },
        { t: 40, type: 'acquired', holder: 'w3.0', worker: 'w3', key: 'p', token: 3, deadline: 340, ...permit },
        ...(w2LostAt === undefined
          ? []
          : [{ t: w2LostAt, type: 'lost', holder: 'w2.0', worker: 'w2', key: 'p', reason: 'taken', deadline: 312 } as const]),
        { t: 500, type: 'released', holder: 'w2.0', worker: 'w2', key: 'p' },
        { t: 550, type: 'released', holder: 'w1.0', worker: 'w1', key: 'p' },
        { t: 600, type: 'released', holder: 'w3.0', worker: 'w3', key: 'p' },
      ];
      const dropped = checkHistory(history(150), told);
      expect(dropped.overlaps).toEqual([expect.objectContaining({ first: 'w1.0', second: 'w3.0', allowedBy: 'restart-store-snapshot' })]);
      expect(dropped.violations['holder-not-told']).toBe(0);
      // Nobody told: three holders act on past the next extension.
      expect(checkHistory(history(), told).violations['holder-not-told']).toBe(1);
    });

    it('does not report a holder told in time, whose lock ends when it was told', () => {
      expect(checkHistory(lostToRestart(500, 150), told).violations['holder-not-told']).toBe(0);
    });

    it('waits for the deadline of a lease nothing extends (autoExtend: false)', () => {
      const unextended = (w1Until: number) =>
        lostToRestart(w1Until).map((e) => (e.type === 'acquired' && e.holder === 'w1.0' ? { ...e, autoExtend: false, deadline: 450 } : e));
      // Told at its deadline (450), not at an extension: still acting at 500 is in time.
      expect(checkHistory(unextended(500), told).overlaps).toEqual([expect.objectContaining({ tellBy: 550, notTold: false })]);
      expect(checkHistory(unextended(600), told).violations['holder-not-told']).toBe(1);
    });
  });

  describe('a key nobody holds must be acquirable again once faults heal', () => {
    const live = { ...options, livenessBoundMs: 500 };
    // w1 holds `k` until 100; w2 asks at 50 and gets it only at `w2At`.
    const handOver = (w2At: number, faults: HistoryEvent[] = []): HistoryEvent[] => [
      { t: 0, type: 'attempt', holder: 'w1.0', worker: 'w1', key: 'k', waitMs: 10_000 },
      { t: 5, type: 'acquired', holder: 'w1.0', worker: 'w1', key: 'k', token: 1, deadline: 1005 },
      { t: 100, type: 'released', holder: 'w1.0', worker: 'w1', key: 'k' },
      { t: 50, type: 'attempt', holder: 'w2.0', worker: 'w2', key: 'k', waitMs: 10_000 },
      { t: w2At, type: 'acquired', holder: 'w2.0', worker: 'w2', key: 'k', token: 2, deadline: w2At + 1000 },
      { t: w2At + 10, type: 'released', holder: 'w2.0', worker: 'w2', key: 'k' },
      ...faults,
    ];

    it('takes a hand-over within the bound as one', () => {
      const report = checkHistory(handOver(550), live);
      expect(report.violations['blocked-key']).toBe(0);
    });

    it('reports a key wanted and held by nobody past the bound', () => {
      const report = checkHistory(handOver(1_000), live);
      expect(report.violations['blocked-key']).toBe(1);
      expect(report.blockedKeys).toEqual([{ key: 'k', from: 100, to: 1_000, since: 600 }]);
    });

    it('excuses it until the bound after a fault of the store heals, and no longer', () => {
      const restart = (end: number): HistoryEvent[] => [
        { t: 200, type: 'fault', kind: 'pause-store', phase: 'start', target: 'redis' },
        { t: end, type: 'fault', kind: 'pause-store', phase: 'end', target: 'redis' },
      ];
      expect(checkHistory(handOver(1_000, restart(600)), live).violations['blocked-key']).toBe(0);
      expect(checkHistory(handOver(1_500, restart(600)), live).blockedKeys).toEqual([expect.objectContaining({ since: 1_100 })]);
    });

    it('does not take a fault of a worker that neither held nor wanted the key as an excuse', () => {
      const elsewhere = (target: string): HistoryEvent[] => [
        { t: 200, type: 'fault', kind: 'net-drop', phase: 'start', target },
        { t: 600, type: 'fault', kind: 'net-drop', phase: 'end', target },
      ];
      expect(checkHistory(handOver(1_000, elsewhere('network:w3')), live).violations['blocked-key']).toBe(1);
      expect(checkHistory(handOver(1_000, elsewhere('network:w2')), live).violations['blocked-key']).toBe(0);
    });

    it('counts a released lock kept for its minHold as held', () => {
      const kept = handOver(1_000).map((e) => (e.type === 'acquired' && e.holder === 'w1.0' ? { ...e, minHold: 900 } : e));
      expect(checkHistory(kept, live).violations['blocked-key']).toBe(0);
    });
  });
  describe('shared locks and semaphores', () => {
    /** A reader's or permit holder's section: held from t+5 to t+20, no write. */
    function held(holder: string, key: string, t: number, token: number, kind: 'shared' | 'permits' | 'exclusive'): HistoryEvent[] {
      const worker = holder.split('.')[0];
      const mode = kind === 'exclusive' ? {} : kind === 'shared' ? { mode: 'shared' as const } : { mode: 'permits' as const, permits: 2 };
      return [
        { t, type: 'attempt', holder, worker, key, waitMs: 1000 },
        { t: t + 5, type: 'acquired', holder, worker, key, token, deadline: t + 1005, ...mode },
        { t: t + 20, type: 'released', holder, worker, key },
      ];
    }

    it('lets readers hold together, and as many permit holders as permits', () => {
      const history = [
        ...held('w1.0', 'register:a', 0, 10, 'shared'),
        ...held('w2.0', 'register:a', 5, 11, 'shared'),
        ...held('w3.0', 'register:a', 8, 12, 'shared'),
        ...held('w1.1', 'permits:a', 0, 13, 'permits'),
        ...held('w2.1', 'permits:a', 5, 14, 'permits'),
      ];
      const report = checkHistory(history, options);
      expect(report.overlaps).toEqual([]);
      expect(report.violations.overlap).toBe(0);
    });

    it('reports a writer beside a reader, and a permit holder beyond the permits', () => {
      const rw = [...held('w1.0', 'register:a', 0, 10, 'shared'), ...held('w2.0', 'register:a', 5, 11, 'exclusive')];
      expect(checkHistory(rw, options).violations.overlap).toBe(1);
      const wr = [...held('w2.0', 'register:a', 0, 10, 'exclusive'), ...held('w1.0', 'register:a', 5, 11, 'shared')];
      expect(checkHistory(wr, options).violations.overlap).toBe(1);
      const permits = [
        ...held('w1.1', 'permits:a', 0, 13, 'permits'),
        ...held('w2.1', 'permits:a', 2, 14, 'permits'),
        ...held('w3.1', 'permits:a', 4, 15, 'permits'),
      ];
      const report = checkHistory(permits, options);
      expect(report.overlaps).toEqual([{ key: 'permits:a', first: 'w1.1', second: 'w3.1', at: 9, ms: 11, allowedBy: undefined }]);
      expect(report.violations.overlap).toBe(1);
    });
  });
});
