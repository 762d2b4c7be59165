import { afterAll, beforeAll, describe, expect, it } from '@jest/globals';
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
  it('locks fail at once with a permanent error that says to connect to the primary; verify() and health() say so', async () => {
    const locks = new LockService(new PostgresLockBackend(onStandby), { keyPrefix: '' });
    fixture.cleanup(() => locks.onApplicationShutdown());
    // Retried, it would wait 10 minutes, far past the test's timeout.
    const error = await locks.acquire('order:1', { wait: 600_000 }).catch((e: unknown) => e);
    expect(error).toBeInstanceOf(LockBackendError);
    expect((error as LockBackendError).permanent).toBe(true);
    expect((error as LockBackendError).message).toMatch(/read-only transaction.*connect to the primary/);
    await expect(locks.backend.verify!()).rejects.toMatchObject({ permanent: true });
    expect(await locks.backend.health!()).toEqual({
      up: false,
      details: { inRecovery: true, readOnly: true },
      message: expect.stringMatching(/hot standby.*Connect to the primary/),
    });
  });
});
