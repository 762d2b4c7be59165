import { Injectable } from '@nestjs/common';
import { setTimeout as sleep } from 'node:timers/promises';
import { LockService, Locked, type LockHandle } from '../lib/index.js';
import type { FencedRegister } from './fenced-register.js';
import { now, type HistoryEvent } from './history.js';

/** What a caller's calls need from its process: the run's settings, its random numbers, its log. */
export interface CallContext {
  ttl: number;
  wait: number;
  /** Longest pause between a read and its write, and between two rounds of a section. */
  workMs: number;
  /** Off: the register takes every write and the holder never looks at its lock (the run must then fail). */
  fencing: boolean;
  register: FencedRegister;
  next: () => number;
  log: (event: HistoryEvent) => void;
  /** How long the process could not run since `since` (its timers fired late). */
  stalledSince: (since: number) => number;
  /** Port of the store server the backend's connection is on, when the store has one. */
  server: () => number | undefined;
  /** The backend holds shared locks and semaphores (sharedHolders): the calls of those kinds run too. */
  shared: boolean;
}

/** How many holders the semaphore of a 'permit' call admits. */
export const SEMAPHORE_PERMITS = 2;

/**
 * The kinds of call a caller makes, each a promise of the library exercised under faults: a plain
 * section, one that re-enters through a nested @Locked method or `using()`, one over two keys, one
 * with `autoExtend: false` and a long ttl, with minHold, with maxHold, and a wait aborted midway.
 * Weights: how often each is drawn.
 */
export const CALL_KINDS = {
  plain: 38,
  nested: 12,
  'using-reentry': 10,
  'multi-key': 10,
  'no-extend': 8,
  'min-hold': 7,
  'max-hold': 7,
  'abort-wait': 8,
  /** A reader: a shared lock on the register's key, reading it beside other readers. */
  read: 30,
  /** A holder of one of the permits of the run's one semaphore (`permits:pool`), writing nothing. */
  permit: 40,
} as const;
/** The kinds a backend without shared holders does not run. */
const SHARED_KINDS: ReadonlySet<CallKind> = new Set<CallKind>(['read', 'permit']);
export type CallKind = keyof typeof CALL_KINDS;

/** A key's register name (`register:<key>`) as a lock key, and its full key (default prefix). */
const lockKey = (key: string) => `register:${key}`;
const fullKey = (key: string) => `lock:register:${key}`;
/**
 * The semaphore every permit call shares (its holds apart from the registers' locks): one key,
 * so that more callers want a permit at once than there are permits.
 */
const PERMIT_KEY = 'pool';
const permitKey = (key: string) => `permits:${key}`;

type Body = (handle: LockHandle) => Promise<void>;

function lost(): never {
  throw new Error('the lock was lost before the section started');
}

/**
 * The @Locked methods: their options are fixed per method, so each kind with options of its own
 * has one. The handle comes from `locks.current()`, undefined when the lease ran out between the
 * acquisition and the body (a stall longer than the ttl): the body then must not run.
 */
export function registerWriter(ttl: number, shared: boolean): new (locks: LockService) => { locks: LockService; [kind: string]: unknown } {
  @Injectable()
  class RegisterWriter {
    constructor(readonly locks: LockService) {}

    protected handle(key: string): LockHandle {
      return this.locks.current(lockKey(key)) ?? lost();
    }

    @Locked('register:<key>')
    async plain(key: string, body: Body): Promise<void> {
      await body(this.handle(key));
    }

    /** Enters again through another @Locked method of the same key; the outer goes on after the inner returns. */
    @Locked('register:<key>')
    async nested(key: string, body: (handle: LockHandle, again: (inner: Body) => Promise<void>) => Promise<void>): Promise<void> {
      await body(this.handle(key), (inner) => this.plain(key, inner));
    }

    @Locked('register:<key>', { autoExtend: false, ttl: ttl * 3 })
    async noExtend(key: string, body: Body): Promise<void> {
      await body(this.handle(key));
    }

    @Locked('register:<key>', { minHold: ttl / 2 })
    async minHold(key: string, body: Body): Promise<void> {
      await body(this.handle(key));
    }

    @Locked('register:<key>', { maxHold: ttl * 2 })
    async maxHold(key: string, body: Body): Promise<void> {
      await body(this.handle(key));
    }
  }

  @Injectable()
  class SharedRegisterWriter extends RegisterWriter {
    @Locked('register:<key>', { mode: 'shared' })
    async read(key: string, body: Body): Promise<void> {
      await body(this.handle(key));
    }

    @Locked('permits:<key>', { permits: SEMAPHORE_PERMITS })
    async permit(key: string, body: Body): Promise<void> {
      await body(this.locks.current(permitKey(key)) ?? lost());
    }
  }
  return (shared ? SharedRegisterWriter : RegisterWriter) as never;
}

interface Writer {
  locks: LockService;
  plain(key: string, body: Body): Promise<void>;
  nested(key: string, body: (handle: LockHandle, again: (inner: Body) => Promise<void>) => Promise<void>): Promise<void>;
  noExtend(key: string, body: Body): Promise<void>;
  minHold(key: string, body: Body): Promise<void>;
  maxHold(key: string, body: Body): Promise<void>;
  read(key: string, body: Body): Promise<void>;
  permit(key: string, body: Body): Promise<void>;
}

/**
 * One call of a caller: draws its kind and its hold time, logs the attempt, the acquisition (per
 * key), every write, the loss of the lock (when its signal aborted) and the release.
 */
export async function oneCall(ctx: CallContext, writerOf: unknown, holder: string, worker: string, keys: string[]): Promise<void> {
  const writer = writerOf as Writer;
  const kind = drawKind(ctx.next, ctx.shared);
  const drawn = kind === 'multi-key' && keys.length > 1 ? keys : keys.slice(0, 1);
  // A permit holder's holds are on its semaphore's key; every other call's on the register's.
  const callKeys = kind === 'permit' ? [permitKey(PERMIT_KEY)] : drawn;
  const key = callKeys[0];
  const startedAt = now();
  const stalledAtStart = ctx.stalledSince(0);
  for (const k of callKeys) ctx.log({ t: startedAt, type: 'attempt', holder, worker, key: k, waitMs: ctx.wait, kind });
  const ttl = kind === 'no-extend' ? ctx.ttl * 3 : ctx.ttl;
  // A quarter of sections outlive several extensions (up to 3.5 ttl); half are short.
  const r = ctx.next();
  const holdMs =
    kind === 'max-hold'
      ? ctx.ttl * 3 // longer than maxHold (2 ttl): the lock is taken from the holder, which must stop
      : kind === 'no-extend'
        ? Math.floor(ctx.next() * ttl * 0.6)
        : r < 0.5
          ? Math.floor(ctx.next() * ctx.workMs)
          : r < 0.75
            ? Math.floor(ctx.ttl / 3 + ctx.next() * ctx.ttl)
            : Math.floor(ctx.ttl + ctx.next() * ctx.ttl * 2.5);
  let entered = false;
  const enter = (handle: LockHandle) => {
    entered = true;
    for (const k of callKeys)
      ctx.log({
        t: now(),
        type: 'acquired',
        holder,
        worker,
        key: k,
        token: callKeys.length > 1 ? handle.fencingTokenFor(fullKey(k)) : handle.fencingToken,
        deadline: now() + (handle.expiresAt.getTime() - Date.now()),
        server: ctx.server(),
        stalledMs: Math.round(ctx.stalledSince(stalledAtStart)),
        ...(kind === 'read' && { mode: 'shared' as const }),
        ...(kind === 'permit' && { mode: 'permits' as const, permits: SEMAPHORE_PERMITS }),
        ttl,
        autoExtend: kind !== 'no-extend',
        minHold: kind === 'min-hold' ? ctx.ttl / 2 : undefined,
        maxHold: kind === 'max-hold' ? ctx.ttl * 2 : undefined,
      });
    const onLost = () => {
      const reason = (handle.signal.reason as { reason?: string }).reason ?? 'unknown';
      for (const k of callKeys)
        ctx.log({ t: now(), type: 'lost', holder, worker, key: k, reason, deadline: now() + (handle.expiresAt.getTime() - Date.now()) });
    };
    handle.signal.addEventListener('abort', onLost, { once: true });
    return () => handle.signal.removeEventListener('abort', onLost);
  };
  const until = () => startedAt + holdMs;
  const section =
    (share: number): Body =>
    async (handle) => {
      const end = now() + Math.max(0, until() - now()) * share;
      do {
        if (kind === 'read') await readRound(ctx, handle, callKeys);
        else if (kind !== 'permit') await round(ctx, handle, holder, worker, callKeys);
        else if (ctx.fencing) handle.throwIfLost();
      } while (now() < end && (!ctx.fencing || !handle.signal.aborted) && (await pause(ctx, handle, end)));
    };
  /** The outermost body: logs the acquisition, the loss and the release around `body`. */
  const held =
    (body: Body): Body =>
    async (handle) => {
      const stop = enter(handle);
      try {
        await body(handle);
      } finally {
        stop();
        // Stamped before the release goes out: the next holder may get the lock (and say so)
        // before this process's code after the release runs.
        for (const k of callKeys) ctx.log({ t: now(), type: 'released', holder, worker, key: k });
      }
    };
  const whole = held(section(1));
  try {
    switch (kind) {
      case 'nested':
        // The inner @Locked method's exit must not release the outer lock: the outer writes after it.
        await writer.nested(key, (outer, again) =>
          held(async (handle) => {
            await section(0.3)(handle);
            await again(section(0.3));
            await section(1)(handle);
          })(outer),
        );
        break;
      case 'using-reentry':
        await writer.plain(
          key,
          held(async (handle) => {
            await section(0.3)(handle);
            // Re-enters through `using()`: the inner scope's exit must not release the outer lock.
            await writer.locks.using(lockKey(key), (inner) => section(0.4)(inner));
            await section(1)(handle);
          }),
        );
        break;
      case 'multi-key':
        await writer.locks.using(callKeys.map(lockKey), whole);
        break;
      case 'no-extend':
        await writer.noExtend(key, whole);
        break;
      case 'min-hold':
        await writer.minHold(key, whole);
        break;
      case 'max-hold':
        await writer.maxHold(key, whole);
        break;
      case 'read':
        await writer.read(key, whole);
        break;
      case 'permit':
        await writer.permit(PERMIT_KEY, whole);
        break;
      case 'abort-wait':
        // Gives up waiting somewhere within the wait: the call must leave the line.
        await writer.locks.using(lockKey(key), whole, { signal: AbortSignal.timeout(1 + Math.floor(ctx.next() * ctx.wait)) });
        break;
      default:
        await writer.plain(key, whole);
    }
  } catch (error) {
    // A lock lost mid-section ends it with its LockLostError: the holder obeying its signal.
    const name = (error as Error)?.constructor?.name ?? typeof error;
    const message = String((error as Error)?.message ?? error).slice(0, 200);
    for (const k of callKeys)
      ctx.log({
        t: now(),
        type: 'error',
        holder,
        worker,
        key: k,
        error: name,
        message,
        stalledMs: Math.round(ctx.stalledSince(stalledAtStart)),
        entered,
      });
  }
}

function drawKind(next: () => number, shared: boolean): CallKind {
  const kinds = (Object.entries(CALL_KINDS) as [CallKind, number][]).filter(([kind]) => shared || !SHARED_KINDS.has(kind));
  let r = next() * kinds.reduce((sum, [, weight]) => sum + weight, 0);
  for (const [kind, weight] of kinds) if ((r -= weight) < 0) return kind;
  return 'plain';
}

/**
 * One read-modify-write of each key's register, as a careful holder does it: `throwIfLost()`
 * before each write (unless fencing is off: then it never looks). A holder relies on being told:
 * a lock that went away without its signal aborting lets it go on writing.
 */
async function round(ctx: CallContext, handle: LockHandle, holder: string, worker: string, keys: string[]): Promise<void> {
  for (const key of keys) {
    // Logged for the checker; the register sees it only with fencing on.
    const token = keys.length > 1 ? handle.fencingTokenFor(fullKey(key)) : handle.fencingToken;
    const fence = ctx.fencing ? token : undefined;
    if (ctx.fencing) handle.throwIfLost();
    const sentAt = now();
    const value = await ctx.register.read(key, fence);
    if (value === undefined) {
      ctx.log({ t: sentAt, type: 'write', holder, worker, key, token, read: -1, wrote: -1, accepted: false });
      return;
    }
    await sleep(Math.floor(ctx.next() * ctx.workMs));
    // What a careful holder does before each write under the lock (the documented way: it throws
    // the LockLostError of the signal, which ends the section).
    if (ctx.fencing) handle.throwIfLost();
    const writtenAt = now();
    const seq = await ctx.register.write(key, fence, value + 1, holder);
    ctx.log({ t: writtenAt, type: 'write', holder, worker, key, token, read: value, wrote: value + 1, accepted: seq !== undefined, seq });
  }
}

/**
 * A reader's round: the register read beside other readers (`peek`), refused only after a newer
 * write; its token is seen from then on, so a writer whose lease ran out meanwhile cannot write.
 */
async function readRound(ctx: CallContext, handle: LockHandle, keys: string[]): Promise<void> {
  for (const key of keys) {
    if (ctx.fencing) handle.throwIfLost();
    await ctx.register.peek(key, ctx.fencing ? handle.fencingToken : undefined);
  }
}

/** Waits between two rounds, at most until `end`; false (the section ends) when the lock was lost meanwhile. */
async function pause(ctx: CallContext, handle: LockHandle, end: number): Promise<boolean> {
  const ms = Math.min(Math.floor(ctx.next() * ctx.workMs), Math.max(0, end - now()));
  if (!ctx.fencing) return sleep(ms).then(() => true);
  return sleep(ms, undefined, { signal: handle.signal }).then(
    () => true,
    () => false,
  );
}
