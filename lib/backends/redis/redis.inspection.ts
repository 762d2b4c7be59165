import { decodeIdentity } from '../../lock-identity.js';
import { SHARED, type LockHolderState, type LockState, type LockWaiterState } from '../lock-backend.interface.js';

/** INSPECT's answer (see INSPECT in redis.lease-scripts.ts). */
export type InspectReply = [null] | [string, number, string | null, (string | null)[], number, string | null, (string | null)[]];

/** `<written at, ms> <instance>\n<site>`: the time and who. */
function stamped(value: string | null | undefined): { at?: number } & ReturnType<typeof decodeIdentity> {
  if (!value) return {};
  const space = value.indexOf(' ');
  const at = Number(value.slice(0, space));
  return { ...(Number.isFinite(at) && at > 0 && { at }), ...decodeIdentity(value.slice(space + 1)) };
}

/** The key's state from INSPECT's answer, its holders and line with who they are. */
export function inspectReply(key: string, reply: InspectReply): LockState | undefined {
  if (reply[0] === null) return undefined;
  const [value, pttl, token, shared, now, holderString, line] = reply;
  const fencingToken = token === null ? undefined : Number(token);
  const waiters: LockWaiterState[] = [];
  for (let i = 0; i < line.length; i += 4) {
    const limit = line[i + 2] === 'shared' ? SHARED : Number(line[i + 2]);
    const { instance, site } = stamped(line[i + 3]);
    waiters.push({
      owner: line[i]!,
      waitingSince: Math.floor(Number(line[i + 1]) / 1_000),
      ...(limit !== 1 && { limit }),
      ...(instance !== undefined && { instance }),
      ...(site !== undefined && { site }),
    });
  }
  if (value.charCodeAt(0) !== 42) {
    // Held alone: the holder string tells who, if it names this owner (a process of an earlier
    // version writes none, and a release may leave the last one's behind).
    const ttlMs = pttl >= 0 ? pttl : Number.POSITIVE_INFINITY;
    const named = holderString?.startsWith(`${value} `) ? stamped(holderString.slice(value.length + 1)) : {};
    const holder: LockHolderState = { owner: value, ttlMs, fencingToken, ...identityOf(named) };
    return { key, owner: value, ttlMs, fencingToken, holders: [holder], waiters };
  }
  // Several holders (the lock holds `*shared` or `*<permits>`): their own leases, longest last.
  const holders: LockHolderState[] = [];
  for (let i = 0; i < shared.length; i += 3) {
    // A lease ends when the server's clock in whole ms reaches its end (see leaseEnd): what is left
    // for sure is one ms less than the difference, `now` having dropped the µs.
    holders.push({ owner: shared[i]!, ttlMs: Number(shared[i + 1]) - now - 1, ...identityOf(stamped(shared[i + 2])) });
  }
  if (holders.length === 0) return undefined;
  const limit = value === '*shared' ? SHARED : Number(value.slice(1));
  return { key, owner: holders[0].owner, ttlMs: holders[holders.length - 1].ttlMs, fencingToken, limit, holders, waiters };
}

function identityOf({ at, instance, site }: ReturnType<typeof stamped>): Partial<LockHolderState> {
  return { ...(at !== undefined && { acquiredAt: at }), ...(instance !== undefined && { instance }), ...(site !== undefined && { site }) };
}
