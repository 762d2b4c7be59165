import { describe, expect, it } from '@jest/globals';
import { BackendOptionChecks } from '../../lib/backends/backend-options.checks.js';
import { show } from '../../lib/option-value.js';
import { InvalidLockOptionsError } from '../../lib/lock.errors.js';

const checks = new BackendOptionChecks('SomeLockBackend');
const known = ['prefix', 'commandTimeout'];

function given(options: unknown): [string, unknown][] {
  return [...checks.given(options, known, '{ commandTimeout: 2000 }')];
}

describe('the option checks the backends share', () => {
  it('yields the options given a value, in order; none for undefined', () => {
    expect(given(undefined)).toEqual([]);
    expect(given({ commandTimeout: 5, prefix: undefined })).toEqual([['commandTimeout', 5]]);
  });

  it('refuses a name of Object.prototype as unknown, not as a known option', () => {
    expect(() => given({ toString: 5 })).toThrow(
      new InvalidLockOptionsError('toString', "SomeLockBackend: unknown option 'toString'. Accepted options: prefix, commandTimeout."),
    );
  });

  it('reports the first wrong option in the order given, whether unknown or of a wrong value', () => {
    const checked = (options: object) => {
      for (const [name, value] of checks.given(options, known, '{}')) if (name === 'commandTimeout') checks.milliseconds(name, value);
    };
    expect(() => checked({ commandTimeout: -1, bad: 1 })).toThrow(/option 'commandTimeout' must be a positive finite number/);
    expect(() => checked({ bad: 1, commandTimeout: -1 })).toThrow(/unknown option 'bad'/);
  });

  it('rounds a time up to whole milliseconds, up to the longest timer', () => {
    expect(checks.milliseconds('commandTimeout', 1.2)).toBe(2);
    expect(() => checks.milliseconds('commandTimeout', 2 ** 31)).toThrow(/At most 2147483647 \(about 24\.8 days\)/);
  });

  it('never shows the password of a connection string given where another value was expected', () => {
    expect(show('postgres://app:secret@db:5432/app')).toBe("'postgres://app:***@db:5432/app'");
    expect(show('redis://db?password=secret')).toBe("'redis://db?password=***'");
  });
});
