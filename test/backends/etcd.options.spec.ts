import { describe, expect, it } from '@jest/globals';
import { Etcd3 } from 'etcd3';
import { inspect } from 'node:util';
import { EtcdLockBackend } from '../../lib/backends/etcd/etcd.backend.js';
import { InvalidLockOptionsError, LockBackendError } from '../../lib/lock.errors.js';
import { freePort } from '../support/redis-server.js';
import { activeTimers } from '../support/wait.js';

describe('EtcdLockBackend options', () => {
  it('refuses bad options with a typed error that says what to pass, and opens nothing', () => {
    const timers = activeTimers();
    const url = 'http://127.0.0.1:2379';
    const cases: [() => unknown, string, RegExp][] = [
      [() => new EtcdLockBackend(42 as never), 'connection', /expected a connection, got 42\. Pass an Etcd3 client/],
      [() => new EtcdLockBackend(null as never), 'connection', /got null/],
      [() => new EtcdLockBackend([]), 'connection', /the list of member URLs is empty/],
      [() => new EtcdLockBackend('etcd-0:2379'), 'connection', /must start with http:\/\/ or https:\/\//],
      [() => new EtcdLockBackend('not a url'), 'connection', /'not a url' is not a URL/],
      [() => new EtcdLockBackend([url, 7 as never]), 'connection', /a member URL must be a string, got 7/],
      [
        () => new EtcdLockBackend('http://root:s3cret@etcd:2379'),
        'connection',
        /no credentials in its URL.*auth: \{ username, password \}/,
      ],
      // Credentials anywhere in a URL are refused, and never shown.
      [() => new EtcdLockBackend([url, 'https://u:s3cret@etcd:2379']), 'connection', /no credentials in its URL/],
      [() => new EtcdLockBackend({ hosts: 'http://u:s3cret@etcd:2379' }), 'connection', /no credentials in its URL/],
      [() => new EtcdLockBackend('http://etcd:2379/?password=s3cret'), 'connection', /no credentials in its URL/],
      [() => new EtcdLockBackend('http://root:s3cret@[etcd'), 'connection', /'http:\/\/root:\*\*\*@\[etcd' is not a URL/],
      [() => new EtcdLockBackend('root:s3cret@etcd:2379'), 'connection', /must start with http:\/\/ or https:\/\//],
      [() => new EtcdLockBackend(new Map() as never), 'connection', /instance of Map, which is not an Etcd3 client/],
      [() => new EtcdLockBackend({ hosts: [] }), 'connection', /settings need 'hosts'/],
      [
        () => new EtcdLockBackend(url, { prefx: 'x' } as never),
        'prefx',
        /unknown option 'prefx'\. Accepted options: prefix, commandTimeout, waiterTimeout/,
      ],
      [() => new EtcdLockBackend(url, { prefix: '' }), 'prefix', /non-empty string/],
      [() => new EtcdLockBackend(url, { commandTimeout: -1 }), 'commandTimeout', /positive finite number of milliseconds, got -1/],
      [() => new EtcdLockBackend(url, { waiterTimeout: Number.NaN }), 'waiterTimeout', /got NaN/],
      [() => new EtcdLockBackend(url, 'fast' as never), '(options)', /options must be an object/],
    ];
    for (const [create, option, message] of cases) {
      let error: unknown;
      try {
        create();
      } catch (caught) {
        error = caught;
      }
      expect(error).toBeInstanceOf(InvalidLockOptionsError);
      expect((error as InvalidLockOptionsError).option).toBe(option);
      expect((error as Error).message).toMatch(message);
      expect((error as Error).message).not.toContain('s3cret');
    }
    expect(activeTimers()).toBeLessThanOrEqual(timers);
  });

  it('shows its prefix in logs, never its connection settings', async () => {
    const backend = new EtcdLockBackend(
      { hosts: ['http://127.0.0.1:2379'], auth: { username: 'locks', password: 's3cret' } },
      { prefix: 'shop/' },
    );
    expect(inspect(backend)).toBe("EtcdLockBackend { name: 'etcd', prefix: 'shop/', commandTimeout: 2000 }");
    expect(JSON.stringify(backend)).not.toContain('s3cret');
    await backend.close();
  });

  it('an unreachable etcd fails an acquire with a LockBackendError within the command timeout', async () => {
    const backend = new EtcdLockBackend(`http://127.0.0.1:${await freePort()}`, { commandTimeout: 500 });
    const started = Date.now();
    const error = await backend.tryAcquire(['k'], 'owner', 1_000).catch((e: unknown) => e);
    expect(error).toBeInstanceOf(LockBackendError);
    expect((error as Error).message).toMatch(/^Lock backend 'etcd' failed: acquire of k failed: /);
    expect(Date.now() - started).toBeLessThan(3_000);
    await backend.close();
  });

  it('leaves a client it was given open', async () => {
    const client = new Etcd3({ hosts: `http://127.0.0.1:${await freePort()}` });
    const backend = new EtcdLockBackend(client);
    await backend.close();
    expect(() => client.watch()).not.toThrow();
    client.close();
  });
});
