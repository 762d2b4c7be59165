import { describe, expect, it } from '@jest/globals';
import fc from 'fast-check';
import { compileKeySource } from '../../lib/lock-key.js';
import { InvalidLockKeyError } from '../../lib/lock.errors.js';
import type { ParameterInfo } from '../../lib/parameter-names.js';

// transfer(id, dto, ...more): every shape of argument a caller can pass, against a few lines that
// say what docs/keys.md promises each placeholder locks.
const params: ParameterInfo[] = [
  { name: 'id', rest: false, hasDefault: false },
  { name: 'dto', rest: false, hasDefault: false },
  { name: 'more', rest: true, hasDefault: false },
];
const origin = { className: 'Accounts', methodName: 'transfer' };

const placeholders = ['<id>', '<0>', '<1>', '<2>', '<dto.x>', '<dto.items.0.sku>', '<1.items.1.sku>', '<more.0>', '<more.1>'];
const literal = fc.stringMatching(/^[a-z0-9:{}._-]{0,6}$/);
const template = fc
  .array(fc.tuple(literal, fc.constantFrom(...placeholders)), { minLength: 1, maxLength: 3 })
  .chain((parts) => literal.map((tail) => parts.map(([text, placeholder]) => text + placeholder).join('') + tail));

const scalar = fc.oneof(
  fc.string({ unit: 'binary', maxLength: 8 }),
  fc.string({ maxLength: 2_000 }),
  fc.integer(),
  fc.double(),
  fc.bigInt(),
  fc.boolean(),
  fc.constantFrom(null, undefined, '', Number.NaN, Number.POSITIVE_INFINITY),
);
const value = fc.oneof(
  { weight: 4, arbitrary: scalar },
  { weight: 1, arbitrary: fc.array(scalar, { maxLength: 3 }) },
  {
    weight: 2,
    arbitrary: fc.record(
      { x: scalar, items: fc.array(fc.oneof(fc.record({ sku: scalar }, { requiredKeys: [] }), scalar), { maxLength: 3 }) },
      { requiredKeys: [] },
    ),
  },
);
const args = fc.array(value, { maxLength: 5 });

/** What a placeholder reaches: `<n>` the n-th argument, a name its parameter, `more` the rest. */
function reach(placeholder: string, call: readonly unknown[]): unknown {
  const [head, ...path] = placeholder.slice(1, -1).split('.');
  let current: unknown = /^\d+$/.test(head) ? call[Number(head)] : head === 'id' ? call[0] : head === 'dto' ? call[1] : call.slice(2);
  for (const segment of path)
    current = current === null || current === undefined ? undefined : (current as Record<string, unknown>)[segment];
  return current;
}

/** docs/keys.md's rule: a non-empty string as it is, a finite number or a bigint as text; nothing else. */
function text(reached: unknown): string | undefined {
  if (typeof reached === 'string') return reached.length > 0 ? reached : undefined;
  if (typeof reached === 'number') return Number.isFinite(reached) ? String(reached) : undefined;
  if (typeof reached === 'bigint') return String(reached);
  return undefined;
}

function expected(source: string, call: readonly unknown[], encode: boolean): string | undefined {
  let key = '';
  let last = 0;
  for (const match of source.matchAll(/<[^<>]*>/g)) {
    const part = text(reach(match[0], call));
    if (part === undefined) return undefined;
    key += source.slice(last, match.index) + (encode ? encodeURIComponent(part) : part);
    last = match.index + match[0].length;
  }
  return key + source.slice(last);
}

describe('key templates against what docs/keys.md says they lock', () => {
  it('give every argument shape its documented key or an InvalidLockKeyError, never another key', () => {
    fc.assert(
      fc.property(template, args, fc.boolean(), (source, call, encode) => {
        const resolve = compileKeySource(source, origin, params);
        const want = expected(source, call, encode);
        if (want === undefined) {
          expect(() => resolve(call, encode)).toThrow(InvalidLockKeyError);
        } else {
          expect(resolve(call, encode)).toEqual([want]);
        }
      }),
      { numRuns: 2_000 },
    );
  });

  it('keep argument lists that join to the same text apart when values are encoded', () => {
    fc.assert(
      fc.property(
        fc.string({ minLength: 1, maxLength: 6 }),
        fc.string({ minLength: 1, maxLength: 6 }),
        fc.string({ minLength: 1, maxLength: 6 }),
        fc.string({ minLength: 1, maxLength: 6 }),
        (a, b, c, d) => {
          fc.pre(a !== c || b !== d);
          const resolve = compileKeySource('order:<0>:<1>', origin, params);
          expect(resolve([a, b], true)).not.toEqual(resolve([c, d], true));
        },
      ),
      { numRuns: 2_000 },
    );
  });
});
