import { MemoryLockBackend } from '../../lib/backends/memory.backend.js';
import { describeBackendConformance } from '../conformance/lock-backend.conformance.js';

let backend = new MemoryLockBackend();

describeBackendConformance('memory', {
  // One process shares one store: every "client" is the same instance.
  connect: async () => backend,
  reset: async () => {
    backend = new MemoryLockBackend();
  },
});
