import { ZooKeeperLockBackend } from '../../lib/backends/zookeeper/zookeeper.backend.js';
import { describeBackendConformance } from '../conformance/lock-backend.conformance.js';
import { useZooKeeper } from '../support/zookeeper-fixture.js';

const fixture = useZooKeeper({ ensemble: true });

describeBackendConformance('zookeeper (three servers)', {
  // Each "process" gets a session of its own, on whichever member the client picks: writes go
  // through the leader, and a waiter may watch through a follower.
  connect: async () => new ZooKeeperLockBackend(fixture.connectionString, { root: fixture.root, sessionTimeout: 4_000 }),
  passedStartsOver: true,
});
