import 'reflect-metadata';
import { describe, expect, it, jest } from '@jest/globals';
import { Logger, Module } from '@nestjs/common';
import { Test } from '@nestjs/testing';
import { Redis } from 'ioredis';
import { RedisLockBackend } from '../../lib/backends/redis/redis.backend.js';
import {
  DistributedLockModule,
  InvalidLockKeyError,
  InvalidLockOptionsError,
  LockBackendError,
  LockLostError,
  LockService,
} from '../../lib/index.js';
import { useRedisServer } from '../support/redis-fixture.js';
import { RedisServer } from '../support/redis-server.js';
import { activeTimers, eventually, until } from '../support/wait.js';

const fixture = useRedisServer();

function backend(...args: Partial<ConstructorParameters<typeof RedisLockBackend>>): RedisLockBackend {
  const created = new RedisLockBackend(args[0] ?? fixture.server.url, args[1]);
  fixture.cleanup(() => created.close());
  return created;
}

function service(b = backend(), options: ConstructorParameters<typeof LockService>[1] = {}): LockService {
  const created = new LockService(b, options);
  fixture.cleanup(() => created.onApplicationShutdown());
  return created;
}

/** The commands a client sends (its round trips) while `work` runs. */
async function commandsDuring(client: Redis, work: () => Promise<unknown>): Promise<Record<string, number>> {
  const sent: Record<string, number> = {};
  const send = client.sendCommand.bind(client);
  const spy = jest.spyOn(client, 'sendCommand').mockImplementation((command, stream) => {
    sent[command.name] = (sent[command.name] ?? 0) + 1;
    return send(command, stream);
  });
  try {
    await work();
  } finally {
    spy.mockRestore();
  }
  return sent;
}

async function clientCount(): Promise<number> {
  return ((await fixture.admin.client('LIST')) as string).trim().split('\n').length;
}

describe('RedisLockBackend', () => {
  describe('construction', () => {
    it.each([
      ['nothing', undefined, /expected a connection, got undefined/],
      ['null', null, /expected a connection, got null/],
      ['a number', 6379, /expected a connection, got 6379/],
      ['an array', ['redis://x'], /got an array/],
      ['a string that is no URL', 'localhost:6379', /'localhost:6379' has no scheme: write it as 'redis:\/\/localhost:6379'/],
      ['an http URL', 'http://localhost:6379', /must start with redis:\/\/ or rediss:\/\/, got 'http:\/\/localhost:6379'/],
      ['a port out of range', { port: 70_000 }, /option 'port' must be an integer from 1 to 65535, got 70000/],
      ['an empty host', { host: '' }, /option 'host' must be a non-empty string/],
      ['Sentinel without a master name', { sentinels: [{ host: 'h', port: 26379 }] }, /Sentinel needs option 'name'/],
      ['empty cluster nodes', { clusterNodes: [] }, /clusterNodes must be a non-empty array/],
      ['some other class', new Map(), /instance of Map, which is not an ioredis client/],
    ])('refuses %s with a message that says what to pass', (_what, connection, message) => {
      const timers = activeTimers();
      const error = (() => {
        try {
          new RedisLockBackend(connection as never);
        } catch (e) {
          return e;
        }
      })();
      expect(error).toBeInstanceOf(InvalidLockOptionsError);
      expect((error as Error).message).toMatch(message);
      expect((error as Error).message).toMatch(/Pass an ioredis client \(new Redis\(\.\.\.\) or new Cluster\(\.\.\.\)\), a URL/);
      expect(activeTimers()).toBeLessThanOrEqual(timers);
    });

    it('refuses a closed client and bad backend options', async () => {
      const client = new Redis(fixture.server.port, '127.0.0.1', { lazyConnect: true });
      client.disconnect();
      expect(() => new RedisLockBackend(client)).toThrow(/the ioredis client given is closed/);
      expect(() => new RedisLockBackend(fixture.server.url, { commandTimeout: 0 })).toThrow(
        /option 'commandTimeout' must be a positive finite number of milliseconds, got 0/,
      );
      expect(() => new RedisLockBackend(fixture.server.url, { waitTimeout: 5 } as never)).toThrow(
        /unknown option 'waitTimeout'. Accepted options: commandTimeout, waiterTimeout/,
      );
    });

    it('leaves a client you passed open, and closes the ones it created', async () => {
      const yours = new Redis(fixture.server.port, '127.0.0.1');
      const locks = new LockService(new RedisLockBackend(yours));
      const handle = await locks.acquire('mine');
      await locks.onApplicationShutdown();
      // Shutdown released the lock, closed the backend's subscriber, and left your client alone.
      expect(await yours.exists('mine')).toBe(0);
      expect(yours.status).toBe('ready');
      expect(handle.isHeld).toBe(false);
      yours.disconnect();

      await until(async () => (await clientCount()) === 1, 5_000, 'only the admin connection');
      const created = new LockService(new RedisLockBackend(fixture.server.url));
      await created.acquire('ours', { wait: 0 }).then((h) => h.release());
      expect(await clientCount()).toBe(2);
      await created.onApplicationShutdown();
      await until(async () => (await clientCount()) === 1, 5_000, 'the created client to disconnect');
    });

    it('works through DistributedLockModule.forRootAsync with a client from a factory', async () => {
      const client = new Redis(fixture.server.port, '127.0.0.1');
      @Module({
        imports: [DistributedLockModule.forRootAsync({ useFactory: () => ({ backend: new RedisLockBackend(client), keyPrefix: 'app:' }) })],
      })
      class AppModule {}
      const app = await Test.createTestingModule({ imports: [AppModule] }).compile();
      await app.init();
      const locks = app.get(LockService);
      await locks.using('job', async (lock) => {
        expect(await client.get('app:job')).toBeTruthy();
        expect(lock.fencingToken).toBeGreaterThan(0);
      });
      await app.close();
      expect(client.status).toBe('ready');
      client.disconnect();
    });
  });

  describe('one round trip per operation', () => {
    it('acquire, extend, release and inspect are one script call each, EVALSHA once loaded', async () => {
      const client = new Redis(fixture.server.port, '127.0.0.1');
      const b = backend(client);
      await b.tryAcquire(['warm'], 'w', 1_000); // loads the script
      await b.release(['warm'], 'w');
      await b.extend(['warm'], 'w', 1_000);
      await b.inspect('warm');
      expect(await commandsDuring(client, () => b.tryAcquire(['a', 'b'], 'o', 5_000))).toEqual({ evalsha: 1 });
      expect(await commandsDuring(client, () => b.extend(['a', 'b'], 'o', 5_000))).toEqual({ evalsha: 1 });
      expect(await commandsDuring(client, () => b.inspect('a'))).toEqual({ evalsha: 1 });
      expect(await commandsDuring(client, () => b.release(['a', 'b'], 'o'))).toEqual({ evalsha: 1 });
      expect(await commandsDuring(client, () => b.tryAcquire(['a'], 'o2', 5_000).then(() => b.tryAcquire(['a'], 'o3', 5_000)))).toEqual({
        evalsha: 2,
      });
      client.disconnect();
    });

    /** The commands Redis ran, those of scripts included, while `work` runs. */
    async function callsInRedis(work: () => Promise<unknown>): Promise<Record<string, number>> {
      await fixture.admin.config('RESETSTAT');
      await work();
      const calls = Object.fromEntries(
        [...((await fixture.admin.info('commandstats')) as string).matchAll(/cmdstat_([\w|]+):calls=(\d+)/g)].map(([, name, n]) => [
          name,
          Number(n),
        ]),
      );
      delete calls['config|resetstat'];
      return calls;
    }

    it('takes a free key nobody waits for with five calls inside Redis: EXISTS, SET NX PX, TIME, SET ... GET for the token, SET of who holds it', async () => {
      const b = backend();
      await b.tryAcquire(['free'], 'warm', 1_000); // loads the script and starts the key's counter
      await b.release(['free'], 'warm');
      expect(await callsInRedis(async () => expect((await b.tryAcquire(['free'], 'o', 5_000)).acquired).toBe(true))).toEqual({
        evalsha: 1,
        exists: 1,
        set: 3,
        time: 1,
      });
    });

    it('releases a key nobody waits for in the short form: the lock and its line, the owner, three calls inside Redis', async () => {
      const client = new Redis(fixture.server.port, '127.0.0.1');
      const b = backend(client);
      await b.tryAcquire(['free'], 'warm', 1_000); // loads the scripts
      await b.release(['free'], 'warm');
      expect((await b.tryAcquire(['free'], 'o', 5_000)).acquired).toBe(true);
      const sent: unknown[][] = [];
      const send = client.sendCommand.bind(client);
      const spy = jest.spyOn(client, 'sendCommand').mockImplementation((command, stream) => {
        sent.push(command.args);
        return send(command, stream);
      });
      const calls = await callsInRedis(async () => expect(await b.release(['free'], 'o')).toBe(true));
      spy.mockRestore();
      expect(calls).toEqual({ evalsha: 1, exists: 1, get: 1, del: 1 });
      expect(sent.map((args) => args.slice(1).map(String))).toEqual([['2', 'free', '{free}:queue', 'o']]);
      expect(await fixture.admin.exists('free')).toBe(0);
      client.disconnect();
    });

    it('a release in the short form that finds someone in line sends the whole call, which hands the lock over', async () => {
      const client = new Redis(fixture.server.port, '127.0.0.1');
      const holder = backend(client);
      expect((await holder.tryAcquire(['joined'], 'holder', 60_000)).acquired).toBe(true); // nobody in line then
      expect((await backend().tryAcquire(['joined'], 'waiter', 60_000)).acquired).toBe(false); // joins the line
      expect(await commandsDuring(client, async () => expect(await holder.release(['joined'], 'holder')).toBe(true))).toEqual({
        evalsha: 2,
      });
      expect(await fixture.admin.get('joined')).toBe('waiter');
      expect(await fixture.admin.exists('{joined}:queue')).toBe(0);
      client.disconnect();
    });

    it('a caller that will not wait costs one round trip on a busy lock and leaves nothing in line', async () => {
      const held = await service().acquire('skip');
      const client = new Redis(fixture.server.port, '127.0.0.1');
      const skipping = service(backend(client));
      await (await skipping.tryAcquire('warm'))!.release(); // loads the script
      const sent = await commandsDuring(client, async () => {
        expect(await skipping.tryAcquire('skip')).toBeUndefined();
        expect(await skipping.using('skip', () => 'ran', { wait: 0, onBusy: 'skip' })).toBeUndefined();
      });
      expect(sent).toEqual({ evalsha: 2 });
      expect(await fixture.admin.exists('{lock:skip}:queue')).toBe(0);
      await held.release();
      client.disconnect();
    });

    it('reloads its scripts after Redis forgot them (NOSCRIPT)', async () => {
      const b = backend();
      expect((await b.tryAcquire(['k'], 'o', 5_000)).acquired).toBe(true);
      await fixture.admin.script('FLUSH');
      expect(await b.release(['k'], 'o')).toBe(true);
      expect((await b.tryAcquire(['k'], 'o2', 5_000)).acquired).toBe(true);
    });
  });

  describe('fencing tokens', () => {
    it('a multi-key token is greater than every earlier token of each key', async () => {
      const b = backend();
      const tokenOf = async (keys: string[]) => {
        const result = await b.tryAcquire(keys, 'o', 5_000);
        await b.release(keys, 'o');
        return result.acquired ? result.fencingToken! : Number.NaN;
      };
      const a1 = await tokenOf(['a']);
      let b1 = 0;
      for (let i = 0; i < 5; i++) b1 = await tokenOf(['b']);
      const both = await tokenOf(['a', 'b']);
      expect(both).toBeGreaterThan(a1);
      expect(both).toBeGreaterThan(b1);
      expect(await tokenOf(['a'])).toBeGreaterThan(both);
      expect(Number.isSafeInteger(both)).toBe(true);
    });

    it('stays ahead of a counter that is ahead of the clock', async () => {
      const b = backend();
      const far = 9_000_000_000_000_000; // above today's clock in µs, still a safe integer
      await fixture.admin.set('{k}:fence', String(far));
      const result = await b.tryAcquire(['k'], 'o', 5_000);
      expect(result).toEqual({ acquired: true, fencingToken: far + 1 });
      expect(await b.inspect('k')).toMatchObject({ owner: 'o', fencingToken: far + 1 });
    });

    it('a lock handed over on release stays ahead of a counter that is ahead of the clock', async () => {
      const b = backend();
      const far = 9_000_000_000_000_000;
      await fixture.admin.set('{h}:fence', String(far));
      expect(await b.tryAcquire(['h'], 'o', 5_000)).toEqual({ acquired: true, fencingToken: far + 1 });
      expect((await backend().tryAcquire(['h'], 'next', 5_000)).acquired).toBe(false);
      expect(await b.release(['h'], 'o')).toBe(true);
      expect(await b.inspect('h')).toMatchObject({ owner: 'next', fencingToken: far + 2 });
    });
  });

  describe('keys on Redis Cluster', () => {
    const fakeCluster = () => {
      const evalsha = jest.fn(async () => [1, 1]);
      return { client: { isCluster: true, status: 'ready', options: {}, evalsha, duplicate: () => undefined }, evalsha };
    };

    it('refuses keys in different slots with a message that says how to fix it, without waiting', async () => {
      const { client, evalsha } = fakeCluster();
      const locks = new LockService(new RedisLockBackend(client as never), { wait: 60_000 });
      const error = await locks.acquire(['order:1', 'order:2']).catch((e: unknown) => e);
      expect(error).toBeInstanceOf(InvalidLockKeyError);
      expect((error as Error).message).toMatch(/'lock:order:1' and 'lock:order:2' are in different slots/);
      expect((error as Error).message).toMatch(/common hash tag, e\.g\. 'order:\{42\}:payment'/);
      expect(evalsha).not.toHaveBeenCalled();
    });

    it('locks keys that share a hash tag together in one script', async () => {
      const { client, evalsha } = fakeCluster();
      const locks = new LockService(new RedisLockBackend(client as never));
      await locks.acquire(['order:{42}:payment', 'order:{42}:stock'], { autoExtend: false });
      expect(evalsha).toHaveBeenCalledTimes(1);
    });
  });

  describe('wake-ups', () => {
    async function subscriptions(): Promise<{ channels: string[]; subscribers: number }> {
      const channels = (await fixture.admin.pubsub('CHANNELS')) as string[];
      const clients = ((await fixture.admin.client('LIST')) as string).split('\n').filter((line) => /sub=[1-9]/.test(line));
      return { channels: channels.sort(), subscribers: clients.length };
    }

    it('hands the lock to the first waiter in line on release: it enters with a greater token and no round trip of its own', async () => {
      const waiterClient = new Redis(fixture.server.port, '127.0.0.1');
      const [watcher, holder] = [backend(waiterClient), backend()];
      const first = await holder.tryAcquire(['w'], 'h', 5_000);
      expect(first.acquired).toBe(true);
      // A failed attempt puts the waiter in line; watch resolves once releases can reach it.
      expect((await watcher.tryAcquire(['w'], 'waiter', 5_000)).acquired).toBe(false);
      let woken = 0;
      const stop = await watcher.watch(['w'], () => woken++, 'waiter');
      expect(await subscriptions()).toEqual({ channels: [expect.stringMatching(/^nest-distributed-lock:/)], subscribers: 1 });
      await holder.release(['w'], 'h');
      // Handed over inside the release script: Redis already names the waiter as holder.
      expect(await fixture.admin.get('w')).toBe('waiter');
      await until(() => woken === 1, 5_000, 'the release message');
      let granted;
      const sent = await commandsDuring(waiterClient, async () => (granted = await watcher.tryAcquire(['w'], 'waiter', 5_000)));
      expect(sent).toEqual({});
      expect(granted).toMatchObject({ acquired: true, fencingToken: expect.any(Number) });
      expect((granted as unknown as { fencingToken: number }).fencingToken).toBeGreaterThan(
        (first as { fencingToken: number }).fencingToken,
      );
      // Its lease is counted from before the hand-over, so it is a little shorter than the ttl.
      expect((granted as unknown as { validityMs: number }).validityMs).toBeLessThanOrEqual(5_000);
      expect(await watcher.extend(['w'], 'waiter', 5_000)).toEqual({ extended: true });
      stop();
      expect(await watcher.release(['w'], 'waiter')).toBe(true);
      waiterClient.disconnect();
    });

    it('on a key others wait for, tells the next holder before it answers the release', async () => {
      const clients = [new Redis(fixture.server.port, '127.0.0.1'), new Redis(fixture.server.port, '127.0.0.1')];
      const [first, x, y] = [backend(), backend(clients[0]), backend(clients[1])];
      const heard: string[] = [];
      const stops = await Promise.all([x.watch(['o'], () => heard.push('x told'), 'x'), y.watch(['o'], () => heard.push('y told'), 'y')]);
      expect((await first.tryAcquire(['o'], 'a', 5_000)).acquired).toBe(true);
      expect((await x.tryAcquire(['o'], 'x', 5_000)).acquired).toBe(false);
      await first.release(['o'], 'a');
      await until(() => heard.length === 1, 5_000, 'the hand-over to x');
      // x and y take turns, each taking the lock from the line: every release is the contended kind.
      let [holder, next] = [
        { b: x, name: 'x', client: clients[0] },
        { b: y, name: 'y', client: clients[1] },
      ];
      for (let round = 0; round < 5; round++) {
        heard.length = 0;
        expect(await holder.b.tryAcquire(['o'], holder.name, 5_000)).toMatchObject({ acquired: true });
        expect((await next.b.tryAcquire(['o'], next.name, 5_000)).acquired).toBe(false);
        await holder.b.release(['o'], holder.name);
        heard.push(`${holder.name} answered`);
        // Both connections are in this process: the one Redis wrote to first was handled first.
        expect(heard).toEqual([`${next.name} told`, `${holder.name} answered`]);
        [holder, next] = [next, holder];
      }
      // With the next waiter in the same backend, that waiter's own attempt is what it waits for
      // (LockService sends it right behind the release): no PING.
      expect(await holder.b.tryAcquire(['o'], holder.name, 5_000)).toMatchObject({ acquired: true });
      expect((await holder.b.tryAcquire(['o'], 'same', 5_000)).acquired).toBe(false);
      expect(await commandsDuring(holder.client, () => holder.b.release(['o'], holder.name))).toEqual({ evalsha: 1 });
      for (const stop of stops) stop();
      for (const client of clients) client.disconnect();
    });

    it('after its subscriber reconnects, wakes every waiter of the process: a release in the gap is not lost', async () => {
      // No poll for a minute: only a wake-up can let the waiter in within the test.
      const waiting = service(backend(fixture.server.url, { waiterTimeout: 120_000 }), { keyPrefix: '', pollInterval: 60_000 });
      const holder = service(backend(), { keyPrefix: '' });
      const first = await holder.acquire('gap', { ttl: 10_000 });
      const second = waiting.acquire('gap', { ttl: 10_000, wait: 20_000 });
      await until(
        async () => (await fixture.admin.zcard('{gap}:queue')) === 1 && ((await fixture.admin.pubsub('CHANNELS')) as string[]).length === 1,
        5_000,
        'the waiter to join the line and listen',
      );
      expect(waiting.backend.watching?.(['gap'])).toBe(true);
      await fixture.admin.client('KILL', 'TYPE', 'pubsub');
      // ioredis waits at least 50 ms before it reconnects: this hand-over's message reaches nobody.
      await first.release();
      expect(await fixture.admin.exists('gap')).toBe(1); // handed to the waiter, which has not heard of it
      let timer: NodeJS.Timeout | undefined;
      const tooLate = new Promise(
        (_, reject) => (timer = setTimeout(() => reject(new Error('the waiter was not woken after the reconnection')), 5_000)),
      );
      const handle = (await Promise.race([second, tooLate]).finally(() => clearTimeout(timer))) as Awaited<typeof second>;
      expect(handle.fencingToken).toBeGreaterThan(first.fencingToken!);
      expect(waiting.backend.watching?.(['gap'])).toBe(true);
      await handle.release();
    });

    it('hands a waiter that died in line the lock for at most waiterTimeout, not its whole ttl', async () => {
      const [holder, dead] = [backend(fixture.server.url, { waiterTimeout: 400 }), backend(fixture.server.url, { waiterTimeout: 400 })];
      expect((await holder.tryAcquire(['gone'], 'h', 60_000)).acquired).toBe(true);
      // It joins the line asking for a 60 s lease, then never asks again.
      expect((await dead.tryAcquire(['gone'], 'dead', 60_000)).acquired).toBe(false);
      await holder.release(['gone'], 'h');
      expect(await fixture.admin.get('gone')).toBe('dead');
      expect(await fixture.admin.pttl('gone')).toBeLessThanOrEqual(400);
      const next = service(backend(fixture.server.url, { waiterTimeout: 400 }), { pollInterval: 100 });
      const started = Date.now();
      const handle = await next.acquire('gone', { wait: 5_000 });
      expect(Date.now() - started).toBeLessThan(3_000);
      await handle.release();
    });

    it('extends a handed-over lease, shorter than the ttl, before it runs out', async () => {
      // The holder's backend caps the lease it hands over at its waiterTimeout.
      // No poll, and a backend that listens already: the waiter makes one attempt, then only the
      // hand-over can let it in (no later attempt of its own can race the release).
      const [holder, waiting] = [
        service(backend(fixture.server.url, { waiterTimeout: 300 }), { keyPrefix: '', pollInterval: 100 }),
        service(backend(fixture.server.url, { waiterTimeout: 120_000 }), { keyPrefix: '', pollInterval: 60_000 }),
      ];
      (await waiting.backend.watch!(['warm-up'], () => undefined, 'warm-up'))();
      expect(waiting.backend.watching?.(['short'])).toBe(true);
      const results: unknown[] = [];
      const tryAcquire = waiting.backend.tryAcquire.bind(waiting.backend);
      jest.spyOn(waiting.backend, 'tryAcquire').mockImplementation(async (...args) => {
        const result = await tryAcquire(...args);
        results.push(result);
        return result;
      });
      const first = await holder.acquire('short', { ttl: 5_000 });
      const second = waiting.acquire('short', { ttl: 5_000, wait: 5_000 });
      await until(async () => (await fixture.admin.zcard('{short}:queue')) === 1, 5_000, 'the waiter to join the line');
      await first.release();
      const handle = await second;
      // Handed over with a 300 ms lease (counted from its last attempt): the watchdog extends it
      // to the 5 s ttl after a third of what is left.
      expect(results.at(-1)).toEqual({ acquired: true, fencingToken: expect.any(Number), validityMs: expect.any(Number) });
      expect((results.at(-1) as { fencingToken: number }).fencingToken).toBeGreaterThan(first.fencingToken!);
      expect((results.at(-1) as { validityMs: number }).validityMs).toBeLessThanOrEqual(300);
      await until(async () => (await fixture.admin.pttl('short')) > 1_000, 2_000, 'the lease to be extended to the ttl');
      await new Promise((resolve) => setTimeout(resolve, 400)); // past the handed-over lease
      expect(handle.isHeld).toBe(true);
      expect((await waiting.inspect('short'))?.heldHere).toBe(true);
      await handle.release();
    });

    it('wakes a waiter for several keys, which then takes them itself', async () => {
      const [watcher, holder] = [backend(), backend()];
      expect((await holder.tryAcquire(['m1'], 'h', 5_000)).acquired).toBe(true);
      expect((await watcher.tryAcquire(['m1', 'm2'], 'waiter', 5_000)).acquired).toBe(false);
      let woken = 0;
      const stop = await watcher.watch(['m1', 'm2'], () => woken++, 'waiter');
      await holder.release(['m1'], 'h');
      await until(() => woken === 1, 5_000, 'the release message');
      // Not handed over: the other key may be busy, and a lock is all or nothing.
      expect(await fixture.admin.exists('m1')).toBe(0);
      expect(await watcher.tryAcquire(['m1', 'm2'], 'waiter', 5_000)).toMatchObject({ acquired: true });
      stop();
    });

    it('shares one subscriber connection and one channel between all waiters of a process', async () => {
      const [holder, waiting] = [service(), service()];
      const held = await Promise.all(['k1', 'k2', 'k3'].map((key) => holder.acquire(key)));
      await fixture.admin.config('RESETSTAT');
      // Settled into values, so a failing assertion below cannot leave rejections to later suites.
      const waiters = Array.from({ length: 12 }, (_, i) =>
        waiting.using(`k${(i % 3) + 1}`, () => 'ran', { wait: 20_000 }).catch((error: unknown) => error),
      );
      await until(
        async () =>
          (await fixture.admin.zcard('{lock:k1}:queue')) +
            (await fixture.admin.zcard('{lock:k2}:queue')) +
            (await fixture.admin.zcard('{lock:k3}:queue')) ===
          12,
        15_000,
        'the waiters to line up',
      );
      // A waiter is in line once its attempt answered; its SUBSCRIBE may still be on its way.
      await eventually(
        async () => expect(await subscriptions()).toEqual({ channels: [expect.stringMatching(/^nest-distributed-lock:/)], subscribers: 1 }),
        10_000,
      );
      await Promise.all(held.map((h) => h.release()));
      expect(await Promise.all(waiters)).toEqual(Array(12).fill('ran'));
      // One SUBSCRIBE for twelve waits, and the channel stays for the next ones.
      expect(await fixture.admin.info('commandstats')).toMatch(/cmdstat_subscribe:calls=1,/);
      expect(await fixture.admin.info('commandstats')).not.toMatch(/cmdstat_unsubscribe/);
    });

    it('serves processes in arrival order: one that releases and re-acquires at once does not starve another', async () => {
      const [busy, other] = [service(), service()];
      const order: string[] = [];
      const first = await busy.acquire('hot');
      // The busy process has callers of its own: five, three sections each. They all ask Redis
      // once, then line up locally; every section ends with the caller asking again at once.
      const busyCallers = Array.from({ length: 5 }, () =>
        (async () => {
          for (let i = 0; i < 3; i++) await busy.using('hot', async () => void order.push('busy'), { wait: 20_000 });
        })(),
      );
      await until(async () => (await fixture.admin.zcard('{lock:hot}:queue')) === 5, 5_000, 'the busy callers to join the line');
      const otherCaller = other.using('hot', async () => void order.push('other'), { wait: 20_000 });
      await until(async () => (await fixture.admin.zcard('{lock:hot}:queue')) === 6, 5_000, 'the other process to join the line');
      await first.release();
      await Promise.all([...busyCallers, otherCaller]);
      // In arrival order: the five busy callers that came first, then the other process. Without a
      // line in Redis the busy process's next caller always wins (its acquire goes out right
      // behind its release), and the other process comes last, after all 15 sections.
      expect(order.indexOf('other')).toBe(5);
      expect(order).toHaveLength(16);
    });

    it('a waiter that gives up leaves the line at once', async () => {
      const [holder, quitter, next] = [service(), service(), service()];
      const held = await holder.acquire('line');
      await expect(quitter.acquire('line', { wait: 100 })).rejects.toThrow(/not acquired/);
      await until(async () => (await fixture.admin.zcard('{lock:line}:queue')) === 0, 5_000, 'the quitter to leave the line');
      await held.release();
      // With the quitter still first in line this would wait for its waiterTimeout.
      const handle = await next.acquire('line', { wait: 0 });
      expect(handle.isHeld).toBe(true);
    });
  });

  describe('watchdog', () => {
    it('fires the signal with LockLostError and logs through Nest Logger when the key is gone', async () => {
      const warn = jest.spyOn(Logger.prototype, 'warn').mockImplementation(() => undefined);
      try {
        const locks = service();
        const handle = await locks.acquire('vanish', { ttl: 600 });
        await fixture.admin.del('lock:vanish');
        const reason = await new Promise<unknown>((resolve) =>
          handle.signal.addEventListener('abort', () => resolve(handle.signal.reason)),
        );
        expect(reason).toBeInstanceOf(LockLostError);
        expect((reason as LockLostError).reason).toBe('taken');
        expect(warn).toHaveBeenCalledWith(expect.stringMatching(/Lock lost on lock:vanish: the backend no longer has this owner/));
      } finally {
        warn.mockRestore();
      }
    });
  });

  describe('failures', () => {
    it('reports an unreachable Redis as LockBackendError within the wait, saying why', async () => {
      const warn = jest.spyOn(Logger.prototype, 'warn').mockImplementation(() => undefined);
      try {
        const dead = await RedisServer.start();
        const port = dead.port;
        await dead.stop();
        const locks = service(backend(`redis://127.0.0.1:${port}`));
        const started = Date.now();
        const error = await locks.acquire('k', { wait: 500 }).catch((e: unknown) => e);
        expect(error).toBeInstanceOf(LockBackendError);
        expect((error as Error).message).toMatch(
          new RegExp(`Lock backend 'redis' failed: acquire of lock:k failed: .*Redis at 127.0.0.1:${port} refused the connection`),
        );
        expect(Date.now() - started).toBeLessThan(5_000);
        expect(warn).toHaveBeenCalledWith(expect.stringMatching(new RegExp(`Redis at 127.0.0.1:${port} refused the connection`)));
      } finally {
        warn.mockRestore();
      }
    });
  });
});
