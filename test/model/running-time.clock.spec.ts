import { describe, expect, it } from '@jest/globals';
import { runningTimeClock } from '../support/running-time.clock.js';

describe('runningTimeClock', () => {
  it('leaves out the time the process could not run, and counts the time it could', async () => {
    const clock = runningTimeClock(0);
    try {
      // Running: the clock moves, never ahead of real time.
      const realStart = performance.now();
      const start = clock.now();
      await new Promise((resolve) => setTimeout(resolve, 50));
      expect(clock.now() - start).toBeGreaterThan(0);
      expect(clock.now() - start).toBeLessThanOrEqual(performance.now() - realStart);

      // Stalled (a busy loop: no timer can fire, as on a starved machine): at most the probe's
      // two ticks of it count, however long it lasts.
      const before = clock.now();
      const stallUntil = performance.now() + 300;
      while (performance.now() < stallUntil);
      expect(clock.now() - before).toBeLessThanOrEqual(10);
    } finally {
      clock.stop();
    }
  });
});
