import { describe, expect, it } from '@jest/globals';
import { Etcd3, type ITxnRequest } from 'etcd3';
import { SHARED } from '../../lib/backends/lock-backend.interface.js';
import { EtcdLockBackend, LockService } from '../../lib/index.js';
import { useEtcdCluster } from '../support/etcd-fixture.js';
import { EtcdRequestGate, isFirstAttempt } from '../support/etcd-request-gate.js';
import { until } from '../support/wait.js';

/**
 * Shared locks and semaphores on etcd, where its line could go wrong: tokens that stay the
 * entries' create revisions (what processes of the previous release give), a caller refused for
 * its limit, attempts applied twice or late, wake-ups behind a caller of several keys, and a
 * caller of several keys that must keep nobody out of the lines after its first busy one.
 */
const fixture = useEtcdCluster({ members: 1 });
const PREFIX = 'nest-distributed-lock/';

function backend(client?: Etcd3): EtcdLockBackend {
  const created = new EtcdLockBackend(client ?? fixture.endpoints[0]);
  fixture.cleanup(() => created.close());
  return created;
}

function service(options: ConstructorParameters<typeof LockService>[1] = {}): LockService {
  const locks = new LockService(backend(), { keyPrefix: '', ...options });
  fixture.cleanup(() => locks.onApplicationShutdown());
  return locks;
}

/** The entries of a key's line, first first: owner, value, create revision. */
async function line(key: string): Promise<{ owner: string; value: string; revision: number }[]> {
  const { kvs } = await fixture.admin.getAll().prefix(`${PREFIX}${key}/`).sort('Create', 'Ascend').exec();
  return kvs.map((kv) => ({
    owner: kv.key.toString().slice(PREFIX.length + key.length + 1),
    value: kv.value.toString(),
    revision: Number(kv.create_revision),
  }));
}

/** A backend whose transactions the test can hold back or run twice. */
function gated(): { backend: EtcdLockBackend; gate: EtcdRequestGate } {
  const client = new Etcd3({ hosts: fixture.endpoints });
  fixture.cleanup(() => client.close());
  const gate = new EtcdRequestGate(client);
  fixture.cleanup(() => gate.open());
  return { backend: backend(client), gate };
}

describe('etcd shared locks and semaphores', () => {
  it("gives a waiter its entry's create revision as token (its place, as the previous release does), not the revision it entered at", async () => {
    const [a, b, c] = [service(), service(), service()];
    const writer = await a.acquire('place');
    const reader = b.acquire('place', { mode: 'shared', wait: 10_000 });
    const permit = c.acquire('place2', { permits: 2, wait: 10_000 });
    const blocker = await a.acquire('place2');
    await until(async () => (await line('place')).length === 2 && (await line('place2')).length === 2, 10_000, 'both to wait');
    const [readerPlace, permitPlace] = [(await line('place'))[1].revision, (await line('place2'))[1].revision];
    // Something else happens in etcd meanwhile: the revision moves on.
    await (await a.acquire('elsewhere')).release();
    await writer.release();
    await blocker.release();
    expect((await reader).fencingToken).toBe(readerPlace);
    expect((await permit).fencingToken).toBe(permitPlace);
  });

  it('a caller refused for its limit leaves no place behind, and takes no place a caller of the right limit gets', async () => {
    const [b1, b2, b3] = [backend(), backend(), backend()];
    const limits = [3];
    for (const owner of ['h1', 'h2']) expect((await b1.tryAcquire(['sem'], owner, 10_000, { limits })).acquired).toBe(true);
    // Its own limit is 5 whatever the entries ahead say: refused, not let in as the third of 3.
    expect(await b2.tryAcquire(['sem'], 'odd', 10_000, { limits: [5] })).toEqual({
      acquired: false,
      limitMismatch: { key: 'sem', limit: 3 },
    });
    expect(await b2.tryAcquire(['sem'], 'reader', 10_000, { limits: [SHARED] })).toEqual({
      acquired: false,
      limitMismatch: { key: 'sem', limit: 3 },
    });
    // Out of the line at once; the lease it would have held on (and its anchor) goes soon after.
    expect((await line('sem')).map((e) => e.owner)).toEqual(['h1', 'h2']);
    const theirs = async () =>
      (await fixture.admin.getAll().prefix(PREFIX).keys()).filter((k) => k.endsWith('/odd') || k.endsWith('/reader'));
    await until(async () => (await theirs()).length === 0, 5_000, 'nothing of the refused callers to be left');
    expect((await b3.tryAcquire(['sem'], 'c3', 10_000, { limits })).acquired).toBe(true);
    expect((await b3.tryAcquire(['sem'], 'd3', 10_000, { limits, willWait: false })).acquired).toBe(false);
    expect((await b1.inspect('sem'))?.holders?.map((h) => h.owner).sort()).toEqual(['c3', 'h1', 'h2']);
  });

  it('a first attempt applied twice (its answer lost, the client retried it) counts its place once', async () => {
    const plain = backend();
    expect((await plain.tryAcquire(['twice'], 'a', 10_000, { limits: [2] })).acquired).toBe(true);
    const { backend: retried, gate } = gated();
    gate.twiceTxn(isFirstAttempt);
    expect(await retried.tryAcquire(['twice'], 'c', 10_000, { limits: [2] })).toMatchObject({ acquired: true });
    // A caller that does not wait, applied twice too: it enters once.
    expect(await plain.release(['twice'], 'a')).toBe(true);
    gate.twiceTxn((request: ITxnRequest) => request.compare?.some((c) => c.target === 'Create' && c.result === 'Less') === true);
    expect(await retried.tryAcquire(['twice'], 'd', 10_000, { limits: [2], willWait: false })).toMatchObject({ acquired: true });
    expect((await plain.tryAcquire(['twice'], 'e', 10_000, { limits: [2], willWait: false })).acquired).toBe(false);
    expect((await plain.inspect('twice'))?.holders?.map((h) => h.owner).sort()).toEqual(['c', 'd']);
  });

  it('a first attempt that lands after its caller asked again and won is refused by etcd: never one more holder than permits', async () => {
    const plain = backend();
    expect((await plain.tryAcquire(['late'], 'a', 10_000, { limits: [2] })).acquired).toBe(true);
    const { backend: late, gate } = gated();
    const held = gate.lateTxn(isFirstAttempt);
    await expect(late.tryAcquire(['late'], 'c', 10_000, { limits: [2] })).rejects.toThrow();
    await held.caught;
    expect(await late.tryAcquire(['late'], 'c', 10_000, { limits: [2] })).toMatchObject({ acquired: true });
    await held.send().catch(() => undefined);
    expect((await plain.tryAcquire(['late'], 'e', 10_000, { limits: [2], willWait: false })).acquired).toBe(false);
    expect((await line('late')).map((e) => e.owner).sort()).toEqual(['a', 'c']);
  });

  it('wakes a permit waiter behind a caller of several keys that is in on its key but waits for another once that caller holds it', async () => {
    // Polls once a minute: only a wake-up lets the waiter in within its wait.
    const services = Array.from({ length: 4 }, () => service({ pollInterval: 60_000 }));
    const waiterBackend = backend();
    const waiting = new LockService(waiterBackend, { keyPrefix: '', pollInterval: 60_000 });
    fixture.cleanup(() => waiting.onApplicationShutdown());
    const answers: boolean[] = [];
    const tryAcquire = waiterBackend.tryAcquire.bind(waiterBackend);
    waiterBackend.tryAcquire = async (...args) => {
      const result = await tryAcquire(...args);
      answers.push(result.acquired);
      return result;
    };
    const holders = [await services[0].acquire('k', { permits: 2 }), await services[1].acquire('k', { permits: 2 })];
    const other = await services[2].acquire('z');
    const both = services[3].acquire(['k', 'z'], { permits: 2, wait: 30_000 });
    both.catch(() => undefined);
    await until(async () => (await line('k')).length === 3, 10_000, 'the caller of both to wait');
    const waiter = waiting.acquire('k', { permits: 2, wait: 30_000 });
    waiter.catch(() => undefined);
    await until(async () => (await line('k')).length === 4, 10_000, 'the permit waiter to wait');
    await holders[0].release();
    // The caller of both is in on k now, and waits for z.
    await until(async () => (await line('z')).some((e) => e.value === 'waiting permits2'), 10_000, 'the caller of both to wait for z');
    await holders[1].release();
    // Woken by that release, the waiter looks: in as far as the permits go, it does not enter beside
    // the caller of both, which does not hold k yet (its token is smaller), and waits for it to.
    await until(() => answers.length === 2, 10_000, 'the waiter to look again');
    expect(answers).toEqual([false, false]);
    await other.release();
    const held = await both;
    const since = performance.now();
    const handle = await waiter;
    // Woken when the entry of the caller of both is marked held, not let in by its last attempt as its wait runs out.
    expect(performance.now() - since).toBeLessThan(5_000);
    expect(handle.isHeld).toBe(true);
    expect(handle.fencingToken).toBeGreaterThan(held.fencingToken!);
    await held.release();
    await handle.release();
  }, 60_000);

  for (const [kind, options] of [
    ['an exclusive', {}],
    ['a shared', { mode: 'shared' as const }],
  ] as const)
    it(`lets a holder of 'a' take 'b' next while a caller of both (${kind} lock) waits for 'a'`, async () => {
      const [locks, other] = [service({ pollInterval: 1_000 }), service({ pollInterval: 1_000 })];
      const holder = await locks.acquire('sorted:a');
      const both = other.acquire(['sorted:a', 'sorted:b'], { ...options, wait: 20_000 });
      both.catch(() => undefined);
      await until(async () => (await line('sorted:a')).length === 2, 10_000, 'the caller of both to wait');
      // In the line of 'b' it keeps nobody out.
      await until(async () => (await line('sorted:b')).every((e) => e.value.startsWith('pending')), 10_000, 'its entry in b to be pending');
      const nested = await locks.acquire('sorted:b', { wait: 2_000 });
      const token = nested.fencingToken!;
      await nested.release();
      await holder.release();
      const handle = await both;
      // Passed on 'b', it took a new place: its token is above the one who passed it.
      expect(handle.fencingToken).toBeGreaterThan(token);
      await handle.release();
    });
});
