import { describe, expect, it } from '@jest/globals';
import { ZooKeeperLockBackend } from '../../lib/backends/zookeeper/zookeeper.backend.js';
import { nodeZooKeeperClients, type ZooKeeperClient, type ZooKeeperMulti } from '../../lib/backends/zookeeper/zookeeper.client.js';
import { useZooKeeper } from '../support/zookeeper-fixture.js';
import { until } from '../support/wait.js';

const fixture = useZooKeeper();

/** Real sessions, with `change` applied to each client (its other calls pass through). */
function changedClients(change: (client: ZooKeeperClient) => Partial<ZooKeeperClient>): () => ZooKeeperClient {
  const clients = nodeZooKeeperClients(fixture.connectionString, 4_000);
  return () => {
    const client = clients();
    return Object.assign(Object.create(client) as ZooKeeperClient, { connect: client.connect.bind(client) }, change(client));
  };
}

function backend(newClient: () => ZooKeeperClient): ZooKeeperLockBackend {
  const created = new ZooKeeperLockBackend(fixture.connectionString, { root: fixture.root, commandTimeout: 1_000 }, newClient);
  fixture.cleanup(() => created.close());
  return created;
}

// A release that ran past its command timeout on a healthy ensemble (bench/README.md, "Where a
// three-server ZooKeeper release's time goes") said only that ZooKeeper did not answer: whether
// the request was waiting for the session, or sent and unanswered, is what tells a slow server from
// a reconnection.
describe('ZooKeeper commandTimeout errors say where the operation stood', () => {
  it('sent on a connected session whose answer never came', async () => {
    let holdRemoves = false;
    const locks = backend(
      changedClients((client) => ({
        multi: (ops) => (holdRemoves && ops[0]?.op === 'remove' ? new Promise<ZooKeeperMulti>(() => undefined) : client.multi(ops)),
      })),
    );
    // Taken first, asked again if a loaded machine kept the first answer past the command timeout.
    await until(
      () =>
        locks.tryAcquire(['k'], 'owner-a', 60_000).then(
          (result) => result.acquired,
          () => false,
        ),
      30_000,
      'the key to be taken',
    );
    holdRemoves = true;
    await expect(locks.release(['k'], 'owner-a')).rejects.toThrow(
      'release of k failed: ZooKeeper did not answer within 1000 ms (commandTimeout); is it reachable? ' +
        'It was sent on a session that is connected, and the connection stayed up.',
    );
  });

  it('nothing sent while the session never connected', async () => {
    // The client connects, but the backend never hears that it did.
    const locks = backend(changedClients((client) => ({ connect: () => client.connect(() => undefined) })));
    await expect(locks.tryAcquire(['k'], 'owner-a', 60_000)).rejects.toThrow(
      'acquire of k failed: ZooKeeper did not answer within 1000 ms (commandTimeout); is it reachable? ' +
        'Nothing was sent: the session is connecting, and the operation waited for it to connect.',
    );
  });
});
