import { RedisLockBackend } from '../../lib/backends/redis/redis.backend.js';
import { describeBackendConformance } from '../conformance/lock-backend.conformance.js';
import { useRedisServer } from '../support/redis-fixture.js';

// The suite empties the store itself (reset), once it closed its clients.
const fixture = useRedisServer({ flush: false });

describeBackendConformance('redis', {
  // Each "process" gets a backend over a client of its own, created from the URL and closed by it.
  // The suite's wake-up test polls once a minute: its waiters must keep their place that long.
  connect: async () => new RedisLockBackend(fixture.server.url, { waiterTimeout: 120_000 }),
  reset: async () => void (await fixture.admin.flushall()),
});
