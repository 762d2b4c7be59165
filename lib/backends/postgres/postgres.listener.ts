import { Logger } from '@nestjs/common';
import { randomBytes } from 'node:crypto';
import type { Client, Notification } from 'pg';
import type { PostgresConnection } from './postgres.connection.js';

const logger = new Logger('DistributedLock');

/** Messages sent and not heard before the backend concludes LISTEN delivers nothing here. */
const PROBES = 2;

/**
 * The backend's LISTEN connection: one per backend, on a channel of its own, so a release that
 * NOTIFYs it reaches this process and no other. LISTEN belongs to a session, so it needs a
 * connection that stays with us: not one of the pool's (it goes back to the pool), and not one
 * through a pooler in transaction mode (it goes back to the pooler after each transaction).
 *
 * Before it reports itself listening, it sends itself a message through the pool, as a release
 * would, and waits for it: a connection that delivers nothing (a pooler in transaction mode, or a
 * different server) is found then, and the backend falls back to polling with a warning.
 */
export class PostgresListener {
  /** The NOTIFY channel of this backend (a name of PostgreSQL's: at most 63 bytes). */
  readonly channel = `ndl_${randomBytes(8).toString('hex')}`;
  private client: Client | undefined;
  private connecting: Promise<void> | undefined;
  private listening = false;
  /** LISTEN delivered nothing, or is switched off: waiters poll. */
  private polling: boolean;
  private stopped = false;
  private readonly probes = new Map<string, () => void>();
  private reconnectTimer: NodeJS.Timeout | undefined;
  private reconnectAttempts = 0;
  /** The connection dropped while listening: messages sent until it is back are lost. */
  private missed = false;

  constructor(
    private readonly connection: PostgresConnection,
    private readonly timeoutMs: number,
    /** `listenConnection: false`: poll, and say nothing about it. */
    disabled: boolean,
    /** A message on our channel (the owner whose turn it is). */
    private readonly onMessage: (payload: string) => void,
    /** The connection was lost and is back: messages sent meanwhile may be lost. */
    private readonly onRecovered: () => void,
    /** Whether anyone waits, so a lost connection is worth making again now rather than on the next wait. */
    private readonly hasWaiters: () => boolean,
  ) {
    this.polling = disabled;
  }

  /** Messages on our channel reach this process now. */
  get active(): boolean {
    return this.listening && !this.stopped;
  }

  /** Resolves once messages on our channel reach us; rejects when they cannot (waiters then poll). */
  listen(): Promise<void> {
    if (this.stopped) return Promise.reject(new Error('the backend is closed'));
    if (this.polling) return Promise.reject(new Error('LISTEN is unavailable: waiters poll'));
    if (this.listening) return Promise.resolve();
    this.connecting ??= this.connect().finally(() => (this.connecting = undefined));
    return this.connecting;
  }

  async close(): Promise<void> {
    this.stopped = true;
    this.listening = false;
    clearTimeout(this.reconnectTimer);
    const client = this.client;
    this.client = undefined;
    await client?.end().catch(() => undefined);
  }

  private async connect(): Promise<void> {
    const client = this.connection.newListenClient();
    this.client = client;
    // Without a listener, a connection error would crash the process; 'end' follows it.
    client.on('error', () => undefined);
    client.on('end', () => this.lost(client));
    client.on('notification', (message: Notification) => {
      if (message.channel !== this.channel || message.payload === undefined) return;
      const probe = this.probes.get(message.payload);
      if (probe) probe();
      else this.onMessage(message.payload);
    });
    try {
      await this.within(client.connect(), 'connect');
      await this.within(client.query(`LISTEN "${this.channel}"`), 'LISTEN');
      if (this.stopped || this.client !== client) throw new Error('the backend is closed');
      // A connection that drops during the check says nothing about a pooler: it is made again, as
      // any dropped connection is, and checked again then.
      const dropped = new Promise<never>((_, reject) =>
        client.once('end', () => reject(new Error('the LISTEN connection dropped during its check: made again'))),
      );
      dropped.catch(() => undefined);
      if (!(await Promise.race([this.probe(), dropped]))) {
        this.polling = true;
        logger.warn(
          `PostgreSQL LISTEN delivered nothing on the connection it was given (a pooler in transaction mode, such as pgbouncer, ` +
            `or another server than the pool's?): waiters of this process poll every pollInterval from now on, instead of waking ` +
            `on release. Give PostgresLockBackend a direct connection for it: listenConnection: 'postgres://...' (or false to poll ` +
            `without this warning).`,
        );
        throw new Error('LISTEN delivered nothing: waiters poll');
      }
      this.listening = true;
      this.reconnectAttempts = 0;
      if (this.missed) {
        this.missed = false;
        this.onRecovered();
      }
    } catch (error) {
      if (this.client === client) this.client = undefined;
      await client.end().catch(() => undefined);
      // Not the pooler's verdict (the connection dropped, or PostgreSQL did not answer): a release
      // sent meanwhile may be lost, so waiters ask again once it is back.
      if (!this.polling && !this.stopped) this.missed = true;
      throw error;
    }
  }

  /**
   * Whether listening failed for a reason that making the connection again can heal (it dropped,
   * PostgreSQL did not answer), rather than LISTEN delivering nothing, or the backend closing.
   */
  get retrying(): boolean {
    return !this.polling && !this.stopped && !this.listening;
  }

  /** Makes the connection again in the background while anyone waits (see reconnect()). */
  retry(): void {
    if (this.reconnectTimer === undefined && this.connecting === undefined) this.reconnect();
  }

  /**
   * Sends a message to our channel through the pool, as a release does; true if it arrived. A pool
   * that is slow to answer says nothing about LISTEN: the wait for the message starts once the
   * NOTIFY was answered (committed), and a failure to send it rejects, which is no verdict. Only
   * a message sent and not heard, twice, says the connection delivers nothing.
   */
  private async probe(): Promise<boolean> {
    for (let attempt = 0; attempt < PROBES; attempt++) {
      if (await this.probeOnce()) return true;
    }
    return false;
  }

  private async probeOnce(): Promise<boolean> {
    const payload = `probe ${randomBytes(9).toString('base64url')}`;
    let timer: NodeJS.Timeout | undefined;
    // Listening before it is sent: the message may come before the NOTIFY's answer.
    const heard = new Promise<boolean>((resolve) => this.probes.set(payload, () => resolve(true)));
    try {
      await this.connection.run({ op: 'listen', keys: [], text: 'SELECT pg_notify($1, $2)', values: [this.channel, payload] });
      const late = new Promise<boolean>((resolve) => (timer = setTimeout(() => resolve(false), this.timeoutMs)));
      return await Promise.race([heard, late]);
    } finally {
      clearTimeout(timer);
      this.probes.delete(payload);
    }
  }

  /**
   * The connection dropped: until it is back, nobody hears releases. With waiters, it is made
   * again at once, without at the next wait; either way, once it is back, every waiter of this
   * process tries again, as a release meant for one of them may have been lost meanwhile.
   */
  private lost(client: Client): void {
    if (this.client !== client) return;
    this.client = undefined;
    if (!this.listening) return;
    this.listening = false;
    this.missed = true;
    if (!this.stopped) this.reconnect();
  }

  private reconnect(): void {
    if (this.stopped || this.polling || !this.hasWaiters()) return;
    const delay = Math.min(100 * ++this.reconnectAttempts, 1_000);
    this.reconnectTimer = setTimeout(() => {
      this.reconnectTimer = undefined;
      this.listen().catch(() => this.reconnect());
    }, delay);
  }

  private within<T>(promise: Promise<T>, what: string): Promise<T> {
    let timer: NodeJS.Timeout | undefined;
    const timeout = new Promise<never>((_, reject) => {
      timer = setTimeout(() => reject(new Error(`PostgreSQL did not answer ${what} within ${this.timeoutMs} ms`)), this.timeoutMs);
    });
    return Promise.race([promise, timeout]).finally(() => clearTimeout(timer));
  }
}
