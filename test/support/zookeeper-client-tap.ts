import {
  nodeZooKeeperClients,
  type ZooKeeperClient,
  type ZooKeeperMulti,
  type ZooKeeperNodeEvent,
  type ZooKeeperOp,
  type ZooKeeperStat,
} from '../../lib/backends/zookeeper/zookeeper.client.js';

/**
 * Where a test steps into a backend's requests to ZooKeeper: each hook gets the request and the
 * real call, and decides what the backend sees (hold it back, fail it, let it through late).
 * Hooks left out pass the request through.
 */
export interface ZooKeeperTaps {
  multi?(ops: readonly ZooKeeperOp[], send: () => Promise<ZooKeeperMulti>): Promise<ZooKeeperMulti>;
  exists?(
    path: string,
    watcher: ((event: ZooKeeperNodeEvent) => void) | undefined,
    send: () => Promise<ZooKeeperStat | undefined>,
  ): Promise<ZooKeeperStat | undefined>;
  getChildren?(path: string, send: () => Promise<string[]>): Promise<string[]>;
}

/** A client factory for ZooKeeperLockBackend's third argument: real node-zookeeper-client sessions, with taps. */
export function tappedClients(connectionString: string, sessionTimeout: number, taps: ZooKeeperTaps): () => ZooKeeperClient {
  const clients = nodeZooKeeperClients(connectionString, sessionTimeout);
  return () => new TappedClient(clients(), taps);
}

class TappedClient implements ZooKeeperClient {
  constructor(
    private readonly inner: ZooKeeperClient,
    private readonly taps: ZooKeeperTaps,
  ) {}

  get sessionTimeout(): number {
    return this.inner.sessionTimeout;
  }

  connect(onState: Parameters<ZooKeeperClient['connect']>[0]): void {
    this.inner.connect(onState);
  }

  multi(ops: readonly ZooKeeperOp[]): Promise<ZooKeeperMulti> {
    const send = () => this.inner.multi(ops);
    return this.taps.multi ? this.taps.multi(ops, send) : send();
  }

  create(path: string, mode: 'persistent'): Promise<void> {
    return this.inner.create(path, mode);
  }

  remove(path: string, version?: number): Promise<void> {
    return this.inner.remove(path, version);
  }

  exists(path: string, watcher?: (event: ZooKeeperNodeEvent) => void): Promise<ZooKeeperStat | undefined> {
    const send = () => this.inner.exists(path, watcher);
    return this.taps.exists ? this.taps.exists(path, watcher, send) : send();
  }

  getData(path: string): Promise<{ data: Buffer; stat: ZooKeeperStat } | undefined> {
    return this.inner.getData(path);
  }

  getChildren(path: string): Promise<string[]> {
    const send = () => this.inner.getChildren(path);
    return this.taps.getChildren ? this.taps.getChildren(path, send) : send();
  }

  reconnect(): void {
    this.inner.reconnect();
  }

  close(): void {
    this.inner.close();
  }
}
