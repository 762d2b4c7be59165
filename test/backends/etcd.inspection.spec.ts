import { describe, expect, it } from '@jest/globals';
import { Etcd3 } from 'etcd3';
import { hostname } from 'node:os';
import { EtcdLockBackend } from '../../lib/backends/etcd/etcd.backend.js';
import { MAX_IDENTITY_LENGTH } from '../../lib/backends/lock-backend.interface.js';
import { InvalidLockOptionsError } from '../../lib/lock.errors.js';
import { LockService } from '../../lib/lock.service.js';
import { useEtcdCluster } from '../support/etcd-fixture.js';
import { Holder } from '../support/lock-holder-process.js';
import { previousRelease } from '../support/previous-release.js';
import { eventually, until } from '../support/wait.js';

/**
 * Who holds and waits on etcd, where the conformance suite cannot see it: who asks sits in a key
 * of its own beside each entry (`<prefix>%who/<key>/<owner>`), on the entry's lease, and goes with
 * the entry (a release, a waiter that gives up, a caller passed on a pending key, a process
 * killed); it moves with the entry (a waiter that takes the key, a lease of another ttl); and a
 * process of the release before, which writes none, waits for, takes from and hands back to this
 * one.
 */
const fixture = useEtcdCluster();
const PREFIX = 'nest-distributed-lock/';
const WHO = `${PREFIX}%who/`;

function backend(): EtcdLockBackend {
  const created = new EtcdLockBackend(fixture.endpoints);
  fixture.cleanup(() => created.close());
  return created;
}

const a = { instance: 'web-1', site: 'Orders.pay' };
const b = { instance: 'web-2', site: 'Refunds.issue' };
const c = { instance: 'worker-3' };

/** The entries of the lines and the identity keys, each by `<key>/<owner>`, with the lease it is on. */
async function layout(): Promise<{ entries: Record<string, string>; identities: Record<string, string> }> {
  const { kvs } = await fixture.admin.getAll().prefix(PREFIX).exec();
  const entries: Record<string, string> = {};
  const identities: Record<string, string> = {};
  for (const kv of kvs) {
    const name = kv.key.toString();
    if (name.startsWith(WHO)) identities[name.slice(WHO.length)] = String(kv.lease);
    else if (!name.startsWith(`${PREFIX}%`)) entries[name.slice(PREFIX.length)] = String(kv.lease);
  }
  return { entries, identities };
}

/** Exactly these entries, and beside each one who asks, on the entry's lease; beside nothing else. */
async function expectBeside(names: string[]): Promise<void> {
  const { entries, identities } = await layout();
  expect(Object.keys(entries).sort()).toEqual([...names].sort());
  expect(identities).toEqual(entries);
}

async function nothingLeft(what: string): Promise<void> {
  await until(async () => (await fixture.admin.getAll().prefix(PREFIX).keys()).length === 0, 15_000, what);
}

describe('etcd: who holds and waits', () => {
  it('sits beside each entry on its lease and goes with it: a waiter that gives up, a release, a waiter that takes the key', async () => {
    const [one, two] = [backend(), backend()];
    expect((await one.tryAcquire(['k'], 'owner-a', 30_000, { holder: a })).acquired).toBe(true);
    expect((await two.tryAcquire(['k'], 'owner-b', 30_000, { holder: b })).acquired).toBe(false);
    expect((await two.tryAcquire(['k'], 'owner-c', 30_000, { holder: c })).acquired).toBe(false);
    await expectBeside(['k/owner-a', 'k/owner-b', 'k/owner-c']);
    const state = (await one.inspect('k'))!;
    expect(state.holders).toEqual([
      { owner: 'owner-a', ...a, ttlMs: expect.any(Number), fencingToken: expect.any(Number), acquiredAt: expect.any(Number) },
    ]);
    expect(state.waiters).toEqual([
      { owner: 'owner-b', ...b, waitingSince: expect.any(Number) },
      { owner: 'owner-c', ...c, waitingSince: expect.any(Number) },
    ]);
    const since = state.waiters![1].waitingSince!;

    // owner-b gives up: who it is goes with its entry at once (the waiter lease lives on, for owner-c).
    await two.release(['k'], 'owner-b');
    await expectBeside(['k/owner-a', 'k/owner-c']);
    // The holder releases (its lease is revoked): the same.
    await one.release(['k'], 'owner-a');
    await expectBeside(['k/owner-c']);

    // owner-c takes the key: who it is moves onto the holder's lease with its entry, and tells when it went in.
    await until(async () => Date.now() > since + 20, 5_000, 'time to pass');
    const taking = Date.now();
    await until(async () => (await two.tryAcquire(['k'], 'owner-c', 30_000, { holder: c })).acquired, 10_000, 'owner-c to take the key');
    await expectBeside(['k/owner-c']);
    const taken = (await one.inspect('k'))!;
    expect(taken.holders).toEqual([
      { owner: 'owner-c', ...c, ttlMs: expect.any(Number), fencingToken: expect.any(Number), acquiredAt: expect.any(Number) },
    ]);
    expect(taken.holders![0].acquiredAt).toBeGreaterThanOrEqual(taking);
    expect(taken.waiters).toEqual([]);
    await two.release(['k'], 'owner-c');
    await nothingLeft('every key to go');
  });

  it('goes with the lease of a holder, and of a waiter, whose process was killed', async () => {
    const observer = backend();
    const urls = fixture.endpoints.join(',');
    const holder = await Holder.start('etcd-lock-holder.mjs', urls, 'killed', 2_000);
    fixture.cleanup(() => holder.kill());
    const waiter = Holder.spawn('etcd-lock-holder.mjs', urls, 'killed', 2_000);
    fixture.cleanup(() => waiter.kill());
    // Each process names itself hostname:pid (the module's default instance).
    await eventually(
      async () =>
        expect((await observer.inspect('fault:killed'))?.waiters?.map((w) => w.instance)).toEqual([`${hostname()}:${waiter.child.pid}`]),
      10_000,
    );
    const state = (await observer.inspect('fault:killed'))!;
    expect(state.holders!.map((h) => h.instance)).toEqual([`${hostname()}:${holder.child.pid}`]);
    const { entries, identities } = await layout();
    expect(Object.keys(entries)).toHaveLength(2);
    expect(identities).toEqual(entries);

    // The waiter dies: its place and who it is go when its process's waiter lease runs out.
    await waiter.kill();
    await until(async () => Object.keys((await layout()).identities).length === 1, 15_000, "the dead waiter's identity to go");
    const left = await layout();
    expect(Object.keys(left.entries)).toHaveLength(1);
    expect(left.identities).toEqual(left.entries);
    // The holder dies: its entry and who it is go when its lease runs out.
    await holder.kill();
    await nothingLeft("the dead holder's entry and identity to go");
  }, 60_000);

  it('shows a caller of several keys waiting in the line of the first key that keeps it out, and in no later one', async () => {
    const [one, two] = [backend(), backend()];
    expect((await one.tryAcquire(['x'], 'owner-a', 30_000, { holder: a })).acquired).toBe(true);
    expect((await one.tryAcquire(['y'], 'owner-c', 30_000, { holder: c })).acquired).toBe(true);
    // owner-b waits for x; its entry in y's line is pending: it keeps nobody out there, and waits there for nothing yet.
    expect((await two.tryAcquire(['x', 'y'], 'owner-b', 30_000, { holder: b })).acquired).toBe(false);
    await expectBeside(['x/owner-a', 'x/owner-b', 'y/owner-b', 'y/owner-c']);
    expect((await one.inspect('x'))!.waiters).toEqual([{ owner: 'owner-b', ...b, waitingSince: expect.any(Number) }]);
    expect((await one.inspect('y'))!.waiters).toEqual([]);
  });

  it('goes with a pending entry that a caller passes', async () => {
    const [one, two] = [backend(), backend()];
    expect((await one.tryAcquire(['x'], 'owner-a', 30_000, { holder: a })).acquired).toBe(true);
    // owner-b waits for x, and is pending in y's line: nobody holds y.
    expect((await two.tryAcquire(['x', 'y'], 'owner-b', 30_000, { holder: b })).acquired).toBe(false);
    await expectBeside(['x/owner-a', 'x/owner-b', 'y/owner-b']);
    expect(await one.inspect('y')).toBeUndefined();
    // A caller that does not wait enters y past it: its entry there goes, and who it is with it.
    expect((await one.tryAcquire(['y'], 'owner-c', 30_000, { holder: c, willWait: false })).acquired).toBe(true);
    await expectBeside(['x/owner-a', 'x/owner-b', 'y/owner-c']);
    expect((await one.inspect('y'))!.holders!.map((h) => [h.owner, h.instance])).toEqual([['owner-c', 'worker-3']]);
  });

  it('moves with the entries to a lease of another ttl, from the process that took them and from another', async () => {
    const locks = new LockService(backend(), { keyPrefix: '', instance: 'web-1' });
    fixture.cleanup(() => locks.onApplicationShutdown());
    const handle = await locks.acquire('moved', { ttl: 3_000, autoExtend: false, site: 'Orders.pay' });
    const before = (await locks.inspect('moved'))!.holders[0];
    const { entries } = await layout();
    await handle.extend(20_000);
    const moved = await layout();
    expect(moved.entries).not.toEqual(entries);
    expect(moved.identities).toEqual(moved.entries);
    expect((await locks.inspect('moved'))!.holders[0]).toMatchObject({
      instance: 'web-1',
      site: 'Orders.pay',
      acquiredAt: before.acquiredAt,
    });

    // Extended by a backend that did not take it (it reads the entries and who asks, and moves both).
    const other = backend();
    expect(await other.extend(['moved'], handle.leases[0].owner, 40_000)).toMatchObject({ extended: true });
    const again = await layout();
    expect(again.entries).not.toEqual(moved.entries);
    expect(again.identities).toEqual(again.entries);
    expect((await other.inspect('moved'))!.holders![0]).toMatchObject({ ...a, acquiredAt: before.acquiredAt });
    // Its lease is the other backend's now: that one frees it.
    expect(await other.release(['moved'], handle.leases[0].owner)).toBe(true);
    await nothingLeft('every key to go');
    await handle.release();
  });

  it('lists held keys without reading the identity keys and anchors beside them', async () => {
    // A client of the listing's own that records every key its reads return.
    const client = new Etcd3({ hosts: fixture.endpoints });
    fixture.cleanup(() => client.close());
    const read: string[] = [];
    const txn = client.kv.txn.bind(client.kv);
    client.kv.txn = async (...args: Parameters<typeof txn>) => {
      const response = await txn(...args);
      for (const r of response.responses) for (const kv of r.response_range?.kvs ?? []) read.push(kv.key.toString());
      return response;
    };
    const lister = new EtcdLockBackend(client);
    fixture.cleanup(() => lister.close());
    const one = backend();
    // Names that sort before the backend's own keys ('!', '#', and '%' and '/' encoded), and after them.
    const names = ['!first', '#x', '%pct', '/slash', ...Array.from({ length: 30 }, (_, i) => `k${String(i).padStart(2, '0')}`)];
    for (const [i, name] of names.entries()) {
      expect((await one.tryAcquire([name], `holder-${i}`, 30_000, { holder: a })).acquired).toBe(true);
      expect((await one.tryAcquire([name], `waiter-${i}`, 30_000, { holder: b })).acquired).toBe(false);
    }
    const listed: string[] = [];
    let cursor: string | undefined;
    do {
      const page = await lister.list({ prefix: '', limit: 5, cursor });
      listed.push(...page.keys);
      cursor = page.cursor;
    } while (cursor !== undefined);
    expect([...listed].sort()).toEqual([...names].sort());
    expect(new Set(listed).size).toBe(listed.length);
    expect(read.length).toBeGreaterThan(0);
    expect(read.filter((key) => key.startsWith(`${PREFIX}%`) && !/^%(25|2F)/.test(key.slice(PREFIX.length)))).toEqual([]);
  });

  it('stores names of the longest length in any characters; a caller of the backend that passes longer ones is refused before anything is made', async () => {
    const one = backend();
    const longest = { instance: '€'.repeat(MAX_IDENTITY_LENGTH), site: '€'.repeat(MAX_IDENTITY_LENGTH - 2) + '😀' };
    expect((await one.tryAcquire(['k'], 'owner-a', 30_000, { holder: longest })).acquired).toBe(true);
    expect((await one.inspect('k'))!.holders![0]).toMatchObject(longest);
    const tooLong = { instance: '€'.repeat(MAX_IDENTITY_LENGTH * 2), site: 'x' };
    await expect(one.tryAcquire(['other'], 'owner-b', 30_000, { holder: tooLong })).rejects.toThrow(InvalidLockOptionsError);
    await expect(one.tryAcquire(['other'], 'owner-b', 30_000, { holder: tooLong })).rejects.toThrow(
      /etcd backend stores an identity \(instance and site\) of at most 769 bytes, got 770/,
    );
    await expectBeside(['k/owner-a']);
  });

  it('a process of the release before, which stores nobody, waits for, takes from and hands back to a process of this one', async () => {
    const locks = new LockService(backend(), { keyPrefix: 'fault:', instance: 'new-1' });
    fixture.cleanup(() => locks.onApplicationShutdown());
    const observer = backend();
    const urls = fixture.endpoints.join(',');
    const library = { LOCK_LIBRARY: previousRelease('release-before-identity').entry };
    const held = await locks.acquire('mixed', { site: 'Jobs.run' });

    const old = Holder.spawn('etcd-lock-holder.mjs', urls, 'mixed', 10_000, [], library);
    fixture.cleanup(() => old.kill());
    await eventually(async () => expect((await observer.inspect('fault:mixed'))!.waiters).toHaveLength(1), 20_000);
    expect((await observer.inspect('fault:mixed'))!.waiters).toEqual([{ owner: expect.any(String) }]);
    await held.release();
    await old.next('acquired');
    expect((await observer.inspect('fault:mixed'))!.holders).toEqual([
      { owner: expect.any(String), ttlMs: expect.any(Number), fencingToken: expect.any(Number) },
    ]);

    // Back to this release: named in line, then as the holder.
    const again = locks.acquire('mixed', { site: 'Jobs.again', wait: 20_000 });
    await eventually(
      async () => expect((await observer.inspect('fault:mixed'))!.waiters?.map((w) => w.site)).toEqual(['Jobs.again']),
      20_000,
    );
    old.child.send({ type: 'release' });
    const handle = await again;
    expect((await observer.inspect('fault:mixed'))!.holders).toEqual([
      expect.objectContaining({ instance: 'new-1', site: 'Jobs.again', acquiredAt: expect.any(Number) }),
    ]);
    await old.next('released');
    await handle.release();
    await nothingLeft('every key to go');
  }, 90_000);
});
