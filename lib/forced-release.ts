import type { LockHolderState } from './backends/lock-backend.interface.js';
import { holderId } from './lock-inspection.js';
import type { LockService } from './lock.service.js';

/** Who lost a key to a forced release, as the store knew them (never the owner token). */
export interface ReleasedHolder {
  instance?: string;
  site?: string;
  fencingToken?: number;
}

/**
 * Takes `key` (without the keyPrefix) away from its holders: the backend's own `inspect()`, then
 * `release()` with each holder's owner token, which is what another instance taking over an expired
 * lease does. Nothing in the holder changes here: it learns at its next extension (its signal aborts
 * with a LockLostError whose reason is 'taken'). With `holder` (its id, as inspect() tells it) or
 * `fencingToken`, only that holder goes: an operator who saw one holder never frees the one that came
 * after it, nor the other readers of a shared key. Returns the holders released; undefined when
 * nobody held the key.
 *
 * One mechanism for every forced release: `revokeLock` (nest-distributed-lock/testing) and the lock
 * board's "force release" both call it.
 */
export async function releaseHolders(
  locks: LockService,
  key: string,
  options: { fencingToken?: number; holder?: string } = {},
): Promise<ReleasedHolder[] | undefined> {
  const [full] = locks.fullKeys(key);
  const state = await locks.backend.inspect(full);
  if (!state) return undefined;
  // Every holder of a key that admits several (a shared lock), else the one.
  const holders: LockHolderState[] = state.holders ?? [{ owner: state.owner, ttlMs: state.ttlMs, fencingToken: state.fencingToken }];
  const chosen = holders.filter(
    (holder) =>
      (options.fencingToken === undefined || holder.fencingToken === options.fencingToken) &&
      (options.holder === undefined || holderId(holder.owner) === options.holder),
  );
  // Compare-and-delete on each owner token: a holder that left meanwhile frees nothing, and nobody else's lease is touched.
  const released = await Promise.all(chosen.map((holder) => locks.backend.release([full], holder.owner)));
  return chosen
    .filter((_, i) => released[i])
    .map(({ instance, site, fencingToken }) => ({
      ...(instance !== undefined && { instance }),
      ...(site !== undefined && { site }),
      ...(fencingToken !== undefined && { fencingToken }),
    }));
}
