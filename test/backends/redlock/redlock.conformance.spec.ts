import { afterAll, beforeAll, describe } from '@jest/globals';
import { describeBackendConformance } from '../../conformance/lock-backend.conformance.js';
import { RedlockLockBackend } from '../../../lib/backends/redlock/redlock.backend.js';
import { RedlockMasters } from './redlock-masters.js';

for (const count of [3, 5]) {
  describe(`${count} real redis-servers`, () => {
    let masters: RedlockMasters;

    beforeAll(async () => {
      masters = await RedlockMasters.start(count);
    }, 30_000);

    afterAll(() => masters.stop());

    describeBackendConformance(`redlock (${count} masters)`, {
      // Every call opens its own clients, as another process would: with 3 masters clients we
      // pass in, with 5 URLs the backend connects (and closes) itself.
      connect: async () => (count === 3 ? masters.backend() : new RedlockLockBackend({ clients: masters.urls(), masterTimeout: 2_000 })),
      withoutLine: true,
      reset: async () => {
        masters.disconnect();
        await masters.flush();
      },
    });
  });
}
