import { ZooKeeperLockBackend } from '../../lib/backends/zookeeper/zookeeper.backend.js';
import { describeBackendConformance } from '../conformance/lock-backend.conformance.js';
import { deleteZooKeeperLineParent } from '../conformance/zookeeper-line-parent.js';
import { useZooKeeper } from '../support/zookeeper-fixture.js';

const fixture = useZooKeeper();

describeBackendConformance('zookeeper (one server)', {
  // Each "process" gets a backend, and so a session, of its own.
  connect: async () => new ZooKeeperLockBackend(fixture.connectionString, { root: fixture.root, sessionTimeout: 4_000 }),
  passedStartsOver: true,
  deleteLineParent: (key) => deleteZooKeeperLineParent(fixture.connectionString, fixture.root, key),
});
