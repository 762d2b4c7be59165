import { releaseHolders } from '../forced-release.js';
import type { LockService } from '../lock.service.js';

/**
 * Takes `key` (as your code names it, without the `keyPrefix`) away from whoever holds it, through
 * the backend's own `inspect()` and `release()` with the holder's owner token: what another
 * instance taking over an expired lease, or an operator freeing the key, does to a holder. Nothing
 * in the holder changes here. It learns at its watchdog's next extension (about a third of its
 * ttl after the last one), as it would in production: its `signal` aborts with a LockLostError
 * whose reason is 'taken', `isHeld` turns false, and `extend()` and `throwIfLost()` throw it. The
 * key is free meanwhile, so another caller may take it. The lock board's "force release" does the
 * same.
 *
 * Throws when nobody holds the key: a test that revokes a free key is not testing what it says.
 */
export async function revokeLock(locks: LockService, key: string): Promise<void> {
  const released = await releaseHolders(locks, key);
  if (!released) {
    const [full] = locks.fullKeys(key);
    throw new Error(
      `revokeLock: nobody holds '${key}' (${full}), so there is nothing to take away. Call it while the holder runs, ` +
        `e.g. after \`await recorder.waitFor('acquired', '${key}')\`.`,
    );
  }
}
