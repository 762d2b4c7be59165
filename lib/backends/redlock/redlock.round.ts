import type { RedlockMaster } from './redlock-master.js';
import type { MasterFailure } from './redlock.errors.js';
import type { LoadedScript, RedlockQuorum } from './redlock.package.js';

/** The votes of one round so far. */
export interface Votes {
  /** Masters where the script applied to every key. */
  readonly granted: RedlockMaster[];
  /** Masters that answered no: another owner holds a key there (or, for a release, nothing of ours). */
  readonly refused: RedlockMaster[];
  /** Masters that did not answer in time, or answered with an error. */
  readonly failures: MasterFailure[];
  /** Masters that have not voted yet. */
  readonly pending: number;
}

/**
 * Reads the votes so far: the answer once the outcome is decided (no vote still out can change
 * it), `undefined` while it is not. Called again after every vote; with every vote in it must
 * answer.
 */
export type Decide<T> = (votes: Votes, total: number) => T | undefined;

/**
 * One script sent to every master at once, answered as soon as `decide` can tell. The package
 * runs the script on each master (by hash, then by text) and counts a master "for" when it
 * returned the number of keys; the counting is ours, so a master that is frozen does not hold up
 * an answer its vote cannot change. `settled` has every vote, each bounded by the master's timeout.
 */
export async function quorumRound<T>(
  redlock: RedlockQuorum,
  masters: readonly RedlockMaster[],
  script: LoadedScript,
  keys: readonly string[],
  args: readonly (string | number)[],
  isRefusal: (error: Error) => boolean,
  decide: Decide<T>,
): Promise<{ answer: T; votes: Votes; settled: Promise<Votes> }> {
  const votes = {
    granted: [] as RedlockMaster[],
    refused: [] as RedlockMaster[],
    failures: [] as MasterFailure[],
    pending: masters.length,
  };
  let settle!: (votes: Votes) => void;
  const settled = new Promise<Votes>((resolve) => (settle = resolve));
  const answer = await new Promise<T>((resolve, reject) => {
    let answered = false;
    const count = () => {
      if (votes.pending === 0) settle(votes);
      if (answered) return;
      try {
        const decided = decide(votes, masters.length);
        if (decided === undefined) return;
        answered = true;
        resolve(decided);
      } catch (error) {
        answered = true;
        reject(error);
      }
    };
    for (const master of masters) {
      void redlock._attemptOperationOnClient(master, script, keys, args).then((result) => {
        votes.pending--;
        if (result.vote === 'for') votes.granted.push(master);
        else if (isRefusal(result.error)) votes.refused.push(master);
        else votes.failures.push({ master: master.name, error: result.error });
        count();
      });
    }
  });
  // The votes that decided, as they stood then; later ones arrive in `settled`.
  return { answer, votes: snapshot(votes), settled };
}

function snapshot(votes: Votes): Votes {
  return { granted: [...votes.granted], refused: [...votes.refused], failures: [...votes.failures], pending: votes.pending };
}
