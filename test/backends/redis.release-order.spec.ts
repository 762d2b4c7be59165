import 'reflect-metadata';
import { afterEach, describe, expect, it } from '@jest/globals';
import { Injectable } from '@nestjs/common';
import { Test } from '@nestjs/testing';
import { setTimeout as sleep } from 'node:timers/promises';
import { DistributedLockModule, LockNotAcquiredError, LockService, Locked, RedisLockBackend } from '../../lib/index.js';
import { useRedisServer } from '../support/redis-fixture.js';

// @Locked and using() return before Redis answers their release: the caller's next call must
// still find the lock free (same process, one connection: the release goes out first), even when
// Redis is slow to answer both.

const fixture = useRedisServer();
const closing: (() => Promise<unknown>)[] = [];
afterEach(async () => {
  for (const close of closing.splice(0)) await close();
});

@Injectable()
class Counter {
  tokens: (number | undefined)[] = [];
  constructor(private readonly locks: LockService) {}

  /** Never waits: a lock still held by the previous call would make it throw LockNotAcquiredError. */
  @Locked('counter:<id>', { wait: 0 })
  async bump(id: string): Promise<void> {
    this.tokens.push(this.locks.current()?.fencingToken);
  }

  @Locked('counter:<id>', { wait: 0 })
  async bumpThen(id: string, inside: () => void): Promise<void> {
    this.tokens.push(this.locks.current()?.fencingToken);
    inside();
  }
}

async function counterApp(): Promise<{ counter: Counter; locks: LockService }> {
  const moduleRef = await Test.createTestingModule({
    imports: [DistributedLockModule.forRoot({ backend: new RedisLockBackend(fixture.server.url) })],
    providers: [Counter],
  }).compile();
  const app = await moduleRef.init();
  closing.push(() => app.close());
  return { counter: app.get(Counter), locks: app.get(LockService) };
}

describe('a release not awaited by @Locked and using()', () => {
  it('is done before the next call of the same process: 300 calls in a row, none finds the lock held', async () => {
    const { counter, locks } = await counterApp();
    for (let i = 0; i < 300; i++) {
      await counter.bump('1');
      // What the process asks next goes out behind the release.
      if (i % 50 === 0) expect(await locks.isLocked('counter:1')).toBe(false);
    }
    expect(counter.tokens).toHaveLength(300);
    for (let i = 1; i < counter.tokens.length; i++) expect(counter.tokens[i]!).toBeGreaterThan(counter.tokens[i - 1]!);
  });

  it('stays ordered while Redis is paused: a release queued behind the pause runs before the next acquire', async () => {
    const { counter } = await counterApp();
    try {
      // The method returns while its release waits for Redis; the next call's acquire queues behind it.
      await counter.bumpThen('2', () => fixture.server.pause());
      const next = counter.bump('2');
      await sleep(100);
      fixture.server.resume();
      await next;
      // Two calls sent before either was answered: the second finds the first's lock and is refused, never a second holder.
      const [, second] = await Promise.all([counter.bump('2'), counter.bump('2').catch((error: unknown) => error)]);
      expect(second).toBeInstanceOf(LockNotAcquiredError);
    } finally {
      fixture.server.resume();
    }
    for (let i = 0; i < 50; i++) await counter.bump('2');
    const tokens = counter.tokens;
    expect(tokens).toHaveLength(53);
    for (let i = 1; i < tokens.length; i++) expect(tokens[i]!).toBeGreaterThan(tokens[i - 1]!);
  });

  it('under concurrency on many keys, with sequential calls per key: none is refused', async () => {
    const { counter } = await counterApp();
    await Promise.all(
      Array.from({ length: 20 }, async (_, key) => {
        for (let i = 0; i < 30; i++) await counter.bump(`many:${key}`);
      }),
    );
    expect(counter.tokens).toHaveLength(600);
  });
});
