import { Inject, Injectable, Logger, type OnModuleDestroy, type OnModuleInit } from '@nestjs/common';
import { ModuleRef } from '@nestjs/core';
import { Observable, Subject, takeUntil } from 'rxjs';
import { releaseHolders, type ReleasedHolder } from '../forced-release.js';
import { LockModuleNotImportedError } from '../lock.errors.js';
import type { LockInfo } from '../lock-inspection.js';
import type { LockKind } from '../lock-mode.js';
import { LockService } from '../lock.service.js';
import { LockContention, type LockContentionCounts } from './lock-contention.js';
import { LOCK_BOARD_OPTIONS, type ResolvedLockBoardOptions } from './lock-board.options.js';

/** One held key as the board shows it. Owner tokens, connection details and argument values are never in it. */
export interface LockBoardRow {
  key: string;
  mode: LockKind;
  limit: number | null;
  holders: { id: string; instance?: string; site?: string; ageMs?: number; ttlMs: number; fencingToken?: number; here: boolean }[];
  /** First first; absent when the backend does not keep a line. */
  waiters?: { instance?: string; site?: string; waitingMs?: number; mode: LockKind }[];
  contention: LockContentionCounts;
}

/** What the page draws on each refresh. */
export interface LockBoardSnapshot {
  /** When it was read, ms since the epoch. */
  at: number;
  /** The backend's name ('redis', 'postgres'), never its address. */
  backend: string;
  /** This process's instance name. */
  instance: string;
  prefix: string;
  /** False when the backend cannot list keys: `prefix` is then looked up as one exact key. */
  listing: boolean;
  locks: LockBoardRow[];
  /** More keys are held under the prefix than the page shows. */
  more: boolean;
  /** The most contended keys of the window, held or not. */
  contended: (LockContentionCounts & { key: string })[];
  contentionWindowMs: number;
  forceRelease: boolean;
}

/** What the board needs of an open stream's response: Node's, under Express and Fastify alike. */
export interface StreamResponse {
  readonly writableFinished: boolean;
  readonly socket?: { end(): unknown } | null;
  once(event: 'close' | 'finish', listener: () => void): this;
}

/** Keys inspected at once for one snapshot: a page of 100 keys is 100 reads, not 100 at the same moment. */
const INSPECT_CONCURRENCY = 16;

/**
 * What the lock board reads: one page of held keys with their holders and lines (LockService.list
 * and inspect), and what this process's lock events tell about contention. Read-only but for
 * forceRelease, which the module routes only when the app enables it.
 */
@Injectable()
export class LockBoardService implements OnModuleInit, OnModuleDestroy {
  private locks!: LockService;
  private contention!: LockContention;
  private readonly logger = new Logger('LockBoard');
  /** Snapshots being read or just read, per prefix: open pages share them instead of each reading the store. */
  private readonly recent = new Map<string, { at: number; snapshot: Promise<LockBoardSnapshot> }>();
  private readonly closing = new Subject<void>();
  /** The responses of open event streams. */
  private readonly streams = new Set<StreamResponse>();

  constructor(
    @Inject(LOCK_BOARD_OPTIONS) readonly options: ResolvedLockBoardOptions,
    @Inject(ModuleRef) private readonly modules: ModuleRef,
  ) {}

  onModuleInit(): void {
    // Found wherever DistributedLockModule is imported, global or not: one LockService per application.
    let locks: LockService | undefined;
    try {
      locks = this.modules.get(LockService, { strict: false });
    } catch {
      // Below, with what to do.
    }
    if (!locks) {
      throw new LockModuleNotImportedError(
        'LockBoardModule shows the locks of DistributedLockModule, which this application does not import. Import ' +
          'DistributedLockModule.forRoot(...) (or forRootAsync) in the root module.',
      );
    }
    this.locks = locks;
    if (this.options.guards.length === 0) {
      this.logger.warn(
        `The lock board at ${this.options.path} has no guard of its own: whoever reaches the app can read who holds which ` +
          `lock, unless a global guard stops them. Pass LockBoardModule.forRoot({ guard }) with your app's auth guard.`,
      );
    }
    const { contentionWindowMs: windowMs } = this.options;
    this.contention = new LockContention(locks.events, { windowMs, maxKeys: 1_000, keyPrefix: locks.options.keyPrefix });
  }

  /**
   * Open pages' streams end here, and their responses are finished before the HTTP server closes:
   * it waits for connections that are not idle, and a board left open in a browser would otherwise
   * hold up the application's shutdown for good (or until the keep-alive timeout, once ended late).
   */
  async onModuleDestroy(): Promise<void> {
    // Taken first: a stream leaves the set as it completes.
    const open = [...this.streams];
    this.closing.next();
    this.closing.complete();
    this.contention?.stop();
    // Each connection closes once its stream is written out: kept alive, an idle connection would
    // still hold up the server's close until its keep-alive timeout.
    const finished = open.map(
      (response) =>
        new Promise<void>((resolve) => {
          const done = () => {
            response.socket?.end();
            resolve();
          };
          if (response.writableFinished) done();
          else response.once('close', done).once('finish', done);
        }),
    );
    let timer: NodeJS.Timeout | undefined;
    // Bounded: a response that cannot finish (a client that stopped reading) must not stop shutdown either.
    await Promise.race([Promise.all(finished), new Promise((resolve) => (timer = setTimeout(resolve, 1_000)))]);
    clearTimeout(timer);
  }

  /** `source` until the application shuts down; `response` (Node's) is finished before the server closes. */
  untilShutdown<T>(source: Observable<T>, response: StreamResponse): Observable<T> {
    return new Observable<T>((subscriber) => {
      this.streams.add(response);
      const subscription = source.pipe(takeUntil(this.closing)).subscribe(subscriber);
      return () => {
        subscription.unsubscribe();
        this.streams.delete(response);
      };
    });
  }

  /**
   * The held keys under `prefix` (at most maxKeys). `shared`: a snapshot read for another open page
   * less than half a refresh ago will do, so many open pages do not each read the store.
   */
  snapshot(prefix: string, shared = false): Promise<LockBoardSnapshot> {
    const now = Date.now();
    for (const [cached, entry] of this.recent) if (now - entry.at > this.options.refreshMs / 2) this.recent.delete(cached);
    const recent = this.recent.get(prefix);
    if (recent && shared) return recent.snapshot;
    const snapshot = this.read(prefix);
    this.recent.set(prefix, { at: now, snapshot });
    snapshot.catch(() => this.recent.delete(prefix));
    return snapshot;
  }

  /** Emits on each lock event of this process, so an open page shows a local change before its next refresh. */
  changes(): Observable<void> {
    return new Observable<void>((subscriber) => {
      const next = () => subscriber.next();
      const stops = (['acquired', 'released', 'busy', 'lost'] as const).map((event) => this.locks.events.on(event, next));
      return () => stops.forEach((stop) => stop());
    });
  }

  /**
   * Frees `key` from the holder the page showed (its id), logged with who asked.
   * The holder learns at its next extension, like any takeover. Undefined when nobody (or not that
   * holder) held it.
   */
  async forceRelease(key: string, holder: string, who: string): Promise<ReleasedHolder[] | undefined> {
    const released = await releaseHolders(this.locks, key, { holder });
    const holders = released?.map(describeHolder).join('; ');
    if (released?.length) this.logger.warn(`Force release of '${key}' by ${who}: took it from ${holders}.`);
    else
      this.logger.log(`Force release of '${key}' by ${who}: nothing to release (${released ? 'that holder is gone' : 'the key is free'}).`);
    this.recent.clear();
    return released?.length ? released : undefined;
  }

  private async read(prefix: string): Promise<LockBoardSnapshot> {
    const { maxKeys, contentionWindowMs, forceRelease } = this.options;
    const listing = this.locks.backend.list !== undefined;
    let keys: string[];
    let more = false;
    if (listing) {
      const page = await this.locks.list({ prefix, limit: maxKeys });
      keys = page.keys;
      more = page.cursor !== undefined;
    } else keys = prefix === '' ? [] : [prefix];
    const infos: (LockInfo | undefined)[] = [];
    for (let i = 0; i < keys.length; i += INSPECT_CONCURRENCY) {
      infos.push(...(await Promise.all(keys.slice(i, i + INSPECT_CONCURRENCY).map((key) => this.locks.inspect(key)))));
    }
    const now = Date.now();
    const locks = keys.flatMap((key, i) => {
      const info = infos[i];
      // Released between the listing and its inspection.
      return info ? [this.row(key, info, now)] : [];
    });
    locks.sort((a, b) => (a.key < b.key ? -1 : a.key > b.key ? 1 : 0));
    const { backend, options } = this.locks;
    return {
      at: now,
      backend: backend.name,
      instance: options.instance,
      prefix,
      listing,
      locks,
      more,
      contended: this.contention.top(10),
      contentionWindowMs,
      forceRelease,
    };
  }

  private row(key: string, info: LockInfo, now: number): LockBoardRow {
    return {
      key,
      mode: info.mode,
      // JSON has no Infinity: a shared lock's limit goes as null.
      limit: Number.isFinite(info.limit) ? info.limit : null,
      holders: info.holders.map(({ id, instance, site, acquiredAt, ttlMs, fencingToken, heldHere }) => ({
        id,
        ...(instance !== undefined && { instance }),
        ...(site !== undefined && { site }),
        ...(acquiredAt !== undefined && { ageMs: Math.max(0, now - acquiredAt) }),
        ttlMs,
        ...(fencingToken !== undefined && { fencingToken }),
        here: heldHere,
      })),
      ...(info.waiters && {
        waiters: info.waiters.map(({ instance, site, waitingSince, mode }) => ({
          ...(instance !== undefined && { instance }),
          ...(site !== undefined && { site }),
          ...(waitingSince !== undefined && { waitingMs: Math.max(0, now - waitingSince) }),
          mode,
        })),
      }),
      contention: this.contention.of(key),
    };
  }
}

function describeHolder({ instance, site, fencingToken }: ReleasedHolder): string {
  const parts = [instance ?? 'an unnamed instance', site && `at ${site}`, fencingToken !== undefined && `token ${fencingToken}`];
  return parts.filter(Boolean).join(' ');
}
