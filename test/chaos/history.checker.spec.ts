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
});
