import { describe, expect, it, jest } from '@jest/globals';
import { Logger } from '@nestjs/common';
import { Etcd3 } from 'etcd3';
import { performance } from 'node:perf_hooks';
import { TcpProxy } from '../support/tcp-proxy.js';
import { EtcdLockBackend, LockLostError, LockService, type AcquireResult } from '../../lib/index.js';
// @ts-expect-error: a plain ESM fixture shared with the child processes, without types.
import { fencedRead, fencedWrite } from '../fixtures/etcd-fenced-store.mjs';
import { useEtcdCluster } from '../support/etcd-fixture.js';
import { Holder } from '../support/lock-holder-process.js';
import { until } from '../support/wait.js';

const write = fencedWrite as (etcd: Etcd3, name: string, token: number, value: string) => Promise<boolean>;
const read = fencedRead as (etcd: Etcd3, name: string) => Promise<{ value: string | null; token: number }>;

const fixture = useEtcdCluster({ members: 1 });

function backend(url = fixture.endpoints[0], options?: ConstructorParameters<typeof EtcdLockBackend>[1]): EtcdLockBackend {
  const created = new EtcdLockBackend(url, options);
  fixture.cleanup(() => created.close());
  return created;
}

function service(options: ConstructorParameters<typeof LockService>[1] = {}, lockBackend = backend()): LockService {
  const locks = new LockService(lockBackend, { keyPrefix: 'fault:', ...options });
  fixture.cleanup(() => locks.onApplicationShutdown());
  return locks;
}

/** Every key the backends wrote under their default prefix. */
async function entries(): Promise<string[]> {
  return fixture.admin.getAll().prefix('nest-distributed-lock/').keys();
}

describe('etcd backend on one member', () => {
  it('inspect tells the holder from a several-key waiter first in the line of a key nobody holds', async () => {
    const [a, b, c] = [backend(), backend(), backend()];
    expect((await a.tryAcquire(['x'], 'owner-a', 10_000)).acquired).toBe(true);
    // b waits for x and y: behind a in x's line; in y's, first, but pending (it keeps nobody out
    // while it waits for x), and the anchor of its first attempt, on the lease it will hold them on.
    // Beside each entry, who asks.
    expect((await b.tryAcquire(['x', 'y'], 'owner-b', 10_000)).acquired).toBe(false);
    expect(await entries()).toEqual([
      'nest-distributed-lock/%anchor/owner-b',
      'nest-distributed-lock/%who/x/owner-a',
      'nest-distributed-lock/%who/x/owner-b',
      'nest-distributed-lock/%who/y/owner-b',
      'nest-distributed-lock/x/owner-a',
      'nest-distributed-lock/x/owner-b',
      'nest-distributed-lock/y/owner-b',
    ]);
    const values = async () => (await fixture.admin.getAll().prefix('nest-distributed-lock/y/').strings()) as Record<string, string>;
    expect(Object.values(await values())).toEqual(['pending']);
    expect(await a.inspect('y')).toBeUndefined();
    expect((await a.inspect('x'))?.owner).toBe('owner-a');
    // Nobody holds y: a newcomer takes it past b's pending entry (which goes: b, passed, takes a new place later).
    const newcomer = await c.tryAcquire(['y'], 'owner-c', 10_000, { willWait: false });
    expect(newcomer).toMatchObject({ acquired: true });
    expect(Object.keys(await values())).toEqual(['nest-distributed-lock/y/owner-c']);

    const woken = new Promise<void>((resolve) => void b.watch(['x', 'y'], resolve, 'owner-b'));
    const tokenA = (await a.inspect('x'))!.fencingToken!;
    expect(await a.release(['x'], 'owner-a')).toBe(true);
    await woken;
    // Its token would be below c's, who held y meanwhile: it stands in line again, behind c.
    expect(await b.tryAcquire(['x', 'y'], 'owner-b', 10_000)).toMatchObject({ acquired: false });
    expect(await c.release(['y'], 'owner-c')).toBe(true);
    let won: AcquireResult = { acquired: false };
    await until(async () => (won = await b.tryAcquire(['x', 'y'], 'owner-b', 10_000)).acquired, 5_000, 'b to take x and y');
    const token = (won as unknown as { fencingToken: number }).fencingToken;
    expect(token).toBeGreaterThan(tokenA);
    expect(token).toBeGreaterThan((newcomer as { fencingToken: number }).fencingToken);
    for (const key of ['x', 'y']) expect(await c.inspect(key)).toMatchObject({ owner: 'owner-b', fencingToken: token });
    expect(await b.release(['x', 'y'], 'owner-b')).toBe(true);
    await until(async () => (await entries()).length === 0, 5_000, 'every entry to go');
  });

  it('rounds a ttl up to whole seconds, and an extension with another ttl moves the keys to a lease of that ttl, token unchanged', async () => {
    const locks = service();
    const handle = await locks.acquire('ttl', { ttl: 2_500, autoExtend: false });
    const lease = async () => {
      const [kv] = await fixture.admin
        .getAll()
        .prefix('nest-distributed-lock/fault:ttl/')
        .exec()
        .then((r) => r.kvs);
      return fixture.admin.leaseClient.leaseTimeToLive({ ID: kv.lease });
    };
    expect(Number((await lease()).grantedTTL)).toBe(3);
    await handle.extend(20_000);
    const after = await lease();
    expect(Number(after.grantedTTL)).toBe(20);
    expect(Number(after.TTL)).toBeGreaterThan(15);
    expect((await locks.inspect('ttl'))?.fencingToken).toBe(handle.fencingToken);
    await handle.release();
    expect(await entries()).toEqual([]);
  });

  it('a waiter whose hold lease was restarted a while ago takes its turn with a validity etcd keeps that lease for', async () => {
    // While it waits, its hold lease (5 s) is restarted once every third of waiterTimeout (3 s).
    const [a, b] = [backend(), backend(fixture.endpoints[0], { waiterTimeout: 9_000 })];
    expect((await a.tryAcquire(['aged'], 'owner-a', 60_000)).acquired).toBe(true);
    expect((await b.tryAcquire(['aged'], 'owner-b', 5_000)).acquired).toBe(false);
    const woken = new Promise<void>((resolve) => void b.watch(['aged'], resolve, 'owner-b'));
    // Not a wait for something to happen: the time the lease ages, 2 of its 5 s, before the next restart.
    await new Promise((resolve) => setTimeout(resolve, 2_000));
    expect(await a.release(['aged'], 'owner-a')).toBe(true);
    await woken;
    const sentAt = performance.now();
    const won = await b.tryAcquire(['aged'], 'owner-b', 5_000);
    expect(won).toMatchObject({ acquired: true });
    const validUntil = sentAt + (won as { validityMs: number }).validityMs;
    // Nobody restarts it any more: etcd lets it run out, and its keys with it, never before then.
    await until(async () => (await entries()).length === 0, 15_000, "b's lease to run out");
    expect(performance.now()).toBeGreaterThanOrEqual(validUntil);
  });

  it('another process acquires once the lease of a holder that was SIGKILLed runs out, with a greater token', async () => {
    const ttl = 2_000;
    const holder = await Holder.start('etcd-lock-holder.mjs', fixture.endpoints.join(','), 'killed', ttl);
    fixture.cleanup(() => holder.kill());
    const locks = service();
    expect(await locks.tryAcquire('killed')).toBeUndefined();
    await holder.kill();
    const killedAt = Date.now();
    const handle = await locks.acquire('killed', { wait: 10_000 });
    // Freed by etcd when the lease ran out (a delete the waiter watches), not by a poll.
    expect(Date.now() - killedAt).toBeLessThan(ttl + 2_000);
    expect(handle.fencingToken).toBeGreaterThan((await holder.next('acquired')).token!);
  });

  it('a holder paused past its lease loses: the next holder has a greater token, and its late write is refused', async () => {
    const holder = await Holder.start('etcd-lock-holder.mjs', fixture.endpoints.join(','), 'paused', 2_000);
    fixture.cleanup(() => holder.kill());
    const stale = (await holder.next('acquired')).token!;
    holder.child.kill('SIGSTOP'); // as in a long GC pause: the process does nothing, not even extend
    fixture.cleanup(() => holder.child.kill('SIGCONT'));

    const locks = service();
    const handle = await locks.acquire('paused', { wait: 10_000 });
    expect(handle.fencingToken).toBeGreaterThan(stale);
    expect(await write(fixture.admin, 'fenced', handle.fencingToken!, 'new holder')).toBe(true);

    holder.child.kill('SIGCONT');
    const lost = await holder.next('lost');
    expect(lost).toMatchObject({ name: 'LockLostError' });
    holder.child.send({ type: 'write' });
    expect(await holder.next('wrote')).toMatchObject({ accepted: false, aborted: true });
    expect(await read(fixture.admin, 'fenced')).toEqual({ value: 'new holder', token: handle.fencingToken });
    // Its release revokes its own lease, which is gone: the new holder's lock is untouched.
    holder.child.send({ type: 'release' });
    await holder.next('released');
    expect(handle.isHeld).toBe(true);
    expect((await locks.inspect('paused'))?.heldHere).toBe(true);
  });

  it('a waiter whose watch comes back at a compacted revision reads its line again and takes its turn', async () => {
    const warn = jest.spyOn(Logger.prototype, 'warn').mockImplementation(() => undefined);
    fixture.cleanup(() => warn.mockRestore());
    const holder = service();
    const proxy = await TcpProxy.start(fixture.cluster.members[0].clientPort);
    fixture.cleanup(() => proxy.close());
    // Neither a poll nor the holder's ttl could hand it over within the test: only its watch.
    const waiters = service({ pollInterval: 60_000 }, backend(`http://127.0.0.1:${proxy.port}`, { waiterTimeout: 10_000 }));
    const held = await holder.acquire('compacted', { ttl: 60_000 });
    const waiting = waiters.acquire('compacted', { wait: 30_000 });
    // The holder's entry, the waiter's and its anchor, and who each of them is.
    await until(async () => (await entries()).length === 5, 5_000, 'the waiter to stand in line');
    // Its watch stream drops; meanwhile the lock is released and the history of it compacted.
    proxy.set({ kind: 'drop' });
    await held.release();
    let revision = 0;
    for (let i = 0; i < 5; i++) revision = Number((await fixture.admin.put('filler').value(String(i)).exec()).header.revision);
    await fixture.admin.kv.compact({ revision, physical: true });
    const healedAt = Date.now();
    proxy.set({ kind: 'pass' });
    const handle = await waiting;
    expect(Date.now() - healedAt).toBeLessThan(10_000);
    expect(handle.isHeld).toBe(true);
    expect(handle.signal.reason).not.toBeInstanceOf(LockLostError);
  });

  it('refuses new work once closed, and leaves no entry and no lease behind', async () => {
    const leases = async () => (await fixture.admin.leaseClient.leaseLeases({})).leases.map((lease) => String(lease.ID));
    const before = await leases();
    const closing = backend();
    expect((await closing.tryAcquire(['closed'], 'owner-a', 10_000)).acquired).toBe(true);
    expect((await closing.tryAcquire(['closed'], 'owner-b', 10_000)).acquired).toBe(false);
    await closing.release(['closed'], 'owner-a');
    await closing.release(['closed'], 'owner-b');
    await closing.close();
    await expect(closing.tryAcquire(['closed'], 'owner-c', 10_000)).rejects.toThrow(/the backend is closed/);
    expect(await entries()).toEqual([]);
    // Its holder's, its waiter's and its waiters' leases, and the spare its acquisitions left.
    expect((await leases()).filter((lease) => !before.includes(lease))).toEqual([]);
  });

  it('waits, once closed, for the leases it was revoking in the background: none of them is left when close() resolves', async () => {
    const leases = async () => (await fixture.admin.leaseClient.leaseLeases({})).leases.map((lease) => String(lease.ID));
    const holder = backend();
    expect(await holder.tryAcquire(['background'], 'owner-a', 10_000, { willWait: false })).toMatchObject({ acquired: true });
    const before = await leases();
    const proxy = await TcpProxy.start(fixture.cluster.members[0].clientPort);
    fixture.cleanup(() => proxy.close());
    const closing = backend(`http://127.0.0.1:${proxy.port}`);
    // Every request now takes 300 ms to reach etcd. A caller that does not wait finds the key held:
    // the lease its attempt was granted is revoked in the background, still on its way when
    // close() is called, which has nothing else to do.
    proxy.set({ kind: 'delay', ms: 300, direction: 'up' });
    expect(await closing.tryAcquire(['background'], 'owner-b', 10_000, { willWait: false })).toMatchObject({ acquired: false });
    await closing.close();
    expect((await leases()).filter((lease) => !before.includes(lease))).toEqual([]);
    await holder.release(['background'], 'owner-a');
  });
});

describe('etcd backend, spare leases', () => {
  /** The leases etcd has now. */
  async function leases(): Promise<string[]> {
    return (await fixture.admin.leaseClient.leaseLeases({})).leases.map((lease) => String(lease.ID));
  }

  /** The lease the entry of `key` (one owner) sits on. */
  async function leaseOf(key: string): Promise<string> {
    const { kvs } = await fixture.admin.getAll().prefix(`nest-distributed-lock/${key}/`).exec();
    expect(kvs).toHaveLength(1);
    return String(kvs[0].lease);
  }

  /** Resolves once etcd has `count` leases that were not in `before`: the spare's grant, sent in the background, is in. */
  async function leasesBeyond(before: readonly string[], count: number): Promise<string[]> {
    let extra: string[] = [];
    await until(async () => (extra = (await leases()).filter((l) => !before.includes(l))).length === count, 5_000, `${count} new leases`);
    return extra;
  }

  /** Takes and releases `key` `count` times in a row, each time as another owner: the leases those locks were on. */
  async function leasesOfLocksInARow(locks: EtcdLockBackend, key: string, count: number): Promise<Set<string>> {
    const used = new Set<string>();
    for (let i = 0; i < count; i++) {
      expect(await locks.tryAcquire([key], `owner-${i}`, 10_000, { willWait: false })).toMatchObject({ acquired: true });
      used.add(await leaseOf(key));
      expect(await locks.release([key], `owner-${i}`)).toBe(true);
    }
    return used;
  }

  /**
   * Two locks of one ttl, `<key>` and `<key>2`, taken one right after the other: the second makes
   * the ttl in demand, and a spare is granted after it. Their own leases.
   */
  async function inDemand(locks: EtcdLockBackend, key: string, ttl: number): Promise<string[]> {
    for (const [k, owner] of [
      [key, 'owner-a'],
      [`${key}2`, 'owner-a2'],
    ])
      expect(await locks.tryAcquire([k], owner, ttl, { willWait: false })).toMatchObject({ acquired: true });
    return [await leaseOf(key), await leaseOf(`${key}2`)];
  }

  it('grants no spare lease to a process that locks less often than every half ttl: it keeps only its lock’s own lease', async () => {
    const before = await leases();
    const locks = backend();
    expect(await locks.tryAcquire(['rare'], 'owner-a', 4_000, { willWait: false })).toMatchObject({ acquired: true });
    const first = await leaseOf('rare');
    // A grant asked for beside its transaction would go to etcd before this release.
    expect(await locks.release(['rare'], 'owner-a')).toBe(true);
    // The lock's lease stays, holding nothing, for the next lock of that ttl: nothing else was granted.
    expect((await leases()).filter((l) => !before.includes(l))).toEqual([first]);
    expect((await fixture.admin.leaseClient.leaseTimeToLive({ ID: first, keys: true })).keys).toEqual([]);
    // The next lock of that ttl, 2 s later: that lease has less than half its ttl left by this
    // process's count, so it goes, and the lock grants its own again, and no spare either.
    const now = performance.now.bind(performance);
    const clock = jest.spyOn(performance, 'now').mockImplementation(() => now() + 2_100);
    fixture.cleanup(() => clock.mockRestore());
    expect(await locks.tryAcquire(['rare'], 'owner-b', 4_000, { willWait: false })).toMatchObject({ acquired: true });
    const second = await leaseOf('rare');
    expect(second).not.toBe(first);
    expect(await locks.release(['rare'], 'owner-b')).toBe(true);
    await until(async () => !(await leases()).includes(first), 5_000, 'the lease too old to use to go');
    expect((await leases()).filter((l) => !before.includes(l))).toEqual([second]);
    clock.mockRestore();
    await locks.close();
  });

  it('hands a spare lease to one owner only: two acquisitions at once get two leases, and a release leaves the other lock alone', async () => {
    const before = await leases();
    const locks = backend();
    const own = await inDemand(locks, 'spare-a', 10_000);
    const [spare] = (await leasesBeyond(before, 3)).filter((l) => !own.includes(l));
    const [b, c] = await Promise.all([
      locks.tryAcquire(['spare-b'], 'owner-b', 10_000, { willWait: false }),
      locks.tryAcquire(['spare-c'], 'owner-c', 10_000, { willWait: false }),
    ]);
    expect([b.acquired, c.acquired]).toEqual([true, true]);
    const [leaseB, leaseC] = [await leaseOf('spare-b'), await leaseOf('spare-c')];
    expect(leaseB).not.toBe(leaseC);
    expect([leaseB, leaseC]).toContain(spare);
    expect(await locks.release(['spare-b'], 'owner-b')).toBe(true);
    expect(await locks.inspect('spare-c')).toMatchObject({ owner: 'owner-c', fencingToken: (c as { fencingToken: number }).fencingToken });
    for (const [key, owner] of [
      ['spare-a', 'owner-a'],
      ['spare-a2', 'owner-a2'],
      ['spare-c', 'owner-c'],
    ])
      expect(await locks.release([key], owner)).toBe(true);
    // Closed, it revokes its spare: no lease of its own is left.
    await locks.close();
    expect((await leases()).filter((l) => !before.includes(l))).toEqual([]);
  });

  it('keeps the waiter lease the process’s waiters stand on when a waiter’s spare lease turns out to be gone', async () => {
    const before = await leases();
    const locks = backend();
    const own = await inDemand(locks, 'spare-w', 10_000);
    const waiterLeaseOf = async (owner: string) => {
      const { kvs } = await fixture.admin.getAll().prefix('nest-distributed-lock/spare-w/').exec();
      return String(kvs.find((kv) => kv.key.toString().endsWith(`/${owner}`))!.lease);
    };
    // The first waiter takes the spare for its hold lease; the next spare is granted behind it.
    expect(await locks.tryAcquire(['spare-w'], 'owner-w1', 10_000, { willWait: true })).toMatchObject({ acquired: false });
    const waiterLease = await waiterLeaseOf('owner-w1');
    let spare: string | undefined;
    await until(
      async () => {
        for (const lease of (await leases()).filter((l) => !before.includes(l) && !own.includes(l) && l !== waiterLease)) {
          if ((await fixture.admin.leaseClient.leaseTimeToLive({ ID: lease, keys: true })).keys.length === 0) spare = lease;
        }
        return spare !== undefined;
      },
      5_000,
      'the next spare lease',
    );
    // Gone before the second waiter takes it: etcd refuses that transaction without saying which lease it missed.
    await fixture.admin.leaseClient.leaseRevoke({ ID: spare! });
    expect(await locks.tryAcquire(['spare-w'], 'owner-w2', 10_000, { willWait: true })).toMatchObject({ acquired: false });
    expect(await waiterLeaseOf('owner-w2')).toBe(waiterLease);
    for (const owner of ['owner-w1', 'owner-w2', 'owner-a']) await locks.release(['spare-w'], owner);
    await locks.release(['spare-w2'], 'owner-a2');
    await locks.close();
  });

  it('counts the validity of a lock on a spare from the spare’s grant, or from a keepalive sent beside the transaction', async () => {
    const client = new Etcd3({ hosts: fixture.endpoints });
    fixture.cleanup(() => client.close());
    const locks = new EtcdLockBackend(client);
    fixture.cleanup(() => locks.close());
    const before = await leases();
    const own = await inDemand(locks, 'aged-a', 5_000);
    const [spare] = (await leasesBeyond(before, 3)).filter((l) => !own.includes(l));
    // The spare ages 2 of its 5 s (this process's clock runs ahead: etcd's stays, so the lease is
    // still alive for sure), and the keepalive sent beside the transaction goes unanswered.
    const now = performance.now.bind(performance);
    let ahead = 2_000;
    const clock = jest.spyOn(performance, 'now').mockImplementation(() => now() + ahead);
    fixture.cleanup(() => clock.mockRestore());
    const keepAlive = jest.spyOn(client.leaseClient, 'leaseKeepAlive').mockRejectedValue(new Error('14 UNAVAILABLE: no connection'));
    const aged = (await locks.tryAcquire(['aged-b'], 'owner-b', 5_000, { willWait: false })) as { acquired: boolean; validityMs: number };
    expect(aged).toMatchObject({ acquired: true });
    expect(await leaseOf('aged-b')).toBe(spare);
    // At most what is left of the spare, counted from its grant: 5 s less the 2 s it aged.
    expect(aged.validityMs).toBeGreaterThan(0);
    expect(aged.validityMs).toBeLessThanOrEqual(3_000);
    // The next spare (granted after that acquisition) ages as much; this time the keepalive is answered: the lease is restarted.
    await leasesBeyond(before, 4);
    keepAlive.mockRestore();
    ahead = 4_000;
    expect(await locks.tryAcquire(['aged-c'], 'owner-c', 5_000, { willWait: false })).toMatchObject({ acquired: true, validityMs: 5_000 });
    for (const [key, owner] of [
      ['aged-a', 'owner-a'],
      ['aged-a2', 'owner-a2'],
      ['aged-b', 'owner-b'],
      ['aged-c', 'owner-c'],
    ])
      expect(await locks.release([key], owner)).toBe(true);
  });

  it('uses a released lock’s lease for the next lock of its ttl: locking in a loop grants and revokes no lease after the first two', async () => {
    const before = await leases();
    const locks = backend();
    const used = await leasesOfLocksInARow(locks, 'loop', 20);
    // The first lock's own lease, and the spare granted once the ttl was in demand.
    expect(used.size).toBeLessThanOrEqual(2);
    // Each released lease held nothing: no key is left on any.
    for (const lease of used) expect((await fixture.admin.leaseClient.leaseTimeToLive({ ID: lease, keys: true })).keys).toEqual([]);
    await locks.close();
    expect((await leases()).filter((l) => !before.includes(l))).toEqual([]);
  });

  it('keeps at most two released leases of one ttl: three locks held at once leave two leases behind, not three', async () => {
    const before = await leases();
    const locks = backend();
    const owners = ['owner-a', 'owner-b', 'owner-c'];
    for (const owner of owners)
      expect(await locks.tryAcquire([`kept-${owner}`], owner, 10_000, { willWait: false })).toMatchObject({ acquired: true });
    for (const owner of owners) expect(await locks.release([`kept-${owner}`], owner)).toBe(true);
    // Two kept for the next locks of that ttl; the others (a third lock's lease, a spare granted meanwhile) revoked.
    await until(async () => (await leases()).filter((l) => !before.includes(l)).length === 2, 5_000, 'two leases kept');
    await locks.close();
    expect((await leases()).filter((l) => !before.includes(l))).toEqual([]);
  });

  it('revokes every released lease with a client passed in: it may send a request twice, and a late copy could put a key on a lease in use', async () => {
    const client = new Etcd3({ hosts: fixture.endpoints });
    fixture.cleanup(() => client.close());
    const locks = new EtcdLockBackend(client);
    fixture.cleanup(() => locks.close());
    const used = await leasesOfLocksInARow(locks, 'passed', 6);
    expect(used.size).toBe(6);
    const left = await leases();
    expect([...used].filter((lease) => left.includes(lease))).toEqual([]);
  });

  it('never uses again a lease that an unanswered request named: that request may still land on it', async () => {
    const proxy = await TcpProxy.start(Number(new URL(fixture.endpoints[0]).port));
    fixture.cleanup(() => proxy.close());
    const locks = backend(`http://127.0.0.1:${proxy.port}`, { commandTimeout: 500 });
    const connection = (
      locks as unknown as { connection: { txn: (r: object, w: object) => Promise<unknown>; reusable: (l: string) => boolean } }
    ).connection;
    const { ID: named } = await fixture.admin.leaseClient.leaseGrant({ TTL: 10 });
    const { ID: other } = await fixture.admin.leaseClient.leaseGrant({ TTL: 10 });
    fixture.cleanup(() => Promise.all([named, other].map((ID) => fixture.admin.leaseClient.leaseRevoke({ ID }))));
    expect(connection.reusable(named)).toBe(true);
    // Applied, its answer lost.
    proxy.set({ kind: 'blackhole-down' });
    const put = { request_put: { key: Buffer.from('nest-distributed-lock/%doubt'), value: Buffer.from('x'), lease: named } };
    await expect(connection.txn({ success: [put] }, { op: 'acquire', keys: ['doubt'] })).rejects.toThrow(/acquire of doubt failed/);
    proxy.set({ kind: 'pass' });
    expect(connection.reusable(named)).toBe(false);
    expect(connection.reusable(other)).toBe(true);
  });

  it('does not use again the lease of a lock released while an extension of it is out: that extension revokes it if it finds the keys gone', async () => {
    const locks = backend();
    const client = (locks as unknown as { connection: { client: Etcd3 } }).connection.client;
    expect(await locks.tryAcquire(['beside'], 'owner-a', 10_000, { willWait: false })).toMatchObject({ acquired: true });
    const lease = await leaseOf('beside');
    // The extension's read of the holder's entries is held back until the lease could serve another lock.
    const txn = client.kv.txn.bind(client.kv);
    let letGo: () => void = () => undefined;
    const held = new Promise<void>((resolve) => (letGo = resolve));
    const spy = jest.spyOn(client.kv, 'txn').mockImplementation(async (request, options) => {
      const reads = request.success?.every((op) => op.request_range) && request.success.length === 1;
      if (reads && request.success![0].request_range!.key!.toString().endsWith('/owner-a')) await held;
      return txn(request, options);
    });
    fixture.cleanup(() => spy.mockRestore());
    const extending = locks.extend(['beside'], 'owner-a', 10_000);
    expect(await locks.release(['beside'], 'owner-a')).toBe(true);
    // The next lock of that ttl, on another key.
    expect(await locks.tryAcquire(['beside-next'], 'owner-b', 10_000, { willWait: false })).toMatchObject({ acquired: true });
    expect(await leaseOf('beside-next')).not.toBe(lease);
    letGo();
    expect(await extending).toEqual({ extended: false });
    expect(await locks.inspect('beside-next')).toMatchObject({ owner: 'owner-b' });
    expect(await locks.release(['beside-next'], 'owner-b')).toBe(true);
  });
});
