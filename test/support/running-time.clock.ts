import type { Clock } from '../model/lock-service.model.js';

const TICK_MS = 5;

/**
 * Real time, less the time this process was kept from running. A bound on real time holds only
 * while the process runs: starved of CPU (a loaded CI runner, other test files, a long GC pause),
 * a correct library missed "entered within wait + faults + poll + 500 ms" (764 ms for a bound of
 * 640) and "the actors finish within 20 s", with nothing wrong but the machine. A probe timer ticks
 * every 5 ms; whatever it fires later than two ticks counts as a stall, which this clock leaves out.
 * The redis-server on the same machine starves with the process: its slower answers are in the
 * slack. `stop()` ends the probe.
 */
export function runningTimeClock(slackMs: number): Clock & { stop(): void } {
  let last = performance.now();
  let stalled = 0;
  const probe = setInterval(() => {
    const t = performance.now();
    stalled += Math.max(0, t - last - 2 * TICK_MS);
    last = t;
  }, TICK_MS);
  // The stall in progress counts too: the probe has not run since `last`.
  const now = () => {
    const t = performance.now();
    return t - stalled - Math.max(0, t - last - 2 * TICK_MS);
  };
  return {
    now,
    async drive(work) {
      const started = now();
      let poll: NodeJS.Timeout | undefined;
      const gaveUp = new Promise<false>((resolve) => {
        poll = setInterval(() => {
          if (now() - started > 20_000) resolve(false);
        }, 100);
      });
      try {
        return await Promise.race([
          work.then(
            () => true as const,
            () => true as const,
          ),
          gaveUp,
        ]);
      } finally {
        clearInterval(poll);
      }
    },
    // Real timers of this process are shared with Jest's own: not counted here (the fake-time
    // model counts them exactly).
    timersLeft: async () => 0,
    slackMs,
    stop: () => clearInterval(probe),
  };
}
