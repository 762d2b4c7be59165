import { readFileSync } from 'node:fs';
import { performance } from 'node:perf_hooks';
import { setTimeout as sleep } from 'node:timers/promises';
import type { LockHandle, LockService } from '../lib/index.js';
import { until } from '../test/support/wait.js';

/** One measured line: what ran, which implementation, and its figures. */
export interface Row {
  scenario: string;
  impl: string;
  [figure: string]: string | number | undefined;
}

/** Collects rows; prints each as it comes (JSON lines) or all at the end as tables (people). */
export class Report {
  private readonly rows: Row[] = [];

  constructor(private readonly json: boolean) {}

  add(row: Row): void {
    this.rows.push(row);
    if (this.json) console.log(JSON.stringify(row));
    else process.stderr.write(`  ${row.scenario} / ${row.impl} done\n`);
  }

  /** Human progress that must not pollute the JSON lines. */
  note(text: string): void {
    process.stderr.write(`${text}\n`);
  }

  printTables(): void {
    if (this.json) return;
    const scenarios = [...new Set(this.rows.map((row) => row.scenario))];
    for (const scenario of scenarios) {
      const rows = this.rows.filter((row) => row.scenario === scenario);
      const columns = ['impl', ...new Set(rows.flatMap((row) => Object.keys(row).filter((k) => k !== 'scenario' && k !== 'impl')))];
      const cells = rows.map((row) => columns.map((column) => format(row[column])));
      const widths = columns.map((column, i) => Math.max(column.length, ...cells.map((line) => line[i].length)));
      const line = (values: string[]) =>
        '| ' + values.map((v, i) => (i === 0 ? v.padEnd(widths[i]) : v.padStart(widths[i]))).join(' | ') + ' |';
      console.log(`\n${scenario}`);
      console.log(line(columns));
      console.log('|' + widths.map((w, i) => (i === 0 ? '-'.repeat(w + 2) : '-'.repeat(w + 1) + ':')).join('|') + '|');
      for (const values of cells) console.log(line(values));
    }
  }
}

function format(value: string | number | undefined): string {
  if (value === undefined) return '-';
  if (typeof value === 'string') return value;
  if (Number.isInteger(value)) return value.toLocaleString('en-US');
  return Math.abs(value) >= 100 ? Math.round(value).toLocaleString('en-US') : value.toFixed(2);
}

/**
 * Runs `op` back to back for `ms` and returns operations per second. Each implementation gets the
 * same number of rounds, interleaved, and the median round counts, so a noisy neighbour on the
 * machine hits every implementation alike.
 */
export async function compareRates(
  impls: Record<string, () => Promise<unknown>>,
  { rounds = 5, ms = 400, warmupMs = 200 } = {},
): Promise<Record<string, number>> {
  for (const op of Object.values(impls)) await loopFor(op, warmupMs);
  const samples: Record<string, number[]> = Object.fromEntries(Object.keys(impls).map((name) => [name, []]));
  for (let round = 0; round < rounds; round++) {
    for (const [name, op] of Object.entries(impls)) samples[name].push(await loopFor(op, ms));
  }
  return Object.fromEntries(Object.entries(samples).map(([name, rates]) => [name, median(rates)]));
}

async function loopFor(op: () => Promise<unknown>, ms: number): Promise<number> {
  const started = performance.now();
  const until = started + ms;
  let count = 0;
  // Check the clock every 64 calls: reading it every call would dominate a sub-microsecond op.
  do {
    for (let i = 0; i < 64; i++) await op();
    count += 64;
  } while (performance.now() < until);
  return (count / (performance.now() - started)) * 1000;
}

export function median(values: readonly number[]): number {
  return percentile(
    [...values].sort((a, b) => a - b),
    50,
  );
}

/** Nearest-rank percentile of an ascending array. */
export function percentile(sorted: readonly number[], p: number): number {
  if (sorted.length === 0) return NaN;
  return sorted[Math.min(sorted.length - 1, Math.max(0, Math.ceil((p / 100) * sorted.length) - 1))];
}

/** Latencies in ms of `count` sequential calls of `op`, ascending. */
export async function latencies(op: () => Promise<unknown>, count: number): Promise<number[]> {
  const times: number[] = [];
  for (let i = 0; i < count; i++) {
    const started = performance.now();
    await op();
    times.push(performance.now() - started);
  }
  return times.sort((a, b) => a - b);
}

/** Heap in use after a full collection; needs `node --expose-gc`. */
export function settledHeap(): number {
  const gc = (globalThis as { gc?: () => void }).gc;
  if (!gc) throw new Error('Run the bench with node --expose-gc (npm run bench does).');
  for (let i = 0; i < 3; i++) gc();
  return process.memoryUsage().heapUsed;
}

export const round = (value: number, digits = 2): number => Number(value.toFixed(digits));

/** A hot-key scenario: `workers` callers, each `sections` times in a section of `sectionMs`. */
export interface HotKeyScenario {
  scenario: string;
  workers: number;
  sections: number;
  sectionMs: number;
}

/** A hot-key row from every wait and every section's real length (ms), and the run's length. */
export function hotKeyRow(hotKey: HotKeyScenario, impl: string, elapsedMs: number, waits: number[], inside: number[]): Row {
  const { workers, sections, scenario } = hotKey;
  waits.sort((a, b) => a - b);
  const rate = (workers * sections * 1000) / elapsedMs;
  // A 1 ms timer sleeps a little longer than 1 ms: the ideal rate is that of the real sections.
  const ideal = 1000 / (inside.reduce((sum, ms) => sum + ms, 0) / inside.length);
  return {
    scenario,
    impl,
    sectionsPerSec: Math.round(rate),
    vsIdeal: round(rate / ideal),
    waitP50Ms: round(waits[Math.floor(waits.length / 2)], 1),
    waitP99Ms: round(percentile(waits, 99), 1),
    waitMaxMs: round(waits[waits.length - 1], 1),
    // A fair lock makes a worker wait for the others at most, once each.
    fifoBoundMs: Math.round(workers * (1000 / ideal)),
  };
}

/** A store's own hand-over floor: the p50 of one hand-over, and what it leaves of a hot key's sections. */
export interface HandoffFloor {
  p50Ms: number;
  /** The best "vs ideal" a lock on this store can reach, paying the floor once per section. */
  bestVsIdeal: number;
}

/**
 * Measures a store's hand-over floor: `count` times, `prepare` sets up a holder and a waiter
 * (not timed) and returns the hand-over, which resolves once the waiter heard of it; it runs after
 * an idle section of `sectionMs`, as a hot key's hand-overs come (an idle connection is slower to
 * wake than a busy one).
 */
export async function measureHandoffFloor(
  prepare: () => Promise<() => Promise<unknown>>,
  sectionMs: number,
  count = 200,
): Promise<HandoffFloor> {
  const handoffs: number[] = [];
  const sections: number[] = [];
  for (let i = 0; i < count; i++) {
    const handOver = await prepare();
    const idle = performance.now();
    await sleep(sectionMs);
    const sent = performance.now();
    sections.push(sent - idle);
    await handOver();
    handoffs.push(performance.now() - sent);
  }
  const p50Ms = median(handoffs);
  const section = median(sections);
  return { p50Ms, bestVsIdeal: section / (section + p50Ms) };
}

/**
 * One hand-over of ours between two instances (services with a client each), measured as the
 * floor is: the first holds `key`, the second waits for it in the store's line; after an idle
 * section the first releases, and the time runs until the second has the lock. Without the seven
 * other workers of a hot key, this is the hand-over's own cost, apart from a busy machine's
 * scheduling of many processes.
 */
export async function measureOurHandoff(holder: LockService, waiter: LockService, key: string, sectionMs: number): Promise<HandoffFloor> {
  let held: LockHandle | undefined;
  return measureHandoffFloor(async () => {
    // The last round's new holder lets go first: not part of a hand-over.
    await held?.release();
    const first = await holder.acquire(key, { ttl: 30_000 });
    const second = waiter.acquire(key, { wait: 30_000, ttl: 30_000 });
    await until(async () => ((await holder.inspect(key))?.waiters?.length ?? 0) > 0, 10_000, 'the second instance to wait in line');
    return async () => {
      [, held] = await Promise.all([first.release(), second]);
    };
  }, sectionMs).finally(() => held?.release());
}

/**
 * The same, with a holder that got the key after waiting for it, as every holder of a hot key does
 * (a backend may learn who waits behind a holder only then): a third instance holds first, the
 * holder waits behind it and the waiter behind the holder; once the holder has the key, its
 * release to the waiter is timed.
 */
export async function measureOurHandoffAfterWait(
  front: LockService,
  holder: LockService,
  waiter: LockService,
  key: string,
  sectionMs: number,
): Promise<HandoffFloor> {
  let held: LockHandle | undefined;
  const waiting = (count: number, what: string) =>
    until(async () => ((await front.inspect(key))?.waiters?.length ?? 0) >= count, 10_000, what);
  return measureHandoffFloor(async () => {
    await held?.release();
    const first = await front.acquire(key, { ttl: 30_000 });
    const second = holder.acquire(key, { wait: 30_000, ttl: 30_000 });
    await waiting(1, 'the holder to wait in line');
    const third = waiter.acquire(key, { wait: 30_000, ttl: 30_000 });
    await waiting(2, 'the waiter to wait behind it');
    await first.release();
    const holding = await second;
    return async () => {
      [, held] = await Promise.all([holding.release(), third]);
    };
  }, sectionMs).finally(() => held?.release());
}

/** Our hand-over's row, against the store's floor measured in the same run. */
export function ourHandoffRow(scenario: string, impl: string, ours: HandoffFloor, floor: HandoffFloor): Row {
  return { scenario, impl, handoffP50Us: round(ours.p50Ms * 1000, 1), handoffVsFloor: round(ours.p50Ms / floor.p50Ms) };
}

/** The floor's own row in a hot-key table. */
export function handoffFloorRow(scenario: string, impl: string, floor: HandoffFloor): Row {
  return { scenario, impl, handoffP50Us: round(floor.p50Ms * 1000, 1), bestVsIdeal: round(floor.bestVsIdeal) };
}

/**
 * A hot-key row read against the store's floor: the time each hand-over took on average (the run's
 * length per section, less the sections' real length: the lock is never free while anyone
 * waits), that time against the floor's, and "vs ideal" against the best the floor allows.
 */
export function againstHandoffFloor(row: Row, hotKey: HotKeyScenario, elapsedMs: number, inside: number[], floor: HandoffFloor): Row {
  const section = inside.reduce((sum, ms) => sum + ms, 0) / inside.length;
  const handoffMs = elapsedMs / (hotKey.workers * hotKey.sections) - section;
  return {
    ...row,
    handoffMs: round(handoffMs),
    handoffVsFloor: round(handoffMs / floor.p50Ms),
    vsHandoffCap: round((row.vsIdeal as number) / floor.bestVsIdeal),
  };
}

/**
 * One hot-key worker: `count` times takes the lock, stays `sectionMs` inside and releases, pushing
 * each wait and each section's real length (ms); `lock` resolves to the lock's release.
 */
export async function timedSections(
  lock: () => Promise<() => Promise<unknown>>,
  count: number,
  sectionMs: number,
  waits: number[],
  inside: number[],
): Promise<void> {
  for (let i = 0; i < count; i++) {
    const asked = performance.now();
    const release = await lock();
    const entered = performance.now();
    waits.push(entered - asked);
    await sleep(sectionMs);
    inside.push(performance.now() - entered);
    await release();
  }
}

/** CPU seconds another process (a store's server) has used, user and system, from /proc. */
export function cpuSecondsOf(pid: number): number {
  const fields = readFileSync(`/proc/${pid}/stat`, 'utf8').split(') ')[1].split(' ');
  return (Number(fields[11]) + Number(fields[12])) / 100;
}
