import { refusalFix, refusalOf } from '../redis/redis.refusals.js';

/**
 * What the Redlock backend needs of an ioredis client. Structural, so the published types do not
 * import ioredis for users of the other backends; an ioredis `Redis` instance fits.
 */
export interface RedlockMasterClient {
  readonly status: string;
  readonly options: { host?: string; port?: number; path?: string | null };
  evalsha(sha: string, numKeys: number, ...args: (string | number)[]): Promise<unknown>;
  eval(script: string, numKeys: number, ...args: (string | number)[]): Promise<unknown>;
  duplicate(): RedlockSubscriberClient;
  /** Asked once per master, to refuse one server listed twice, a replica or a Cluster node. */
  info(): Promise<string>;
  once?(event: 'ready', listener: () => void): unknown;
}

/** The connection `duplicate()` returns, used only for SUBSCRIBE. */
export interface RedlockSubscriberClient {
  readonly status: string;
  subscribe(...channels: string[]): Promise<unknown>;
  unsubscribe(...channels: string[]): Promise<unknown>;
  on(event: 'message', listener: (channel: string, message: string) => void): unknown;
  on(event: 'error', listener: (error: Error) => void): unknown;
  once?(event: 'ready', listener: () => void): unknown;
  disconnect(): void;
  /** ioredis's socket, when it has one. */
  readonly stream?: { destroy(): void };
}

/**
 * Closes a connection of the backend's own at once. ioredis's disconnect() only ends the socket
 * (sends FIN) and destroys it `disconnectTimeout` (2 s) later if the server never closes its side,
 * as a frozen master does not: that timer would keep the process from exiting after shutdown.
 * Nothing is lost: a subscriber has nothing to flush, and a client is dropped only once its QUIT
 * was answered, timed out, or could not be sent.
 */
export function dropConnection(connection: { disconnect(): void; readonly stream?: { destroy(): void } }): void {
  connection.disconnect();
  connection.stream?.destroy();
}

/** Failed releases kept at most per master: a master down for long under heavy traffic must not grow them for good. */
const MAX_SENT_AGAIN = 10_000;

/** ioredis states in which a command would sit in the offline queue until a reconnect. */
const DOWN = new Set(['reconnecting', 'close', 'end']);

/** A master's request failed or timed out: a vote that is neither for nor against the lock. */
export class MasterRequestError extends Error {
  constructor(
    readonly master: string,
    message: string,
    options?: ErrorOptions,
  ) {
    super(`master ${master}: ${message}`, options);
    this.name = 'MasterRequestError';
  }
}

/**
 * One master as the redlock package sees it (it only calls `evalsha` and `eval`). The package
 * waits for every vote without a timeout, and ioredis queues commands for a dead master until it
 * gives up (seconds); here every request gets `timeoutMs`, and a master known to be down fails at
 * once, so a lost master costs an attempt one timeout at most, never a hang.
 *
 * Scripts in `patient` (release; by hash and by text) are queued even while the master is down: ioredis resends an
 * unanswered acquire after reconnecting, and a release queued behind it then still removes it.
 * One that ioredis fails (after `maxRetriesPerRequest` reconnection attempts, while the unanswered
 * acquire or extension it was to follow stays queued, and goes out on reconnecting) is sent again
 * once the client is ready, behind what ioredis sends again: else the key stays, held by nobody,
 * until its ttl. They delete by owner, whose token is never used again, so twice does no harm.
 */
export class RedlockMaster {
  /** Patient requests ioredis failed, by what they send: sent again at the next 'ready'. */
  private readonly sendAgain = new Map<string, () => Promise<unknown>>();
  /** The last connection error of a client the backend opened (it hears no other's). */
  private lastError: Error | undefined;
  /** Set while this master refuses the client for good (credentials, no such database). */
  private refused: MasterRequestError | undefined;

  constructor(
    readonly client: RedlockMasterClient,
    readonly name: string,
    private readonly timeoutMs: number,
    private readonly patient: ReadonlySet<string>,
    /** The backend opened the client from a URL: its connection errors are ours to read. */
    owned = false,
  ) {
    const events = client as RedlockMasterClient & {
      on?: (event: 'error' | 'ready', listener: (error: Error) => void) => unknown;
      disconnect?: () => void;
      options: { db?: number };
    };
    if (!owned || typeof events.on !== 'function') return;
    events.on('error', (error) => {
      this.lastError = error;
      const refusal = refusalOf(error);
      if (refusal !== 'credentials' && refusal !== 'database') return;
      const fix =
        refusal === 'database'
          ? `it has no database ${events.options.db ?? 0}: name one it has in the URL ('redis://host:6379/0'), or raise 'databases' in its redis.conf`
          : refusalFix(refusal, 'it');
      this.refused = new MasterRequestError(name, `${error.message.replace(/\.+$/, '')}: ${fix}.`, { cause: error });
      // ioredis would go on in database 0, where this master's votes would not be where the others' are.
      if (refusal === 'database') events.disconnect?.();
    });
    events.on('ready', () => {
      this.lastError = undefined;
      this.refused = undefined;
    });
  }

  get up(): boolean {
    return !DOWN.has(this.client.status);
  }

  /** Why this master does not answer, in words about the server (not ioredis's about its retries). */
  unreachable(): string {
    if (this.refused) return this.refused.message;
    return `master ${this.name}: ${this.why()}`;
  }

  private why(): string {
    const code = (this.lastError as { code?: string } | undefined)?.code;
    if (code === 'ECONNREFUSED') return 'refused the connection (is it running, on this host and port?)';
    if (code === 'ENOTFOUND' || code === 'EAI_AGAIN') return 'cannot be reached: its host name does not resolve';
    if (this.lastError) return `cannot be reached (${this.lastError.message.replace(/\.+$/, '')})`;
    return `not connected (${this.client.status})`;
  }

  evalsha(sha: string, numKeys: number, args: (string | number)[]): Promise<unknown> {
    return this.request(
      this.patient.has(sha),
      () => this.client.evalsha(sha, numKeys, ...args),
      () => `${sha} ${args.join(' ')}`,
    );
  }

  eval(script: string, numKeys: number, args: (string | number)[]): Promise<unknown> {
    return this.request(
      this.patient.has(script),
      () => this.client.eval(script, numKeys, ...args),
      () => `${script} ${args.join(' ')}`,
    );
  }

  info(): Promise<string> {
    return this.request(false, () => this.client.info()) as Promise<string>;
  }

  /**
   * Loads `scripts` now if connected, and each time the connection is made again. A master that
   * restarted has no scripts: a vote by hash would get NOSCRIPT and be sent again by text, later
   * than the clean-up of a failed attempt sent meanwhile, which it would then outlive as a stray
   * key. Loaded first, the hash works. (Commands queued while it was down still go out before the
   * load; those can still meet NOSCRIPT.)
   */
  preload(scripts: readonly string[]): void {
    const client = this.client as RedlockMasterClient & {
      on?: (event: 'ready', listener: () => void) => unknown;
      script?: (subcommand: 'LOAD', script: string) => Promise<unknown>;
    };
    if (typeof client.on !== 'function' || typeof client.script !== 'function') return;
    const load = () => {
      for (const script of scripts) client.script!('LOAD', script).catch(() => undefined);
    };
    client.on('ready', load);
    if (client.status === 'ready') load();
  }

  /** Requests that ioredis failed are sent again when the client is next ready; those that fail again wait for the one after. */
  private retryWhenReady(what: string, send: () => Promise<unknown>): void {
    const client = this.client as RedlockMasterClient & { once?: (event: 'ready', listener: () => void) => unknown };
    if (typeof client.once !== 'function') return;
    if (this.sendAgain.size >= MAX_SENT_AGAIN) this.sendAgain.delete(this.sendAgain.keys().next().value!);
    const first = this.sendAgain.size === 0;
    this.sendAgain.set(what, send);
    if (!first) return;
    // 'ready' is emitted after ioredis has written what it sends again on reconnecting.
    client.once('ready', () => {
      const pending = [...this.sendAgain];
      this.sendAgain.clear();
      for (const [again, resend] of pending) resend().catch(() => this.retryWhenReady(again, resend));
    });
  }

  /** `what` names the request among those to send again; built only when one failed. */
  private request(patient: boolean, send: () => Promise<unknown>, what?: () => string): Promise<unknown> {
    if (!patient && this.refused) return Promise.reject(this.refused);
    if (!patient && !this.up) {
      return Promise.reject(new MasterRequestError(this.name, this.why()));
    }
    return new Promise((resolve, reject) => {
      const timer = setTimeout(() => reject(new MasterRequestError(this.name, `no answer within ${this.timeoutMs} ms`)), this.timeoutMs);
      // A request to a dead master must not keep a finished process alive.
      timer.unref();
      send().then(
        (value) => {
          clearTimeout(timer);
          resolve(value);
        },
        (error: unknown) => {
          clearTimeout(timer);
          if (patient && what !== undefined && !(error instanceof Error && error.message.startsWith('NOSCRIPT'))) {
            this.retryWhenReady(what(), send);
          }
          reject(
            error instanceof Error && error.message.startsWith('NOSCRIPT')
              ? error
              : new MasterRequestError(this.name, String(error instanceof Error ? error.message : error), { cause: error }),
          );
        },
      );
    });
  }
}
