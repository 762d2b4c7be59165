import { EtcdLockBackend } from '../../lib/backends/etcd/etcd.backend.js';
import { describeBackendConformance } from '../conformance/lock-backend.conformance.js';
import { useEtcdCluster } from '../support/etcd-fixture.js';

const fixture = useEtcdCluster({ members: 3 });

describeBackendConformance('etcd (three members)', {
  // Each "process" gets a client of every member, as a service in production is configured.
  connect: async () => new EtcdLockBackend(fixture.endpoints),
  // Its tokens are entries' create revisions: a caller passed on a later key starts over (see the suite).
  passedStartsOver: true,
});
