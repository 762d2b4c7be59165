// @ts-expect-error: node-zookeeper-client ships no types; only the calls below are used.
import zookeeper from 'node-zookeeper-client';

/** The part of node-zookeeper-client used here. */
interface RawClient {
  once(event: 'connected', listener: () => void): void;
  connect(): void;
  remove(path: string, version: number, callback: (error: (Error & { getName?(): string }) | null) => void): void;
  close(): void;
}

/**
 * Deletes the parent node of `key`'s line (`<root>/<key>`, the key percent-encoded as the backend
 * names it), as another process's clean-up or an operator does once the line is empty. The
 * conformance suite's `deleteLineParent` on ZooKeeper.
 */
export async function deleteZooKeeperLineParent(connectionString: string, root: string, key: string): Promise<void> {
  const client = (zookeeper as { createClient(connection: string, options: object): RawClient }).createClient(connectionString, {
    sessionTimeout: 4_000,
  });
  try {
    await new Promise<void>((resolve, reject) => {
      const timer = setTimeout(() => reject(new Error(`no ZooKeeper session on ${connectionString} within 10 s`)), 10_000);
      client.once('connected', () => {
        clearTimeout(timer);
        resolve();
      });
      client.connect();
    });
    const parent = `${root}/${encodeURIComponent(key).replace(/\./g, '%2E')}`;
    await new Promise<void>((resolve, reject) =>
      client.remove(parent, -1, (error) => (error && error.getName?.() !== 'NO_NODE' ? reject(error) : resolve())),
    );
  } finally {
    client.close();
  }
}
