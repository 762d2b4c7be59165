import { describe, expect, it } from '@jest/globals';
import { inspect } from 'node:util';
import { ZooKeeperLockBackend } from '../../lib/backends/zookeeper/zookeeper.backend.js';
import { InvalidLockOptionsError } from '../../lib/lock.errors.js';
import { activeTimers } from '../support/wait.js';

describe('ZooKeeperLockBackend options', () => {
  it.each([
    [undefined, {}, "expected a connection string, got undefined. Pass a connection string like '127.0.0.1:2181'"],
    ['', {}, 'expected a connection string'],
    ['zk1:99999', {}, "'zk1:99999' in the connection string is not host:port"],
    ['zk1:2181,:2181', {}, "':2181' in the connection string is not host:port"],
    ['127.0.0.1:2181', { root: 'locks' }, "option 'root' must be an absolute ZooKeeper path like '/locks'"],
    ['127.0.0.1:2181', { root: '/locks/' }, "option 'root' must be an absolute ZooKeeper path"],
    ['127.0.0.1:2181', { root: '/a/../b' }, "option 'root' must be an absolute ZooKeeper path"],
    ['127.0.0.1:2181', { root: '/' }, "option 'root' must be an absolute ZooKeeper path like '/locks' (no trailing '/')"],
    ['127.0.0.1:2181', { root: '/locks\u0001' }, 'no control, surrogate (emoji), private-use or special characters'],
    ['127.0.0.1:2181', { root: '/locks-😀' }, 'no control, surrogate (emoji), private-use or special characters'],
    ['127.0.0.1:2181', { root: '/zookeeper' }, "option 'root' must not be under /zookeeper, ZooKeeper's own tree"],
    ['127.0.0.1:2181', { root: '/zookeeper/locks' }, "option 'root' must not be under /zookeeper"],
    ['127.0.0.1:2181/app/', {}, "the chroot '/app/' in the connection string is not a ZooKeeper path (no trailing '/')"],
    ['127.0.0.1:2181/a//b', {}, "the chroot '/a//b' in the connection string is not a ZooKeeper path (no empty, '.' or '..' segment)"],
    ['127.0.0.1:2181', { sessionTimeout: 0 }, "option 'sessionTimeout' must be a positive finite number of milliseconds, got 0"],
    ['127.0.0.1:2181', { commandTimeout: Number.NaN }, "option 'commandTimeout' must be a positive finite number"],
    ['127.0.0.1:2181', { ttl: 1_000 }, "unknown option 'ttl'. Accepted options: root, sessionTimeout, commandTimeout"],
    ['127.0.0.1:2181', 'fast', 'options must be an object'],
    ['127.0.0.1:2181', { auth: 'locks:secret' }, "option 'auth' must be digest credentials, got a string. Pass { username: 'locks'"],
    ['127.0.0.1:2181', { auth: { username: 'a:b', password: 'secret' } }, "the digest user name must be a non-empty string without ':'"],
    ['127.0.0.1:2181', { auth: { username: 'locks', password: '' } }, 'the digest password must be a non-empty string'],
    ['127.0.0.1:2181', { auth: { username: 'locks', password: 'x', scheme: 'sasl' } }, "option 'auth' takes username and password only"],
    ['locks@127.0.0.1:2181', {}, "the credentials in '***@127.0.0.1:2181' have no password"],
    [
      'locks:secret@127.0.0.1:2181',
      { auth: { username: 'locks', password: 'secret' } },
      "credentials were given twice, in the connection string 'locks:***@127.0.0.1:2181' and in the auth option",
    ],
  ])('refuses %p with %p at construction, saying what to pass, and leaves nothing running', (connection, options, message) => {
    const before = activeTimers();
    const create = () => new ZooKeeperLockBackend(connection as string, options as object);
    expect(create).toThrow(InvalidLockOptionsError);
    expect(create).toThrow(message);
    expect(activeTimers()).toBe(before);
  });

  it.each([
    ['locks:s3cret@zk1:99999', "'zk1:99999' in the connection string is not host:port"],
    ['locks:s3cret@zk1:2181,zk2:x', "'zk2:x' in the connection string is not host:port"],
    ['locks:s3cret@zk1:2181/app/', "the chroot '/app/' in the connection string is not a ZooKeeper path"],
    ['locks:s3cret%zz@zk1:2181', "the credentials in 'locks:***@zk1:2181' are not percent-encoded correctly"],
    ['locks:s3cret@', "'' in the connection string is not host:port"],
    ['s3cret@zk1:2181', "the credentials in '***@zk1:2181' have no password"],
    ['zk1:2181?password=s3cret', "'zk1:2181?password=***' in the connection string is not host:port"],
  ])('refuses %p without the password in the message, its cause or its stack', (connection, message) => {
    let error: unknown;
    try {
      new ZooKeeperLockBackend(connection);
    } catch (e) {
      error = e;
    }
    expect(error).toBeInstanceOf(InvalidLockOptionsError);
    expect((error as Error).message).toContain(message);
    expect(inspect(error, { depth: 10 })).not.toContain('s3cret');
  });

  it('takes digest credentials in the option or in the connection string, and never shows them', async () => {
    for (const [connection, options] of [
      ['locks:p%40ss@zk1:2181,zk2:2181/app', {}],
      ['locks:p@ss/w,rd@zk1:2181', {}],
      ['zk1:2181', { auth: { username: 'locks', password: 'p@ss' } }],
    ] as const) {
      const backend = new ZooKeeperLockBackend(connection, options);
      expect(inspect(backend)).not.toMatch(/p@ss|p%40ss|locks/);
      expect(JSON.stringify(backend)).not.toMatch(/p@ss|p%40ss|locks/);
      await backend.close();
    }
  });

  it('takes host:port lists with a chroot, and shows its root, not its servers, in logs', async () => {
    const backend = new ZooKeeperLockBackend('zk1:2181,zk2,zk3:2182/app', { root: '/locks-ключ' });
    expect(inspect(backend)).toBe("ZooKeeperLockBackend { name: 'zookeeper', root: '/locks-ключ' }");
    expect(JSON.stringify(backend)).toBe('{"name":"zookeeper","root":"/locks-ключ"}');
    await backend.close();
  });
});
