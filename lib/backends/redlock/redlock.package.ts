import { InvalidLockOptionsError } from '../../lock.errors.js';
import { requirePeer } from '../../peer-require.cjs';
import { redactUrl } from '../../option-value.js';
import type { RedlockMaster, RedlockMasterClient } from './redlock-master.js';

export interface LoadedScript {
  readonly value: string;
  readonly hash: string;
}

/** One master's vote, as the package reports it. */
export type MasterVote = { vote: 'for'; client: RedlockMaster } | { vote: 'against'; client: RedlockMaster; error: Error };

/**
 * One Redlock instance. `_attemptOperationOnClient` runs a script on one master (by hash, then by
 * text) and votes "for" when it returned the number of keys; it never rejects. It is private in
 * the typings but stable in the exactly pinned version; everything around it (the quorum count,
 * retries, expiry arithmetic, errors) is ours, because that is where 5.0.0-beta.2 goes wrong.
 */
export interface RedlockQuorum {
  readonly scripts: { acquireScript: LoadedScript; extendScript: LoadedScript; releaseScript: LoadedScript };
  on(event: 'error', listener: (error: Error) => void): unknown;
  _attemptOperationOnClient(
    client: RedlockMaster,
    script: LoadedScript,
    keys: readonly string[],
    args: readonly (string | number)[],
  ): Promise<MasterVote>;
}

interface RedlockPackage {
  default: new (
    clients: Iterable<RedlockMaster>,
    settings: { retryCount: number },
    scripts: { acquireScript?: string; extendScript?: string; releaseScript?: string },
  ) => RedlockQuorum;
  ResourceLockedError: new (message: string) => Error;
}

let loaded: RedlockPackage | undefined;

/**
 * Loads `redlock` on first use, synchronously (its CommonJS build), so `lib/index.ts` does not
 * make users of the other backends install it, and a missing or different version fails at
 * construction with a message that says what to install.
 */
export function loadRedlock(): RedlockPackage {
  if (loaded) return loaded;
  let pkg: RedlockPackage;
  try {
    pkg = requirePeer('redlock') as RedlockPackage;
  } catch (error) {
    throw new InvalidLockOptionsError(
      'redlock',
      `RedlockLockBackend needs the 'redlock' package: npm install redlock@5.0.0-beta.2 ioredis (${error instanceof Error ? error.message : String(error)})`,
    );
  }
  const vote = (pkg.default?.prototype as Partial<RedlockQuorum> | undefined)?._attemptOperationOnClient;
  if (typeof vote !== 'function' || typeof pkg.ResourceLockedError !== 'function') {
    throw new InvalidLockOptionsError(
      'redlock',
      `RedlockLockBackend is built on redlock 5.0.0-beta.2 and found a version without its per-master script call. ` +
        `Install the pinned version: npm install redlock@5.0.0-beta.2.`,
    );
  }
  loaded = pkg;
  return pkg;
}

/** A client the backend opened from a URL, and therefore closes. */
export interface OwnedClient extends RedlockMasterClient {
  quit(): Promise<unknown>;
  disconnect(): void;
  /** ioredis's socket, when it has one. */
  readonly stream?: { destroy(): void };
}

/** Opens an ioredis client for a URL, lazily connected; ioredis is loaded on first use only. */
export function openClient(url: string): OwnedClient {
  let ioredis: { Redis: new (url: string, options: object) => OwnedClient };
  try {
    ioredis = requirePeer('ioredis') as typeof ioredis;
  } catch (error) {
    throw new InvalidLockOptionsError(
      'clients',
      `RedlockLockBackend needs the 'ioredis' package to connect to ${redactUrl(url)}: npm install ioredis (${error instanceof Error ? error.message : String(error)})`,
    );
  }
  const client = new ioredis.Redis(url, { lazyConnect: true });
  // Failures surface as failed votes and RedlockQuorumError; ioredis would also log each one.
  (client as unknown as { on(event: 'error', listener: () => void): void }).on('error', () => undefined);
  return client;
}
