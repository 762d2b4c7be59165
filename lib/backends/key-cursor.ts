import { InvalidLockOptionsError } from '../lock.errors.js';

/*
 * The cursor of list() on a store that keeps keys in order (or can sort them): the last key of the
 * page, so the next page is the keys after it. A key held from the first page to the last is then
 * on exactly one page, whatever was taken or freed meanwhile. Opaque to callers, who pass it back
 * as it came.
 */

export function encodeKeyCursor(lastKey: string): string {
  return Buffer.from(lastKey, 'utf8').toString('base64url');
}

export function decodeKeyCursor(cursor: string, backend: string): string {
  const key = Buffer.from(cursor, 'base64url').toString('utf8');
  if (key === '' || encodeKeyCursor(key) !== cursor) {
    throw new InvalidLockOptionsError(
      'cursor',
      `list: cursor '${cursor.slice(0, 40)}' is not one the ${backend} backend returned. Pass a page's cursor back unchanged.`,
    );
  }
  return key;
}

/** A LIKE pattern for keys that start with `prefix`: `escape` (by default `\`) before `%`, `_` and itself. */
export function likePrefix(prefix: string, escape = '\\'): string {
  let pattern = '';
  for (const char of prefix) pattern += char === escape || char === '%' || char === '_' ? escape + char : char;
  return pattern + '%';
}
