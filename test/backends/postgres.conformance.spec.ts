import { PostgresLockBackend } from '../../lib/backends/postgres/postgres.backend.js';
import { describeBackendConformance } from '../conformance/lock-backend.conformance.js';
import { usePostgresServer } from '../support/postgres-fixture.js';

const fixture = usePostgresServer();

describeBackendConformance('postgres', {
  // Each "process" gets a backend over a pool of its own, created from the URL and closed by it.
  // The suite's wake-up test polls once a minute: its waiters must keep their place that long.
  connect: async () => new PostgresLockBackend(fixture.url, { waiterTimeout: 120_000 }),
});
