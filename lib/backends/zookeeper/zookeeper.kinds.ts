import { SHARED } from '../lock-backend.interface.js';

/**
 * Shared locks and semaphores in one ZooKeeper line, as ZooKeeper's own recipe for shared locks:
 * every caller of a key, whatever its kind, has a sequential ephemeral node in the key's line, and
 * the node's name carries its kind. Who holds the key, and which single node a waiter watches, both
 * follow from the line alone (less its pending nodes, zookeeper.pending.ts), so every process reads
 * the same answer from the same children.
 *
 * Names: `<owner>-<sequence>` for an exclusive lock (the writer: the names exclusive locks always
 * had, so processes of an earlier version on the same ensemble still agree on them),
 * `<owner>.read-<sequence>` for a shared lock, `<owner>.permits<n>-<sequence>` for a semaphore of n.
 * An owner is percent-encoded with `.` escaped too, so the first `.` starts the kind.
 */

/** The part of a node's name between the owner and the sequence number that tells its limit. */
export function kindSuffix(limit: number): string {
  if (limit === 1) return '';
  return limit === SHARED ? '.read' : `.permits${limit}`;
}

/** The owner (decoded) and limit a line entry's name carries; undefined for a name that is no line entry. */
export function parseEntry(name: string): { owner: string; limit: number } | undefined {
  const match = /^([^.]+)(?:\.([^-]*))?-\d{10}$/.exec(name);
  if (!match) return undefined;
  return { owner: decodeURIComponent(match[1]), limit: limitOf(match[2]) };
}

function limitOf(kind: string | undefined): number {
  if (kind === undefined) return 1;
  if (kind === 'read') return SHARED;
  const permits = /^permits(\d+)$/.exec(kind);
  // A kind this version does not know (a later one's) is taken as a writer: it keeps everyone out.
  return permits && Number(permits[1]) > 1 ? Number(permits[1]) : 1;
}

/**
 * Where one node stands in its line (names in line order):
 * - `in`: it holds the key (as far as this line goes); `mark`: a permit caller right behind it
 *   may be watching it as a waiter, to take its turn at watching the holders once it enters;
 * - `mismatch`: the earliest reader or permit caller ahead has another limit (a semaphore of
 *   another size, or shared against permits);
 * - `waitFor`: the nodes to watch, and whether their data being set (a mark) counts as well as
 *   their deletion.
 */
export type LineStanding =
  { in: true; mark: boolean } | { in: false; mismatch: number } | { in: false; waitFor: string[]; marks: boolean } | { gone: true };

/**
 * The rule of who enters, the same as every backend's (docs/shared-locks.md), read off the line:
 * the node at index i holds when i + 1 is at most the limit of every node up to it. Every node
 * ahead counts as in, so nobody passes a waiter (a queued writer blocks later readers, a queued
 * permit caller blocks later ones), and who holds is always a prefix of the line: once in, a node
 * stays in while the nodes ahead of it leave.
 *
 * A waiter watches the nodes whose deletion can let it in, no others:
 * - a writer: the node just before it (it needs the key empty);
 * - a reader: the nearest writer ahead (everything between is readers, who let it in);
 * - a permit caller behind a writer, close enough that the writer's going lets it in: the writer;
 * - the first permit caller behind n permit holders: those n holders, as any one of them going
 *   lets it in (their marks are not its business);
 * - any later permit caller: the one just before it, for its deletion or its mark: the mark says
 *   that one went in, and this one is now first to wait, to watch the holders in its place.
 */
export function lineStanding(line: readonly string[], name: string, limit: number): LineStanding {
  const at = line.indexOf(name);
  if (at < 0) return { gone: true };
  const limits = effectiveLimits(line.slice(0, at + 1));
  if (limit > 1) {
    const theirs = limits.slice(0, at).find((l) => l > 1);
    if (theirs !== undefined && theirs !== limit) return { in: false, mismatch: theirs };
  }
  if (at + 1 <= Math.min(...limits)) {
    const behind = line[at + 1] === undefined ? undefined : parseEntry(line[at + 1])?.limit;
    return { in: true, mark: limit > 1 && limit !== SHARED && behind === limit };
  }
  const before = (i: number) => ({ in: false as const, waitFor: [line[i]], marks: false });
  if (limit === 1) return before(at - 1);
  // Not in, so something ahead is a writer or (for a semaphore) n holders.
  const writer = lastIndex(limits, at, (l) => l === 1);
  if (limit === SHARED) return before(writer);
  if (writer >= 0 && at - 1 < limit) return before(writer);
  if (writer < 0 && at === limit) return { in: false, waitFor: line.slice(0, at), marks: false };
  return { in: false, waitFor: [line[at - 1]], marks: limits[at - 1] !== 1 };
}

/**
 * The limits the rule counts with: the earliest reader or permit caller says what the key is, and
 * a later one that disagrees with it counts as a writer. It leaves as soon as it looks (its caller
 * gets limitMismatch); one whose process died before it looked keeps everyone behind it waiting
 * until its session ends, as a dead writer does, and refuses nobody.
 */
function effectiveLimits(line: readonly string[]): number[] {
  let key: number | undefined;
  return line.map((entry) => {
    const limit = parseEntry(entry)?.limit ?? 1;
    if (limit === 1) return 1;
    key ??= limit;
    return limit === key ? limit : 1;
  });
}

/** The last index before `end` whose limit passes `test`, or -1. */
function lastIndex(limits: readonly number[], end: number, test: (limit: number) => boolean): number {
  for (let i = end - 1; i >= 0; i--) if (test(limits[i])) return i;
  return -1;
}
