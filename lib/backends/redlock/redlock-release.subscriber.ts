import { performance } from 'node:perf_hooks';
import { Logger } from '@nestjs/common';
import { ACL_RULE_DOCS, isAclDenial } from '../redis/redis.acl.js';
import { dropConnection, type RedlockMaster, type RedlockSubscriberClient } from './redlock-master.js';

const logger = new Logger('DistributedLock');

/**
 * Release notifications from every master, for every waiter of one backend: one subscriber
 * connection per master, one SUBSCRIBE per watched key (counted, unsubscribed when its last
 * waiter leaves).
 *
 * A release deletes the key on at least a quorum of masters and publishes on each of them, and a
 * watch counts as live once a quorum of masters confirmed its subscription: two quorums share a
 * master, so at least one copy of the message reaches us. The other copies carry the same owner
 * token and are dropped, so a release wakes a waiter once, not once per master: unless the
 * waiter's attempt after the first copy was refused by that master (see `attemptFailed`). A
 * releaser far from most masters reaches the near one first; a waiter that heard it tries while
 * the far ones still hold the key, and their copies are the news it waits for.
 */
export class RedlockReleaseSubscriber {
  private readonly connections: (RedlockSubscriberClient | undefined)[];
  private readonly channels = new Map<string, Channel>();
  /** Per master: channels whose SUBSCRIBE failed, asked again when its connection is back. */
  private readonly renewals: Set<Channel>[];
  private closed = false;
  /** A refusal by ACL is said once: unlike a master that is down, it does not go away by itself. */
  private refusalLogged = false;

  constructor(
    private readonly masters: readonly RedlockMaster[],
    private readonly quorum: number,
    private readonly timeoutMs: number,
  ) {
    this.connections = masters.map(() => undefined);
    this.renewals = masters.map(() => new Set());
  }

  /** Resolves when a quorum of masters confirmed, or after the timeout (the waiter then polls). */
  async watch(channelNames: readonly string[], onRelease: () => void): Promise<() => void> {
    if (this.closed) return () => undefined;
    const watched = channelNames.map((name) => this.join(name, onRelease));
    let stopped = false;
    const stop = () => {
      if (stopped) return;
      stopped = true;
      for (const channel of watched) this.leave(channel, onRelease);
    };
    await this.confirmed(watched);
    return stop;
  }

  /**
   * An attempt on these channels' keys, sent at `sentAt` (performance.now()), was refused by
   * `refused`. A master that announced a release since the attempt went out may have refused it
   * before that release reached it: the waiters are woken now to try again. The others are
   * waited on: their next copy of a release wakes the waiters even if it repeats one heard.
   */
  attemptFailed(channelNames: readonly string[], sentAt: number, refused: readonly RedlockMaster[]): void {
    const indices = refused.map((master) => this.masters.indexOf(master));
    for (const name of channelNames) {
      const channel = this.channels.get(name);
      if (!channel) continue;
      if (indices.some((i) => (channel.heardAt[i] ?? Number.NEGATIVE_INFINITY) >= sentAt)) {
        this.wake(channel);
        continue;
      }
      for (const i of indices) channel.waitingOn.add(i);
    }
  }

  async close(): Promise<void> {
    this.closed = true;
    this.channels.clear();
    for (const connection of this.connections) if (connection) dropConnection(connection);
    this.connections.fill(undefined);
  }

  private join(name: string, onRelease: () => void): Channel {
    let channel = this.channels.get(name);
    if (!channel) {
      channel = { name, listeners: new Set(), lastOwner: undefined, subscribed: [], heardAt: [], waitingOn: new Set() };
      this.channels.set(name, channel);
      for (const i of this.masters.keys()) this.subscribe(channel, i);
    }
    channel.listeners.add(onRelease);
    return channel;
  }

  /**
   * ioredis renews on reconnect only the subscriptions a server confirmed: one rejected while the
   * master was down is asked again here when the connection is back, as long as it is watched.
   */
  private subscribe(channel: Channel, i: number): void {
    const connection = this.connection(i);
    channel.subscribed[i] = connection.subscribe(channel.name).then(
      () => true,
      (error: unknown) => {
        if (isAclDenial(error)) this.logRefusal(channel.name, i, error as Error);
        if (!this.live(channel)) return false;
        const renew = this.renewals[i];
        // One listener per connection, whatever the number of channels to renew.
        if (renew.size === 0) {
          connection.once?.('ready', () => {
            const channels = [...renew];
            renew.clear();
            for (const pending of channels) if (this.live(pending)) this.subscribe(pending, i);
          });
        }
        renew.add(channel);
        return false;
      },
    );
  }

  /** Locks still work, but waiters would wait for a poll: the operator should hear of it. */
  private logRefusal(channel: string, i: number, error: Error): void {
    if (this.refusalLogged) return;
    this.refusalLogged = true;
    logger.warn(
      `RedlockLockBackend: master ${this.masters[i].name} refused SUBSCRIBE ${channel}: ${error.message.replace(/\.+$/, '')}. ` +
        `Waiters of this process are not woken when a lock is released, and find out by polling (pollInterval) instead. ` +
        `Allow the Redis user SUBSCRIBE and UNSUBSCRIBE on the release channels: ${ACL_RULE_DOCS}.`,
    );
  }

  private live(channel: Channel): boolean {
    return !this.closed && this.channels.get(channel.name) === channel;
  }

  private leave(channel: Channel, onRelease: () => void): void {
    channel.listeners.delete(onRelease);
    if (channel.listeners.size > 0 || this.channels.get(channel.name) !== channel) return;
    this.channels.delete(channel.name);
    for (const connection of this.connections) connection?.unsubscribe(channel.name).catch(() => undefined);
  }

  private confirmed(watched: readonly Channel[]): Promise<void> {
    return new Promise((resolve) => {
      let yes = 0;
      let settled = 0;
      const done = () => {
        clearTimeout(timer);
        resolve();
      };
      const timer = setTimeout(done, this.timeoutMs);
      timer.unref();
      this.masters.forEach((_, i) => {
        void Promise.all(watched.map((channel) => channel.subscribed[i])).then((results) => {
          settled++;
          if (results.every(Boolean)) yes++;
          if (yes >= this.quorum || settled === this.masters.length) done();
        });
      });
    });
  }

  private connection(i: number): RedlockSubscriberClient {
    let connection = this.connections[i];
    if (!connection) {
      connection = this.masters[i].client.duplicate();
      // Its errors show up as failed subscriptions and as polling; ioredis reconnects and
      // resubscribes by itself.
      connection.on('error', () => undefined);
      connection.on('message', (name, owner) => this.dispatch(i, name, owner));
      this.connections[i] = connection;
    }
    return connection;
  }

  /** A copy of a release from master `i`. */
  private dispatch(i: number, name: string, owner: string): void {
    const channel = this.channels.get(name);
    if (!channel) return;
    channel.heardAt[i] = performance.now();
    if (channel.lastOwner === owner && !channel.waitingOn.has(i)) return;
    channel.lastOwner = owner;
    this.wake(channel);
  }

  private wake(channel: Channel): void {
    // The attempt this wakes tells anew which masters refused it.
    channel.waitingOn.clear();
    for (const onRelease of [...channel.listeners]) onRelease();
  }
}

interface Channel {
  name: string;
  listeners: Set<() => void>;
  /** Owner token of the last release announced here: the same release arrives once per master. */
  lastOwner: string | undefined;
  /** Per master: whether SUBSCRIBE was confirmed. */
  subscribed: Promise<boolean>[];
  /** Per master: when its last release message came (performance.now()). */
  heardAt: number[];
  /** Masters that refused the last failed attempt and have announced no release since. */
  waitingOn: Set<number>;
}
