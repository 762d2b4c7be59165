import 'reflect-metadata';
import { afterAll, beforeAll, describe, expect, it } from '@jest/globals';
import { Injectable, Module } from '@nestjs/common';
import { Test, type TestingModule } from '@nestjs/testing';
import fc from 'fast-check';
import { defer, firstValueFrom, Observable, of } from 'rxjs';
import { DistributedLockModule, InvalidLockKeyError, Locked, MemoryLockBackend } from '../../lib/index.js';

/** The in-memory store, recording the keys each acquisition asked for. */
class RecordingBackend extends MemoryLockBackend {
  readonly asked: string[][] = [];
  override tryAcquire(...args: Parameters<MemoryLockBackend['tryAcquire']>) {
    this.asked.push([...args[0]]);
    return super.tryAcquire(...args);
  }
}
const backend = new RecordingBackend();

/** A decorator that wraps the method before @Locked sees it, as logging or caching decorators do. */
function Wrapped(): MethodDecorator {
  return (_target, _key, descriptor) => {
    const inner = descriptor.value as unknown as (...args: unknown[]) => unknown;
    descriptor.value = function (this: unknown, ...args: unknown[]) {
      return inner.apply(this, args);
    } as never;
    return descriptor;
  };
}

@Injectable()
class Accounts {
  @Locked('acct:<id>:<dto.items.0.sku>')
  async pay(id: unknown, dto: unknown) {
    return [id, dto];
  }

  @Locked('batch:<ids.1>')
  async batch(first: unknown, ...ids: unknown[]) {
    return [first, ids];
  }

  @Locked('note:<id>')
  @Wrapped()
  async note(id: unknown, text = '') {
    return [id, text];
  }

  // A default value is invisible to a template, so the key comes from a function.
  @Locked((day: unknown = 'today') => `report:${String(day)}`)
  async report(day?: unknown) {
    return day;
  }

  // Declared as an Observable (a value import: the decorator reads the declared return type).
  @Locked('stream:<0>')
  watch(id: unknown): Observable<unknown> {
    return defer(() => of(id));
  }

  @Locked('nightly:<day>')
  static async run(day: unknown) {
    return day;
  }
}

@Module({ imports: [DistributedLockModule.forRoot({ backend })], providers: [Accounts] })
class AppModule {}

const scalar = fc.oneof(
  fc.string({ unit: 'binary', maxLength: 8 }),
  fc.string({ unit: 'grapheme', maxLength: 8 }),
  fc.string({ maxLength: 600 }),
  // Around the longest key allowed (512 with the prefix): random lengths seldom land there.
  fc.integer({ min: 490, max: 520 }).map((length) => 'x'.repeat(length)),
  // A control character (C0, DEL, C1) or half of a surrogate pair inside an id.
  fc
    .tuple(fc.string({ maxLength: 3 }), fc.constantFrom('\n', '\u0000', '\u007f', '\u0085', '\u009b', '\ud83d', '\ude00'))
    .map(([id, odd]) => id + odd + id),
  fc.integer(),
  fc.double(),
  fc.bigInt(),
  fc.boolean(),
  fc.constantFrom(null, undefined, '', Number.NaN, Number.NEGATIVE_INFINITY, -0),
);
const value = fc.oneof(
  { weight: 4, arbitrary: scalar },
  { weight: 1, arbitrary: fc.array(scalar, { maxLength: 3 }) },
  {
    weight: 2,
    arbitrary: fc.record(
      { items: fc.array(fc.oneof(fc.record({ sku: scalar }, { requiredKeys: [] }), scalar), { maxLength: 2 }) },
      { requiredKeys: [] },
    ),
  },
);

/** docs/keys.md's rule for a placeholder: a non-empty string as it is, a finite number or a bigint as text. */
function text(reached: unknown): string | undefined {
  if (typeof reached === 'string') return reached.length > 0 ? reached : undefined;
  if (typeof reached === 'number') return Number.isFinite(reached) ? String(reached) : undefined;
  if (typeof reached === 'bigint') return String(reached);
  return undefined;
}

/** docs/keys.md's rule for a whole key: the prefix, at most 512 characters, no control character, well-formed Unicode. */
function fullKey(key: string | undefined): string | undefined {
  if (key === undefined) return undefined;
  const full = `lock:${key}`;
  return full.length <= 512 && !/\p{Cc}/u.test(full) && wellFormed(full) ? full : undefined;
}

/** encodeURIComponent refuses a lone surrogate. */
function wellFormed(key: string): boolean {
  try {
    encodeURIComponent(key);
    return true;
  } catch {
    return false;
  }
}

const sku = (dto: unknown) => (dto as { items?: { sku?: unknown }[] } | null | undefined)?.items?.[0]?.sku;

/** Each entry point, with the key docs/keys.md says a call locks (undefined: an InvalidLockKeyError). */
const methods: Record<
  string,
  { call: (accounts: Accounts, args: unknown[]) => Promise<unknown>; key: (args: unknown[]) => string | undefined }
> = {
  'an instance method, a path into an argument': {
    call: (a, [id, dto]) => a.pay(id, dto),
    key: ([id, dto]) => {
      const [one, two] = [text(id), text(sku(dto))];
      return one === undefined || two === undefined ? undefined : fullKey(`acct:${one}:${two}`);
    },
  },
  'a rest parameter': {
    call: (a, args) => a.batch(...(args as [unknown, ...unknown[]])),
    key: (args) => {
      const part = text(args[2]);
      return part === undefined ? undefined : fullKey(`batch:${part}`);
    },
  },
  'a method another decorator wrapped first': {
    call: (a, [id]) => a.note(id),
    key: ([id]) => {
      const part = text(id);
      return part === undefined ? undefined : fullKey(`note:${part}`);
    },
  },
  'a default parameter, through a key function': {
    call: (a, [day]) => a.report(day),
    key: ([day]) => (typeof day === 'string' || day === undefined ? fullKey(`report:${day ?? 'today'}`) : 'skip'),
  },
  'an Observable result, locked while subscribed': {
    call: (a, [id]) => firstValueFrom(a.watch(id)),
    key: ([id]) => {
      const part = text(id);
      return part === undefined ? undefined : fullKey(`stream:${part}`);
    },
  },
  'a static method': {
    call: (_a, [day]) => Accounts.run(day),
    key: ([day]) => {
      const part = text(day);
      return part === undefined ? undefined : fullKey(`nightly:${part}`);
    },
  },
};

describe('@Locked against what docs/keys.md says each call locks', () => {
  let app: TestingModule;
  let accounts: Accounts;
  beforeAll(async () => {
    app = await Test.createTestingModule({ imports: [AppModule] }).compile();
    await app.init();
    accounts = app.get(Accounts);
  });
  afterAll(() => app.close());

  it.each(Object.keys(methods))('%s: the documented key or an InvalidLockKeyError, never another key', async (name) => {
    const { call, key } = methods[name];
    await fc.assert(
      fc.asyncProperty(fc.array(value, { maxLength: 4 }), async (args) => {
        const want = key(args);
        if (want === 'skip') return;
        backend.asked.length = 0;
        if (want === undefined) {
          await expect(call(accounts, args)).rejects.toThrow(InvalidLockKeyError);
          expect(backend.asked).toEqual([]);
        } else {
          await call(accounts, args);
          expect(backend.asked).toEqual([[want]]);
        }
      }),
      { numRuns: 300 },
    );
  });
});
