import { describe, expect, it } from '@jest/globals';
import { EtcdLockBackend, LockService } from '../../lib/index.js';
import { useEtcdCluster } from '../support/etcd-fixture.js';
import { until } from '../support/wait.js';

/**
 * Fencing tokens of one key grow in order of acquisition, whatever the mode: every holder's token
 * is above the tokens of the holders of that key that ended before it began. On etcd a holder's
 * token is its entry's create revision (the previous release's processes use it too), and a
 * reader or permit caller may be in on a key before it holds it: a caller of several keys in on
 * its first key while it waits for a later one, or a reader let in that has not taken the key yet.
 * A later caller of that key that entered beside it, held and left before it took the key would
 * have a greater token than it: so a later caller waits until every entry ahead of it holds.
 *
 * Each test lets the later caller run a section that ends at once, and tells when it could go in
 * by its first attempt (a spy on the backend): let in at once, its section is over before the
 * entry ahead takes the key; made to wait, the entry ahead takes the key first. Either way the
 * test then checks, in the store's revisions, that the later caller (the greater token) did not
 * end before the entry ahead (the smaller one) began to hold.
 */
const fixture = useEtcdCluster({ members: 1 });
const PREFIX = 'nest-distributed-lock/';

function service(): { locks: LockService; backend: EtcdLockBackend } {
  const backend = new EtcdLockBackend(fixture.endpoints[0]);
  const locks = new LockService(backend, { keyPrefix: '' });
  fixture.cleanup(async () => {
    await locks.onApplicationShutdown();
    await backend.close();
  });
  return { locks, backend };
}

async function line(key: string): Promise<{ key: string; value: string; create: number; mod: number }[]> {
  const { kvs } = await fixture.admin.getAll().prefix(`${PREFIX}${key}/`).sort('Create', 'Ascend').exec();
  return kvs.map((kv) => ({
    key: kv.key.toString(),
    value: kv.value.toString(),
    create: Number(kv.create_revision),
    mod: Number(kv.mod_revision),
  }));
}

/** The store's revision now. */
async function revision(): Promise<number> {
  return Number((await fixture.admin.get('revision').exec()).header.revision);
}

/** Whether the backend's first attempt got the keys (the caller was let in at once). */
function firstAttempt(backend: EtcdLockBackend): Promise<boolean> {
  const original = backend.tryAcquire.bind(backend);
  return new Promise((resolve) => {
    backend.tryAcquire = async (...args) => {
      const result = await original(...args);
      resolve(result.acquired);
      return result;
    };
  });
}

/** What each attempt of the backend answered (acquired or not), in order. */
function answers(backend: EtcdLockBackend): boolean[] {
  const answered: boolean[] = [];
  const original = backend.tryAcquire.bind(backend);
  backend.tryAcquire = async (...args) => {
    const result = await original(...args);
    answered.push(result.acquired);
    return result;
  };
  return answered;
}

/** A caller of `a` alone whose section ends at once: its token, and a revision its section ended by. */
function shortSection(locks: LockService, options: object): Promise<{ token: number; endedBy: number }> {
  return locks.acquire('a', { ...options, wait: 10_000 }).then(async (handle) => {
    await handle.release();
    return { token: handle.fencingToken!, endedBy: await revision() };
  });
}

describe.each([
  ['shared', { mode: 'shared' as const }, 'shared'],
  ['permits 3', { permits: 3 }, 'permits3'],
])('token order on etcd (%s)', (_kind, kind, word) => {
  it('a later caller of the first key of a caller of two keys that waits for the second does not hold and leave before it', async () => {
    const [writer, several, later] = [service(), service(), service()];
    const blocker = await writer.locks.acquire('b');
    const both = several.locks.acquire(['a', 'b'], { ...kind, wait: 10_000 });
    await until(async () => (await line('a')).length === 1 && (await line('b')).length === 2, 10_000, 'the caller of both to wait');
    const letIn = firstAttempt(later.backend);
    const section = shortSection(later.locks, kind);
    if (await letIn) await section;
    await blocker.release();
    const handle = await both;
    fixture.cleanup(() => handle.release());
    const began = (await line('a')).find((entry) => entry.create === handle.fencingToken)!.mod;
    const single = await section;
    expect(single.token).toBeGreaterThan(handle.fencingToken!);
    // Seen without the rule: the later caller's section ended before the caller of both began.
    expect(single.endedBy).toBeGreaterThan(began);
  });

  it('a later caller does not hold and leave before a caller let in ahead of it takes the key', async () => {
    const [later] = [service()];
    // A caller let in (a reader woken with others as a writer left, say) that has not taken the key yet.
    const lease = fixture.admin.lease(30, { autoKeepAlive: false });
    fixture.cleanup(() => lease.revoke());
    const slow = `${PREFIX}a/slow`;
    const placed = Number((await lease.put(slow).value(`waiting ${word}`).exec()).header.revision);
    const letIn = firstAttempt(later.backend);
    const section = shortSection(later.locks, kind);
    if (await letIn) await section;
    // It takes the key now, as its transaction would: marked held, same create revision (its token).
    const began = Number((await lease.put(slow).value(`held ${word}`).exec()).header.revision);
    const single = await section;
    expect(single.token).toBeGreaterThan(placed);
    expect(single.endedBy).toBeGreaterThan(began);
  });

  it('a later caller told that the entry it waited for went does not enter beside an earlier one that does not hold yet', async () => {
    const [later] = [service()];
    const lease = fixture.admin.lease(30, { autoKeepAlive: false });
    fixture.cleanup(() => lease.revoke());
    // Two callers let in that have not taken the key yet; the later caller waits for the nearer one.
    const [first, second] = [`${PREFIX}a/first`, `${PREFIX}a/second`];
    await lease.put(first).value(`waiting ${word}`).exec();
    await lease.put(second).value(`waiting ${word}`).exec();
    const answered = answers(later.backend);
    const section = shortSection(later.locks, kind);
    await until(() => answered.length === 1, 10_000, 'the later caller to wait');
    // The nearer one gives up: the later caller, woken, goes for the key, but the first does not hold yet.
    await fixture.admin.delete().key(second).exec();
    await until(() => answered.length === 2, 10_000, 'the later caller to ask again');
    const began = Number((await lease.put(first).value(`held ${word}`).exec()).header.revision);
    const single = await section;
    expect(answered.slice(0, 2)).toEqual([false, false]);
    expect(single.endedBy).toBeGreaterThan(began);
  });
});
