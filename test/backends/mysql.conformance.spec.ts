import { MysqlLockBackend } from '../../lib/backends/mysql/mysql.backend.js';
import { describeBackendConformance } from '../conformance/lock-backend.conformance.js';
import { useMariadbServer } from '../support/mariadb-fixture.js';

const fixture = useMariadbServer();

describeBackendConformance('mysql', {
  // Each "process" gets a backend over a pool of its own, created from the URL and closed by it.
  // The suite's wake-up test polls once a minute: its waiters must keep their place that long.
  connect: async () => new MysqlLockBackend(fixture.url, { waiterTimeout: 120_000 }),
});
