import { describe, expect, it } from '@jest/globals';
import { InvalidLockOptionsError, RedisLockBackend } from '../../lib/index.js';
import { redactUrl } from '../../lib/option-value.js';

const SECRET = 'Pw7q';

/** Connection strings whose password a message once showed, in part or whole. */
const written = [
  `redis:/u:${SECRET}x@host:6379`,
  `user:se/${SECRET}@host:6379`,
  `redis://u:pa/${SECRET}@host:6379`,
  `user:p@${SECRET}@host:6379`,
  `redis://u:p@${SECRET}@host:6379/0`,
  `user:pa:${SECRET}@host:6379`,
  `redis://${SECRET}@host:6379`,
  `redis://host:6379/0?password=${SECRET}`,
];

describe('a connection string in a message', () => {
  it.each(written)('%s: its password appears nowhere, its host does', (text) => {
    const shown = redactUrl(text);
    expect(shown).not.toContain(SECRET);
    expect(shown).toContain('host:6379');
  });

  it('keeps the user name and the scheme', () => {
    expect(redactUrl('redis://locks:pa/ss@host:6379/0')).toBe('redis://locks:***@host:6379/0');
    expect(redactUrl('redis:/locks:secret@host')).toBe('redis:/locks:***@host');
    expect(redactUrl('locks:p@ss@host:6379')).toBe('locks:***@host:6379');
    expect(redactUrl('redis://host:6379')).toBe('redis://host:6379');
  });

  it.each(written)('%s: the Redis backend refusing it does not show the password', (text) => {
    let error: unknown;
    try {
      // A string the backend accepts is not refused: give it an unknown scheme then.
      new RedisLockBackend(text.startsWith('redis://') ? text.replace('redis://', 'redix://') : text);
    } catch (e) {
      error = e;
    }
    expect(error).toBeInstanceOf(InvalidLockOptionsError);
    expect(String((error as Error).message)).not.toContain(SECRET);
  });
});
