import { afterAll, beforeAll, describe, expect, it } from '@jest/globals';
import { spawn, type ChildProcess } from 'node:child_process';
import { once } from 'node:events';
import { resolve } from 'node:path';
import { createInterface } from 'node:readline';
import { ClockShift } from '../support/clock-shift.js';
import { useRedisServer } from '../support/redis-fixture.js';
import { until } from '../support/wait.js';

const fixture = useRedisServer();
const app = resolve(process.cwd(), 'test/fixtures/scheduled-jobs.mjs');
/** Ticks every job must run, all instances up. */
const TICKS = 6;

const instances: ChildProcess[] = [];
const clocks: ClockShift[] = [];
beforeAll(() => {
  // Two instances' clocks are off: one 150 ms ahead (its timers fire first), one 120 ms behind.
  for (const offset of [150, -120]) {
    const clock = ClockShift.compile();
    clock.set(offset);
    clocks.push(clock);
  }
});
afterAll(async () => {
  await stopAll();
  for (const clock of clocks) clock.remove();
});

async function stopAll(): Promise<void> {
  await Promise.all(
    instances.splice(0).map(async (child) => {
      if (child.exitCode !== null || child.signalCode !== null) return;
      child.kill('SIGKILL');
      await once(child, 'exit');
    }),
  );
}

/** Starts an instance of the app (its clock shifted by `clock`) and resolves once its jobs are scheduled. */
async function startInstance(minHold: number, clock?: ClockShift): Promise<void> {
  const child = spawn(process.execPath, [app, fixture.server.url, String(minHold)], {
    env: { ...process.env, ...clock?.env },
    stdio: ['ignore', 'pipe', 'inherit'],
  });
  instances.push(child);
  const lines = createInterface({ input: child.stdout! });
  const ready = new Promise<void>((resolveReady, reject) => {
    lines.on('line', (line) => line === 'ready' && resolveReady());
    child.once('exit', (code) => reject(new Error(`an instance exited with ${code} before it was ready`)));
  });
  await ready;
}

/** Runs per tick of one job, for the ticks after `from` that every instance saw from start to end. */
async function runsPerTick(job: string, from: number): Promise<Map<number, number>> {
  const recorded = await fixture.admin.hgetall(`runs:${job}`);
  const runs = new Map<number, number>();
  for (let tick = from + 1; tick <= from + TICKS; tick++) runs.set(tick, Number(recorded[tick] ?? 0));
  return runs;
}

describe('scheduled jobs on three instances, two with skewed clocks', () => {
  it('@Cron + @Locked({ onBusy: "skip", minHold }) runs every tick exactly once, a fast job and a slow one, in either decorator order', async () => {
    await Promise.all([startInstance(500), startInstance(500, clocks[0]), startInstance(500, clocks[1])]);
    const from = Math.round(Date.now() / 1000) + 1;
    // Wait until the slow job (300 ms) of the last tick counted has been recorded.
    await until(
      async () => Object.keys(await fixture.admin.hgetall('runs:slow')).some((tick) => Number(tick) > from + TICKS),
      (TICKS + 10) * 1_000,
      'the ticks to pass',
    );
    await stopAll();
    const expected = new Map(Array.from({ length: TICKS }, (_, i) => [from + 1 + i, 1]));
    expect(await runsPerTick('fast', from)).toEqual(expected);
    expect(await runsPerTick('slow', from)).toEqual(expected);
  }, 60_000);
});
