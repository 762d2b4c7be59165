import { describe, expect, it } from '@jest/globals';
import { hashTag, keySlot, lockKeyLayout, lockKeyLayouts } from '../../lib/backends/redis/redis.keys.js';
import { InvalidLockKeyError } from '../../lib/lock.errors.js';

describe('Redis key layout', () => {
  it('computes slots as Redis does', () => {
    // Values from CLUSTER KEYSLOT on a real Redis.
    expect(keySlot('foo')).toBe(12182);
    expect(keySlot('{user1000}.following')).toBe(keySlot('user1000'));
    // An empty first tag: Redis hashes the whole key, not what follows up to a later '}'.
    expect(keySlot('foo{}{bar}')).toBe(8363);
    expect(keySlot('p:{}:{t}')).toBe(10001);
    expect(keySlot('{}a}b')).toBe(5168);
    expect(keySlot('lock:é🔒{}}')).toBe(9959);
    expect(keySlot('foo{{bar}}zap')).toBe(4015);
    expect(hashTag('foo{}{bar}')).toBeUndefined();
    expect(hashTag('foo{{bar}}zap')).toBe('{bar');
    expect(hashTag('foo{bar}{zap}')).toBe('bar');
    expect(keySlot('123456789')).toBe(0x31c3 & 0x3fff);
  });

  it('keeps the lock under its own name, and the user hash tag decides its slot', () => {
    const layout = lockKeyLayout('lock:order:{42}:payment');
    expect(layout.lock).toBe('lock:order:{42}:payment');
    expect(keySlot(layout.fence)).toBe(keySlot('42'));
    expect(lockKeyLayout('lock:order:42').fence).toBe('{lock:order:42}:fence');
  });

  it('puts companions in the lock slot whatever braces a user value brings', () => {
    const alphabet = ['{', '}', 'a', 'b', ':', '{}', '}{', 'é', '🔒'];
    let seed = 7;
    const random = () => (seed = (seed * 48271) % 2147483647) / 2147483647;
    const keys = ['}', '{', '{}', '}{', 'a}b', '{}x', 'x{', '{a', 'a{}}', 'lock:{}', 'lock:}{x}'];
    for (let i = 0; i < 500; i++) {
      keys.push(
        'lock:' + Array.from({ length: 1 + Math.floor(random() * 8) }, () => alphabet[Math.floor(random() * alphabet.length)]).join(''),
      );
    }
    for (const key of keys) {
      const { lock, fence, line, records, holders, holder, who } = lockKeyLayout(key);
      expect(lock).toBe(key);
      for (const companion of [fence, line, records, holders, holder, who]) {
        expect([key, companion, keySlot(companion)]).toEqual([key, companion, keySlot(key)]);
        expect(companion.startsWith('{')).toBe(true);
      }
    }
    // Distinct keys never share companions.
    const fences = keys.map((key) => lockKeyLayout(key).fence);
    expect(new Set(fences).size).toBe(new Set(keys).size);
  });

  it('keeps the names stored in Redis, which processes of other versions read during a rolling upgrade', () => {
    expect(lockKeyLayout('lock:order:42')).toEqual({
      lock: 'lock:order:42',
      fence: '{lock:order:42}:fence',
      line: '{lock:order:42}:queue',
      records: '{lock:order:42}:waiters',
      holders: '{lock:order:42}:holders',
      holder: '{lock:order:42}:holder',
      who: '{lock:order:42}:who',
    });
  });

  it('accounts for the client key prefix that ioredis adds', () => {
    const layout = lockKeyLayout('order:42', 'app:');
    expect(layout.lock).toBe('order:42');
    expect(keySlot('app:' + layout.fence)).toBe(keySlot('app:order:42'));
  });
});

describe('lock names on Redis', () => {
  it("refuses a lock named like another lock's companion, which only an empty keyPrefix lets through", () => {
    for (const key of ['{k}:holder', '{k}:fence', '{lock:a}:queue', '{x}:order:{42}:who']) {
      expect(() => lockKeyLayouts([key], '', false)).toThrow(InvalidLockKeyError);
      expect(() => lockKeyLayouts([key], '', false)).toThrow(/named like the companion of another lock/);
    }
    // Hash tags of the user's own, and the same names under a prefix, stay allowed.
    for (const [key, prefix] of [
      ['{42}:order', ''],
      ['order:{42}:holder', ''],
      ['{k}:holder', 'app:'],
    ]) {
      expect(lockKeyLayouts([key], prefix, false)[0].lock).toBe(key);
    }
  });
});
