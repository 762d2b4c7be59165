import { hostname } from 'node:os';
import { MAX_IDENTITY_LENGTH, type LockHolderIdentity } from './backends/lock-backend.interface.js';
import { InvalidLockOptionsError } from './lock.errors.js';

/*
 * Who holds or waits for a lock, as backends store it next to the lease: the process (`instance`)
 * and the place in the code (`site`). Both are names the application chose or the class and
 * method names of a @Locked method, never argument values, and both are bounded, so what a store
 * keeps per holder stays small (docs/inspection.md).
 */

/** Control characters would break a line of a log or of a store's encoding (see encodeIdentity). */
// eslint-disable-next-line no-control-regex -- exactly what it refuses
const CONTROL = /[\u0000-\u001f\u007f]/;

/** Whether `value` may be stored as an instance or a site: 1 to MAX_IDENTITY_LENGTH characters, no control characters. */
export function isIdentityName(value: unknown): value is string {
  return typeof value === 'string' && value.length > 0 && value.length <= MAX_IDENTITY_LENGTH && !CONTROL.test(value);
}

/** What the option checks say an instance or a site must be. */
export const IDENTITY_NAME_RULE = `a string of 1 to ${MAX_IDENTITY_LENGTH} characters without control characters`;

/** A name the library makes itself (host name, class and method), cut to what a store keeps. */
function bounded(name: string): string {
  return name.replace(new RegExp(CONTROL.source, 'g'), '?').slice(0, MAX_IDENTITY_LENGTH);
}

/** The default `instance`: `hostname:pid`. */
export function defaultInstance(): string {
  return bounded(`${hostname()}:${process.pid}`);
}

/** The site of a @Locked method: `Class.method`. */
export function methodSite(className: string, methodName: string): string {
  return bounded(`${className}.${methodName}`);
}

/**
 * One string for stores that keep the identity in one field: `instance`, a line feed, `site` (empty
 * when absent). Neither may hold a line feed, so it splits back without escaping.
 */
export function encodeIdentity(holder: LockHolderIdentity | undefined): string {
  return holder === undefined ? '' : `${holder.instance}\n${holder.site ?? ''}`;
}

/** encodeIdentity's string back; nothing for an empty or malformed one (a holder of a release that stored none). */
export function decodeIdentity(encoded: string | null | undefined): Partial<LockHolderIdentity> {
  if (!encoded) return {};
  const cut = encoded.indexOf('\n');
  if (cut <= 0) return {};
  const site = encoded.slice(cut + 1);
  return site === '' ? { instance: encoded.slice(0, cut) } : { instance: encoded.slice(0, cut), site };
}

/**
 * The most bytes encodeIdentity's string takes in UTF-8: two names of MAX_IDENTITY_LENGTH UTF-16
 * units, each unit 3 bytes at most (a pair of them, 4), and the line feed.
 */
export const MAX_IDENTITY_BYTES = 2 * MAX_IDENTITY_LENGTH * 3 + 1;

/**
 * encodeIdentity's string as UTF-8, for a store that keeps it in a field of MAX_IDENTITY_BYTES;
 * undefined without a holder. LockService checks the names; a caller of the backend itself that
 * passes longer ones is refused here, rather than cut or refused by the store.
 */
export function identityBytes(holder: LockHolderIdentity | undefined, backend: string): Buffer | undefined {
  if (holder === undefined) return undefined;
  const bytes = Buffer.from(encodeIdentity(holder));
  if (bytes.length > MAX_IDENTITY_BYTES) {
    throw new InvalidLockOptionsError(
      'holder',
      `The ${backend} backend stores an identity (instance and site) of at most ${MAX_IDENTITY_BYTES} bytes, got ${bytes.length}: ` +
        `give names of at most ${MAX_IDENTITY_LENGTH} characters each, as LockService checks.`,
    );
  }
  return bytes;
}
