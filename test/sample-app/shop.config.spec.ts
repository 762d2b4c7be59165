import { describe, expect, it } from '@jest/globals';
import { describeConfig } from '../../sample-app/shop.config.js';

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
