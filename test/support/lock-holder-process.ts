import { fork, type ChildProcess } from 'node:child_process';
import { once } from 'node:events';
import { resolve } from 'node:path';
import { until } from './wait.js';

const fixtures = resolve(import.meta.dirname, '../fixtures');

/** What a holder fixture (test/fixtures/*-lock-holder.mjs) reports over IPC. */
export interface HolderMessage {
  type: 'acquired' | 'lost' | 'wrote' | 'released' | 'extended';
  token?: number;
  reason?: string;
  name?: string;
  accepted?: boolean;
  aborted?: boolean;
}

/** A child process holding `key` through one backend's holder fixture, and the messages it sent so far. */
export class Holder {
  readonly messages: HolderMessage[] = [];
  /** When the child exited (Date.now()), if it did. */
  private exitedAt?: number;
  private constructor(readonly child: ChildProcess) {
    child.on('message', (message: HolderMessage) => this.messages.push(message));
    child.on('exit', () => (this.exitedAt = Date.now()));
  }

  /** `fixture`: the file name under test/fixtures, e.g. 'redis-lock-holder.mjs'; `args` follow the ttl. */
  static async start(fixture: string, url: string, key: string, ttl: number, args: string[] = []): Promise<Holder> {
    const holder = Holder.spawn(fixture, url, key, ttl, args);
    await holder.next('acquired');
    return holder;
  }

  /** As start(), without waiting for the child to hold (it may wait in line); `env` adds to the child's environment. */
  static spawn(fixture: string, url: string, key: string, ttl: number, args: string[] = [], env: NodeJS.ProcessEnv = {}): Holder {
    return new Holder(
      fork(resolve(fixtures, fixture), [url, key, String(ttl), ...args], {
        env: { ...process.env, ...env },
        stdio: ['ignore', 'inherit', 'inherit', 'ipc'],
      }),
    );
  }

  /**
   * The first message of `type`. A child that exited without it fails the wait; one still running
   * gets 20 s, since a process that loads the library and a client takes seconds on a busy
   * 2-core machine.
   */
  next(type: HolderMessage['type']): Promise<HolderMessage> {
    const sent = () => this.messages.find((m) => m.type === type);
    return until(
      () => {
        if (sent()) return true;
        // A second for messages it sent just before it exited, still on their way.
        if (this.exitedAt !== undefined && Date.now() - this.exitedAt > 1_000) {
          const { exitCode, signalCode } = this.child;
          throw new Error(`The holder exited (${signalCode ?? `code ${exitCode}`}) without its '${type}' message`);
        }
        return false;
      },
      20_000,
      `the holder's '${type}' message`,
    ).then(() => sent()!);
  }

  async kill(): Promise<void> {
    if (this.child.exitCode !== null || this.child.signalCode !== null) return;
    const exited = once(this.child, 'exit');
    this.child.kill('SIGKILL');
    await exited;
  }
}
