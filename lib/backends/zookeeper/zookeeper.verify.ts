import { randomUUID } from 'node:crypto';
import { LockBackendError } from '../../lock.errors.js';
import { createRoot, isNoNode } from './zookeeper.line.js';
import type { ZooKeeperSession } from './zookeeper.session.js';

/**
 * The start-up check: that this identity may create and delete under the lock root (which is
 * made if missing), with one write, a multi() that creates an ephemeral probe node and deletes it
 * (nothing stays, even if the answer is lost). Rejects with a permanent LockBackendError when
 * ZooKeeper refuses it (NO_AUTH: no credentials, or not the root's identity) or when the
 * connection string's chroot does not exist; resolves when the ensemble does not answer within
 * the command timeout (lock operations fail until it is back, as they would anyway).
 */
export async function verifyRoot(session: ZooKeeperSession, root: string): Promise<void> {
  // '.' is escaped in key names, so no key's line can be named like the probe.
  const probe = `${root}/.verify-${randomUUID()}`;
  const ops = [
    { op: 'create', path: probe, mode: 'ephemeral' },
    { op: 'remove', path: probe },
  ] as const;
  try {
    await session.run(`start-up check of the lock root ${root}`, [], async ({ client }) => {
      try {
        await client.multi(ops);
      } catch (error) {
        if (!isNoNode(error)) throw error;
        await createRoot(client, root).catch((e: unknown) => {
          // Every segment of the root is made when missing: what is missing is above it, the chroot.
          if (!isNoNode(e)) throw e;
          throw session.error(
            'start-up check',
            [],
            `the chroot of the connection string does not exist on ZooKeeper (the root ${root} is made under it). ` +
              'Create it, or remove it from the connection string.',
            e,
            true,
          );
        });
        await client.multi(ops);
      }
    });
  } catch (error) {
    if (error instanceof LockBackendError && error.permanent) throw error;
    // Not reachable, or not now: lock operations fail until it is back, as they would anyway.
  }
}
