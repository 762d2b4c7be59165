import { execFileSync } from 'node:child_process';
import { mkdtempSync, renameSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';

/**
 * A wall clock a test can move for one redis-server: `clock-shift.c`, compiled here (never
 * committed as a binary) and preloaded into the server, adds the offset written to a file to
 * CLOCK_REALTIME. Redis expires keys by that clock, so a jump forward frees keys early.
 */
export class ClockShift {
  private constructor(private readonly dir: string) {}

  static compile(): ClockShift {
    const dir = mkdtempSync(join(tmpdir(), 'ndl-clock-'));
    const source = join(process.cwd(), 'test', 'support', 'clock-shift.c');
    execFileSync('gcc', ['-shared', '-fPIC', '-O2', '-o', join(dir, 'clock-shift.so'), source]);
    const shift = new ClockShift(dir);
    shift.set(0);
    return shift;
  }

  /** The environment of a server whose clock follows `set()`. */
  get env(): NodeJS.ProcessEnv {
    return { LD_PRELOAD: join(this.dir, 'clock-shift.so'), CLOCK_SHIFT_FILE: join(this.dir, 'offset') };
  }

  /** Moves the server's wall clock to `ms` from the real one, at once. */
  set(ms: number): void {
    // Written aside and renamed: the server reads the file on every clock call, and would read
    // an empty file (no shift: its clock back to real time) between a truncation and a write.
    writeFileSync(join(this.dir, 'offset.next'), String(Math.round(ms)));
    renameSync(join(this.dir, 'offset.next'), join(this.dir, 'offset'));
  }

  remove(): void {
    rmSync(this.dir, { recursive: true, force: true });
  }
}
