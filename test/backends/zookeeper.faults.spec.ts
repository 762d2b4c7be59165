import { describe, expect, it, jest } from '@jest/globals';
import { Logger } from '@nestjs/common';
// @ts-expect-error: node-zookeeper-client ships no types; the tests only pass it to the fixture.
import zookeeper from 'node-zookeeper-client';
import { fork, type ChildProcess } from 'node:child_process';
import { once } from 'node:events';
import { resolve } from 'node:path';
import { TcpProxy } from '../support/tcp-proxy.js';
import { LockBackendError, LockLostError, LockService, ZooKeeperLockBackend } from '../../lib/index.js';
import { LinePaths } from '../../lib/backends/zookeeper/zookeeper.line.js';
// @ts-expect-error: a plain ESM fixture shared with the child processes, without types.
import { connectedClient, fencedRead, fencedWrite } from '../fixtures/zookeeper-fenced-store.mjs';
import { Holder } from '../support/lock-holder-process.js';
import { eventually, until } from '../support/wait.js';
import { useZooKeeper } from '../support/zookeeper-fixture.js';

type Client = { close(): void; getChildren(path: string, done: (error: { getName?(): string } | null, names: string[]) => void): void };
const write = fencedWrite as (client: Client, path: string, token: number, value: string) => Promise<boolean>;
const read = fencedRead as (client: Client, path: string) => Promise<{ token: number; value: string } | undefined>;
const connect = connectedClient as (zk: unknown, connectionString: string) => Promise<Client>;

const fixtures = resolve(import.meta.dirname, '../fixtures');

/** What test/fixtures/zookeeper-lock-waiter.mjs reports. */
interface WaiterMessage {
  type: 'acquired' | 'failed' | 'released';
  token?: number;
  owner?: string;
  held?: boolean;
  name?: string;
  waitedMs?: number;
}

// Three servers: a leader to kill, and a quorum to lose. Sessions may be as short as 1 s (two ticks).
const fixture = useZooKeeper({ ensemble: true });

function service(options: { sessionTimeout?: number; connectionString?: string; root?: string } = {}): LockService {
  const backend = new ZooKeeperLockBackend(options.connectionString ?? fixture.connectionString, {
    root: options.root ?? fixture.root,
    sessionTimeout: options.sessionTimeout ?? 4_000,
    commandTimeout: 1_000,
  });
  const locks = new LockService(backend, { keyPrefix: 'fault:' });
  fixture.cleanup(() => locks.onApplicationShutdown());
  return locks;
}

function quietWarnings(): void {
  const warn = jest.spyOn(Logger.prototype, 'warn').mockImplementation(() => undefined);
  fixture.cleanup(() => warn.mockRestore());
}

async function store(): Promise<Client> {
  const client = await connect(zookeeper, fixture.connectionString);
  fixture.cleanup(() => client.close());
  return client;
}

describe('ZooKeeper backend under faults, with real processes', () => {
  it('another process acquires once the SIGKILLed holder’s session expires (1 s session), with a greater token', async () => {
    const holder = await Holder.start('zookeeper-lock-holder.mjs', fixture.connectionString, 'killed', 60_000);
    fixture.cleanup(() => holder.kill());
    const locks = service({ root: '/fault' });
    expect(await locks.tryAcquire('killed')).toBeUndefined();
    await holder.kill();
    const killedAt = Date.now();
    const handle = await locks.acquire('killed', { wait: 10_000 });
    // Not the holder's ttl (60 s): its session, 1 s, rounded up to the server's ticks.
    expect(Date.now() - killedAt).toBeLessThan(5_000);
    expect(handle.fencingToken).toBeGreaterThan((await holder.next('acquired')).token!);
    await handle.release();
  }, 30_000);

  it('a holder paused past its session timeout loses: the next holder has a greater token, the paused one’s late write is refused', async () => {
    const holder = await Holder.start('zookeeper-lock-holder.mjs', fixture.connectionString, 'paused', 60_000);
    fixture.cleanup(() => holder.kill());
    const stale = (await holder.next('acquired')).token!;
    holder.child.kill('SIGSTOP'); // a long GC pause: no heartbeat, no extension, nothing
    fixture.cleanup(() => holder.child.kill('SIGCONT'));

    const locks = service({ root: '/fault' });
    const handle = await locks.acquire('paused', { wait: 10_000 });
    expect(handle.fencingToken).toBeGreaterThan(stale);
    const register = await store();
    expect(await write(register, '/fenced', handle.fencingToken!, 'new holder')).toBe(true);

    holder.child.kill('SIGCONT');
    // The first thing it sees is that its lease's deadline (two thirds of its session) passed.
    expect(await holder.next('lost')).toMatchObject({ name: 'LockLostError', reason: 'expired' });
    holder.child.send({ type: 'write' });
    expect(await holder.next('wrote')).toMatchObject({ accepted: false, aborted: true });
    expect((await read(register, '/fenced'))?.value).toBe('new holder');
    holder.child.send({ type: 'release' });
    await holder.next('released');
    expect(handle.isHeld).toBe(true);
    expect((await locks.inspect('paused'))?.heldHere).toBe(true);
    await handle.release();
  }, 30_000);

  it('the leader killed under load: callers go on after the election, one holder at a time, tokens strictly increasing', async () => {
    quietWarnings();
    const services = [service(), service(), service()];
    const tokens: number[] = [];
    const failures: unknown[] = [];
    let inside = 0;
    let overlaps = 0;
    let stop = false;
    const callers = Array.from({ length: 6 }, (_, i) =>
      (async () => {
        while (!stop && failures.length < 1_000) {
          try {
            await services[i % 3].using(
              'leader',
              async (lock) => {
                if (++inside > 1) overlaps++;
                tokens.push(lock.fencingToken!);
                await new Promise((resolve) => setTimeout(resolve, 2));
                inside--;
              },
              { wait: 15_000 },
            );
          } catch (error) {
            failures.push(error);
          }
        }
      })(),
    );
    await until(() => tokens.length >= 50, 15_000, '50 acquisitions before the kill');
    const leader = (await fixture.server.leader())!;
    await fixture.server.kill(leader);
    fixture.cleanup(() => fixture.server.revive(leader));
    const atKill = tokens.length;
    await until(() => tokens.length >= atKill + 50, 30_000, '50 acquisitions after the new leader was elected');
    stop = true;
    await Promise.all(callers);
    expect(overlaps).toBe(0);
    for (let i = 1; i < tokens.length; i++) expect(tokens[i]).toBeGreaterThan(tokens[i - 1]);
    // A new leader starts a new epoch: the high 32 bits of every zxid after it are greater.
    expect(Math.floor(tokens.at(-1)! / 2 ** 32)).toBeGreaterThan(Math.floor(tokens[0] / 2 ** 32));
    for (const failure of failures) expect(failure).toBeInstanceOf(LockBackendError);
  }, 60_000);

  it('a client cut off from every server goes SUSPENDED, then LOST after its session timeout; its holder is told, and the lock is taken after', async () => {
    quietWarnings();
    const proxies = await Promise.all(fixture.server.ports.map((port) => TcpProxy.start(port)));
    fixture.cleanup(() => Promise.all(proxies.map((p) => p.close())));
    const backend = new ZooKeeperLockBackend(proxies.map((p) => `127.0.0.1:${p.port}`).join(','), {
      root: fixture.root,
      sessionTimeout: 1_000,
      commandTimeout: 500,
    });
    const cutOff = new LockService(backend, { keyPrefix: 'fault:' });
    fixture.cleanup(() => cutOff.onApplicationShutdown());
    const handle = await cutOff.acquire('partition', { ttl: 60_000 });
    const states: string[] = [backend.state];
    const watcher = setInterval(() => states.at(-1) !== backend.state && states.push(backend.state), 5);
    fixture.cleanup(() => clearInterval(watcher));
    const lost = new Promise<unknown>((resolve) => handle.signal.addEventListener('abort', () => resolve(handle.signal.reason)));

    for (const proxy of proxies) proxy.set({ kind: 'drop' });
    const cutAt = Date.now();
    await until(() => backend.state === 'lost', 10_000, 'the session to count as lost');
    await eventually(() => expect(states).toEqual(['connected', 'suspended', 'lost']), 1_000);
    // Its lease ran out first: two thirds of the session after its last answered extension.
    const reason = (await lost) as LockLostError;
    expect(reason).toBeInstanceOf(LockLostError);
    expect(['backend-error', 'expired']).toContain(reason.reason);

    const other = service();
    const next = await other.acquire('partition', { wait: 10_000 });
    expect(Date.now() - cutAt).toBeLessThan(6_000);
    expect(next.fencingToken).toBeGreaterThan(handle.fencingToken!);

    // Back on the network: a new session, and the lock is waited for as any other.
    for (const proxy of proxies) proxy.set({ kind: 'pass' });
    expect(await cutOff.tryAcquire('partition')).toBeUndefined();
    expect(backend.state).toBe('connected');
    await next.release();
    const again = await cutOff.acquire('partition', { wait: 5_000 });
    expect(again.fencingToken).toBeGreaterThan(next.fencingToken!);
    await again.release();
  }, 30_000);

  it('with the quorum lost, holders lose their locks and acquisitions fail with LockBackendError; once it is back, locks are taken again', async () => {
    quietWarnings();
    const locks = service({ sessionTimeout: 2_000 });
    const handle = await locks.acquire('quorum', { ttl: 60_000 });
    const lost = new Promise<unknown>((resolve) => handle.signal.addEventListener('abort', () => resolve(handle.signal.reason)));
    const leader = (await fixture.server.leader())!;
    const follower = [1, 2, 3].find((id) => id !== leader)!;
    await fixture.server.kill(follower);
    await fixture.server.kill(leader);
    fixture.cleanup(async () => {
      await fixture.server.revive(follower);
      await fixture.server.revive(leader);
    });

    const reason = (await lost) as LockLostError;
    expect(reason).toBeInstanceOf(LockLostError);
    expect(['backend-error', 'expired']).toContain(reason.reason);
    const error = await service()
      .acquire('quorum', { wait: 1_500 })
      .catch((e: unknown) => e);
    expect(error).toBeInstanceOf(LockBackendError);

    await fixture.server.revive(follower);
    await fixture.server.revive(leader);
    const next = await service().acquire('quorum', { wait: 15_000 });
    expect(next.fencingToken).toBeGreaterThan(handle.fencingToken!);
    await next.release();
  }, 90_000);

  it('a waiter stopped past its session while its turn comes: a third contender takes the lock, and the stopped one never believes it holds until its new turn, with a greater token', async () => {
    quietWarnings();
    const line = `${fixture.root}/fault%3Astall`;
    const zk = await store();
    const children = () =>
      new Promise<string[]>((done, fail) =>
        zk.getChildren(line, (error, names) => (error?.getName?.() === 'NO_NODE' ? done([]) : error ? fail(error) : done(names))),
      );
    const holder = await service().acquire('stall');
    // Its own process, with a 2 s session, waiting up to 30 s.
    const args = [fixture.connectionString, fixture.root, 'stall', '2000', '30000'];
    const waiter: ChildProcess = fork(resolve(fixtures, 'zookeeper-lock-waiter.mjs'), args, {
      stdio: ['ignore', 'ignore', 'inherit', 'ipc'],
    });
    const heard: WaiterMessage[] = [];
    waiter.on('message', (message: WaiterMessage) => heard.push(message));
    fixture.cleanup(async () => {
      if (waiter.exitCode !== null || waiter.signalCode !== null) return;
      const exited = once(waiter, 'exit');
      waiter.kill('SIGKILL');
      await exited;
    });
    await until(async () => (await children()).length === 2, 15_000, 'the waiter to stand in line');
    const third = service().acquire('stall', { wait: 20_000 });
    await until(async () => (await children()).length === 3, 10_000, 'the third contender to stand in line');

    // Stopped as by a long GC pause: the release's watch event reaches it while it cannot run.
    waiter.kill('SIGSTOP');
    fixture.cleanup(() => waiter.kill('SIGCONT'));
    await holder.release();
    // The third gets the lock once the stopped waiter's session expired and took its node along.
    const taken = await third;
    expect(taken.fencingToken).toBeGreaterThan(holder.fencingToken!);

    waiter.kill('SIGCONT');
    // It finds its session lost and stands in line again, behind the third, without entering.
    await until(async () => (await children()).length === 2, 15_000, 'the stopped waiter to stand in line again');
    expect(heard).toEqual([]);
    expect(taken.isHeld).toBe(true);
    await taken.release();
    await until(() => heard.length > 0, 15_000, "the waiter's answer");
    const [answer] = heard;
    expect(answer).toMatchObject({ type: 'acquired', held: true });
    expect(answer.token).toBeGreaterThan(taken.fencingToken!);
    expect(answer.waitedMs).toBeLessThan(30_000);
    // Its node is the one that holds: the lock it believes in is there.
    expect((await children()).map((name) => LinePaths.owner(name))).toEqual([answer.owner]);

    waiter.send({ type: 'release' });
    await until(() => heard.some((m) => m.type === 'released'), 10_000, 'the waiter to let go');
    expect(await children()).toEqual([]);
  }, 60_000);
});
