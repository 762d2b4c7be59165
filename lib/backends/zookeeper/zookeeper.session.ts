import { Logger } from '@nestjs/common';
import { performance } from 'node:perf_hooks';
import { DistributedLockError, LockBackendError } from '../../lock.errors.js';
import { ZooKeeperError, type ZooKeeperClient, type ZooKeeperClientState } from './zookeeper.client.js';

const logger = new Logger('DistributedLock');

/**
 * How long a request may go unanswered on a connection that stayed up before the session sends
 * the server a read. ZooKeeper 3.6.0 to 3.8.0 (ZOOKEEPER-4537, fixed in 3.8.1; Debian 12 ships
 * 3.8.0) can miss the commit of a write on the member that received it and keep the answer until
 * another request reaches that member: for seconds on a quiet ensemble. Any request wakes it, and
 * a session's answers come in order, so the write's answer comes first. A usual answer takes
 * milliseconds: the read costs nothing until one is this late.
 */
const NUDGE_AFTER_MS = 250;

/**
 * ZooKeeper's answers that waiting cannot change, by code, with what to do: the session's
 * identity may not do this under the lock root, or its credentials were refused. NO_AUTH and
 * INVALID_ACL only count on a connection known to be authenticated (see `run`).
 */
const REFUSED: Readonly<Record<string, string>> = {
  NO_AUTH:
    "this session's identity has no right to create or delete nodes under the lock root (its ACL refuses it). Give the backend the " +
    'credentials of an identity the ACL allows (the auth option, or user:password@ in the connection string), or have an ' +
    'admin grant that identity cdrwa on the root (docs/zookeeper.md, "Authentication and ACLs").',
  AUTH_FAILED:
    'the server refused the credentials. Check the auth option (or user:password@ in the connection string) and the ' +
    "server's authentication provider.",
  INVALID_ACL:
    'the server refused the ACL of a node the backend creates (an ACL for the creator needs credentials). Check the auth ' +
    'option (or user:password@ in the connection string).',
};

/**
 * The session as Curator names its states: `connected`; `suspended` (no connection: the session,
 * and every lock of it, may still live on the server); `lost` (it expired, or nothing was heard
 * for a whole session timeout: its ephemeral nodes are gone, or about to go).
 */
export type ZooKeeperSessionState = 'connecting' | 'connected' | 'suspended' | 'lost';

/** One live session, as operations see it: the client and which session it is. */
export interface LiveSession {
  readonly client: ZooKeeperClient;
  /** Counts sessions: a node created in an earlier one is not ours any more. */
  readonly generation: number;
}

/**
 * The backend's session with ZooKeeper: made on first use, made again after it is lost, and
 * watched for silence. Every operation is bounded by the command timeout.
 *
 * Liveness is the session: the server deletes a session's ephemeral nodes (its locks and places
 * in line) when it has heard nothing of it for the session timeout. `lastHeard` is when the last
 * answer came; the session cannot expire on the server before `sentAt + sessionTimeout` of any
 * request that was answered, which bounds a lock's validity (see the backend).
 */
export class ZooKeeperSession {
  private live: LiveSession | undefined;
  private connecting: Promise<LiveSession> | undefined;
  private generation = 0;
  private current: ZooKeeperSessionState = 'connecting';
  private lastHeard = performance.now();
  private watchdog: NodeJS.Timeout | undefined;
  private closed = false;
  private pinging = false;
  /** Counts the client's changes of connection: a request sent on an earlier one may have gone before the credentials. */
  private connection = 0;
  /** Operations waiting for a suspended session to connect again (or for close()). */
  private readonly resuming = new Set<() => void>();
  /** Operations sent and not answered yet: when, and on which connection (see NUDGE_AFTER_MS). */
  private readonly unanswered = new Set<{ sentAt: number; on: number }>();
  private nudgedAt = -Infinity;
  private readonly listeners = new Set<(state: ZooKeeperSessionState) => void>();
  /** Called after each operation ZooKeeper answered in time: it is reachable (see FailedReleases). */
  onAnswer: (() => void) | undefined;

  constructor(
    private readonly newClient: () => ZooKeeperClient,
    private readonly commandTimeout: number,
    private readonly backendName: string,
  ) {}

  get state(): ZooKeeperSessionState {
    return this.current;
  }

  /**
   * The connection the client is on now, while it is connected: a number that changes with every
   * change of connection; undefined while it has none. One connection brings answers and events in
   * the order its server applied the changes; the next may be to another member, behind the first,
   * and the events of the watches the client sets again come in no particular order.
   */
  get connectedOn(): number | undefined {
    return this.current === 'connected' ? this.connection : undefined;
  }

  /** The session timeout the server granted (0 before the first session). */
  get timeout(): number {
    return this.live?.client.sessionTimeout ?? 0;
  }

  /** Hears every change of state; returns how to stop. */
  onState(listener: (state: ZooKeeperSessionState) => void): () => void {
    this.listeners.add(listener);
    return () => this.listeners.delete(listener);
  }

  /** Runs `operation` on the live session (made if needed), bounded by the command timeout. */
  async run<T>(what: string, keys: readonly string[], operation: (session: LiveSession) => Promise<T>): Promise<T> {
    if (this.closed) throw this.error(what, keys, 'the backend is closed (the application shut down).');
    let timer: NodeJS.Timeout | undefined;
    let sentOn = -1;
    const timeout = new Promise<never>((_, reject) => {
      timer = setTimeout(() => {
        const message = `ZooKeeper did not answer within ${this.commandTimeout} ms (commandTimeout); is it reachable? ${this.stage(sentOn)}`;
        reject(this.error(what, keys, message));
      }, this.commandTimeout);
    });
    try {
      const answered = this.session().then((session) => {
        sentOn = this.connection;
        return this.tracked(sentOn, () => operation(session));
      });
      const result = await Promise.race([answered, timeout]);
      this.heard();
      this.onAnswer?.();
      return result;
    } catch (error) {
      if (error instanceof ZooKeeperError && error.code !== 'CONNECTION_LOSS' && error.code !== 'SESSION_EXPIRED') this.heard();
      // ZooKeeper's own errors stay inside the backend: callers (and LockService.inspect's) get a LockBackendError.
      if (error instanceof DistributedLockError) throw error;
      // Refused for this identity: no retry within the wait can change that, the caller hears it at once.
      // Unless the request may have reached the server before the credentials: on reconnection
      // the client sends them behind what it queued meanwhile, and the server refuses such a
      // request (NO_AUTH, INVALID_ACL) as coming from nobody. Only a connection that stayed up
      // from before the operation to its answer was surely authenticated.
      const code = error instanceof ZooKeeperError ? error.code : undefined;
      const authenticated = code === 'AUTH_FAILED' || (sentOn === this.connection && this.current === 'connected');
      const refused = code && authenticated ? REFUSED[code] : undefined;
      if (refused) throw this.error(what, keys, `ZooKeeper refused it (${(error as ZooKeeperError).code}): ${refused}`, error, true);
      throw this.error(what, keys, String(error), error);
    } finally {
      clearTimeout(timer);
    }
  }

  /**
   * Runs what sends the requests, counted as unanswered until it settles: also past its command
   * timeout, and also when the session came after that timeout (its answer is just as late).
   */
  private tracked<T>(on: number, send: () => Promise<T>): Promise<T> {
    const sent = { sentAt: performance.now(), on };
    this.unanswered.add(sent);
    const answered = (): void => void this.unanswered.delete(sent);
    try {
      const pending = send();
      pending.then(answered, answered);
      return pending;
    } catch (error) {
      answered();
      throw error;
    }
  }

  /**
   * Where a late operation stood, for its error: still waiting for a session (nothing was sent),
   * or sent and unanswered on a connection that stayed up (the server, or the way to it, is slow),
   * or sent on a connection that has since dropped.
   */
  private stage(sentOn: number): string {
    if (sentOn === -1) return `Nothing was sent: the session is ${this.current}, and the operation waited for it to connect.`;
    if (sentOn === this.connection) return `It was sent on a session that is ${this.current}, and the connection stayed up.`;
    return `It was sent, and the connection changed since (the session is ${this.current}).`;
  }

  /** Ends the session: its nodes go at once. */
  close(): void {
    this.closed = true;
    clearInterval(this.watchdog);
    for (const resume of [...this.resuming]) resume();
    this.live?.client.close();
    this.live = undefined;
  }

  error(what: string, keys: readonly string[], message: string, cause?: unknown, permanent = false): LockBackendError {
    const text = `${what}${keys.length ? ` of ${keys.join(', ')}` : ''} failed: ${message}`;
    return new LockBackendError(this.backendName, text, cause, { permanent });
  }

  private session(): Promise<LiveSession> {
    if (this.closed) return Promise.reject(this.error('operation', [], 'the backend is closed (the application shut down).'));
    // A session being made is handed out once connected, for the same reason as a suspended one.
    if (this.connecting) return this.connecting;
    if (this.live && this.current === 'connected') return Promise.resolve(this.live);
    if (this.live && this.current === 'suspended') return this.resumed();
    this.connecting = this.open().finally(() => (this.connecting = undefined));
    return this.connecting;
  }

  /**
   * The session once it is connected again (or a new one once it is lost): nothing is sent while
   * it is suspended. The client would queue it and, on reconnection, send it before its
   * credentials, and the server would refuse it as coming from nobody. Bounded by run()'s timeout.
   */
  private resumed(): Promise<LiveSession> {
    return new Promise<void>((resolve) => {
      const resume = (): void => {
        stop();
        this.resuming.delete(resume);
        resolve();
      };
      const stop = this.onState((state) => state !== 'suspended' && resume());
      this.resuming.add(resume);
    }).then(() => this.session());
  }

  private open(): Promise<LiveSession> {
    const client = this.newClient();
    const session: LiveSession = { client, generation: ++this.generation };
    return new Promise((resolve) => {
      client.connect((state) => {
        if (this.closed || this.generation !== session.generation) return;
        this.onClientState(session, state);
        if (state === 'connected') resolve(session);
      });
      // The old session's client goes once the new one is asked for; its nodes are gone or going.
      this.live?.client.close();
      this.live = session;
      this.watchdog ??= setInterval(() => this.checkSilence(), 100).unref();
    });
  }

  private onClientState(session: LiveSession, state: ZooKeeperClientState): void {
    this.connection++;
    if (state === 'connected') {
      this.heard();
      this.set('connected');
    } else if (state === 'disconnected') {
      this.set('suspended');
    } else {
      this.lose(session, 'ZooKeeper ended the session (it expired)');
    }
  }

  /**
   * The client has no read timeout: a connection that went silent is dropped here after two
   * thirds of the session timeout (as ZooKeeper's own clients do), so it connects to another
   * server in time; after a whole session timeout without an answer the session counts as lost,
   * as Curator declares it, and the next operation makes a new one.
   */
  private checkSilence(): void {
    const live = this.live;
    const timeout = live?.client.sessionTimeout;
    if (!live || !timeout || this.current === 'lost' || this.current === 'connecting') return;
    const silent = performance.now() - this.lastHeard;
    if (silent >= timeout) {
      this.lose(live, `nothing was heard from ZooKeeper for the session timeout (${timeout} ms)`);
    } else if (silent >= (timeout * 2) / 3 && this.current === 'connected') {
      live.client.reconnect();
    } else if (silent >= timeout / 3 && this.current === 'connected' && !this.pinging) {
      // A cheap read, answered by the server we are connected to, shows the connection works.
      this.pinging = true;
      this.run('ping', [], (s) => s.client.exists('/'))
        .catch(() => undefined)
        .finally(() => (this.pinging = false));
    } else if (this.current === 'connected') {
      this.nudgeIfLate(live);
    }
  }

  /**
   * A read on the session when a request sent on this connection is NUDGE_AFTER_MS late, and again
   * every NUDGE_AFTER_MS while one is: the read may itself reach the member before the commit it is
   * to wake up (the race of ZOOKEEPER-4537), and then only the next request frees both. Its answer
   * is not waited for, nor bounded: the late request's own timeout still decides.
   */
  private nudgeIfLate(live: LiveSession): void {
    const now = performance.now();
    if (now - this.nudgedAt < NUDGE_AFTER_MS) return;
    for (const sent of this.unanswered) {
      if (sent.on !== this.connection) {
        // Never worth a read on this connection, and a request the client queued on one that
        // dropped may never settle.
        this.unanswered.delete(sent);
        continue;
      }
      if (now - sent.sentAt < NUDGE_AFTER_MS) continue;
      this.nudgedAt = now;
      live.client.exists('/').then(
        () => this.live === live && this.heard(),
        () => undefined,
      );
      return;
    }
  }

  private lose(session: LiveSession, why: string): void {
    if (this.live !== session || this.current === 'lost') return;
    logger.warn(`ZooKeeper session lost: ${why}. Its locks are gone; a new session is made for the next operation.`);
    session.client.close();
    this.set('lost');
  }

  private heard(): void {
    this.lastHeard = performance.now();
  }

  private set(state: ZooKeeperSessionState): void {
    if (this.current === state) return;
    this.current = state;
    for (const listener of [...this.listeners]) listener(state);
  }
}
