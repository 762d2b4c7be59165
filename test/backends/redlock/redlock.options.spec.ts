import { afterAll, describe, expect, it, jest } from '@jest/globals';
import { Logger } from '@nestjs/common';
import { Redis } from 'ioredis';
import { RedlockLockBackend } from '../../../lib/backends/redlock/redlock.backend.js';
import { InvalidLockOptionsError } from '../../../lib/lock.errors.js';

/** Option checks need no server: the clients never connect. */
describe('RedlockLockBackend options', () => {
  const opened: Redis[] = [];
  const client = (port: number) => {
    const created = new Redis({ port, host: '127.0.0.1', lazyConnect: true });
    opened.push(created);
    return created;
  };
  const clients = (count: number) => Array.from({ length: count }, (_, i) => client(7001 + i));

  afterAll(() => opened.forEach((c) => c.disconnect()));

  const rejects = (input: unknown, option: string, message: RegExp) => {
    let error: unknown;
    try {
      new RedlockLockBackend(input as never);
    } catch (e) {
      error = e;
    }
    expect(error).toBeInstanceOf(InvalidLockOptionsError);
    expect((error as InvalidLockOptionsError).option).toBe(option);
    expect((error as Error).message).toMatch(message);
  };

  it('takes a bare array of clients or { clients, ... } and defaults to a majority quorum', () => {
    expect(new RedlockLockBackend(clients(3)).quorum).toBe(2);
    expect(new RedlockLockBackend({ clients: clients(5) }).quorum).toBe(3);
    expect(new RedlockLockBackend({ clients: clients(5), quorum: 4, driftFactor: 0.02, masterTimeout: 50 }).quorum).toBe(4);
    const backend = new RedlockLockBackend(clients(3));
    expect(backend.name).toBe('redlock');
    expect(backend.fencing).toBe(false);
  });

  it('opens clients for redis:// URLs and still refuses one server listed twice', () => {
    const backend = new RedlockLockBackend(['redis://127.0.0.1:7101', 'redis://127.0.0.1:7102', 'rediss://127.0.0.1:7103']);
    expect(backend.quorum).toBe(2);
    void backend.close();
    rejects(
      ['redis://127.0.0.1:7101', 'redis://127.0.0.1:7102', 'redis://127.0.0.1:7101'],
      'clients',
      /clients\[2\] and clients\[0\] both point at 127.0.0.1:7101/,
    );
  });

  it('refuses fewer than three masters and says what to use instead', () => {
    rejects(clients(1), 'clients', /at least 3 independent masters, got 1.*Redis backend/);
    rejects({ clients: clients(2) }, 'clients', /at least 3 independent masters, got 2/);
    rejects({ clients: [] }, 'clients', /got 0/);
  });

  it('refuses a master counted twice, as the same client or the same address', () => {
    const [a, b] = clients(2);
    rejects([a, b, a], 'clients', /clients\[2\] is the same client object as clients\[0\]/);
    rejects([a, b, client(7001)], 'clients', /clients\[2\] and clients\[0\] both point at 127.0.0.1:7001/);
  });

  it('refuses a minority or impossible quorum, bad numbers and unknown options', () => {
    rejects({ clients: clients(5), quorum: 2 }, 'quorum', /from 3 \(a majority of 5 masters\) to 5, got 2.*two owners/);
    rejects({ clients: clients(3), quorum: 4 }, 'quorum', /from 2 .* to 3, got 4/);
    rejects({ clients: clients(3), quorum: 2.5 }, 'quorum', /got 2.5/);
    rejects({ clients: clients(3), driftFactor: -0.1 }, 'driftFactor', /from 0 to below 0.5/);
    rejects({ clients: clients(3), masterTimeout: 0 }, 'masterTimeout', /positive number/);
    rejects({ clients: clients(3), retryCount: 3 }, 'retryCount', /unknown option 'retryCount'/);
    rejects({ clients: 'redis://a' }, 'clients', /must be an array of ioredis clients or redis:\/\/ URLs/);
    rejects([{ get: () => 1 }, client(7010), client(7011)], 'clients', /clients\[0\] is neither an ioredis client .* nor a redis:\/\/ URL/);
    rejects(
      ['localhost:6379', client(7010), client(7011)],
      'clients',
      /clients\[0\] is 'localhost:6379', which has no scheme: write it as 'redis:\/\/localhost:6379'/,
    );
  });

  it('warns about an even number of masters, which buys no extra fault tolerance', () => {
    const warn = jest.spyOn(Logger.prototype, 'warn').mockImplementation(() => undefined);
    try {
      new RedlockLockBackend(clients(4));
      expect(warn).toHaveBeenCalledWith(expect.stringMatching(/4 masters \(an even count\).*Prefer an odd count/));
      warn.mockClear();
      new RedlockLockBackend(clients(5));
      expect(warn).not.toHaveBeenCalled();
    } finally {
      warn.mockRestore();
    }
  });
});
