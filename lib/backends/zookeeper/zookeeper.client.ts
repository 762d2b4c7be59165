import { InvalidLockOptionsError } from '../../lock.errors.js';
import { requirePeer } from '../../peer-require.cjs';

/**
 * What the backend needs of a ZooKeeper client, and nothing more: one session's operations as
 * promises. The backend is written against this, so the client package can be swapped by writing
 * one of these (see docs/zookeeper.md for why node-zookeeper-client is the one used).
 */
export interface ZooKeeperClient {
  /** The session timeout the server granted, in ms (0 until connected). */
  readonly sessionTimeout: number;
  /** Resolves once a session is established; `onState` hears what happens to it from then on. */
  connect(onState: (state: ZooKeeperClientState) => void): void;
  /** All-or-nothing, one transaction: see ZooKeeperMulti for what its answer says. */
  multi(ops: readonly ZooKeeperOp[]): Promise<ZooKeeperMulti>;
  create(path: string, mode: 'persistent'): Promise<void>;
  /** With a version, fails (BAD_VERSION) unless the node's data was set exactly that many times. */
  remove(path: string, version?: number): Promise<void>;
  /**
   * The node's stat, or undefined when there is none. `watcher` is called once when the node
   * changes (`'changed'`: its data was set) or goes (`'deleted'`), and is set only on a node that
   * exists: a watch on a missing node would wait for its creation, which never comes for a line
   * entry, and stay on the server for good.
   */
  exists(path: string, watcher?: (event: ZooKeeperNodeEvent) => void): Promise<ZooKeeperStat | undefined>;
  /** The node's data and stat, or undefined when there is none. Sets no watch. */
  getData(path: string): Promise<{ data: Buffer; stat: ZooKeeperStat } | undefined>;
  getChildren(path: string): Promise<string[]>;
  /** Drops the connection (not the session): the client connects again, to the next server. */
  reconnect(): void;
  /** Ends the session: its ephemeral nodes go at once. */
  close(): void;
}

/** What a watch on a node saw: it went, or its data was set (anything else the server reports counts as this). */
export type ZooKeeperNodeEvent = 'deleted' | 'changed';

/** `connected`: a session, reachable; `disconnected`: no connection, the session may live on; `expired`: the server ended it. */
export type ZooKeeperClientState = 'connected' | 'disconnected' | 'expired';

export type ZooKeeperOp =
  | { op: 'create'; path: string; data?: Buffer; mode: 'persistent' | 'ephemeral' | 'ephemeral-sequential' }
  /** With a version, fails the whole multi() (BAD_VERSION) unless the node's data was set exactly that many times. */
  | { op: 'remove'; path: string; version?: number }
  /** Fails the whole multi() when the node is gone. */
  | { op: 'check'; path: string }
  /** Sets the node's data (at `version` when given, else any); fails the whole multi() when the node is gone. */
  | { op: 'set'; path: string; data: Buffer; version?: number };

/** What a multi() did, from its answer. */
export interface ZooKeeperMulti {
  /** The created paths, in the order of the create operations. */
  created: string[];
  /**
   * The zxid of its transaction, when it set a node's data: the mzxid of that node as the set left
   * it. A multi() is one transaction with one zxid, so this is also the czxid of every node it
   * created. (Its answer to a create carries no stat: a server reads a create2 inside a multi as a
   * plain create, and answers with the path only.) Undefined when it set nothing.
   */
  zxid: number | undefined;
}

export interface ZooKeeperStat {
  /** The zxid of the transaction that created the node: global and increasing. */
  czxid: number;
  /** How many times its data was set. */
  version: number;
  /** When it was created, and when its data was last set (its creation, if never): ms since the epoch, by the clock of the server that applied it. */
  ctime: number;
  mtime: number;
}

/** A server's answer to one operation, by its name in ZooKeeper's KeeperException.Code. */
export class ZooKeeperError extends Error {
  constructor(
    readonly code:
      'NO_NODE' | 'BAD_VERSION' | 'NODE_EXISTS' | 'NOT_EMPTY' | 'CONNECTION_LOSS' | 'SESSION_EXPIRED' | 'NO_AUTH' | 'AUTH_FAILED' | string,
    message: string,
  ) {
    super(message);
    this.name = 'ZooKeeperError';
  }
}

// The part of node-zookeeper-client's API this adapter uses (the package ships no types).
interface NzkClient {
  on(event: 'state', listener: (state: { name: string }) => void): void;
  connect(): void;
  close(): void;
  getSessionTimeout(): number;
  transaction(): NzkTransaction;
  create(path: string, data: Buffer | null, acl: NzkAcl[], mode: number, callback: (error: NzkError | null, path: string) => void): void;
  remove(path: string, version: number, callback: (error: NzkError | null) => void): void;
  exists(path: string, watcher: (() => void) | undefined, callback: (error: NzkError | null, stat: NzkStat | null) => void): void;
  getData(
    path: string,
    watcher: ((event: { getType(): number }) => void) | undefined,
    callback: (error: NzkError | null, data: Buffer | null, stat: NzkStat) => void,
  ): void;
  getChildren(path: string, callback: (error: NzkError | null, children: string[]) => void): void;
  addAuthInfo(scheme: string, auth: Buffer): void;
  connectionManager: { socket?: { destroy(): void } };
}
interface NzkTransaction {
  /** The operations queued, as the package sends them. */
  ops: { version?: number }[];
  create(path: string, data: Buffer | undefined, acl: NzkAcl[], mode: number): NzkTransaction;
  remove(path: string, version: number): NzkTransaction;
  check(path: string, version: number): NzkTransaction;
  setData(path: string, data: Buffer, version: number): NzkTransaction;
  commit(callback: (error: NzkError | null, results: { type: number; path?: string; stat?: NzkStat }[]) => void): void;
}
interface NzkError extends Error {
  getCode?(): number;
  getName?(): string;
  name: string;
}
interface NzkStat {
  czxid: Buffer;
  mzxid: Buffer;
  version: number;
  ctime: Buffer;
  mtime: Buffer;
}
/** An ACL entry as the package builds and sends it. */
type NzkAcl = object;
interface NzkPackage {
  ACL: { OPEN_ACL_UNSAFE: NzkAcl[]; CREATOR_ALL_ACL: NzkAcl[] };
  createClient(connectionString: string, options: { sessionTimeout: number; spinDelay: number; retries: number }): NzkClient;
}

/** node-zookeeper-client's Event.NODE_DELETED. */
const NODE_DELETED = 2;

const CREATE_MODE = { persistent: 0, ephemeral: 1, 'ephemeral-sequential': 3 } as const;

/**
 * Makes clients of node-zookeeper-client, one per session. The package is loaded now (it is an
 * optional peer), so a missing one stops the application at start-up with what to install.
 *
 * With `digest` credentials ('user:password'), each session authenticates before its first
 * request (the client sends them right after the handshake, and again after every reconnection),
 * and every node it creates gets ZooKeeper's CREATOR_ALL_ACL: all rights to this identity (the
 * server writes the digest of the session's credentials into the ACL), none to anyone else. No
 * READ for anyone either: node names carry keys and owner tokens, which the other tenants of a
 * shared ensemble have no need to see. Without credentials there is no identity to give rights
 * to, and nodes get the open ACL, as before.
 */
export function nodeZooKeeperClients(connectionString: string, requestedTimeout: number, digest?: string): () => ZooKeeperClient {
  const nzk = loadClientPackage();
  const acl = digest === undefined ? nzk.ACL.OPEN_ACL_UNSAFE : nzk.ACL.CREATOR_ALL_ACL;
  // No retries inside the client: the backend bounds each call and decides what to do again.
  return () => {
    const client = nzk.createClient(connectionString, { sessionTimeout: requestedTimeout, spinDelay: 100, retries: 0 });
    if (digest !== undefined) client.addAuthInfo('digest', Buffer.from(digest));
    return new NodeZooKeeperClient(client, acl);
  };
}

/** The adapter over one node-zookeeper-client client. */
class NodeZooKeeperClient implements ZooKeeperClient {
  constructor(
    private readonly client: NzkClient,
    /** The ACL of every node this client creates. */
    private readonly acl: NzkAcl[],
  ) {}

  get sessionTimeout(): number {
    return this.client.getSessionTimeout();
  }

  connect(onState: (state: ZooKeeperClientState) => void): void {
    this.client.on('state', (state) => {
      if (state.name === 'SYNC_CONNECTED') onState('connected');
      else if (state.name === 'DISCONNECTED') onState('disconnected');
      else if (state.name === 'EXPIRED' || state.name === 'AUTH_FAILED') onState('expired');
    });
    this.client.connect();
  }

  multi(ops: readonly ZooKeeperOp[]): Promise<ZooKeeperMulti> {
    const transaction = this.client.transaction();
    for (const op of ops) {
      if (op.op === 'create') transaction.create(op.path, op.data, this.acl, CREATE_MODE[op.mode]);
      else if (op.op === 'remove') transaction.remove(op.path, op.version ?? -1);
      else if (op.op === 'set') transaction.setData(op.path, op.data, op.version ?? -1);
      else transaction.check(op.path, -1);
      // The package's transaction takes a version of 0 for "any" (`version || -1`): the one asked
      // for is set on the operation it queued.
      if ((op.op === 'remove' || op.op === 'set') && op.version !== undefined)
        transaction.ops[transaction.ops.length - 1].version = op.version;
    }
    return new Promise((resolve, reject) =>
      transaction.commit((error, results) => {
        if (error) return reject(toError(error));
        // A setData's answer is the node's stat as the set left it: its mzxid is this transaction's.
        const set = results.find((r) => r.stat !== undefined)?.stat;
        resolve({
          created: results.filter((r) => r.path !== undefined).map((r) => r.path!),
          zxid: set && Number(set.mzxid.readBigInt64BE(0)),
        });
      }),
    );
  }

  create(path: string, mode: 'persistent'): Promise<void> {
    return new Promise((resolve, reject) =>
      this.client.create(path, null, this.acl, CREATE_MODE[mode], (error) => (error ? reject(toError(error)) : resolve())),
    );
  }

  remove(path: string, version = -1): Promise<void> {
    return new Promise((resolve, reject) => this.client.remove(path, version, (error) => (error ? reject(toError(error)) : resolve())));
  }

  exists(path: string, watcher?: (event: ZooKeeperNodeEvent) => void): Promise<ZooKeeperStat | undefined> {
    if (watcher) {
      const onEvent = (event: { getType(): number }) => watcher(event.getType() === NODE_DELETED ? 'deleted' : 'changed');
      // getData, as Curator does: it sets no watch on a missing node, where exists() would leave
      // one for good (on the server, and in every reconnection's SetWatches of this client).
      return new Promise((resolve, reject) =>
        this.client.getData(path, onEvent, (error, _data, stat) => {
          if (error?.getName?.() === 'NO_NODE') resolve(undefined);
          else if (error) reject(toError(error));
          else resolve(toStat(stat));
        }),
      );
    }
    return new Promise((resolve, reject) =>
      this.client.exists(path, undefined, (error, stat) => {
        if (error) reject(toError(error));
        else resolve(stat ? toStat(stat) : undefined);
      }),
    );
  }

  getData(path: string): Promise<{ data: Buffer; stat: ZooKeeperStat } | undefined> {
    return new Promise((resolve, reject) =>
      this.client.getData(path, undefined, (error, data, stat) => {
        if (error?.getName?.() === 'NO_NODE') resolve(undefined);
        else if (error) reject(toError(error));
        else resolve({ data: data ?? Buffer.alloc(0), stat: toStat(stat) });
      }),
    );
  }

  getChildren(path: string): Promise<string[]> {
    return new Promise((resolve, reject) =>
      this.client.getChildren(path, (error, children) => (error ? reject(toError(error)) : resolve(children))),
    );
  }

  reconnect(): void {
    // The client has no read timeout of its own: on a connection that went silent (a partition
    // that keeps TCP up) it would wait forever. Closing the socket makes it connect again.
    this.client.connectionManager.socket?.destroy();
  }

  close(): void {
    this.client.close();
  }
}

function toStat(stat: NzkStat): ZooKeeperStat {
  return {
    czxid: Number(stat.czxid.readBigInt64BE(0)),
    version: stat.version,
    ctime: Number(stat.ctime.readBigInt64BE(0)),
    mtime: Number(stat.mtime.readBigInt64BE(0)),
  };
}

function toError(error: NzkError): ZooKeeperError {
  return new ZooKeeperError(error.getName?.() ?? error.name, error.message);
}

function loadClientPackage(): NzkPackage {
  try {
    return requirePeer('node-zookeeper-client') as NzkPackage;
  } catch (error) {
    throw new InvalidLockOptionsError(
      'connection',
      `ZooKeeperLockBackend needs the 'node-zookeeper-client' package: npm install node-zookeeper-client@1.1.3 ` +
        `(${error instanceof Error ? error.message : String(error)})`,
    );
  }
}
