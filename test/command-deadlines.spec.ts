import { describe, expect, it } from '@jest/globals';
import { performance } from 'node:perf_hooks';
import { CommandDeadlines } from '../lib/backends/command-deadlines.js';
import { until } from './support/wait.js';

describe('CommandDeadlines', () => {
  it('expires a command that gets no answer once its timeout has passed, never before, and never one answered in time', async () => {
    const deadlines = new CommandDeadlines(200);
    const started = performance.now();
    let expiredAt: number | undefined;
    let answeredExpired = false;
    deadlines.track(() => (expiredAt = performance.now() - started));
    const answered = deadlines.track(() => (answeredExpired = true));
    expect(deadlines.answered(answered)).toBe(true);
    await until(() => expiredAt !== undefined, 5_000, 'the silent command to expire');
    expect(expiredAt).toBeGreaterThanOrEqual(200);
    // Checked every quarter of the timeout (50 ms); the rest is room for a loaded machine's timers.
    expect(expiredAt).toBeLessThan(250 + 200);
    expect(answeredExpired).toBe(false);
  });

  it('reports an answer that came after its command expired as late', async () => {
    const deadlines = new CommandDeadlines(40);
    let expired = false;
    const command = deadlines.track(() => (expired = true));
    await until(() => expired, 5_000, 'the command to expire');
    expect(deadlines.answered(command)).toBe(false);
  });
});
