import { describe, expect, it, jest } from '@jest/globals';
import { Logger } from '@nestjs/common';
import { TcpProxy } from '../support/tcp-proxy.js';
import { EtcdLockBackend, LockBackendError, LockNotAcquiredError, LockService } from '../../lib/index.js';
import { useEtcdCluster } from '../support/etcd-fixture.js';
import { until } from '../support/wait.js';

// Three members: a minority may fail without a second holder.
const fixture = useEtcdCluster({ members: 3 });

function service(endpoints: string[] = fixture.endpoints): LockService {
  const locks = new LockService(new EtcdLockBackend(endpoints), { keyPrefix: 'fault:' });
  fixture.cleanup(() => locks.onApplicationShutdown());
  return locks;
}

function quietLogs(): void {
  const warn = jest.spyOn(Logger.prototype, 'warn').mockImplementation(() => undefined);
  const error = jest.spyOn(Logger.prototype, 'error').mockImplementation(() => undefined);
  fixture.cleanup(() => {
    warn.mockRestore();
    error.mockRestore();
  });
}

/**
 * Callers that take turns on one key until stopped, each section checking that nobody else is
 * inside unless the one inside was told it lost its lock. Tokens are recorded in order of entry.
 */
function load(services: LockService[], callers: number, key: string) {
  const tokens: number[] = [];
  const failures: unknown[] = [];
  const overlaps: string[] = [];
  let inside: { lost: () => boolean } | undefined;
  let stop = false;
  const running = Array.from({ length: callers }, (_, i) =>
    (async () => {
      while (!stop) {
        try {
          await services[i % services.length].using(
            key,
            async (lock) => {
              if (inside && !inside.lost()) overlaps.push(`token ${lock.fencingToken} entered while another holder was inside`);
              const me = { lost: () => lock.signal.aborted };
              inside = me;
              tokens.push(lock.fencingToken!);
              await new Promise((resolve) => setTimeout(resolve, 2));
              if (inside === me) inside = undefined;
            },
            { wait: 4_000, ttl: 3_000 },
          );
        } catch (error) {
          failures.push(error);
          await new Promise((resolve) => setTimeout(resolve, 50));
        }
      }
    })(),
  );
  return {
    tokens,
    failures,
    overlaps,
    stop: () => {
      stop = true;
      return Promise.all(running);
    },
  };
}

describe('etcd backend on three members, under faults', () => {
  it('the leader killed under load: holders keep their locks or learn they lost them, tokens keep increasing', async () => {
    quietLogs();
    const run = load([service(), service()], 6, 'leader');
    await until(() => run.tokens.length >= 30, 20_000, 'acquisitions before the kill');
    const leader = await fixture.cluster.leader();
    await fixture.cluster.members[leader].kill();
    fixture.cleanup(() => fixture.cluster.restart(leader));
    const before = run.tokens.length;
    await until(() => run.tokens.length >= before + 30, 30_000, 'acquisitions under the new leader');
    await fixture.cluster.restart(leader);
    await until(() => run.tokens.length >= before + 60, 30_000, 'acquisitions with the old leader back');
    await run.stop();

    expect(run.overlaps).toEqual([]);
    for (let i = 1; i < run.tokens.length; i++) expect(run.tokens[i]).toBeGreaterThan(run.tokens[i - 1]);
    for (const failure of run.failures) expect(failure instanceof LockBackendError || failure instanceof LockNotAcquiredError).toBe(true);
  }, 120_000);

  it('a member cut off from a client: its requests go to the other members, and a lock held meanwhile is kept', async () => {
    quietLogs();
    const proxy = await TcpProxy.start(fixture.cluster.members[0].clientPort);
    fixture.cleanup(() => proxy.close());
    // This client reaches the first member through the proxy, the other two directly.
    const locks = service([`http://127.0.0.1:${proxy.port}`, ...fixture.endpoints.slice(1)]);
    // A request to the cut-off member hangs for the command timeout (2 s): the lease outlives one.
    const held = await locks.acquire('kept', { ttl: 6_000 });
    const run = load([locks, service()], 4, 'cut');
    await until(() => run.tokens.length >= 20, 20_000, 'acquisitions before the cut');
    // Requests to it are never answered, as behind a partition (the connection stays up).
    proxy.set({ kind: 'blackhole-up' });
    const before = run.tokens.length;
    // Longer than the held lock's ttl: its extensions must have gone to the other members.
    const cutAt = Date.now();
    await until(() => run.tokens.length >= before + 30 && Date.now() - cutAt > 8_000, 30_000, 'acquisitions while cut off');
    expect(held.isHeld).toBe(true);
    proxy.set({ kind: 'pass' });
    await run.stop();
    expect(run.overlaps).toEqual([]);
    for (let i = 1; i < run.tokens.length; i++) expect(run.tokens[i]).toBeGreaterThan(run.tokens[i - 1]);
    await held.release();
  }, 90_000);

  it('quorum lost: acquisitions fail with a LockBackendError that says so, and nothing is left behind once it is back', async () => {
    quietLogs();
    const locks = service();
    const holder = service();
    const held = await holder.acquire('quorum', { ttl: 3_000 });
    await Promise.all([fixture.cluster.members[1].kill(), fixture.cluster.members[2].kill()]);
    fixture.cleanup(async () => {
      await Promise.all([fixture.cluster.restart(1), fixture.cluster.restart(2)]);
      await fixture.cluster.waitHealthy();
    });
    const started = Date.now();
    const error = await locks.acquire('quorum-free', { wait: 1_000 }).catch((e: unknown) => e);
    expect(error).toBeInstanceOf(LockBackendError);
    // The member left answers nothing, or that its request timed out; the two killed refuse connections.
    expect((error as Error).message).toMatch(/acquire of fault:quorum-free failed: .*has the cluster lost its quorum\?/);
    // The wait, and at most one command timeout past it.
    expect(Date.now() - started).toBeLessThan(1_000 + 2_000 + 1_500);
    const waited = await locks.acquire('quorum', { wait: 1_000 }).catch((e: unknown) => e);
    expect(waited).toBeInstanceOf(LockBackendError);
    // The holder cannot extend: it is told before its lease could have run out on etcd.
    const lost = held.signal.aborted
      ? held.signal.reason
      : await new Promise<unknown>((resolve) => held.signal.addEventListener('abort', () => resolve(held.signal.reason)));
    expect(lost).toMatchObject({ reason: 'backend-error' });

    await Promise.all([fixture.cluster.restart(1), fixture.cluster.restart(2)]);
    await fixture.cluster.waitHealthy();
    // Whatever the failed calls left (a waiter's place, a lease) runs out: every key goes.
    await until(
      async () => (await fixture.admin.getAll().prefix('nest-distributed-lock/').keys()).length === 0,
      15_000,
      'the lock entries to go',
    );
    const after = await locks.acquire('quorum', { wait: 5_000 });
    expect(after.fencingToken).toBeGreaterThan(held.fencingToken!);
    await after.release();
  }, 120_000);
});
