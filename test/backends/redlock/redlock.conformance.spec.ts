import { afterAll, beforeAll, describe } from '@jest/globals';
import { describeBackendConformance } from '../../conformance/lock-backend.conformance.js';
import { RedlockMasters } from './redlock-masters.js';

for (const count of [3, 5]) {
  describe(`${count} real redis-servers`, () => {
    let masters: RedlockMasters;

    beforeAll(async () => {
      masters = await RedlockMasters.start(count);
    }, 30_000);

    afterAll(() => masters.stop());

    describeBackendConformance(`redlock (${count} masters)`, {
      // Every call opens its own clients, as another process would.
      connect: async () => masters.backend(),
      reset: async () => {
        masters.disconnect();
        await masters.flush();
      },
    });
  });
}
