import 'reflect-metadata';
import { afterEach, describe, expect, it } from '@jest/globals';
import { Injectable, Module } from '@nestjs/common';
import { Test, type TestingModule } from '@nestjs/testing';
import {
  DistributedLockError,
  DistributedLockModule,
  InvalidLockKeyError,
  InvalidLockOptionsError,
  LockService,
  Locked,
  MemoryLockBackend,
  RedisLockBackend,
} from '../lib/index.js';
import { resolveRedlockOptions } from '../lib/backends/redlock/redlock.options.js';
import { activeTimers } from './support/wait.js';

const backend = new MemoryLockBackend();

@Injectable()
class Orders {
  @Locked('order:<id>')
  async pay(id: unknown) {
    return id;
  }

  @Locked('cart:<dto.owner.id>')
  async checkout(dto: unknown) {
    return dto;
  }

  @Locked(() => '')
  async emptyFromFunction() {
    return 'ran';
  }
}

@Module({ imports: [DistributedLockModule.forRoot({ backend, maxKeyLength: 40 })], providers: [Orders] })
class AppModule {}

async function boot(module: unknown): Promise<TestingModule> {
  const moduleRef = await Test.createTestingModule({ imports: [module as never] }).compile();
  await moduleRef.init();
  return moduleRef;
}

/** Every bad input must leave nothing behind: no lease, no timer. */
async function expectNothingLeft(locks: LockService, timersBefore: number) {
  for (const key of ['order:undefined', 'order:null', 'order:', 'order:[object Object]', 'cart:undefined']) {
    expect(await locks.isLocked(key)).toBe(false);
  }
  expect(activeTimers()).toBeLessThanOrEqual(timersBefore);
}

describe('bad input', () => {
  let moduleRef: TestingModule | undefined;
  afterEach(async () => {
    await moduleRef?.close();
    moduleRef = undefined;
  });

  describe('keys at call time', () => {
    const cases: [string, (orders: Orders) => Promise<unknown>, RegExp][] = [
      ['undefined', (o) => o.pay(undefined), /<id> in template 'order:<id>' on Orders\.pay resolved to undefined/],
      ['null', (o) => o.pay(null), /resolved to null/],
      ['an object', (o) => o.pay({ id: 1 }), /resolved to an object/],
      ["''", (o) => o.pay(''), /resolved to an empty string/],
      ['NaN', (o) => o.pay(Number.NaN), /resolved to NaN/],
      ['a missing path', (o) => o.checkout({ owner: {} }), /<dto\.owner\.id> .* resolved to undefined/],
      ['a path through null', (o) => o.checkout(null), /resolved to undefined/],
      [
        'an empty key from a function',
        (o) => o.emptyFromFunction(),
        /key function of @Locked on Orders\.emptyFromFunction resolved to an empty string/,
      ],
      ['a key over maxKeyLength', (o) => o.pay('x'.repeat(40)), /over maxKeyLength 40/],
      ['a boolean', (o) => o.pay(true), /resolved to boolean true/],
      // A line break would forge a log line where the key is printed; the message shows it escaped.
      ['a line break', (o) => o.pay('1\r\nWARN forged'), /"lock:order:1\\r\\nWARN forged" contains a control character/],
      ['a lone surrogate', (o) => o.pay('\ud800'), /"lock:order:\\ud800" is not well-formed Unicode/],
    ];
    for (const [what, call, message] of cases) {
      it(`refuses a placeholder that resolves to ${what}`, async () => {
        moduleRef = await boot(AppModule);
        const locks = moduleRef.get(LockService);
        const timers = activeTimers();
        const error = await call(moduleRef.get(Orders)).catch((e: unknown) => e);
        expect(error).toBeInstanceOf(InvalidLockKeyError);
        expect(error).toBeInstanceOf(DistributedLockError);
        expect((error as Error).message).toMatch(message);
        expect((error as Error).message).toMatch(/check that the argument|maxKeyLength|control character|well-formed/);
        expect((error as Error).message).not.toMatch(/[\r\n]/);
        await expectNothingLeft(locks, timers);
      });
    }
  });

  describe('LockService arguments', () => {
    const service = () => new LockService(new MemoryLockBackend());
    it.each([
      ['an empty key', (s: LockService) => s.acquire(''), InvalidLockKeyError, /non-empty string/],
      ['an empty key list', (s: LockService) => s.acquire([]), InvalidLockKeyError, /non-empty array/],
      // Keys several at once share a local queue named by the keys joined with a line break.
      ['a key with a line break', (s: LockService) => s.acquire(['a\nb']), InvalidLockKeyError, /contains a control character/],
      ['a lone surrogate', (s: LockService) => s.acquire('\udc00'), InvalidLockKeyError, /not well-formed Unicode/],
      [
        'ttl 0',
        (s: LockService) => s.acquire('k', { ttl: 0 }),
        InvalidLockOptionsError,
        /'ttl' must be a positive finite number of milliseconds, got 0/,
      ],
      ['a negative ttl', (s: LockService) => s.acquire('k', { ttl: -5 }), InvalidLockOptionsError, /'ttl' .* got -5/],
      ['a NaN ttl', (s: LockService) => s.acquire('k', { ttl: Number.NaN }), InvalidLockOptionsError, /'ttl' .* got NaN/],
      ['an infinite ttl', (s: LockService) => s.acquire('k', { ttl: Infinity }), InvalidLockOptionsError, /'ttl' .* got Infinity/],
      [
        'a negative wait',
        (s: LockService) => s.acquire('k', { wait: -1 }),
        InvalidLockOptionsError,
        /'wait' must be 0 \(try once\) or a positive/,
      ],
      [
        'an unknown option',
        (s: LockService) => s.acquire('k', { tll: 5 } as never),
        InvalidLockOptionsError,
        /unknown option 'tll'. Accepted options: ttl, wait, autoExtend/,
      ],
      [
        'a bad onBusy',
        (s: LockService) => s.using('k', () => 1, { onBusy: 'wait' as never }),
        InvalidLockOptionsError,
        /'onBusy' must be 'throw' or 'skip'/,
      ],
    ])('refuses %s, holding nothing', async (_what, call, type, message) => {
      const locks = service();
      const error = await call(locks).catch((e: unknown) => e);
      expect(error).toBeInstanceOf(type);
      expect((error as Error).message).toMatch(message);
      expect(await locks.isLocked('k')).toBe(false);
    });
  });

  describe('at start-up', () => {
    it.each([
      [{ ttl: 0 }, /option 'ttl' must be a positive finite number/],
      [{ wait: -1 }, /option 'wait' must be 0 \(try once\)/],
      [{ keyPrefix: 3 }, /option 'keyPrefix' must be a string/],
      [{ backend: {} }, /option 'backend' must be an object implementing LockBackend/],
      [{ maxKeyLength: 1.5 }, /option 'maxKeyLength' must be a positive integer/],
      [
        { wait: 1e20 },
        /option 'wait' must be 0 \(try once\) or a positive finite number of milliseconds, got 100000000000000000000\. At most 2147483647/,
      ],
      [{ ttl: 1e20 }, /option 'ttl' must be a positive finite number of milliseconds, got 100000000000000000000\. At most 2147483647/],
      [{ pollInterval: 3_000_000_000 }, /option 'pollInterval' .* got 3000000000\. At most 2147483647 \(about 24\.8 days\)/],
      [{ retries: 3 }, /unknown option 'retries'/],
    ])('stops the app on module option %p', async (options, message) => {
      @Module({ imports: [DistributedLockModule.forRoot(options as never)] })
      class BadOptionsModule {}
      const error = await boot(BadOptionsModule).catch((e: unknown) => e);
      expect(error).toBeInstanceOf(InvalidLockOptionsError);
      expect((error as Error).message).toMatch(/^DistributedLockModule: /);
      expect((error as Error).message).toMatch(message);
    });

    it('stops the app when waiters would poll Redis less often than Redis keeps their place in line', async () => {
      // A URL: the backend connects on first use, so nothing here needs a server.
      const backend = new RedisLockBackend('redis://127.0.0.1:1', { waiterTimeout: 1_000 });
      @Module({ imports: [DistributedLockModule.forRoot({ backend, pollInterval: 1_000 })] })
      class SlowPollModule {}
      const error = await boot(SlowPollModule).catch((e: unknown) => e);
      expect(error).toBeInstanceOf(InvalidLockOptionsError);
      expect((error as InvalidLockOptionsError).option).toBe('pollInterval');
      expect((error as Error).message).toMatch(
        /option 'pollInterval' \(1000 ms\) must be below the redis backend's waiterTimeout \(1000 ms\)/,
      );
      expect((error as Error).message).toMatch(/Lower pollInterval, or raise waiterTimeout/);
      // The default pollInterval (500 ms) counts too.
      expect(() => new LockService(new RedisLockBackend('redis://127.0.0.1:1', { waiterTimeout: 400 }))).toThrow(
        /'pollInterval' \(500 ms, the default\) must be below the redis backend's waiterTimeout \(400 ms\)/,
      );
      expect(
        new LockService(new RedisLockBackend('redis://127.0.0.1:1', { waiterTimeout: 400 }), { pollInterval: 100 }).options.pollInterval,
      ).toBe(100);
    });

    it('stops the app on a @Locked option of the wrong type, naming the method', async () => {
      @Injectable()
      class BadLocked {
        @Locked('k', { ttl: -1 })
        async run() {}
      }
      @Module({ imports: [DistributedLockModule.forRoot()], providers: [BadLocked] })
      class BadLockedModule {}
      const error = await boot(BadLockedModule).catch((e: unknown) => e);
      expect(error).toBeInstanceOf(InvalidLockOptionsError);
      expect((error as Error).message).toContain('@Locked on BadLocked.run');
    });

    it.each([
      ['waiterTimeout', 3_000_000_000],
      ['commandTimeout', 3_000_000_000],
      ['waiterTimeout', Number.NaN],
    ])("refuses the Redis backend's option %s = %p, saying what it accepts", (option, value) => {
      const create = () => new RedisLockBackend('redis://127.0.0.1:1', { [option]: value });
      expect(create).toThrow(InvalidLockOptionsError);
      expect(create).toThrow(
        new RegExp(`option '${option}' must be a positive finite number of milliseconds, got ${value}\\. At most 2147483647`),
      );
    });

    it.each([
      ['an unparsable URL', 'redis://:s3cret@no such host:6379', /is not a URL/],
      ['a URL of another scheme', 'http://user:s3cret@host:6379/?password=s3cret', /must start with redis:\/\//],
    ])('refuses %s without printing its password', (_what, url, message) => {
      const error = (() => {
        try {
          new RedisLockBackend(url);
        } catch (caught) {
          return caught as Error;
        }
      })();
      expect(error).toBeInstanceOf(InvalidLockOptionsError);
      expect(error!.message).toMatch(message);
      expect(error!.message).not.toContain('s3cret');
    });

    it("rounds a fractional waiterTimeout up to whole milliseconds, as Redis's PEXPIRE needs", () => {
      expect(new RedisLockBackend('redis://127.0.0.1:1', { waiterTimeout: 2_500.5 }).waiterTimeout).toBe(2_501);
    });

    it.each(['masterTimeout', 'subscribeTimeout'])("refuses Redlock's %s beyond what a timer keeps", (option) => {
      const master = (port: number) => ({
        evalsha: () => undefined,
        eval: () => undefined,
        duplicate: () => undefined,
        options: { host: 'h', port },
      });
      const resolve = () =>
        resolveRedlockOptions({ clients: [master(1), master(2), master(3)] as never, [option]: 3_000_000_000 }, () => undefined as never);
      expect(resolve).toThrow(InvalidLockOptionsError);
      expect(resolve).toThrow(
        new RegExp(`option '${option}' must be a positive number of milliseconds, got 3000000000\\. At most 2147483647`),
      );
    });

    it.each([
      ['order:<id', /unmatched '<' or '>'/],
      ['order:<>', /placeholder '<>' .* is not a parameter name/],
      ['order:<a-b>', /placeholder '<a-b>'/],
      ['', /empty key template/],
    ])('stops the app on the malformed template %p', async (template, message) => {
      @Injectable()
      class BadTemplate {
        @Locked(template)
        async run(id: string) {
          return id;
        }
      }
      @Module({ imports: [DistributedLockModule.forRoot()], providers: [BadTemplate] })
      class BadTemplateModule {}
      const error = await boot(BadTemplateModule).catch((e: unknown) => e);
      expect(error).toBeInstanceOf(InvalidLockKeyError);
      expect((error as Error).message).toMatch(message);
    });
  });
});
