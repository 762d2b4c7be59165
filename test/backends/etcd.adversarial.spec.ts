import { describe, expect, it, jest } from '@jest/globals';
import { Logger } from '@nestjs/common';
import { Test } from '@nestjs/testing';
import { Etcd3, type ITxnRequest } from 'etcd3';
import {
  DistributedLockError,
  DistributedLockModule,
  EtcdLockBackend,
  InvalidLockKeyError,
  LockBackendError,
  LockLostError,
  LockService,
  type LockHandle,
} from '../../lib/index.js';
import { EtcdReleases } from '../../lib/backends/etcd/etcd.releases.js';
import { useEtcdCluster } from '../support/etcd-fixture.js';
import { EtcdRequestGate, isDeletion, isFirstAttempt, isLeaseMove, isPromotion, names } from '../support/etcd-request-gate.js';
// @ts-expect-error: a plain ESM fixture shared with the child processes, without types.
import { fencedRead, fencedWrite } from '../fixtures/etcd-fenced-store.mjs';
import { activeTimers, eventually, until } from '../support/wait.js';
import { TcpProxy } from '../support/tcp-proxy.js';

/**
 * Attempts to break what the etcd backend promises (docs/etcd.md, the LockBackend contract):
 * requests that reach etcd after the client gave up on them, aborts and shutdowns in the middle
 * of a step, stalls, odd keys, and hands other than ours on the keys and leases.
 */
const fixture = useEtcdCluster({ members: 3 });

const PREFIX = 'nest-distributed-lock/';

const write = fencedWrite as (etcd: Etcd3, name: string, token: number, value: string) => Promise<boolean>;
const read = fencedRead as (etcd: Etcd3, name: string) => Promise<{ value: string | null; token: number }>;

type ServiceOptions = ConstructorParameters<typeof LockService>[1];

function service(options: ServiceOptions = {}, backend: EtcdLockBackend = new EtcdLockBackend(fixture.endpoints)): LockService {
  const locks = new LockService(backend, { keyPrefix: 'adv:', ...options });
  fixture.cleanup(() => locks.onApplicationShutdown());
  return locks;
}

/** A service over a client whose requests the test can hold back (see EtcdRequestGate). */
function gated(
  options: ServiceOptions = {},
  backendOptions?: ConstructorParameters<typeof EtcdLockBackend>[1],
): { locks: LockService; gate: EtcdRequestGate } {
  const client = new Etcd3({ hosts: fixture.endpoints });
  fixture.cleanup(() => client.close());
  const gate = new EtcdRequestGate(client);
  const locks = service(options, new EtcdLockBackend(client, backendOptions));
  // Shutdown waits for what the service sent: nothing may stay held once the test is over.
  fixture.cleanup(() => gate.open());
  return { locks, gate };
}

/** Every key the backend wrote in etcd, with what it says and the lease it is on. */
async function keys(): Promise<{ key: string; value: string; lease: string }[]> {
  const { kvs } = await fixture.admin.getAll().prefix(PREFIX).exec();
  return kvs.map((kv) => ({ key: kv.key.toString(), value: kv.value.toString(), lease: kv.lease }));
}

/** The entries of the lines (not the anchors of waiters' first attempts, nor who asks beside each entry). */
async function entries(): Promise<{ key: string; value: string; lease: string }[]> {
  return (await keys()).filter((kv) => !kv.key.startsWith(`${PREFIX}%anchor/`) && !kv.key.startsWith(`${PREFIX}%who/`));
}

/** The leases etcd has now. */
async function leases(): Promise<string[]> {
  return (await fixture.admin.leaseClient.leaseLeases({})).leases.map((lease) => String(lease.ID));
}

/** Watches open on the members (etcd's own count). */
async function watchers(): Promise<number> {
  let total = 0;
  for (const member of fixture.cluster.members.filter((m) => m.running)) {
    const metrics = await (await fetch(`${member.endpoint}/metrics`)).text();
    total += Number(/^etcd_debugging_mvcc_watcher_total (\d+)/m.exec(metrics)?.[1] ?? 0);
  }
  return total;
}

/** Resolves once nothing of what the test started is left in etcd: no entry, no watch, no lease but `kept` ones. */
async function nothingLeft(kept: readonly string[], what: string): Promise<void> {
  const left = async () => {
    const extra = (await leases()).filter((lease) => !kept.includes(lease));
    return { keys: await keys(), leases: extra, watchers: await watchers() };
  };
  try {
    await until(
      async () => {
        const now = await left();
        return now.keys.length === 0 && now.leases.length === 0 && now.watchers === 0;
      },
      10_000,
      what,
    );
  } catch (error) {
    throw new Error(`${(error as Error).message}; left: ${JSON.stringify(await left())}`);
  }
}

function quietLogs(): void {
  const warn = jest.spyOn(Logger.prototype, 'warn').mockImplementation(() => undefined);
  fixture.cleanup(() => warn.mockRestore());
}

describe('etcd backend, attacked', () => {
  describe('late and repeated requests', () => {
    it("a waiting first attempt that lands after the caller's retry won leaves the holder's entry held, and a release frees the key", async () => {
      const { locks, gate } = gated({ pollInterval: 100 });
      const late = gate.lateTxn(isFirstAttempt);
      const acquiring = locks.acquire('late-first', { wait: 10_000 });
      await late.caught;
      // The retry finds nothing of the first attempt, starts over, and wins the free key.
      const handle = await acquiring;
      // Now etcd gets the first attempt: the key is taken (by its own owner), so it would stand in
      // line, if etcd took it at all.
      await late.send().catch(() => undefined);
      expect((await locks.inspect('late-first'))?.heldHere).toBe(true);
      expect(await entries()).toEqual([expect.objectContaining({ value: 'held' })]);
      await handle.release();
      const other = service();
      const next = await other.tryAcquire('late-first');
      expect(next).toBeDefined();
      await next!.release();
    });

    it('a spare lease whose grant was answered too late holds no key: the next acquisition grants its own, and nothing else is left', async () => {
      const kept = await leases();
      const { locks, gate } = gated();
      // The first two grants are the first two acquisitions' own leases (a caller that does not
      // wait needs no waiter lease); the third, the spare asked for after the second (the ttl is
      // in demand).
      let grants = 0;
      const late = gate.late('leaseClient', 'leaseGrant', () => ++grants === 3);
      const first = (await locks.tryAcquire('spare-late-a', { ttl: 3_000 }))!;
      const again = (await locks.tryAcquire('spare-late-a2', { ttl: 3_000 }))!;
      await late.caught;
      const orphan = String(((await late.send()) as { ID: string }).ID);
      const second = (await locks.tryAcquire('spare-late-b', { ttl: 3_000 }))!;
      const onLeases = (await entries()).map((entry) => entry.lease);
      expect(onLeases).toHaveLength(3);
      expect(onLeases).not.toContain(orphan);
      // etcd has the lease, with nothing on it: it runs out by itself.
      expect((await fixture.admin.leaseClient.leaseTimeToLive({ ID: orphan, keys: true })).keys).toEqual([]);
      await first.release();
      await again.release();
      await second.release();
      await locks.onApplicationShutdown();
      await nothingLeft([...kept, orphan], 'nothing but the lease granted too late to be left');
    });

    it('an extension to another ttl that lands after the next extension read where the keys are never frees them under a holder that believes it holds', async () => {
      const { locks, gate } = gated();
      const handle = await locks.acquire('late-move', { ttl: 3_000 });
      const late = gate.lateTxn(isLeaseMove);
      await expect(handle.extend(20_000)).rejects.toThrow(LockBackendError);
      const to = (await late.caught).success![0].request_put!.lease!;
      // The next extension finds the keys still on the first lease and lets the new one go; the
      // move reaches etcd just before that revoke does.
      const revoke = gate.slow<{ ID: string }>('leaseClient', 'leaseRevoke', (r) => String(r.ID) === String(to));
      const extending = handle.extend(3_000).then(
        () => 'extended',
        (error: unknown) => error,
      );
      await revoke.caught;
      await late.send();
      await revoke.send().catch(() => undefined);
      const outcome = await extending;
      const kept = (await entries()).length > 0;
      // Whatever happened, the holder knows it: it holds exactly when its keys are in etcd.
      expect({ outcome: outcome === 'extended' ? outcome : (outcome as Error).name, isHeld: handle.isHeld }).toEqual(
        kept ? { outcome: 'extended', isHeld: true } : { outcome: 'LockLostError', isHeld: false },
      );
    });

    it("a waiter's attempt to take its keys that lands after it took them and moved them to another lease does not bring them back to the lease it revokes", async () => {
      const holder = service();
      const held = await holder.acquire('late-turn');
      const { locks, gate } = gated({ pollInterval: 100 });
      const waiting = locks.acquire('late-turn', { wait: 10_000 });
      await until(async () => (await entries()).some((e) => e.value.startsWith('waiting')), 10_000, 'the waiter to stand in line');
      const late = gate.lateTxn(isPromotion);
      await held.release();
      const from = (await late.caught).success![0].request_put!.lease!;
      // Its retry finds it still waiting, and takes the keys.
      const handle = await waiting;
      // An extension to another ttl moves them to a new lease and revokes this one; the late
      // attempt reaches etcd between the two.
      const revoke = gate.slow<{ ID: string }>('leaseClient', 'leaseRevoke', (r) => String(r.ID) === String(from));
      await handle.extend(20_000);
      await revoke.caught;
      await late.send().catch(() => undefined);
      await revoke.send().catch(() => undefined);
      expect(await entries()).toEqual([expect.objectContaining({ value: 'held' })]);
      expect((await holder.inspect('late-turn'))?.fencingToken).toBe(handle.fencingToken);
    });

    it('a release while an extension to another ttl is out frees the key, whichever reaches etcd first', async () => {
      quietLogs();
      const { locks, gate } = gated();
      const handle = await locks.acquire('release-while-moving', { ttl: 3_000, autoExtend: false });
      const [entry] = await entries();
      // The extension's new lease is granted only once the release is out; then its move reaches
      // etcd before the release's revoke.
      const grant = gate.slow('leaseClient', 'leaseGrant', () => true);
      const revoke = gate.slow<{ ID: string }>('leaseClient', 'leaseRevoke', (r) => String(r.ID) === entry.lease);
      const extending = handle.extend(20_000).catch((e: unknown) => e);
      await grant.caught;
      const releasing = handle.release();
      await revoke.caught;
      await grant.send();
      await extending;
      await revoke.send().catch(() => undefined);
      await releasing;
      const next = await service().tryAcquire('release-while-moving');
      expect(next).toBeDefined();
      await next!.release();
    });

    it('an acquire that does not wait and timed out: what its request won when it lands is freed', async () => {
      const kept = await leases();
      const { locks, gate } = gated();
      const late = gate.lateTxn(isFirstAttempt);
      // Its lease's revoke reaches etcd after the request does; so does the release that giving up
      // sends, which finds nothing yet.
      const revoke = gate.slow('leaseClient', 'leaseRevoke', () => true);
      const deletion = gate.slow('kv', 'txn', isDeletion);
      await expect(locks.tryAcquire('late-try')).rejects.toThrow(LockBackendError);
      await Promise.all([revoke.caught, deletion.caught]);
      await deletion.send();
      expect(((await late.send()) as { succeeded: boolean }).succeeded).toBe(true);
      expect(await entries()).toEqual([expect.objectContaining({ value: 'held' })]);
      await revoke.send();
      // The spare lease it keeps for its next acquisition goes with it.
      await locks.onApplicationShutdown();
      await nothingLeft(kept, 'the lock its late request won to be freed');
    });

    it('a waiter that gave up after its first attempt timed out leaves no place in line when that attempt lands late', async () => {
      const holder = service();
      const held = await holder.acquire(['late-gave-up', 'late-other']);
      const kept = await leases();
      // (A waiter lease that outlives a loaded machine's slow keepalives: no place is lost and taken again.)
      const { locks, gate } = gated({ pollInterval: 2_000 }, { waiterTimeout: 30_000 });
      // A waiter of the same process keeps the process's waiter lease alive meanwhile.
      const other = locks.acquire('late-other', { wait: 25_000 });
      other.catch(() => undefined);
      await until(async () => (await entries()).length === 3, 10_000, 'the other waiter to stand in line');
      const late = gate.lateTxn((r) => isFirstAttempt(r) && names(r, 'adv:late-gave-up'));
      // Before it starts over (a last attempt) or once it gave up (its release), it revokes the lease
      // of that attempt, then deletes what landed. The attempt lands in between.
      let hold: string | undefined;
      void late.caught.then((request) => (hold = String(request.success![0].request_put!.lease)));
      const revoke = gate.slow<{ ID: string }>('leaseClient', 'leaseRevoke', (r) => String(r.ID) === hold);
      const acquiring = locks.acquire('late-gave-up', { wait: 300 }).catch((e: unknown) => e);
      await revoke.caught;
      await late.send().catch(() => undefined);
      await revoke.send();
      expect(await acquiring).toBeInstanceOf(DistributedLockError);
      const line = async () => (await entries()).filter((e) => e.key.startsWith(`${PREFIX}adv:late-gave-up/`));
      await until(async () => (await line()).length === 1, 10_000, 'only the holder to be left in the line');
      await held.release();
      await (await other).release();
      // The process's waiter lease outlives its last place (the next one may use it) unless it stops.
      await locks.onApplicationShutdown();
      await nothingLeft(kept, 'every entry and lease to go');
    });

    it('a waiter whose release was lost leaves no place in line while another caller of its process waits on', async () => {
      quietLogs();
      const holder = service();
      const held = await holder.acquire('lost-release');
      const busy = await holder.acquire('lost-release-other');
      const { locks, gate } = gated({}, { waiterTimeout: 3_000 });
      // This caller waits all along: the process's waiter lease, which the entries sit on, stays alive.
      const waitingOn = locks.acquire('lost-release-other', { wait: 30_000 });
      waitingOn.catch(() => undefined);
      await until(async () => (await entries()).some((e) => e.value.startsWith('waiting')), 10_000, 'the first waiter to stand in line');
      const lost = gate.lateTxn((r) => isDeletion(r) && names(r, 'adv:lost-release'));
      await expect(locks.acquire('lost-release', { wait: 300 })).rejects.toBeInstanceOf(DistributedLockError);
      await lost.caught;
      await held.release();
      // Not after the other caller's 30 s: its entry is deleted again once etcd answers.
      const next = await service().acquire('lost-release', { wait: 10_000 });
      expect(next.fencingToken).toBeGreaterThan(held.fencingToken!);
      // Who it was went with it: beside the one entry left in the line, who asks, on its lease.
      const line = async (folder: string) =>
        (await keys()).filter((kv) => kv.key.startsWith(`${PREFIX}${folder}adv:lost-release/`)).map((kv) => kv.lease);
      expect(await line('')).toHaveLength(1);
      expect(await line('%who/')).toEqual(await line(''));
      await next.release();
      await busy.release();
      await (await waitingOn).release();
    }, 30_000);

    it('shutdown while a lost release waits to be deleted again: no timer, entry or lease is left', async () => {
      quietLogs();
      const timers = activeTimers();
      const holder = service();
      const held = await holder.acquire('leftover-shutdown');
      const kept = await leases();
      const { locks, gate } = gated({}, { waiterTimeout: 30_000 });
      gate.lateTxn((r) => isDeletion(r) && names(r, 'adv:leftover-shutdown'));
      await expect(locks.acquire('leftover-shutdown', { wait: 300 })).rejects.toBeInstanceOf(DistributedLockError);
      // Its place sat alone on its process's waiter lease, which the failed release retires: revoked,
      // it takes the place along. The deletion sent again still waits, with its timer.
      await eventually(async () => expect((await entries()).map((e) => e.value)).toEqual(['held']), 10_000);
      await locks.onApplicationShutdown();
      await held.release();
      await nothingLeft(kept, 'the waiter’s entry and lease to go with the shutdown');
      await holder.onApplicationShutdown();
      await eventually(() => expect(activeTimers()).toBeLessThanOrEqual(timers), 10_000);
    });

    it('a lost release deleted again while its owner asks again: the deletion does not take the lock that owner won meanwhile', async () => {
      quietLogs();
      const holder = service();
      const held = await holder.acquire('leftover-owner');
      const client = new Etcd3({ hosts: fixture.endpoints });
      fixture.cleanup(() => client.close());
      const gate = new EtcdRequestGate(client);
      fixture.cleanup(() => gate.open());
      const backend = new EtcdLockBackend(client, { waiterTimeout: 3_000 });
      fixture.cleanup(() => backend.close());
      const keys = ['adv:leftover-owner'];
      expect(await backend.tryAcquire(keys, 'owner-1', 10_000)).toMatchObject({ acquired: false });
      gate.lateTxn((r) => isDeletion(r) && names(r, 'adv:leftover-owner'));
      await expect(backend.release(keys, 'owner-1')).rejects.toBeInstanceOf(LockBackendError);
      // The deletion sent again is on its way when the same owner asks again, and wins the key.
      const deletes = (r: ITxnRequest) => (r.success ?? []).every((op) => op.request_delete_range) && names(r, 'adv:leftover-owner');
      const again = gate.slow<ITxnRequest>('kv', 'txn', deletes);
      await again.caught;
      await held.release();
      // Its old entry, still there, is its place again: first in line, it takes the key at once.
      expect(await backend.tryAcquire(keys, 'owner-1', 10_000)).toMatchObject({ acquired: true });
      await again.send().catch(() => undefined);
      expect(await service().tryAcquire('leftover-owner')).toBeUndefined();
      expect(await backend.extend(keys, 'owner-1', 10_000)).toMatchObject({ extended: true });
      expect(await backend.release(keys, 'owner-1')).toBe(true);
    }, 30_000);

    it('a first attempt applied twice (a client that retries a request whose answer it lost) still takes the free key', async () => {
      const { locks, gate } = gated({ pollInterval: 100 });
      gate.twiceTxn(isFirstAttempt);
      const handle = await locks.acquire('twice-first', { wait: 10_000 });
      expect(await entries()).toEqual([expect.objectContaining({ value: 'held' })]);
      expect((await locks.inspect('twice-first'))?.fencingToken).toBe(handle.fencingToken);
      await handle.release();
      expect(await entries()).toEqual([]);
    });

    it("a waiter's attempt to take its keys applied twice takes them once", async () => {
      const holder = service();
      const held = await holder.acquire('twice-turn');
      const { locks, gate } = gated({ pollInterval: 100 });
      const waiting = locks.acquire('twice-turn', { wait: 10_000 });
      await until(async () => (await entries()).some((e) => e.value.startsWith('waiting')), 10_000, 'the waiter to stand in line');
      gate.twiceTxn(isPromotion);
      await held.release();
      const handle = await waiting;
      expect(handle.fencingToken).toBeGreaterThan(held.fencingToken!);
      expect(await entries()).toEqual([expect.objectContaining({ value: 'held' })]);
      await handle.release();
      expect(await entries()).toEqual([]);
    });

    it('an extension to another ttl applied twice keeps the lock', async () => {
      quietLogs();
      const { locks, gate } = gated();
      const handle = await locks.acquire('twice-move', { ttl: 3_000 });
      gate.twiceTxn(isLeaseMove);
      await handle.extend(20_000);
      expect(handle.isHeld).toBe(true);
      expect(await entries()).toEqual([expect.objectContaining({ value: 'held' })]);
      await handle.release();
    });
  });

  describe('real timeouts', () => {
    it('callers whose every call may time out while etcd still applies it: never two inside, and nothing left once they stop', async () => {
      quietLogs();
      const kept = await leases();
      // Most calls of this one time out on the client (15 ms) and are applied by etcd afterwards.
      const hasty = service({ pollInterval: 50 }, new EtcdLockBackend(fixture.endpoints, { commandTimeout: 15 }));
      const steady = service({ pollInterval: 200 });
      let inside: (() => boolean) | undefined;
      const overlaps: string[] = [];
      const done = { hasty: 0, steady: 0 };
      let stop = false;
      const callers = [hasty, hasty, hasty, steady, steady].map((locks, i) =>
        (async () => {
          const who = i < 3 ? 'hasty' : 'steady';
          while (!stop) {
            await locks
              .using(
                'hasty',
                async (lock) => {
                  if (inside?.()) overlaps.push(`${who} ${lock.fencingToken} entered while another holder was inside`);
                  const me = () => !lock.signal.aborted;
                  inside = me;
                  await new Promise((resolve) => setTimeout(resolve, 3));
                  if (inside === me) inside = undefined;
                  done[who] += 1;
                },
                { wait: 2_000, ttl: 3_000 },
              )
              // A call that fails at once (the service shutting down) must not spin without timers.
              .catch(() => new Promise((resolve) => setImmediate(resolve)));
          }
        })(),
      );
      try {
        await until(() => done.steady >= 30, 20_000, 'the steady callers to get the lock 30 times');
      } finally {
        stop = true;
        await Promise.all(callers);
      }
      expect(overlaps).toEqual([]);
      await hasty.onApplicationShutdown();
      await steady.onApplicationShutdown();
      await nothingLeft(kept, 'nothing of the timed-out calls to be left');
    });
  });

  describe('aborts, stalls and shutdown', () => {
    it('an abort while the first attempt is out leaves nothing: no entry, lease or watch', async () => {
      const holder = service();
      const held = await holder.acquire('abort-first');
      const kept = await leases();
      const { locks, gate } = gated();
      const slow = gate.slow('kv', 'txn', isFirstAttempt);
      const controller = new AbortController();
      const acquiring = locks.acquire('abort-first', { wait: 10_000, signal: controller.signal }).catch((e: unknown) => e);
      await slow.caught;
      controller.abort(new Error('the caller went away'));
      await slow.send();
      expect(await acquiring).toMatchObject({ message: 'the caller went away' });
      await held.release();
      // The spare lease it keeps for its next acquisition goes with it.
      await locks.onApplicationShutdown();
      await nothingLeft(kept, 'the aborted waiter to leave nothing');
    });

    it('an abort while waiting in line leaves nothing, no timer either, and the next waiter is not held up', async () => {
      const timers = activeTimers();
      const holder = service();
      const held = await holder.acquire('abort-wait');
      const kept = await leases();
      const aborting = service();
      const controller = new AbortController();
      const acquiring = aborting.acquire('abort-wait', { wait: 20_000, signal: controller.signal }).catch((e: unknown) => e);
      await until(async () => (await entries()).length === 2 && (await watchers()) === 2, 10_000, 'the first waiter to watch');
      // Behind it, a waiter of another process, which watches it.
      const nextService = service({ pollInterval: 2_000 });
      const next = nextService.acquire('abort-wait', { wait: 20_000 });
      await until(async () => (await entries()).length === 3 && (await watchers()) === 4, 10_000, 'the second waiter to watch');
      controller.abort(new Error('gone'));
      expect(await acquiring).toMatchObject({ message: 'gone' });
      await until(async () => (await entries()).length === 2, 10_000, 'the aborted place to go');
      await held.release();
      const handle = await next;
      await handle.release();
      await until(async () => (await entries()).length === 0 && (await watchers()) === 0, 10_000, 'every place and watch to go');
      // The spare leases they keep for their next acquisitions go with them.
      await Promise.all([holder, aborting, nextService].map((locks) => locks.onApplicationShutdown()));
      await nothingLeft(kept, 'every place to go');
      await eventually(() => expect(activeTimers()).toBeLessThanOrEqual(timers), 10_000);
    });

    it('an event loop stalled past the lease: the holder knows at once, and its fenced write is refused', async () => {
      quietLogs();
      const locks = service();
      const handle = await locks.acquire('stall', { ttl: 2_000 });
      expect(await write(fixture.admin, 'adv-fenced', handle.fencingToken!, 'first')).toBe(true);
      // A stall (a long GC, a blocking call): this thread does nothing for 5 s.
      Atomics.wait(new Int32Array(new SharedArrayBuffer(4)), 0, 0, 5_000);
      expect(handle.isHeld).toBe(false);
      expect(handle.signal.aborted).toBe(true);
      const next = await service().acquire('stall', { wait: 10_000 });
      expect(next.fencingToken).toBeGreaterThan(handle.fencingToken!);
      expect(await write(fixture.admin, 'adv-fenced', next.fencingToken!, 'second')).toBe(true);
      expect(await write(fixture.admin, 'adv-fenced', handle.fencingToken!, 'stale')).toBe(false);
      expect(await read(fixture.admin, 'adv-fenced')).toEqual({ value: 'second', token: next.fencingToken });
      await fixture.admin.delete().prefix('adv-fenced/');
    });
  });

  describe('shutdown', () => {
    it('app.close() while callers wait and one holds: every call settles, nothing is left in etcd, and the client it made is closed', async () => {
      quietLogs();
      const other = service();
      const elsewhere = await other.acquire('sd-busy');
      const kept = await leases();
      const sockets = () => process.getActiveResourcesInfo().filter((r) => r === 'TCPSocketWrap').length;
      const socketsBefore = sockets();
      const app = await Test.createTestingModule({
        imports: [DistributedLockModule.forRoot({ backend: new EtcdLockBackend(fixture.endpoints), keyPrefix: 'adv:' })],
      }).compile();
      await app.init();
      const locks = app.get(LockService);
      const holding = await locks.acquire('sd-held');
      const waiting = [
        locks.acquire('sd-busy', { wait: 25_000 }),
        locks.acquire('sd-busy', { wait: 25_000 }),
        locks.acquire(['sd-busy', 'sd-held'], { wait: 25_000 }),
        locks.acquire('sd-held', { wait: 25_000 }),
      ].map((p) =>
        p.then(
          () => 'acquired',
          (error: unknown) => (error as Error).name,
        ),
      );
      await until(async () => (await entries()).length === 7, 10_000, 'the waiters to stand in line');
      await app.close();
      expect(await Promise.all(waiting)).toEqual(Array(4).fill('LockBackendError'));
      expect(holding.signal.reason).toMatchObject({ reason: 'shutdown' });
      await until(async () => (await entries()).length === 1, 10_000, "only the other process's lock to be left");
      await elsewhere.release();
      await nothingLeft(kept, 'nothing of the closed application to be left');
      await until(() => sockets() <= socketsBefore, 10_000, 'the connections of the closed client to close');
    });

    it('app.close() while a first attempt is out: nothing is left once it answers', async () => {
      quietLogs();
      const held = await service().acquire('sd-first');
      const kept = await leases();
      const { locks, gate } = gated();
      const first = gate.slow('kv', 'txn', isFirstAttempt);
      const waiting = locks.acquire('sd-first', { wait: 25_000 }).catch((e: unknown) => e);
      await first.caught;
      const closing = locks.onApplicationShutdown();
      await first.send();
      await closing;
      expect(await waiting).toBeInstanceOf(LockBackendError);
      await held.release();
      await nothingLeft(kept, 'nothing of the closed service to be left');
    });

    it('app.close() in the middle of a hand-over: the waiter gets an error or a lock it is told it lost, and nothing is left', async () => {
      quietLogs();
      const other = service();
      const held = await other.acquire('sd-handover');
      const kept = await leases();
      const client = new Etcd3({ hosts: fixture.endpoints });
      fixture.cleanup(() => client.close());
      const gate = new EtcdRequestGate(client);
      fixture.cleanup(() => gate.open());
      const locks = new LockService(new EtcdLockBackend(client), { keyPrefix: 'adv:' });
      const waiting = locks.acquire('sd-handover', { wait: 25_000 }).then(
        (handle) => handle,
        (error: unknown) => error as Error,
      );
      await until(async () => (await entries()).length === 2, 10_000, 'the waiter to stand in line');
      const turn = gate.slow('kv', 'txn', isPromotion);
      await held.release();
      await turn.caught;
      const closing = locks.onApplicationShutdown();
      await turn.send();
      await closing;
      const outcome = await waiting;
      if (outcome instanceof Error) expect(outcome).toBeInstanceOf(LockBackendError);
      else expect((outcome as LockHandle).isHeld).toBe(false);
      await nothingLeft(kept, 'nothing of the hand-over to be left');
    });
  });

  describe('odd keys and odd ttls', () => {
    it("keys with '/', '%', a key and another one's line prefix are separate locks, each with its own line", async () => {
      const names = ['a', 'a/', 'a/b', 'a0', 'a.', '/', '//', '%', '%2F', 'a%2Fb', '%anchor', 'é', '😀'];
      const mine = service({ keyPrefix: '' });
      const handles = await Promise.all(names.map((name) => mine.tryAcquire(name)));
      expect(handles.map((h) => h !== undefined)).toEqual(names.map(() => true));
      const theirs = service({ keyPrefix: '' });
      for (const [i, name] of names.entries()) {
        expect((await theirs.inspect(name))?.fencingToken).toBe(handles[i]!.fencingToken);
        expect(await theirs.tryAcquire(name)).toBeUndefined();
      }
      // Freeing one frees only that one.
      await handles[0]!.release();
      const a = await theirs.tryAcquire('a');
      expect(a).toBeDefined();
      for (const name of names.slice(1)) expect(await theirs.isLocked(name)).toBe(true);
      await Promise.all([a!.release(), ...handles.slice(1).map((h) => h!.release())]);
      expect(await keys()).toEqual([]);
    });

    it('a key of 100 000 characters is locked, waited for and released; one too long for etcd is refused at once, with a short message, leaving nothing', async () => {
      const kept = await leases();
      const long = 'k'.repeat(100_000);
      const locks = service({ maxKeyLength: 3_000_000 });
      const held = await locks.acquire(long);
      const other = service({ maxKeyLength: 3_000_000 });
      const waiting = other.acquire(long, { wait: 20_000 });
      await until(async () => (await entries()).length === 2, 10_000, 'the waiter to stand in line');
      await held.release();
      await (await waiting).release();
      // etcd takes requests of at most 1.5 MiB; an acquisition names each key several times.
      // Not retried for the whole wait (a LockBackendError would be): no retry can make it fit.
      const error = await locks.acquire('k'.repeat(400_000), { wait: 10_000 }).catch((e: unknown) => e);
      expect(error).toBeInstanceOf(InvalidLockKeyError);
      expect((error as Error).message).toMatch(/larger than etcd takes/);
      expect((error as Error).message.length).toBeLessThan(1_000);
      await until(async () => (await keys()).length === 0, 10_000, 'every key to go');
      // The spare leases they keep for their next acquisitions go with them.
      await Promise.all([locks, other].map((service) => service.onApplicationShutdown()));
      await nothingLeft(kept, 'nothing of the refused acquisition to be left');
    });

    it('more keys in one call than an etcd transaction takes are refused at once, saying how many fit, leaving nothing', async () => {
      const kept = await leases();
      const locks = service();
      // 42 fit in the transactions of a caller that waits at etcd's default --max-txn-ops (128).
      const fits = Array.from({ length: 42 }, (_, i) => `many:${String(i).padStart(2, '0')}`);
      await (await locks.acquire(fits, { wait: 10_000 })).release();
      // Not retried for the whole wait (a LockBackendError would be): no retry can make it fit.
      const error = await locks.acquire([...fits, 'many:42'], { wait: 20_000 }).catch((e: unknown) => e);
      expect(error).toBeInstanceOf(InvalidLockKeyError);
      expect((error as Error).message).toMatch(/43 keys .*--max-txn-ops/);
      await until(async () => (await keys()).length === 0, 10_000, 'every key to go');
      // The spare lease it keeps for its next acquisition goes with it.
      await locks.onApplicationShutdown();
      await nothingLeft(kept, 'nothing of the refused acquisition to be left');
    });

    it('a ttl of 1 ms never gives a lock that is not already lost, and leaves nothing', async () => {
      quietLogs();
      const kept = await leases();
      const locks = service();
      const handle = await locks.tryAcquire('tiny-ttl', { ttl: 1 }).catch((e: unknown) => e);
      expect(handle === undefined || handle instanceof Error || !(handle as LockHandle).isHeld).toBe(true);
      // The spare lease it keeps for its next acquisition goes with it.
      await locks.onApplicationShutdown();
      await nothingLeft(kept, 'nothing of the 1 ms lock to be left');
    });

    it('the longest ttl (about 24.8 days) is granted in whole seconds, and released', async () => {
      const kept = await leases();
      const locks = service();
      const handle = await locks.acquire('huge-ttl', { ttl: 2_147_483_647 });
      const [entry] = await entries();
      expect(Number((await fixture.admin.leaseClient.leaseTimeToLive({ ID: entry.lease })).grantedTTL)).toBe(2_147_484);
      await handle.extend();
      await handle.release();
      // The spare lease it keeps for its next acquisition goes with it.
      await locks.onApplicationShutdown();
      await nothingLeft(kept, 'the lease to go');
    });
  });

  describe('lines', () => {
    it('eight waiters of eight processes on one key: served in order, and each release wakes only the next one', async () => {
      const holder = service();
      const first = await holder.acquire('herd');
      const txns: number[] = [];
      const waiters: Promise<LockHandle>[] = [];
      for (let i = 0; i < 8; i++) {
        const client = new Etcd3({ hosts: fixture.endpoints });
        fixture.cleanup(() => client.close());
        txns.push(0);
        const txn = client.kv.txn.bind(client.kv);
        client.kv.txn = (...args) => ((txns[i] += 1), txn(...args));
        // No poll within the test: only a wake-up moves a waiter.
        const locks = service({ pollInterval: 25_000 }, new EtcdLockBackend(client, { waiterTimeout: 30_000 }));
        waiters.push(locks.acquire('herd', { wait: 28_000 }));
        await until(async () => (await entries()).length === i + 2, 10_000, `waiter ${i} to stand in line`);
      }
      // Two watches a waiter: the entry ahead of it, and its own (a release may hand it the key).
      await until(async () => (await watchers()) === 16, 10_000, 'each waiter to watch the one ahead');
      const before = [...txns];
      await first.release();
      const tokens = [first.fencingToken!];
      for (let i = 0; i < 8; i++) {
        const handle = await waiters[i];
        tokens.push(handle.fencingToken!);
        // Those behind it have not asked etcd anything since the line formed.
        expect(txns.slice(i + 1)).toEqual(before.slice(i + 1));
        await handle.release();
      }
      for (let i = 1; i < tokens.length; i++) expect(tokens[i]).toBeGreaterThan(tokens[i - 1]);
    });

    it('a holder that waited hands the key to the waiter behind it: that waiter sends no transaction, and its lock moves onto its own lease at its first extension', async () => {
      const counted = () => {
        const client = new Etcd3({ hosts: fixture.endpoints });
        fixture.cleanup(() => client.close());
        const count = { txns: 0 };
        const txn = client.kv.txn.bind(client.kv);
        client.kv.txn = (...args) => ((count.txns += 1), txn(...args));
        return { locks: service({ pollInterval: 25_000 }, new EtcdLockBackend(client, { waiterTimeout: 30_000 })), count };
      };
      const first = await service().acquire('hand');
      const [second, third] = [counted(), counted()];
      const secondWaits = second.locks.acquire('hand', { wait: 28_000 });
      await until(async () => (await entries()).length === 2, 10_000, 'the second to stand in line');
      const thirdWaits = third.locks.acquire('hand', { wait: 28_000 });
      await until(async () => (await entries()).length === 3, 10_000, 'the third to stand in line');
      // The first took the key uncontended and knows of nobody behind it: the second takes the key itself.
      await first.release();
      const secondHandle = await secondWaits;
      const before = third.count.txns;
      await secondHandle.release();
      const thirdHandle = await thirdWaits;
      expect(third.count.txns).toBe(before);
      expect(thirdHandle.fencingToken).toBeGreaterThan(secondHandle.fencingToken!);
      // Held where it waited, on its process's waiter lease, marked as handed over.
      const [entry] = await entries();
      expect(entry.value).toBe('held handed');
      await thirdHandle.extend();
      expect(thirdHandle.isHeld).toBe(true);
      const [moved] = await entries();
      expect(moved.value).toBe('held');
      expect(moved.lease).not.toBe(entry.lease);
      expect(await second.locks.inspect('hand')).toMatchObject({ fencingToken: thirdHandle.fencingToken });
      await thirdHandle.release();
      await until(async () => (await entries()).length === 0, 10_000, 'the line to empty');
    });

    it('a waiter that gave up while its deletion was lost, and was handed the key before it was sent again, leaves the key free once etcd answers', async () => {
      quietLogs();
      const first = await service().acquire('hand-gone');
      // The holder to be: it waits, so once it holds it reads who is behind it.
      const holderWaits = service().acquire('hand-gone', { wait: 20_000 });
      await until(async () => (await entries()).length === 2, 10_000, 'the holder to be in line');
      // Behind it, a waiter of a process with another caller waiting all along (its waiter lease stays kept alive).
      const busy = await service().acquire('hand-gone-other');
      const { locks, gate } = gated({}, { waiterTimeout: 3_000 });
      const other = locks.acquire('hand-gone-other', { wait: 60_000 });
      other.catch(() => undefined);
      const gives = locks.acquire('hand-gone', { wait: 2_000 });
      await until(
        async () => (await entries()).some((e) => e.value === 'waiting handover' && e.key.includes('hand-gone/')),
        10_000,
        'the waiter in line',
      );
      await first.release();
      const held = await holderWaits;
      // It gives up: its deletion is lost, and the one sent again is held back until after the hand-over.
      const lost = gate.lateTxn((r) => isDeletion(r) && names(r, 'adv:hand-gone'));
      const again = gate.slow<ITxnRequest>(
        'kv',
        'txn',
        (r) => r.compare?.some((c) => c.target === 'Value' && c.result === 'Greater') === true,
      );
      await expect(gives).rejects.toBeInstanceOf(DistributedLockError);
      await lost.caught;
      await held.release();
      await until(async () => (await entries()).some((e) => e.value === 'held handed'), 5_000, 'the hand-over to the waiter that gave up');
      await again.caught;
      await again.send();
      // etcd answers again: the key is free at once, not once that process stops waiting.
      const next = await service().acquire('hand-gone', { wait: 10_000 });
      await next.release();
      await busy.release();
      await (await other).release();
    }, 60_000);

    it('a lock handed over, released while an extension to another ttl moves it: the key is free at once, not when the new lease runs out', async () => {
      quietLogs();
      const first = await service().acquire('hand-move');
      const holderWaits = service().acquire('hand-move', { wait: 20_000 });
      await until(async () => (await entries()).length === 2, 10_000, 'the holder to be in line');
      const { locks, gate } = gated({}, { waiterTimeout: 30_000 });
      const handedWaits = locks.acquire('hand-move', { wait: 20_000, ttl: 9_000 });
      await until(async () => (await entries()).length === 3, 10_000, 'the one to be handed the key in line');
      const lastWaits = service().acquire('hand-move', { wait: 40_000 });
      lastWaits.catch(() => undefined);
      await until(async () => (await entries()).length === 4, 10_000, 'a waiter behind it');
      await first.release();
      await (await holderWaits).release();
      const handle = await handedWaits;
      expect((await entries()).some((e) => e.value === 'held handed')).toBe(true);
      // Its extension to another ttl first moves the entry onto its own lease; that move is held back.
      const isMove = (r: ITxnRequest) =>
        r.compare?.some((c) => c.target === 'Lease') === true && !r.compare.some((c) => c.target === 'Mod');
      const moveOut = gate.slow<ITxnRequest>('kv', 'txn', isMove);
      const handOver = gate.slow<ITxnRequest>('kv', 'txn', (r) => r.compare?.some((c) => c.target === 'Mod') === true);
      handOver.caught.catch(() => undefined);
      const extended = handle.extend(60_000).catch(() => undefined);
      await moveOut.caught;
      const released = handle.release().catch(() => undefined);
      const releasedAt = Date.now();
      // A second move, to a lease of 60 s, would be applied with its answer lost.
      const moveOn = gate.lateTxn(isMove);
      moveOn.caught.catch(() => undefined);
      await moveOut.send().catch(() => undefined);
      if ((await Promise.race([moveOn.caught.then(() => 'moved on'), released.then(() => 'released')])) === 'moved on') {
        await moveOn.send().catch(() => undefined);
        await handOver.caught;
        await handOver.send().catch(() => undefined);
      }
      await Promise.all([released, extended]);
      const next = await lastWaits;
      expect(Date.now() - releasedAt).toBeLessThan(10_000);
      await next.release();
    }, 60_000);

    it('a waiter whose place was gone, and whose deletion of what was left went unanswered, keeps the lock it took at the back when that deletion lands', async () => {
      const backend = new EtcdLockBackend(fixture.endpoints);
      fixture.cleanup(() => backend.close());
      const gate = new EtcdRequestGate((backend as unknown as { connection: { client: Etcd3 } }).connection.client);
      fixture.cleanup(() => gate.open());
      const other = new EtcdLockBackend(fixture.endpoints);
      fixture.cleanup(() => other.close());
      expect(await other.tryAcquire(['start-over'], 'H', 10_000)).toMatchObject({ acquired: true });
      expect(await backend.tryAcquire(['start-over'], 'A', 10_000, { willWait: true })).toMatchObject({ acquired: false });
      // Its place goes (as when a caller entering past a pending entry deletes it).
      await fixture.admin.delete().key(`${PREFIX}start-over/A`);
      // Its next attempt finds it gone and deletes whatever is left of it before it starts over: unanswered, that lands later.
      const deletes = (r: ITxnRequest): boolean =>
        !r.compare?.length &&
        (r.success ?? []).some((op) =>
          [op.request_delete_range, ...(op.request_txn?.success ?? []).map((inner) => inner.request_delete_range)].some(
            (d) => d?.key !== undefined && Buffer.from(d.key).toString() === `${PREFIX}start-over/A`,
          ),
        );
      const lost = gate.lateTxn(deletes);
      await expect(backend.tryAcquire(['start-over'], 'A', 10_000, { willWait: true })).rejects.toThrow();
      await lost.caught;
      // It asks again: a new place at the back, then the key once the holder leaves.
      expect(await backend.tryAcquire(['start-over'], 'A', 10_000, { willWait: true })).toMatchObject({ acquired: false });
      expect(await other.release(['start-over'], 'H')).toBe(true);
      await eventually(
        async () => expect(await backend.tryAcquire(['start-over'], 'A', 10_000, { willWait: true })).toMatchObject({ acquired: true }),
        10_000,
      );
      // The deletion lands now: it leaves the lock A holds alone.
      await lost.send().catch(() => undefined);
      expect(await other.tryAcquire(['start-over'], 'C', 10_000, { willWait: false })).toMatchObject({ acquired: false });
      expect(await backend.release(['start-over'], 'A')).toBe(true);
    });

    /**
     * Owner A of a backend whose requests the test holds back: its first attempt on `key` goes
     * unanswered (and is sent later by `first`), and the revoke of that attempt's lease, which its
     * next attempt sends, too (`revoke`). `other` is another process's backend.
     */
    async function lostAttemptAndRevoke(key: string) {
      const backend = new EtcdLockBackend(fixture.endpoints);
      fixture.cleanup(() => backend.close());
      const gate = new EtcdRequestGate((backend as unknown as { connection: { client: Etcd3 } }).connection.client);
      fixture.cleanup(() => gate.open());
      const other = new EtcdLockBackend(fixture.endpoints);
      fixture.cleanup(() => other.close());
      const first = gate.lateTxn((r) => isFirstAttempt(r) && names(r, key));
      await expect(backend.tryAcquire([key], 'A', 10_000, { willWait: true })).rejects.toThrow();
      const request = await first.caught;
      const lease = String(request.success!.find((op) => op.request_put)!.request_put!.lease);
      // A asks again: it finds nothing, and revokes that lease, which goes unanswered too.
      const revoke = gate.late<{ ID: string }>('leaseClient', 'leaseRevoke', (r) => String(r.ID) === lease);
      await expect(backend.tryAcquire([key], 'A', 10_000, { willWait: true })).rejects.toThrow();
      await revoke.caught;
      // The first attempt lands on that lease now; A asks again and holds.
      await first.send();
      expect(await backend.tryAcquire([key], 'A', 10_000, { willWait: true })).toMatchObject({ acquired: true });
      return { backend, other, revoke };
    }

    it('a revoke of a lease that an unanswered request named, itself unanswered, never reaches a later lock of the process on that lease', async () => {
      const { backend, other, revoke } = await lostAttemptAndRevoke('late-revoke');
      expect(await backend.release(['late-revoke'], 'A')).toBe(true);
      // Another lock of the process, then the revoke A sent lands.
      expect(await backend.tryAcquire(['late-revoke-2'], 'B', 10_000, { willWait: true })).toMatchObject({ acquired: true });
      await revoke.send().catch(() => undefined);
      expect(await other.tryAcquire(['late-revoke-2'], 'C', 10_000, { willWait: false })).toMatchObject({ acquired: false });
      expect(await backend.release(['late-revoke-2'], 'B')).toBe(true);
    });

    it('an owner whose revoke of its lease went unanswered does not take its lock on that lease, which the revoke may still delete', async () => {
      const { backend, other, revoke } = await lostAttemptAndRevoke('late-revoke-own');
      // The revoke lands: A's lock is not on that lease.
      await revoke.send().catch(() => undefined);
      expect(await other.tryAcquire(['late-revoke-own'], 'C', 10_000, { willWait: false })).toMatchObject({ acquired: false });
      expect(await backend.extend(['late-revoke-own'], 'A', 10_000)).toMatchObject({ extended: true });
      expect(await backend.release(['late-revoke-own'], 'A')).toBe(true);
    });

    it('a waiter cut off from etcd that a release hands the key to holds it up no longer than waiterTimeout, not for its ttl', async () => {
      quietLogs();
      const first = await service().acquire('hand-dead');
      const second = service();
      const secondWaits = second.acquire('hand-dead', { wait: 28_000 });
      await until(async () => (await entries()).length === 2, 10_000, 'the second to stand in line');
      // The third reaches etcd through a proxy, which is then cut: its process is as good as dead.
      const proxies = await Promise.all(fixture.cluster.members.map((m) => TcpProxy.start(m.clientPort)));
      fixture.cleanup(() => Promise.all(proxies.map((p) => p.close())));
      const cut = service(
        {},
        new EtcdLockBackend(
          proxies.map((p) => `http://127.0.0.1:${p.port}`),
          { waiterTimeout: 3_000 },
        ),
      );
      cut.acquire('hand-dead', { wait: 28_000, ttl: 30_000 }).catch(() => undefined);
      await until(async () => (await entries()).length === 3, 10_000, 'the third to stand in line');
      await first.release();
      const secondHandle = await secondWaits;
      for (const proxy of proxies) proxy.set({ kind: 'drop' });
      const cutAt = Date.now();
      // Handed to the third, whose entry sits on its process's waiter lease (3 s), not on a lease of the lock's ttl.
      await secondHandle.release();
      const next = await service().acquire('hand-dead', { wait: 20_000 });
      expect(Date.now() - cutAt).toBeLessThan(10_000);
      await next.release();
    }, 40_000);

    it('callers of overlapping key sets across processes: no deadlock, never two inside one key, tokens increasing per key', async () => {
      const services = [service(), service(), service()];
      let seed = 7;
      const random = () => (seed = (seed * 1_103_515_245 + 12_345) % 2_147_483_648) / 2_147_483_648;
      const names = ['m0', 'm1', 'm2', 'm3', 'm4'];
      const inside = new Map<string, number>();
      const tokens = new Map<string, number[]>();
      const overlaps: string[] = [];
      const calls = Array.from({ length: 24 }, (_, i) => {
        const set = names.filter(() => random() < 0.45);
        const keySet = set.length > 0 ? set : [names[i % names.length]];
        return services[i % services.length].using(
          keySet,
          async (lock) => {
            for (const key of keySet) {
              if (inside.has(key)) overlaps.push(`${key}: ${inside.get(key)} and ${i}`);
              inside.set(key, i);
              tokens.set(key, [...(tokens.get(key) ?? []), lock.fencingToken!]);
            }
            await new Promise((resolve) => setTimeout(resolve, 5));
            for (const key of keySet) inside.delete(key);
          },
          { wait: 25_000 },
        );
      });
      await Promise.all(calls);
      expect(overlaps).toEqual([]);
      for (const list of tokens.values()) for (let i = 1; i < list.length; i++) expect(list[i]).toBeGreaterThan(list[i - 1]);
    });

    it('a waiter whose member dies watches again through another one, and takes its turn', async () => {
      quietLogs();
      const held = await service().acquire('member-dies', { ttl: 3_000 });
      const locks = service({ pollInterval: 2_000 }, new EtcdLockBackend(fixture.endpoints, { waiterTimeout: 30_000 }));
      const waiting = locks.acquire('member-dies', { wait: 25_000 });
      // Its two watches (the entry ahead, its own) run on one member.
      await until(async () => (await watchers()) === 2, 10_000, 'the waiter to watch');
      // The member its watch runs on.
      const counts = await Promise.all(
        fixture.cluster.members.map(async (m) =>
          Number(/^etcd_debugging_mvcc_watcher_total (\d+)/m.exec(await (await fetch(`${m.endpoint}/metrics`)).text())?.[1]),
        ),
      );
      const index = counts.indexOf(2);
      await fixture.cluster.members[index].kill();
      fixture.cleanup(() => fixture.cluster.restart(index));
      await until(async () => (await watchers()) === 2, 15_000, 'the watch to come back on another member');
      // A release sent to the dead member fails: the lease then runs out, which deletes the entry as well.
      await held.release().catch(() => undefined);
      const handle = await waiting;
      expect(handle.fencingToken).toBeGreaterThan(held.fencingToken!);
      // This release too may go to the dead member and fail (it did in one CI run); its lease runs out.
      await handle.release().catch(() => undefined);
    });
  });

  describe('hands other than ours', () => {
    it("a waiter's place deleted by hand (its waiter lease revoked): it stands in line again and gets the lock", async () => {
      const held = await service().acquire('place-revoked');
      const locks = service();
      const waiting = locks.acquire('place-revoked', { wait: 20_000 });
      await until(async () => (await entries()).some((e) => e.value.startsWith('waiting')), 10_000, 'the waiter to stand in line');
      const place = (await entries()).find((e) => e.value.startsWith('waiting'))!;
      await fixture.admin.leaseClient.leaseRevoke({ ID: place.lease });
      // It notices (its keeper's next round) and takes a new place, behind the holder still.
      await until(
        async () => (await entries()).some((e) => e.value.startsWith('waiting') && e.lease !== place.lease),
        10_000,
        'the waiter to stand in line again',
      );
      await held.release();
      const handle = await waiting;
      expect(handle.fencingToken).toBeGreaterThan(held.fencingToken!);
      await handle.release();
    });

    it('the lease a waiter would hold its keys on, revoked by hand: it takes its turn on a new one', async () => {
      const held = await service().acquire('hold-revoked');
      const locks = service();
      const waiting = locks.acquire('hold-revoked', { wait: 20_000 });
      await until(async () => (await keys()).some((e) => e.key.includes('%anchor/')), 10_000, 'the waiter to stand in line');
      const anchor = (await keys()).find((e) => e.key.includes('%anchor/'))!;
      await fixture.admin.leaseClient.leaseRevoke({ ID: anchor.lease });
      await held.release();
      const handle = await waiting;
      expect(handle.isHeld).toBe(true);
      expect(handle.fencingToken).toBeGreaterThan(held.fencingToken!);
      expect(await entries()).toEqual([expect.objectContaining({ value: 'held' })]);
      await handle.release();
      expect(await keys()).toEqual([]);
    });

    it("an entry deleted by hand is noticed at the holder's next extension", async () => {
      quietLogs();
      const locks = service();
      const handle = await locks.acquire('by-hand', { ttl: 3_000 });
      await fixture.admin.delete().prefix(`${PREFIX}adv:by-hand/`);
      // Its next extension is due a third of the ttl after the last one.
      await until(() => handle.signal.aborted, 10_000, 'the holder to be told');
      const reason: unknown = handle.signal.reason;
      expect(reason).toBeInstanceOf(LockLostError);
      expect(reason).toMatchObject({ reason: 'taken' });
    });

    it("a holder's lease revoked by hand: the holder is told at its next extension, and its release leaves the next holder's lock alone", async () => {
      quietLogs();
      const locks = service();
      const handle = await locks.acquire('revoked', { ttl: 3_000 });
      const [entry] = await entries();
      const rival = service();
      const next = rival.acquire('revoked', { wait: 10_000 });
      await fixture.admin.leaseClient.leaseRevoke({ ID: entry.lease });
      const taken = await next;
      expect(taken.fencingToken).toBeGreaterThan(handle.fencingToken!);
      const reason = await new Promise<unknown>((resolve) =>
        handle.signal.aborted
          ? resolve(handle.signal.reason)
          : handle.signal.addEventListener('abort', () => resolve(handle.signal.reason)),
      );
      expect(reason).toMatchObject({ reason: 'taken' });
      await handle.release().catch(() => undefined);
      expect(taken.isHeld).toBe(true);
      expect((await rival.inspect('revoked'))?.fencingToken).toBe(taken.fencingToken);
    });
  });
  describe('releases sent again', () => {
    /**
     * EtcdReleases on a connection of the test's own: each revoke is answered (and says so, as
     * the real connection does; the lease of owner 'slow' a turn of the event loop later), each
     * transaction fails at once with `txnError`, the first 100. Each owner's last request went
     * unanswered: its release revokes its lease, then deletes its entries.
     */
    function releasesOn(txnError: () => Error): { releases: EtcdReleases; answer: () => void; txns: () => number } {
      let txns = 0;
      const connection = {
        closed: false,
        onAnswer: undefined as (() => void) | undefined,
        revoke: async (lease: string) => {
          if (lease === 'slow') await turn();
          connection.onAnswer?.();
          return true;
        },
        txn: async () => {
          if (++txns > 100) return { responses: [] };
          throw txnError();
        },
        revokeQuietly: () => undefined,
      };
      const line = { deleteOwn: () => ({}), deleteWaiting: () => ({}), deletedOf: () => [] };
      const places = {
        get: (owner: string) => ({ keys: ['k'], state: 'unknown', hold: { id: owner }, moving: false, movingTo: undefined }),
        drop: () => undefined,
      };
      const releases = new EtcdReleases(connection as never, line as never, places as never, {} as never, () => undefined, 60_000);
      fixture.cleanup(() => releases.close());
      return { releases, answer: () => connection.onAnswer!(), txns: () => txns };
    }

    const turn = (): Promise<void> => new Promise((resolve) => setImmediate(resolve));

    async function turns(count: number): Promise<void> {
      for (let i = 0; i < count; i++) await turn();
    }

    it('releases sent again that fail again at once, after their revokes were answered, wait for the next answer instead of looping', async () => {
      const { releases, answer, txns } = releasesOn(() => new LockBackendError('etcd', 'release failed: etcd is unavailable'));
      for (const owner of ['fast', 'slow']) await expect(releases.release(['k'], owner)).rejects.toBeInstanceOf(LockBackendError);
      await turns(20);
      // The slow revoke's answer sent the first release again, once.
      expect(txns()).toBe(3);
      answer();
      await turns(20);
      expect(txns()).toBe(5);
      answer();
      await turns(20);
      expect(txns()).toBe(7);
    });

    it('a release whose keys are too large for etcd is not sent again', async () => {
      const { releases, answer, txns } = releasesOn(() => new InvalidLockKeyError('the keys are too large for one etcd request'));
      await expect(releases.release(['k'], 'owner')).rejects.toBeInstanceOf(InvalidLockKeyError);
      answer();
      await turns(20);
      // Its lease was revoked again; its entries, which no request can delete, were not sent again.
      expect(txns()).toBe(1);
    });
  });
});
