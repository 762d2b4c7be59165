import { EtcdLockBackend } from '../../lib/backends/etcd/etcd.backend.js';
import { describeBackendConformance } from '../conformance/lock-backend.conformance.js';
import { useEtcdCluster } from '../support/etcd-fixture.js';

const fixture = useEtcdCluster({ members: 1 });

describeBackendConformance('etcd (one member)', {
  // Each "process" gets a client of its own, created from the URL and closed by the backend.
  connect: async () => new EtcdLockBackend(fixture.endpoints[0]),
  // Its tokens are entries' create revisions: a caller passed on a later key starts over (see the suite).
  passedStartsOver: true,
});
