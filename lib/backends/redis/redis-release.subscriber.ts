import { Logger } from '@nestjs/common';
import type { Cluster, Redis } from 'ioredis';
import { ACL_RULE_DOCS, isAclDenial } from './redis.acl.js';

const logger = new Logger('DistributedLock');

interface Channel {
  listeners: Set<(message: string) => void>;
  /** Resolves once Redis confirmed the subscription. */
  active: Promise<void>;
}

/**
 * One subscriber connection per backend, shared by every waiter of the process: each channel is
 * subscribed once, however many waiters watch it, and unsubscribed when the last one leaves.
 * (Clients in subscriber mode cannot send other commands, hence a connection of its own.)
 *
 * SUBSCRIBE and UNSUBSCRIBE go out in call order on that one connection, so an unsubscribe
 * followed by a new subscribe of the same channel always ends subscribed.
 */
export class RedisReleaseSubscriber {
  private readonly channels = new Map<string, Channel>();
  /** Created on the first watch. Every (un)subscribe chains on it, so they go out in call order. */
  private client: Promise<Redis | Cluster> | undefined;
  /** A refusal by ACL is said once: unlike a lost connection, it does not go away by itself. */
  private refusalLogged = false;

  constructor(
    private readonly connect: () => Promise<Redis | Cluster>,
    /** Sharded pub/sub (SSUBSCRIBE) on Cluster: a plain PUBLISH would go to every node. */
    private readonly sharded: boolean,
    private readonly timeoutMs: number,
  ) {}

  /**
   * Calls `onMessage` whenever one of `channels` gets a message. Resolves once every subscription
   * is active, to the function that stops it; rejects (subscribing nothing) if one fails.
   */
  async watch(channels: readonly string[], onMessage: (message: string) => void): Promise<() => void> {
    let watching = true;
    const stop = () => {
      if (!watching) return;
      watching = false;
      for (const channel of channels) this.remove(channel, onMessage);
    };
    try {
      await this.within(Promise.all(channels.map((channel) => this.add(channel, onMessage))));
    } catch (error) {
      stop();
      throw error;
    }
    return stop;
  }

  async close(): Promise<void> {
    this.channels.clear();
    const client = this.client;
    this.client = undefined;
    (await client?.catch(() => undefined))?.disconnect();
  }

  private add(name: string, listener: (message: string) => void): Promise<void> {
    let channel = this.channels.get(name);
    if (!channel) {
      const active = this.subscriber().then(async (client) => {
        await (this.sharded ? client.ssubscribe(name) : client.subscribe(name));
      });
      channel = { listeners: new Set(), active };
      this.channels.set(name, channel);
      const added = channel;
      active.catch((error: unknown) => {
        // A failed subscription must not stay cached as if active: the next watcher tries anew.
        if (this.channels.get(name) === added) this.channels.delete(name);
        if (isAclDenial(error)) this.logRefusal(name, error as Error);
      });
    }
    channel.listeners.add(listener);
    return channel.active;
  }

  private remove(name: string, listener: (message: string) => void): void {
    const channel = this.channels.get(name);
    if (!channel?.listeners.delete(listener) || channel.listeners.size > 0) return;
    this.channels.delete(name);
    this.client?.then((client) => (this.sharded ? client.sunsubscribe(name) : client.unsubscribe(name))).catch(() => undefined);
  }

  /** Locks still work, but waiters would wait for a poll: the operator should hear of it. */
  private logRefusal(channel: string, error: Error): void {
    if (this.refusalLogged) return;
    this.refusalLogged = true;
    const command = this.sharded ? 'SSUBSCRIBE' : 'SUBSCRIBE';
    logger.warn(
      `Redis refused ${command} ${channel}: ${error.message.replace(/\.+$/, '')}. Waiters of this process are not woken when a lock is ` +
        `released, and find out by polling (pollInterval) instead. Allow the Redis user ${command} on this channel: ${ACL_RULE_DOCS}.`,
    );
  }

  private subscriber(): Promise<Redis | Cluster> {
    this.client ??= this.connect().then((client) => {
      client.on(this.sharded ? 'smessage' : 'message', (channel: string, message: string) => {
        const listeners = this.channels.get(channel)?.listeners;
        if (listeners) for (const listener of [...listeners]) listener(message);
      });
      return client;
    });
    return this.client;
  }

  /** A subscription that Redis does not confirm in time fails: the waiter then polls instead. */
  private within<T>(promise: Promise<T>): Promise<T> {
    let timer: NodeJS.Timeout | undefined;
    const timeout = new Promise<never>((_, reject) => {
      timer = setTimeout(() => reject(new Error(`Redis did not confirm the subscription within ${this.timeoutMs} ms`)), this.timeoutMs);
    });
    return Promise.race([promise, timeout]).finally(() => clearTimeout(timer));
  }
}
