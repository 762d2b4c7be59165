import { describe, expect, it } from '@jest/globals';
import { configFromEnv, describeConfig } from '../../sample-app/shop.config.js';

describe('the shop logs its configuration without credentials', () => {
  it.each([
    ['in the user info', 'redis://user:s3cret@redis:6379/0'],
    ['as a password parameter, which ioredis honours', 'redis://redis:6379/0?password=s3cret'],
  ])('masks a Redis password %s', (_where, redisUrl) => {
    const described = describeConfig({ redisUrl, databaseUrl: 'postgres://shop:s3cret@db/shop?password=s3cret' });
    expect(described).toContain('redis:6379');
    expect(described).not.toContain('s3cret');
  });
});

describe('SHOP_DEMO, the switch for POST /demo', () => {
  it.each([
    [undefined, false],
    ['', false],
    ['off', false],
    ['0', false],
    ['false', false],
    ['on', true],
    ['ON', true],
    ['1', true],
    ['true', true],
  ])('%p: demo %p', (value, demo) => {
    expect(configFromEnv({ SHOP_DEMO: value }).demo).toBe(demo);
  });

  it.each(['yes', 'of', 'onn'])('%p is refused at start-up, saying what it takes, rather than guessed', (value) => {
    expect(() => configFromEnv({ SHOP_DEMO: value })).toThrow(`SHOP_DEMO must be 'on' or 'off' (unset: off), got '${value}'.`);
  });

  it('is named in the start-up line when on', () => {
    expect(describeConfig({ demo: true })).toMatch(/; POST \/demo on \(SHOP_DEMO\)$/);
    expect(describeConfig({})).not.toMatch(/demo/);
  });
});
