import { MAX_TIMER_MS } from '../distributed-lock.options.js';
import { InvalidLockOptionsError } from '../lock.errors.js';
import { show } from '../option-value.js';

/**
 * The checks every backend makes of what its constructor got, in one wording: a failure is an
 * InvalidLockOptionsError that names the option, its message led by the backend's class name.
 */
export class BackendOptionChecks {
  constructor(private readonly where: string) {}

  fail(option: string, message: string): never {
    throw new InvalidLockOptionsError(option, `${this.where}: ${message}`);
  }

  /** Refuses an option name not in `known`, listing the accepted ones. */
  known(name: string, known: readonly string[]): void {
    if (!known.includes(name)) this.fail(name, `unknown option '${name}'. Accepted options: ${known.join(', ')}.`);
  }

  /**
   * The options given a value, in their order, once `options` proved an object (`example` shows
   * one in the message) and each name one of `known`; nothing for undefined.
   */
  *given(options: unknown, known: readonly string[], example: string): Generator<[name: string, value: unknown]> {
    if (options === undefined) return;
    if (typeof options !== 'object' || options === null || Array.isArray(options)) {
      this.fail('(options)', `options must be an object like ${example}, got ${show(options)}.`);
    }
    for (const [name, value] of Object.entries(options)) {
      this.known(name, known);
      if (value !== undefined) yield [name, value];
    }
  }

  /** A time option: a positive number of ms a timer can wait, rounded up to whole milliseconds. */
  milliseconds(name: string, value: unknown): number {
    if (typeof value !== 'number' || !Number.isFinite(value) || value <= 0 || value > MAX_TIMER_MS) {
      this.fail(
        name,
        `option '${name}' must be a positive finite number of milliseconds, got ${show(value)}. ` +
          `At most ${MAX_TIMER_MS} (about 24.8 days); fractions are rounded up to whole milliseconds.`,
      );
    }
    return Math.ceil(value);
  }

  /** Refuses an instance of a class where settings (a plain object) or `what` were expected, saying what to pass. */
  plainSettings(option: string, value: object, what: string, howTo: string): void {
    const prototype: unknown = Object.getPrototypeOf(value);
    if (prototype !== Object.prototype && prototype !== null) {
      this.fail(option, `got an instance of ${value.constructor?.name ?? 'an unknown class'}, which is not ${what}. ${howTo}`);
    }
  }
}
