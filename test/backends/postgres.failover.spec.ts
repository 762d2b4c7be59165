import { afterAll, afterEach, beforeAll, describe, expect, it } from '@jest/globals';
import { randomBytes } from 'node:crypto';
import { PostgresLockBackend } from '../../lib/backends/postgres/postgres.backend.js';
import { PostgresServer } from '../support/postgres-server.js';

/**
 * A failover to an asynchronous streaming replica, as the guarantees table describes it: the
 * replica stops receiving WAL (its link to the primary fails), the primary goes on granting leases
 * for a while, then the replica is promoted and the clients move to it. Leases and token advances
 * of that window are not on the new primary.
 */
describe('PostgreSQL backend: failover to an asynchronous replica', () => {
  let primary: PostgresServer;
  const opened: { close(): Promise<void> | void }[] = [];
  const owner = () => randomBytes(16).toString('hex');
  const ttl = 60_000;

  beforeAll(async () => {
    // Durable: a commit is acknowledged once it is in the primary's WAL, as in production; it
    // still reaches the replica only later (asynchronous replication).
    primary = await PostgresServer.start({ durable: true });
  }, 60_000);
  afterEach(async () => {
    while (opened.length > 0) await opened.pop()!.close();
  });
  afterAll(async () => {
    await primary?.stop();
  });

  /** A database with the lock tables on the primary, a replica of it, and a backend on each. */
  async function primaryAndReplica() {
    const url = await primary.createDatabase('failover');
    const database = new URL(url).pathname.slice(1);
    const before = new PostgresLockBackend(url, { listenConnection: false });
    opened.push(before);
    // Creates the tables, so the base backup has them.
    const setup = await take(before, 'setup');
    await before.release(['setup'], setup.owner);
    const replica = await PostgresServer.startReplica(primary);
    opened.push({ close: () => replica.stop() });
    const after = new PostgresLockBackend(`postgres://postgres@127.0.0.1:${replica.port}/${database}`, { listenConnection: false });
    opened.push(after);
    const tokens = async () => {
      const client = await primary.connect(database);
      try {
        const { rows } = await client.query<{ last: string; ahead: string }>(
          'SELECT last_value::text AS last, log_cnt::text AS ahead FROM distributed_locks_fencing_tokens',
        );
        return { last: Number(rows[0].last), ahead: Number(rows[0].ahead) };
      } finally {
        await client.end();
      }
    };
    return { before, after, replica, tokens };
  }

  async function take(backend: PostgresLockBackend, key: string, holder = owner()) {
    const result = await backend.tryAcquire([key], holder, ttl, { willWait: false });
    if (!result.acquired) throw new Error(`${key} was not free`);
    return { owner: holder, token: result.fencingToken! };
  }

  /** A store that checks the fence: a write is accepted only with a newer token than the last. */
  function fencedStore() {
    let last = 0;
    const writes: number[] = [];
    return {
      writes,
      write(token: number): boolean {
        if (token <= last) return false;
        last = token;
        writes.push(token);
        return true;
      },
    };
  }

  it('leases granted after the replica stopped receiving are lost: a second holder, while the first learns it at its next extension', async () => {
    const { before, after, replica, tokens } = await primaryAndReplica();
    // Replicated before the link fails: a lease held, and one that will be released in the window.
    const kept = await take(before, 'kept');
    const released = await take(before, 'released');
    // At least one token logged ahead, so the one acquisition of the window stays within it.
    while ((await tokens()).ahead < 1) await before.release(['spin'], (await take(before, 'spin')).owner);
    await replica.catchUpWith(primary);
    await replica.stopFollowing();
    const { last, ahead } = await tokens();

    // The window: the primary still answers, and grants a lease that never reaches the replica.
    const first = await take(before, 'hot');
    expect(first.token).toBe(last + 1);
    expect(await before.release(['released'], released.owner)).toBe(true);

    await replica.promote();

    // What was replicated survived the failover.
    expect(await after.tryAcquire(['kept'], owner(), ttl, { willWait: false })).toMatchObject({ acquired: false });
    expect(await after.extend(['kept'], kept.owner, ttl)).toMatchObject({ extended: true });
    expect(await after.release(['kept'], kept.owner)).toBe(true);
    // The release of the window was lost with it: the key is held until its lease runs out.
    expect(await after.inspect('released')).toMatchObject({ owner: released.owner });

    // The lease of the window is not there: a second owner gets the key while the first holds it.
    const second = await take(after, 'hot');
    expect(await after.extend(['hot'], first.owner, ttl)).toEqual({ extended: false });

    // The sequence goes on from the last value it logged ahead, beyond every token the window took:
    // the second holder's token is greater, and the fence refuses the first holder's late write.
    expect(second.token).toBe(last + ahead + 1);
    expect(second.token).toBeGreaterThan(first.token);
    const store = fencedStore();
    expect(store.write(second.token)).toBe(true);
    expect(store.write(first.token)).toBe(false);
  }, 90_000);

  it('more acquisitions in the window than the sequence logged ahead: tokens are handed out again, and the fence no longer tells the holders apart', async () => {
    const { before, after, replica, tokens } = await primaryAndReplica();
    // A token taken since the replica was copied, so it has replayed the sequence's last record.
    await before.release(['spin'], (await take(before, 'spin')).owner);
    await replica.catchUpWith(primary);
    await replica.stopFollowing();
    const { last, ahead } = await tokens();

    // The window: one more acquisition than the primary had logged ahead, then the lease on 'hot'.
    const window: number[] = [];
    for (let i = 0; i <= ahead; i++) {
      const spin = await take(before, 'spin');
      window.push(spin.token);
      await before.release(['spin'], spin.owner);
    }
    const first = await take(before, 'hot');
    window.push(first.token);
    expect(window).toEqual(Array.from({ length: ahead + 2 }, (_, i) => last + 1 + i));

    await replica.promote();

    // The second holder's token is one the window already handed out, below the first holder's.
    const second = await take(after, 'hot');
    expect(second.token).toBe(last + ahead + 1);
    expect(window).toContain(second.token);
    expect(second.token).toBeLessThan(first.token);
    // The second holder writes, then the first one's late write is accepted over it.
    const store = fencedStore();
    expect(store.write(second.token)).toBe(true);
    expect(store.write(first.token)).toBe(true);
  }, 90_000);
});
