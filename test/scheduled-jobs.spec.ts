import 'reflect-metadata';
import { afterEach, describe, expect, it } from '@jest/globals';
import { Injectable, Module, type INestApplicationContext } from '@nestjs/common';
import { NestFactory } from '@nestjs/core';
import { Interval, ScheduleModule, SchedulerRegistry, Timeout } from '@nestjs/schedule';
import { DistributedLockModule, LockService, Locked } from '../lib/index.js';
import { until } from './support/wait.js';

/** Counts runs, and runs inside at once: more than one means ticks overlapped. */
class Runs {
  count = 0;
  inside = 0;
  most = 0;
  async run(ms: number): Promise<void> {
    this.count++;
    this.most = Math.max(this.most, ++this.inside);
    await new Promise((resolve) => setTimeout(resolve, ms));
    this.inside--;
  }
}

@Injectable()
class Jobs {
  readonly interval = new Runs();
  readonly timeout = new Runs();

  // Fires every 20 ms; a run takes 60 ms, so ticks overlap.
  @Interval(20)
  @Locked('job:interval', { onBusy: 'skip' })
  async everyFewMs(): Promise<void> {
    await this.interval.run(60);
  }

  @Locked('job:timeout', { onBusy: 'skip' })
  @Timeout(10)
  async once(): Promise<void> {
    await this.timeout.run(1);
  }
}

@Module({ imports: [ScheduleModule.forRoot(), DistributedLockModule.forRoot()], providers: [Jobs] })
class AppModule {}

let app: INestApplicationContext | undefined;
afterEach(async () => {
  await app?.close();
  app = undefined;
});

describe('scheduled jobs in one process (in-memory backend)', () => {
  it('@Interval and @Timeout with @Locked in either order: overlapping ticks are skipped, never run twice at once', async () => {
    app = await NestFactory.createApplicationContext(AppModule, { logger: false });
    const jobs = app.get(Jobs);
    const locks = app.get(LockService);
    // A tick that finds the job running is skipped, not queued to run after it.
    let queued = 0;
    await until(
      () => ((queued = Math.max(queued, locks.queue.waiting)), jobs.interval.count >= 5 && jobs.timeout.count === 1),
      10_000,
      'five runs of the interval job',
    );
    expect(queued).toBe(0);
    expect(jobs.interval.most).toBe(1);
    expect(jobs.timeout.count).toBe(1);
  });

  it('a job registered through SchedulerRegistry runs under using() the same way', async () => {
    app = await NestFactory.createApplicationContext(AppModule, { logger: false });
    const locks = app.get(LockService);
    const runs = new Runs();
    const failures: unknown[] = [];
    const tick = () => locks.using('job:dynamic', () => runs.run(60), { onBusy: 'skip' }).catch((error: unknown) => failures.push(error));
    app.get(SchedulerRegistry).addInterval('dynamic', setInterval(tick, 20));
    let queued = 0;
    await until(() => ((queued = Math.max(queued, locks.queue.waiting)), runs.count >= 5), 10_000, 'five runs of the dynamic job');
    expect(queued).toBe(0);
    expect(runs.most).toBe(1);
    expect(failures).toEqual([]);
  });
});
