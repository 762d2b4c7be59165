import { describe, expect, it } from '@jest/globals';
import { configFromEnv, describeConfig, lockBackendKind } from '../../sample-app/shop.config.js';

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

describe('LOCK_BACKEND, where the locks are kept', () => {
  const db = 'postgres://shop@db/shop';

  it.each([
    [{}, 'memory'],
    [{ REDIS_URL: 'redis://r' }, 'redis'],
    [{ REDIS_URL: 'redis://r', REDLOCK_URLS: 'redis://a,redis://b' }, 'redlock'],
    [{ DATABASE_URL: db }, 'memory'],
    [{ DATABASE_URL: db, LOCK_BACKEND: 'postgres' }, 'postgres'],
    [{ DATABASE_URL: db, REDIS_URL: 'redis://r', LOCK_BACKEND: ' Postgres ' }, 'postgres'],
    [{ DATABASE_URL: 'mysql://shop@db/shop', LOCK_BACKEND: 'mysql' }, 'mysql'],
    [{ DATABASE_URL: 'mariadb://shop@db/shop', LOCK_BACKEND: 'MySQL' }, 'mysql'],
    [{ REDIS_URL: 'redis://r', LOCK_BACKEND: 'memory' }, 'memory'],
    [{ REDIS_URL: 'redis://r', LOCK_BACKEND: '' }, 'redis'],
  ])('%p: %s', (env, kind) => {
    expect(lockBackendKind(configFromEnv(env))).toBe(kind);
  });

  it.each(['pg', 'postgresql', 'sentinel', 'none'])('%p is refused at start-up with the values it takes', (value) => {
    expect(() => configFromEnv({ DATABASE_URL: db, LOCK_BACKEND: value })).toThrow(
      `LOCK_BACKEND must be one of memory, redis, redlock, postgres, mysql (unset: redlock with REDLOCK_URLS, else redis with REDIS_URL, else memory), got '${value}'.`,
    );
  });

  it.each([
    ['postgres', /^LOCK_BACKEND=postgres needs DATABASE_URL \(the shop's PostgreSQL, .*\), which is not set\.$/],
    ['mysql', /^LOCK_BACKEND=mysql needs DATABASE_URL \(the shop's MySQL or MariaDB, mysql:\/\/.*\), which is not set\.$/],
    ['redis', /^LOCK_BACKEND=redis needs REDIS_URL, which is not set\.$/],
    ['redlock', /^LOCK_BACKEND=redlock needs REDLOCK_URLS \(comma-separated Redis masters\), which is not set\.$/],
  ])('%s without its server says which variable is missing rather than falling back', (value, message) => {
    expect(() => configFromEnv({ LOCK_BACKEND: value })).toThrow(message);
  });

  it.each([
    ['mysql', db, 'DATABASE_URL must be a mysql:// or mariadb:// URL; it is a postgres:// one.'],
    ['postgres', 'mysql://shop@db/shop', 'DATABASE_URL must be a postgres:// URL; it is a mysql:// or mariadb:// one.'],
  ])('%s keeps the locks in the shop database, and refuses one of the other kind', (value, url, message) => {
    expect(() => configFromEnv({ DATABASE_URL: url, LOCK_BACKEND: value })).toThrow(
      `LOCK_BACKEND=${value} keeps the locks in the shop's database, so ${message}`,
    );
  });

  it('is named in the start-up line', () => {
    expect(describeConfig(configFromEnv({ DATABASE_URL: db, LOCK_BACKEND: 'postgres' }))).toBe(
      'PostgreSQL at postgres://shop@db/shop; locks in that PostgreSQL (PostgresLockBackend)',
    );
    expect(describeConfig(configFromEnv({ DATABASE_URL: 'mysql://shop:s3cret@db/shop', LOCK_BACKEND: 'mysql' }))).toBe(
      'MySQL at mysql://shop:***@db/shop; locks in that MySQL (MysqlLockBackend)',
    );
  });
});

describe('DATABASE_URL, the shop database', () => {
  it.each([
    ['redis://db/shop', "'redis:...'"],
    ['db:5432/shop', "'db:...'"],
    ['/var/run/shop.sock', 'no scheme'],
  ])('%p is refused at start-up with the schemes it takes', (url, got) => {
    expect(() => configFromEnv({ DATABASE_URL: url })).toThrow(
      `DATABASE_URL must start with postgres:// or postgresql:// (PostgreSQL) or mysql:// or mariadb:// (MySQL or MariaDB), got ${got}.`,
    );
  });
});
