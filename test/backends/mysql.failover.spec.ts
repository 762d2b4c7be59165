import { afterAll, beforeAll, describe, expect, it, jest } from '@jest/globals';
import { Logger } from '@nestjs/common';
import { MysqlLockBackend } from '../../lib/backends/mysql/mysql.backend.js';
import { MariadbServer } from '../support/mariadb-server.js';

/**
 * What the guarantees table says of a failover to an asynchronous replica, tried: a primary with a
 * row-based binary log and a replica following it; the link between them fails, locks are taken
 * and released on the primary meanwhile, the primary is killed and the replica promoted.
 */
describe('MySQL backend: a failover to an asynchronous MariaDB replica', () => {
  let primary: MariadbServer;
  let replica: MariadbServer;
  const backends: MysqlLockBackend[] = [];

  beforeAll(async () => {
    primary = await MariadbServer.startPrimary();
    replica = await MariadbServer.startReplica(primary);
  }, 60_000);
  afterAll(async () => {
    for (const backend of backends) await backend.close();
    await primary?.stop();
    await replica?.stop();
  });

  function backend(url: string): MysqlLockBackend {
    const created = new MysqlLockBackend(url, { commandTimeout: 1_000 });
    backends.push(created);
    return created;
  }

  it("loses the window's leases and releases, keeps the others, and hands the window's tokens out again", async () => {
    jest.spyOn(Logger.prototype, 'warn').mockImplementation(() => undefined);
    const { name, url } = await primary.createDatabase('failover');
    const onPrimary = backend(url);
    const ttl = 60_000;
    // Before the window: received by the replica.
    expect(await onPrimary.tryAcquire(['kept'], 'kept-owner', ttl)).toMatchObject({ acquired: true });
    expect(await onPrimary.tryAcquire(['released-in-window'], 'early-owner', ttl)).toMatchObject({ acquired: true });
    await replica.catchUpWith(primary);
    await replica.stopFollowing();

    // The window: applied on the primary only.
    const first = await onPrimary.tryAcquire(['taken-in-window'], 'first-owner', ttl);
    expect(first).toMatchObject({ acquired: true });
    for (let i = 0; i < 3; i++) {
      expect(await onPrimary.tryAcquire(['busy'], `busy-${i}`, ttl)).toMatchObject({ acquired: true });
      expect(await onPrimary.release(['busy'], `busy-${i}`)).toBe(true);
    }
    expect(await onPrimary.release(['released-in-window'], 'early-owner')).toBe(true);
    const firstToken = (first as { fencingToken: number }).fencingToken;

    await primary.crash();
    await replica.promote();
    const onReplica = backend(`mysql://locks:locks-password@127.0.0.1:${replica.port}/${name}`);

    // A lease of the window is gone: a second owner gets the key the first still believes it holds,
    // with a token the primary had handed out already (no greater than the first owner's).
    const second = await onReplica.tryAcquire(['taken-in-window'], 'second-owner', ttl);
    expect(second).toMatchObject({ acquired: true });
    expect((second as { fencingToken: number }).fencingToken).toBeLessThanOrEqual(firstToken);
    expect(await onReplica.extend(['taken-in-window'], 'first-owner', ttl)).toEqual({ extended: false });
    // A release of the window is undone: the key stays taken until its lease runs out.
    expect(await onReplica.inspect('released-in-window')).toMatchObject({ owner: 'early-owner' });
    // A lease the replica had received is kept, and its owner goes on with it.
    expect(await onReplica.tryAcquire(['kept'], 'someone-else', ttl, { willWait: false })).toMatchObject({ acquired: false });
    expect(await onReplica.extend(['kept'], 'kept-owner', ttl)).toEqual({ extended: true });
    expect(await onReplica.release(['kept'], 'kept-owner')).toBe(true);
  });
});
