import { afterAll, beforeAll, describe, expect, it, jest } from '@jest/globals';
import { Logger } from '@nestjs/common';
import { LockBackendError, LockService, PostgresLockBackend } from '../../lib/index.js';
import { usePostgresServer } from '../support/postgres-fixture.js';
import { PostgresServer } from '../support/postgres-server.js';

// A hot standby made from a base backup of the file's server, following it.
const fixture = usePostgresServer({ durable: true });
let standby: PostgresServer;
/** The file's database on the standby. */
let onStandby: string;

beforeAll(async () => {
  // The tables, created on the primary, reach the standby as everything else does.
  const primary = new PostgresLockBackend(fixture.url);
  await primary.inspect('any');
  await primary.close();
  standby = await PostgresServer.startReplica(fixture.server);
  await standby.catchUpWith(fixture.server);
  const url = new URL(fixture.url);
  url.port = String(standby.port);
  onStandby = url.toString();
}, 60_000);
afterAll(async () => {
  await standby?.stop();
});

describe('PostgreSQL backend on a hot standby', () => {
  it('locks are retried within the wait (a failover ends it) and fail with an error that says so; verify() refuses it; health() is down', async () => {
    jest.spyOn(Logger.prototype, 'warn').mockImplementation(() => undefined);
    fixture.cleanup(() => jest.restoreAllMocks());
    const backend = new PostgresLockBackend(onStandby);
    const locks = new LockService(backend, { keyPrefix: '' });
    fixture.cleanup(() => locks.onApplicationShutdown());
    // The acquire asks more than once: the standby's refusal was not taken as final.
    let attempts = 0;
    const tryAcquire = backend.tryAcquire.bind(backend);
    backend.tryAcquire = (...args) => (attempts++, tryAcquire(...args));
    const error = await locks.acquire('order:1', { wait: 1_500 }).catch((e: unknown) => e);
    expect(error).toBeInstanceOf(LockBackendError);
    expect((error as LockBackendError).permanent).toBe(false);
    expect((error as LockBackendError).message).toMatch(/read-only transaction.*in recovery.*connect to the primary/);
    expect(attempts).toBeGreaterThan(1);
    const refused = await backend.verify().catch((e: unknown) => e);
    expect(refused).toMatchObject({ permanent: true, message: expect.stringMatching(/hot standby.*connect to the primary/) });
    expect(await backend.health()).toEqual({
      up: false,
      details: { inRecovery: true, readOnly: true },
      message: expect.stringMatching(/hot standby.*Connect to the primary/),
    });
  });
});
