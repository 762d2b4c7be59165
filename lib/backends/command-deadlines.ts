import { performance } from 'node:perf_hooks';

/**
 * How long after its deadline a statement still unanswered gives up its pooled connection. An
 * answer swallowed on the way (a network black hole, a failover behind a virtual IP) never comes:
 * its connection would stay checked out for good, and once as many as the pool has, no lock
 * operation would work again. Long enough for a statement that only waited on a lock to finish
 * and be answered late (its late win is then given back); one given up costs its lock, if it won
 * one, the rest of its ttl.
 */
export const GIVE_UP_CONNECTION_AFTER_MS = 10_000;

/** The pooled connection a statement runs on, once it has one: `giveUp` closes it, and fails the statement. */
export interface Seat {
  giveUp?: () => void;
}

/** The statement's deadline passed: its connection is given up if its answer has not come GIVE_UP_CONNECTION_AFTER_MS later. */
export function giveUpLater(seat: Seat): void {
  setTimeout(() => seat.giveUp?.(), GIVE_UP_CONNECTION_AFTER_MS).unref();
}

/** A command waiting for its answer. */
export interface PendingCommand {
  readonly deadline: number;
  readonly expire: () => void;
}

/**
 * Bounds the commands of one backend with one timer, not one per command: a timer per command
 * was a measurable share of an uncontended acquire+release. Pending commands are checked every
 * quarter of the timeout, so one that gets no answer fails after 1 to 1.25 times the timeout.
 */
export class CommandDeadlines {
  private readonly pending = new Set<PendingCommand>();
  private timer: NodeJS.Timeout | undefined;

  constructor(private readonly timeoutMs: number) {}

  /** Starts the clock for one command; `expire` runs if it is not answered in time. */
  track(expire: () => void): PendingCommand {
    const command = { deadline: performance.now() + this.timeoutMs, expire };
    this.pending.add(command);
    this.timer ??= this.schedule();
    return command;
  }

  /** The command was answered: true if in time, false if it had expired already. */
  answered(command: PendingCommand): boolean {
    return this.pending.delete(command);
  }

  private schedule(): NodeJS.Timeout {
    // It stops once nothing is pending, so it needs no closing; and the pending commands' sockets
    // keep the process alive, so this timer need not.
    return setTimeout(this.sweep, this.timeoutMs / 4).unref();
  }

  private readonly sweep = (): void => {
    const now = performance.now();
    for (const command of this.pending) {
      if (command.deadline > now) continue;
      this.pending.delete(command);
      command.expire();
    }
    this.timer = this.pending.size > 0 ? this.schedule() : undefined;
  };
}
