import { describe, expect, it, jest } from '@jest/globals';
import { Logger } from '@nestjs/common';
// @ts-expect-error: node-zookeeper-client ships no types; the tests only pass it to the fixture.
import zookeeper from 'node-zookeeper-client';
import type { AcquireResult } from '../../lib/backends/lock-backend.interface.js';
import { ZooKeeperLockBackend } from '../../lib/backends/zookeeper/zookeeper.backend.js';
import {
  nodeZooKeeperClients,
  ZooKeeperError,
  type ZooKeeperClient,
  type ZooKeeperMulti,
} from '../../lib/backends/zookeeper/zookeeper.client.js';
import type { ZooKeeperLockBackendOptions } from '../../lib/backends/zookeeper/zookeeper.options.js';
import { InvalidLockKeyError, LockBackendError, LockLostError, LockNotAcquiredError } from '../../lib/lock.errors.js';
import type { LockHandle } from '../../lib/lock.handle.js';
import { LockService } from '../../lib/lock.service.js';
import type { DistributedLockModuleOptions } from '../../lib/distributed-lock.options.js';
// @ts-expect-error: a plain ESM fixture shared with the child processes, without types.
import { connectedClient, fencedWrite } from '../fixtures/zookeeper-fenced-store.mjs';
import { TcpProxy } from '../support/tcp-proxy.js';
import { activeTimers, eventually, until } from '../support/wait.js';
import { tappedClients, type ZooKeeperTaps } from '../support/zookeeper-client-tap.js';
import { useZooKeeper } from '../support/zookeeper-fixture.js';
import { fourLetterWord } from '../support/zookeeper-server.js';

type Callback<T> = (error: (Error & { getName?(): string }) | null, value: T) => void;
/** The part of node-zookeeper-client this file uses to look at (and break) lines as an operator would. */
interface RawClient {
  getChildren(path: string, callback: Callback<string[]>): void;
  exists(path: string, callback: Callback<unknown>): void;
  remove(path: string, version: number, callback: Callback<void>): void;
  transaction(): { remove(path: string, version: number): unknown; commit(callback: Callback<unknown>): void };
  close(): void;
}

const write = fencedWrite as (client: RawClient, path: string, token: number, value: string) => Promise<boolean>;

// One server for the file; each test has a root of its own (fixture.root).
const fixture = useZooKeeper();

function backend(options: ZooKeeperLockBackendOptions & { connectionString?: string } = {}, taps?: ZooKeeperTaps): ZooKeeperLockBackend {
  const { connectionString = fixture.connectionString, ...rest } = options;
  const resolved = { root: fixture.root, sessionTimeout: 4_000, commandTimeout: 1_000, ...rest };
  const created = new ZooKeeperLockBackend(
    connectionString,
    resolved,
    taps && tappedClients(connectionString, resolved.sessionTimeout, taps),
  );
  fixture.cleanup(() => created.close());
  return created;
}

function service(lockBackend: ZooKeeperLockBackend = backend(), options: Omit<DistributedLockModuleOptions, 'backend'> = {}): LockService {
  const locks = new LockService(lockBackend, { keyPrefix: '', ...options });
  fixture.cleanup(() => locks.onApplicationShutdown());
  return locks;
}

function quietWarnings(): void {
  const warn = jest.spyOn(Logger.prototype, 'warn').mockImplementation(() => undefined);
  fixture.cleanup(() => warn.mockRestore());
}

async function proxy(): Promise<TcpProxy> {
  const started = await TcpProxy.start(fixture.server.ports[0]);
  fixture.cleanup(() => started.close());
  return started;
}

let rawClient: Promise<RawClient> | undefined;
/** A session of the test's own, as an operator's zkCli. */
function raw(): Promise<RawClient> {
  if (!rawClient) {
    rawClient = connectedClient(zookeeper, fixture.connectionString) as Promise<RawClient>;
    const opened = rawClient;
    fixture.cleanup(async () => {
      rawClient = undefined;
      (await opened).close();
    });
  }
  return rawClient;
}

function call<T>(send: (callback: Callback<T>) => void): Promise<T> {
  return new Promise((resolve, reject) => send((error, value) => (error ? reject(error) : resolve(value))));
}

/** A node's children (a key's line, or the root's lines); none when it does not exist. */
async function children(path: string): Promise<string[]> {
  const client = await raw();
  return call<string[]>((cb) => client.getChildren(path, cb)).catch((error: Error & { getName?(): string }) =>
    error.getName?.() === 'NO_NODE' ? [] : Promise.reject(error),
  );
}

/** Watches the server holds: path -> sessions watching it (`wchp`). */
async function watches(): Promise<Map<string, string[]>> {
  const answer = await fourLetterWord(fixture.server.ports[0], 'wchp');
  const byPath = new Map<string, string[]>();
  let path: string | undefined;
  for (const line of answer.split('\n')) {
    if (line.startsWith('/')) byPath.set((path = line.trim()), []);
    else if (path && line.trim()) byPath.get(path)!.push(line.trim());
  }
  return byPath;
}

/** Watches the server holds under this test's root. */
async function watchesHere(): Promise<Map<string, string[]>> {
  return new Map([...(await watches())].filter(([path]) => path.startsWith(`${fixture.root}/`)));
}

/** A promise that stays pending until `open()`: a request held back on the network. */
function gate(): { wait: Promise<void>; open: () => void } {
  let open: () => void = () => undefined;
  const wait = new Promise<void>((resolve) => (open = resolve));
  return { wait, open };
}

/**
 * A backend whose first look at a line (the read right behind its first create) is answered only
 * once `open()` is called: after the command timeout, its caller gave up on the attempt.
 */
function slowFirstLook(): { backend: ZooKeeperLockBackend; open: () => void } {
  const slowRead = gate();
  let reads = 0;
  const slow = backend(
    { commandTimeout: 500 },
    { getChildren: async (_path, send) => (++reads === 1 ? slowRead.wait.then(send) : send()) },
  );
  return { backend: slow, open: slowRead.open };
}

/** One attempt on `key` by `owner` through a backend directly, with a lease of 60 s. */
const taking = (key: string) => (lockBackend: ZooKeeperLockBackend, owner: string) => lockBackend.tryAcquire([key], owner, 60_000);

function lostReason(handle: LockHandle): Promise<string> {
  return new Promise((resolve) =>
    handle.signal.addEventListener('abort', () => resolve((handle.signal.reason as LockLostError).reason), { once: true }),
  );
}

describe('ZooKeeper backend under attack', () => {
  describe('late and lost answers', () => {
    it('a tryAcquire whose create ZooKeeper applied, but whose answer was lost with the connection, leaves no node: the key stays free', async () => {
      quietWarnings();
      const line = await proxy();
      const cutBackend = backend({ connectionString: `127.0.0.1:${line.port}`, commandTimeout: 500 });
      const cut = service(cutBackend);
      // The key's parent exists and is known: the next request is the create itself.
      await (await cut.acquire('job')).release();

      line.set({ kind: 'blackhole-down' }); // requests reach ZooKeeper, answers are lost
      await expect(cut.tryAcquire('job')).rejects.toBeInstanceOf(LockBackendError);
      // The connection breaks and comes back within the session: the session, and every node it made, live on.
      line.set({ kind: 'drop' });
      await until(() => cutBackend.state === 'suspended', 10_000, 'the cut client to notice');
      line.set({ kind: 'pass' });
      await until(() => cutBackend.state === 'connected', 10_000, 'the cut client to reconnect');

      // Nobody holds the key: another process takes it.
      const handle = await service().acquire('job', { wait: 5_000 });
      await handle.release();
      await eventually(async () => expect(await children(`${fixture.root}/job`)).toEqual([]), 5_000);
    }, 30_000);

    it('a tryAcquire whose create was answered but whose look at the line came after the command timeout leaves no node', async () => {
      // The first look at the line after the create: answered after the caller gave up.
      const slow = slowFirstLook();
      const locks = service(slow.backend);
      await expect(locks.tryAcquire('cron')).rejects.toBeInstanceOf(LockBackendError);
      slow.open(); // ...and says the node is first in line
      const other = service();
      const handle = await other.acquire('cron', { wait: 5_000 });
      await handle.release();
      await eventually(async () => expect(await children(`${fixture.root}/cron`)).toEqual([]), 5_000);
    });

    it('an acquisition answered after the lease it won ran out is confirmed again, not left first in line with nobody to use it', async () => {
      // The look at the line after the create is answered after the lease it would certify ran
      // out (two thirds of the 2 s session): a stalled event loop, or a slow ensemble under load.
      let createdAt: number | undefined;
      let creating: Promise<unknown> | undefined;
      const slow = backend(
        { sessionTimeout: 2_000, commandTimeout: 10_000 },
        {
          multi: (ops, send) => {
            const answer = send().finally(() => ops[0]?.op === 'create' && (createdAt ??= performance.now()));
            if (ops[0]?.op === 'create') creating ??= answer.catch(() => undefined);
            return answer;
          },
          // The look is read right behind the create: its answer is held until the create's is late.
          getChildren: async (path, send) => {
            const answer = await send();
            await creating;
            if (createdAt !== undefined && performance.now() - createdAt < 2_000) {
              await until(() => performance.now() - createdAt! >= 2_000, 10_000, 'the answer to be late');
            }
            return answer;
          },
        },
      );
      let attempts = 0;
      const tryAcquire = slow.tryAcquire.bind(slow);
      slow.tryAcquire = (...args) => (attempts++, tryAcquire(...args));
      // No polling: a caller whose win came too late, taken as lost, would not ask again before
      // its wait ends, and its node would stay first in line meanwhile.
      const handle = await service(slow, { pollInterval: 60_000 }).acquire('late-win', { wait: 20_000 });
      expect(attempts).toBe(1);
      expect(handle.isHeld).toBe(true);
      await handle.release();
    }, 30_000);

    it('an acquisition whose every confirmation came too late gives its nodes up, and its caller takes the free key at once, not at its next poll', async () => {
      // As above, and each check of the session is answered after the lease it would certify ran out too.
      let createdAt: number | undefined;
      let creating: Promise<unknown> | undefined;
      let lateChecks = 0;
      const afterLease = (since: number) => until(() => performance.now() - since >= 2_000, 10_000, 'the answer to be late');
      const slow = backend(
        { sessionTimeout: 2_000, commandTimeout: 10_000 },
        {
          multi: async (ops, send) => {
            if (ops[0]?.op === 'check' && lateChecks < 3) {
              lateChecks++;
              const sentAt = performance.now();
              const answer = await send();
              await afterLease(sentAt);
              return answer;
            }
            const answer = send().finally(() => ops[0]?.op === 'create' && (createdAt ??= performance.now()));
            if (ops[0]?.op === 'create') creating ??= answer.catch(() => undefined);
            return answer;
          },
          // The look is read right behind the create: its answer is held until the create's is late.
          getChildren: async (path, send) => {
            const answer = await send();
            await creating;
            if (createdAt !== undefined && performance.now() - createdAt < 2_000) await afterLease(createdAt);
            return answer;
          },
        },
      );
      let attempts = 0;
      const tryAcquire = slow.tryAcquire.bind(slow);
      slow.tryAcquire = (...args) => (attempts++, tryAcquire(...args));
      // No polling within the test: only the backend's answer can send the caller back at once.
      const acquiring = service(slow, { pollInterval: 60_000 }).acquire('late-thrice', { wait: 60_000, ttl: 60_000 });
      await until(() => lateChecks === 3, 20_000, 'the third late check');
      await until(() => attempts === 2, 10_000, 'the caller to try again');
      const handle = await acquiring;
      expect(handle.isHeld).toBe(true);
      await handle.release();
    }, 40_000);

    /**
     * The client queues requests while it has no connection and sends them once it has one again
     * (a leader election): a create can reach ZooKeeper long after the attempt that sent it timed
     * out, and its answer can then be lost with the connection. The held-back create below is sent
     * when the test says, and its answer replaced by CONNECTION_LOSS.
     */
    function heldBackCreate(): { taps: ZooKeeperTaps; send: () => void; sent: Promise<void> } {
      const release = gate();
      let sent: () => void = () => undefined;
      const done = new Promise<void>((resolve) => (sent = resolve));
      let creates = 0;
      const taps: ZooKeeperTaps = {
        multi: async (ops, send) => {
          if (ops[0]?.op !== 'create' || ++creates !== 2) return send();
          await release.wait;
          await send().finally(sent);
          throw new ZooKeeperError('CONNECTION_LOSS', 'Exception: CONNECTION_LOSS[-4]');
        },
      };
      return { taps, send: release.open, sent: done };
    }

    it('a create sent after its waiting caller gave up, whose answer was lost, leaves no node in line', async () => {
      quietWarnings();
      const held = heldBackCreate();
      const locks = service(backend({ commandTimeout: 300 }, held.taps));
      const holder = await service().acquire('late-create');
      // The first create makes the key's parent known; the second is held back.
      await (await locks.acquire('other')).release();
      await expect(locks.acquire('late-create', { wait: 1_000 })).rejects.toBeInstanceOf(Error);
      held.send();
      await held.sent;
      await holder.release();
      const next = await service().acquire('late-create', { wait: 5_000 });
      await next.release();
      await eventually(async () => expect(await children(`${fixture.root}/late-create`)).toEqual([]), 5_000);
    }, 30_000);

    it('a create applied after its attempt timed out, whose answer was lost, is the waiter’s one place in line: its release frees the key', async () => {
      quietWarnings();
      const held = heldBackCreate();
      const waiterBackend = backend({ commandTimeout: 300 }, held.taps);
      let attempts = 0;
      const tryAcquire = waiterBackend.tryAcquire.bind(waiterBackend);
      waiterBackend.tryAcquire = (...args) => (attempts++, tryAcquire(...args));
      const locks = service(waiterBackend);
      const holder = await service().acquire('late-place');
      await (await locks.acquire('other')).release();
      const waiting = locks.acquire('late-place', { wait: 20_000 });
      // The waiter tries again meanwhile, its attempts timing out: it must not stand in line twice.
      await until(() => attempts >= 4, 10_000, 'the waiter to try again');
      held.send();
      await held.sent;
      await holder.release();
      const handle = await waiting;
      await handle.release();
      const next = await service().acquire('late-place', { wait: 5_000 });
      expect(next.fencingToken).toBeGreaterThan(handle.fencingToken!);
      await next.release();
      await eventually(async () => expect(await children(`${fixture.root}/late-place`)).toEqual([]), 5_000);
    }, 30_000);

    it('a multi-key create applied whose answer was lost: the waiter finds its nodes in both lines, holds both keys, and its release frees both', async () => {
      quietWarnings();
      let creates = 0;
      const waiterBackend = backend(
        { commandTimeout: 300 },
        {
          multi: async (ops, send) => {
            if (ops[0]?.op !== 'create' || ++creates !== 2) return send();
            await send();
            throw new ZooKeeperError('CONNECTION_LOSS', 'Exception: CONNECTION_LOSS[-4]');
          },
        },
      );
      const locks = service(waiterBackend);
      // The first create makes the keys' parents known; the second is applied, its answer lost.
      await (await locks.acquire(['lost-a', 'lost-b'])).release();
      const blocker = await service().acquire('lost-b');
      const waiting = locks.acquire(['lost-a', 'lost-b'], { wait: 20_000 });
      await until(() => creates >= 2, 10_000, 'the lost create');
      await blocker.release();
      const handle = await waiting;
      for (const key of ['lost-a', 'lost-b']) expect(await children(`${fixture.root}/${key}`)).toHaveLength(1);
      await handle.release();
      const next = await service().acquire(['lost-a', 'lost-b'], { wait: 5_000 });
      expect(next.fencingToken).toBeGreaterThan(handle.fencingToken!);
      await next.release();
      await eventually(async () => {
        for (const key of ['lost-a', 'lost-b']) expect(await children(`${fixture.root}/${key}`)).toEqual([]);
      }, 5_000);
    }, 30_000);

    it('a create queued while the connection was down, in a session then lost, does not hold up the waiter in the next session', async () => {
      quietWarnings();
      const line = await proxy();
      const cutBackend = backend({ connectionString: `127.0.0.1:${line.port}`, sessionTimeout: 2_000, commandTimeout: 500 });
      const locks = service(cutBackend);
      // The key's parent is known: the waiter's first request is the create, queued by the client.
      await (await locks.acquire('queued')).release();
      line.set({ kind: 'drop' });
      await until(() => cutBackend.state === 'suspended', 10_000, 'the client to lose its connection');
      const acquiring = locks.acquire('queued', { wait: 20_000 });
      await until(() => cutBackend.state === 'lost', 10_000, 'the session to be lost');
      line.set({ kind: 'pass' });
      const handle = await acquiring;
      expect(handle.isHeld).toBe(true);
      await handle.release();
      await eventually(async () => expect(await children(`${fixture.root}/queued`)).toEqual([]), 5_000);
    }, 30_000);

    it('attempts that timed out behind one create, resumed together when it failed, make one place in line between them, not one each', async () => {
      quietWarnings();
      const queued = gate();
      let creates = 0;
      const waiterBackend = backend(
        { commandTimeout: 300 },
        {
          multi: async (ops, send) => {
            if (ops[0]?.op !== 'create') return send();
            const n = ++creates;
            const lost = () => Promise.reject(new ZooKeeperError('CONNECTION_LOSS', 'Exception: CONNECTION_LOSS[-4]'));
            // The first makes the key's parent known; the second never reaches ZooKeeper; the
            // next two are sent as the connection breaks: applied, their answers lost.
            if (n === 1) return send();
            if (n === 2) return queued.wait.then(lost);
            return n <= 4 ? send().then(lost) : send();
          },
        },
      );
      let attempts = 0;
      const tryAcquire = waiterBackend.tryAcquire.bind(waiterBackend);
      waiterBackend.tryAcquire = (...args) => (attempts++, tryAcquire(...args));
      const locks = service(waiterBackend);
      const holder = await service().acquire('one-place');
      await (await locks.acquire('other')).release();
      const waiting = locks.acquire('one-place', { wait: 15_000 });
      // Several attempts time out while the create is held back: each goes on, waiting for it.
      await until(() => attempts >= 4, 10_000, 'the waiter to try again');
      queued.open();
      await until(() => creates >= 3, 10_000, 'the attempts to go on');
      await holder.release();
      const handle = await waiting;
      await handle.release();
      const next = await service().acquire('one-place', { wait: 5_000 });
      await next.release();
      await eventually(async () => expect(await children(`${fixture.root}/one-place`)).toEqual([]), 5_000);
    }, 40_000);

    it('a create whose answer was lost in a session given up as lost: the next session does not take its node, which ends with the old session, for its own', async () => {
      quietWarnings();
      const line = await proxy();
      // The first session goes through the proxy; the next ones straight to ZooKeeper. The first's
      // close never reaches ZooKeeper (its connection is cut first): it lives on there until it expires.
      const viaProxy = nodeZooKeeperClients(`127.0.0.1:${line.port}`, 4_000);
      const direct = nodeZooKeeperClients(fixture.connectionString, 4_000);
      const made: ZooKeeperClient[] = [];
      const newClient = (): ZooKeeperClient => {
        const client = made.length === 0 ? viaProxy() : direct();
        const first = made.length === 0;
        made.push(client);
        if (!first) return client;
        const cut: ZooKeeperClient = Object.create(client);
        cut.close = () => (line.set({ kind: 'drop' }), client.close());
        return cut;
      };
      const waiterBackend = new ZooKeeperLockBackend(
        fixture.connectionString,
        { root: fixture.root, sessionTimeout: 4_000, commandTimeout: 500 },
        newClient,
      );
      fixture.cleanup(() => waiterBackend.close());
      const locks = service(waiterBackend);
      const holder = await service().acquire('old-session', { ttl: 60_000 });
      // The key's parent is known: the waiter's first request is the create.
      expect(await locks.tryAcquire('old-session')).toBeUndefined();
      // Requests reach ZooKeeper, answers are lost: the create is applied, and the session kept alive there.
      line.set({ kind: 'blackhole-down' });
      const waiting = locks.acquire('old-session', { wait: 30_000 });
      // A second client is made only once the first session was given up as lost. (Its state may be
      // 'lost' for a moment only: the waiter's next attempt makes the new session at once.)
      await until(() => made.length === 2, 15_000, 'the waiter to give its session up');
      await until(() => waiterBackend.state === 'connected', 10_000, 'the waiter’s next session');
      await holder.release();
      const handle = await waiting;
      // Every node of the line is the live session's: the lock ends with the session it is certified for.
      const sessionId = (made[1] as unknown as { client: { getSessionId(): Buffer } }).client.getSessionId();
      const client = await raw();
      for (const name of await children(`${fixture.root}/old-session`)) {
        const stat = await call<{ ephemeralOwner: Buffer }>((cb) =>
          client.exists(`${fixture.root}/old-session/${name}`, cb as Callback<unknown>),
        );
        expect(stat.ephemeralOwner.equals(sessionId)).toBe(true);
      }
      await handle.release();
      await eventually(async () => expect(await children(`${fixture.root}/old-session`)).toEqual([]), 10_000);
    }, 40_000);

    it('a create whose answer was lost, looked for on a server that has not applied it yet: the waiter holds its one place, not two', async () => {
      quietWarnings();
      // A follower the client reconnected to may be behind the leader that applied the create: its
      // reads miss the node until this client's next write is answered (a server answers a write
      // only once it applied everything before it). Played here on one server: the nodes of the
      // lost create are hidden from reads until a later write of this client is answered.
      let hidden: string[] | undefined;
      let creates = 0;
      const lagging = backend(
        { commandTimeout: 500 },
        {
          multi: async (ops, send) => {
            if (ops[0]?.op === 'create' && ++creates === 2) {
              hidden = (await send()).created;
              throw new ZooKeeperError('CONNECTION_LOSS', 'Exception: CONNECTION_LOSS[-4]');
            }
            const answer = await send();
            hidden = undefined;
            return answer;
          },
          getChildren: async (path, send) => (await send()).filter((name) => !hidden?.some((node) => node === `${path}/${name}`)),
        },
      );
      const locks = service(lagging);
      // The first create makes the key's parent known; the second is the one whose answer is lost.
      await (await locks.acquire('lagging')).release();
      const handle = await locks.acquire('lagging', { wait: 5_000 });
      expect(await children(`${fixture.root}/lagging`)).toHaveLength(1);
      await handle.release();
      await eventually(async () => expect(await children(`${fixture.root}/lagging`)).toEqual([]), 5_000);
    }, 30_000);

    it('a release whose delete never reached ZooKeeper: the handle says so, and the node is deleted once ZooKeeper is reachable again', async () => {
      quietWarnings();
      const line = await proxy();
      const cutBackend = backend({ connectionString: `127.0.0.1:${line.port}`, sessionTimeout: 8_000, commandTimeout: 500 });
      const handle = await service(cutBackend).acquire('release-late', { ttl: 60_000 });
      line.set({ kind: 'blackhole-up' }); // the delete is lost on the way
      await expect(handle.release()).rejects.toBeInstanceOf(LockBackendError);
      expect(await children(`${fixture.root}/release-late`)).toHaveLength(1);
      const next = service().acquire('release-late', { wait: 20_000 });
      line.set({ kind: 'pass' });
      const taken = await next;
      expect(taken.fencingToken).toBeGreaterThan(handle.fencingToken!);
      // It was the delete sent again, not the session's end, that freed the key.
      expect(cutBackend.state).not.toBe('lost');
      await taken.release();
    }, 30_000);

    it('a server that keeps each answer until its next request (ZOOKEEPER-4537): the session sends it reads until the acquisition and release are answered', async () => {
      const line = await proxy();
      // The session's own pings start after a third of its timeout (3.3 s), past the command timeout.
      const slowServer = backend({ connectionString: `127.0.0.1:${line.port}`, sessionTimeout: 10_000, commandTimeout: 2_000 });
      const locks = service(slowServer);
      await locks.acquire('held-answer').then((handle) => handle.release());
      // It misses the first request after the answer it keeps too: one read is not enough.
      line.set({ kind: 'hold-down-until-up', requests: 2 });
      // One attempt: not a retry within a wait that happens to come after the answer.
      const handle = await locks.tryAcquire('held-answer', { ttl: 60_000 });
      expect(handle).toBeDefined();
      await handle!.release();
      expect(await children(`${fixture.root}/held-answer`)).toEqual([]);
      expect(slowServer.state).toBe('connected');
    }, 30_000);

    it('reads sent while an answer is late stop once it comes, also when it came after the command timeout', async () => {
      quietWarnings();
      let holdNext = false;
      let letGo: () => void = () => undefined;
      let nudges = 0;
      const late = backend(
        { commandTimeout: 500 },
        {
          multi: async (ops, send) => {
            if (!holdNext) return send();
            holdNext = false;
            await new Promise<void>((resolve) => (letGo = resolve));
            return send();
          },
          exists: (path, watcher, send) => {
            if (path === '/' && !watcher) nudges++;
            return send();
          },
        },
      );
      const locks = service(late);
      await locks.acquire('late-answer').then((handle) => handle.release());
      holdNext = true;
      await expect(locks.tryAcquire('late-answer', { ttl: 60_000 })).rejects.toBeInstanceOf(LockBackendError);
      // Past its command timeout, the request is still unanswered: the session still asks.
      await until(() => nudges >= 2, 5_000, 'reads while the answer is late');
      letGo();
      await until(async () => (await children(`${fixture.root}/late-answer`)).length === 0, 10_000, 'the late node to go');
      const after = nudges;
      // What must not happen is watched for a fixed while: four periods of the reads.
      await new Promise((resolve) => setTimeout(resolve, 1_000));
      expect(nudges).toBe(after);
    }, 30_000);

    it('inspect() during a connection loss fails with LockBackendError, the error every other call gives', async () => {
      let failNext = false;
      const flaky = backend(
        {},
        {
          getChildren: (path, send) =>
            failNext
              ? ((failNext = false), Promise.reject(new ZooKeeperError('CONNECTION_LOSS', 'Exception: CONNECTION_LOSS[-4]')))
              : send(),
        },
      );
      const locks = service(flaky);
      expect(await locks.inspect('seen')).toBeUndefined();
      failNext = true;
      await expect(locks.inspect('seen')).rejects.toBeInstanceOf(LockBackendError);
    });
  });

  describe('watches', () => {
    it('a predecessor that goes before its watch is set leaves no watch behind on the server', async () => {
      const held = await service().acquire('race', { ttl: 60_000 });
      const watchSent = gate();
      const watchAsked = gate();
      const waiter = service(
        backend(
          {},
          {
            // The watch on the holder's node goes out only after the holder released.
            exists: async (path, watcher, send) => {
              if (watcher) {
                watchAsked.open();
                await watchSent.wait;
              }
              return send();
            },
          },
        ),
      );
      const waiting = waiter.acquire('race', { wait: 10_000 });
      await watchAsked.wait;
      await held.release();
      watchSent.open();
      await (await waiting).release();
      await eventually(async () => expect(await children(`${fixture.root}/race`)).toEqual([]), 5_000);
      expect([...(await watchesHere()).keys()]).toEqual([]);
    });

    it('a watch whose request failed is asked for again: the waiter is woken by the release, not by polling', async () => {
      let failures = 0;
      let attempts = 0;
      let wakes = 0;
      const flaky = backend(
        {},
        {
          exists: (path, watcher, send) =>
            watcher && failures++ === 0 ? Promise.reject(new ZooKeeperError('CONNECTION_LOSS', 'Exception: CONNECTION_LOSS[-4]')) : send(),
        },
      );
      const [tryAcquire, watch] = [flaky.tryAcquire.bind(flaky), flaky.watch.bind(flaky)];
      flaky.tryAcquire = (...args) => tryAcquire(...args).finally(() => attempts++);
      flaky.watch = (keys, onRelease, owner) => watch(keys, () => (wakes++, onRelease()), owner);
      const held = await service().acquire('rewatch', { ttl: 60_000 });
      // No polling: only a wake-up can move the waiter before its wait ends.
      const waiting = service(flaky, { pollInterval: 60_000 }).acquire('rewatch', { wait: 25_000 });
      // The first attempt failed on the watch; the second stands in line.
      await until(() => attempts >= 2, 10_000, 'the waiter to stand in line');
      const before = wakes;
      await held.release();
      await until(() => wakes > before, 10_000, 'the release to wake the waiter');
      await (await waiting).release();
    }, 30_000);

    it('many waiters on one key: each watches only the node just before its own, and its own', async () => {
      const held = await service().acquire('herd', { ttl: 60_000 });
      const waiters: Promise<LockHandle>[] = [];
      for (let i = 0; i < 6; i++) {
        waiters.push(service().acquire('herd', { wait: 20_000 }));
        await until(async () => (await children(`${fixture.root}/herd`)).length === i + 2, 10_000, `waiter ${i} in line`);
      }
      const line = (await children(`${fixture.root}/herd`)).sort((a, b) => Number(a.slice(-10)) - Number(b.slice(-10)));
      await eventually(async () => {
        const watched = await watchesHere();
        const sessions = (i: number) => watched.get(`${fixture.root}/herd/${line[i]}`) ?? [];
        // Every node is watched: the holder's by the first waiter, the last one's by its waiter
        // alone (see LineRequest.ownWatch), each other one by its waiter and the waiter behind it.
        expect(watched.size).toBe(line.length);
        for (let i = 0; i < line.length; i++) expect(sessions(i)).toHaveLength(i === 0 || i === line.length - 1 ? 1 : 2);
        // The one session that watches two neighbours is the later one's waiter: nobody watches a
        // node further ahead, so a release wakes the next waiter only.
        for (let i = 1; i < line.length; i++) expect(sessions(i).filter((session) => sessions(i - 1).includes(session))).toHaveLength(1);
        const all = [...watched.values()].flat();
        expect(new Set(all).size).toBe(line.length - 1);
        expect(all).toHaveLength(2 * (line.length - 1));
      }, 5_000);
      await held.release();
      for (const waiting of waiters) await (await waiting).release();
    }, 30_000);
  });

  describe('giving up and shutting down', () => {
    it('an AbortSignal that fires while the create is on its way: the caller gets the abort, and no node or watch is left', async () => {
      const held = await service().acquire('abort', { ttl: 60_000 });
      const [holderNode] = await children(`${fixture.root}/abort`);
      const createSent = gate();
      const createAsked = gate();
      let created: Promise<ZooKeeperMulti> | undefined;
      const waiters = service(
        backend(
          { commandTimeout: 500 },
          {
            multi: async (ops, send) => {
              if (ops[0]?.op !== 'create' || created) return send();
              createAsked.open();
              await createSent.wait;
              return (created = send());
            },
          },
        ),
      );
      const controller = new AbortController();
      const waiting = waiters.acquire('abort', { signal: controller.signal, wait: 20_000 });
      await createAsked.wait;
      controller.abort(new Error('the caller left'));
      await expect(waiting).rejects.toThrow('the caller left');
      createSent.open(); // the create reaches ZooKeeper after the caller left
      await until(() => created !== undefined, 5_000, 'the create to go out');
      await created!.catch(() => undefined);
      await eventually(async () => expect(await children(`${fixture.root}/abort`)).toEqual([holderNode]), 5_000);
      await held.release();
      await eventually(async () => expect([...(await watchesHere()).keys()]).toEqual([]), 5_000);
      expect(waiters.footprint()).toEqual({ leases: 0, requests: 0, keySets: 0, countedKeys: 0, scheduled: expect.any(Number) });
    });

    it('shutdown during a hand-over with waiters in three processes: every caller settles, no node or connection is left', async () => {
      quietWarnings();
      const sockets = () => process.getActiveResourcesInfo().filter((r) => r === 'TCPSocketWrap').length;
      await raw();
      const before = sockets();
      const services = [service(), service(), service()];
      const held = await services[0].acquire('handover', { ttl: 60_000 });
      const callers = services.flatMap((locks) =>
        [0, 1].map(() =>
          locks.using(
            'handover',
            async (lock) => {
              await new Promise<void>((resolve) => lock.signal.addEventListener('abort', () => resolve(), { once: true }));
            },
            { wait: 20_000 },
          ),
        ),
      );
      await until(async () => (await children(`${fixture.root}/handover`)).length >= 4, 10_000, 'a waiter of each process in line');
      const releasing = held.release();
      await Promise.all([releasing, ...services.map((locks) => locks.onApplicationShutdown())]);
      const outcomes = await Promise.allSettled(callers);
      for (const outcome of outcomes) {
        if (outcome.status === 'rejected') expect(outcome.reason).toBeInstanceOf(LockBackendError);
      }
      expect(await children(`${fixture.root}/handover`)).toEqual([]);
      await until(() => sockets() <= before, 5_000, 'the sessions’ sockets to close');
    });

    it('a multi-key create queued while the connection is down, its caller aborted: sent once the connection is back, its nodes go', async () => {
      quietWarnings();
      const line = await proxy();
      let creates = 0;
      let cutDone: (() => void) | undefined;
      const cut = new Promise<void>((resolve) => (cutDone = resolve));
      const cutBackend = backend(
        { connectionString: `127.0.0.1:${line.port}`, sessionTimeout: 8_000, commandTimeout: 500 },
        {
          // The create of the second attempt, sent on a connected session, reaches the client
          // once its connection dropped: the client queues it until it is back.
          multi: async (ops, send) => {
            if (ops[0]?.op === 'create' && ++creates === 2) await cut;
            return send();
          },
        },
      );
      const locks = service(cutBackend);
      // The parents are known: the caller's first request is the create.
      await (await locks.acquire(['queued-a', 'queued-b'])).release();
      const controller = new AbortController();
      const waiting = locks.acquire(['queued-a', 'queued-b'], { signal: controller.signal, wait: 20_000 });
      await until(() => creates === 2, 5_000, 'the create to be sent');
      line.set({ kind: 'drop' });
      await until(() => cutBackend.state === 'suspended', 10_000, 'the client to lose its connection');
      cutDone!();
      controller.abort(new Error('the caller left'));
      await expect(waiting).rejects.toThrow('the caller left');
      line.set({ kind: 'pass' });
      await until(() => cutBackend.state === 'connected', 10_000, 'the client to reconnect in its session');
      const handle = await service().acquire(['queued-a', 'queued-b'], { wait: 5_000 });
      await handle.release();
      expect(cutBackend.state).toBe('connected');
      await eventually(async () => {
        for (const key of ['queued-a', 'queued-b']) expect(await children(`${fixture.root}/${key}`)).toEqual([]);
      }, 5_000);
    }, 30_000);

    it('shutdown while ZooKeeper is unreachable, with a create queued and releases left to retry: every timer goes, and the nodes with the session', async () => {
      quietWarnings();
      const line = await proxy();
      await raw();
      const before = activeTimers();
      const cutBackend = backend({ connectionString: `127.0.0.1:${line.port}`, sessionTimeout: 4_000, commandTimeout: 500 });
      let attempts = 0;
      const tryAcquire = cutBackend.tryAcquire.bind(cutBackend);
      cutBackend.tryAcquire = (...args) => (attempts++, tryAcquire(...args));
      const locks = service(cutBackend);
      await (await locks.acquire('down-warm')).release();
      const held = await locks.acquire('down-held', { ttl: 60_000 });
      line.set({ kind: 'drop' });
      await until(() => cutBackend.state === 'suspended', 10_000, 'the client to lose its connection');
      const waiting = locks.acquire('down-wait', { wait: 20_000 }).catch((error: unknown) => error);
      const noWait = locks.tryAcquire('down-try').catch((error: unknown) => error);
      await until(() => attempts >= 5, 10_000, 'the waiter to try again');
      await locks.onApplicationShutdown();
      expect(await waiting).toBeInstanceOf(LockBackendError);
      expect(await noWait).toBeInstanceOf(LockBackendError);
      expect(held.isHeld).toBe(false);
      line.set({ kind: 'pass' });
      await eventually(() => expect(activeTimers()).toBeLessThanOrEqual(before), 10_000);
      await eventually(async () => {
        for (const key of ['down-held', 'down-wait', 'down-try']) expect(await children(`${fixture.root}/${key}`)).toEqual([]);
      }, 15_000);
    }, 40_000);

    it('a graceful shutdown deletes the parent nodes of the keys it released, instead of leaving one per key', async () => {
      const locks = service();
      for (const id of [1, 2, 3]) await (await locks.acquire(`order:${id}`)).release();
      expect(await children(fixture.root)).toHaveLength(3);
      await locks.onApplicationShutdown();
      expect(await children(fixture.root)).toEqual([]);
    });
  });

  describe('sessions', () => {
    it('the lease is min(ttl, two thirds of the session timeout ZooKeeper granted), not of the one asked for', async () => {
      // The server grants 2 to 20 ticks of 500 ms: 60 s asked is 10 s granted, 300 ms asked is 1 s.
      const long = backend({ sessionTimeout: 60_000 });
      expect(await long.tryAcquire(['lease-long'], 'owner-a', 60_000)).toMatchObject({ acquired: true, validityMs: 6_666 });
      expect(await long.tryAcquire(['lease-short-ttl'], 'owner-b', 1_000)).toMatchObject({ acquired: true, validityMs: 1_000 });
      const short = backend({ sessionTimeout: 300 });
      expect(await short.tryAcquire(['lease-short'], 'owner-c', 60_000)).toMatchObject({ acquired: true, validityMs: 666 });
      const handle = await service(backend({ sessionTimeout: 60_000 })).acquire('lease-huge', { ttl: 2_147_483_647 });
      expect(handle.expiresAt.getTime() - Date.now()).toBeLessThanOrEqual(6_666);
      await handle.release();
    });

    it('a ttl of 1 ms runs out before any answer: never held, nothing left behind, the key free for others', async () => {
      const impatient = service();
      await expect(impatient.acquire('ttl-1', { ttl: 1, wait: 300 })).rejects.toBeInstanceOf(LockNotAcquiredError);
      await eventually(async () => expect(await children(`${fixture.root}/ttl-1`)).toEqual([]), 5_000);
      await (await service().acquire('ttl-1', { wait: 0 })).release();
      expect(impatient.footprint()).toMatchObject({ leases: 0, keySets: 0, countedKeys: 0 });
    });

    it('a connection broken and restored within the session keeps the lock and the waiter’s watch', async () => {
      quietWarnings();
      const line = await proxy();
      const viaProxy = () => backend({ connectionString: `127.0.0.1:${line.port}`, sessionTimeout: 8_000 });
      const [holderBackend, waiterBackend] = [viaProxy(), viaProxy()];
      const held = await service(holderBackend).acquire('blip', { ttl: 60_000 });
      const waiting = service(waiterBackend, { pollInterval: 60_000 }).acquire('blip', { wait: 20_000 });
      await until(async () => (await children(`${fixture.root}/blip`)).length === 2, 10_000, 'the waiter in line');
      // The holder's node, and the waiter's own (see LineRequest.ownWatch).
      await eventually(async () => expect((await watchesHere()).size).toBe(2), 5_000);
      line.set({ kind: 'drop' });
      await until(() => holderBackend.state === 'suspended' && waiterBackend.state === 'suspended', 10_000, 'both to notice');
      line.set({ kind: 'pass' });
      await until(() => holderBackend.state === 'connected' && waiterBackend.state === 'connected', 10_000, 'both to reconnect');
      await held.extend();
      expect(held.isHeld).toBe(true);
      expect((await service().inspect('blip'))?.fencingToken).toBe(held.fencingToken);
      await held.release();
      const next = await waiting;
      expect(next.fencingToken).toBeGreaterThan(held.fencingToken!);
      await next.release();
    }, 30_000);

    it('a waiter cut off while an operator released its place and the holder released does not take the key on the events of its reconnection', async () => {
      quietWarnings();
      const line = await proxy();
      const [h, w] = [backend(), backend({ connectionString: `127.0.0.1:${line.port}`, sessionTimeout: 8_000 })];
      const take = taking('replayed');
      expect((await take(h, 'h')).acquired).toBe(true);
      // w stands just behind the holder, and watches its node.
      expect((await take(w, 'w')).acquired).toBe(false);
      // w's connection is cut, and stays cut: its session lives on.
      line.set({ kind: 'drop' });
      await until(() => w.state === 'suspended', 10_000, 'w to notice');
      // Meanwhile an operator releases w's place by force, then h releases, and y takes the key.
      await backend().release(['replayed'], 'w');
      await h.release(['replayed'], 'h');
      const y = backend();
      expect((await take(y, 'y')).acquired).toBe(true);
      // w comes back within its session. The server answers the watches its client sets again with
      // h's node gone, each answer read on its own.
      let attempt: Promise<AcquireResult> | undefined;
      await w.watch(['replayed'], () => (attempt ??= take(w, 'w')), 'w');
      line.set({ kind: 'split-down', ms: 20 });
      await until(() => attempt !== undefined, 10_000, 'w to hear that h went');
      line.set({ kind: 'pass' });
      expect((await attempt!).acquired).toBe(false);
      expect((await y.inspect('replayed'))?.holders?.map((holder) => holder.owner)).toEqual(['y']);
      await y.release(['replayed'], 'y');
      await w.release(['replayed'], 'w');
    }, 30_000);

    it('a holder cut off in silence is told it lost the lock before anyone else takes it, and its fenced write is refused', async () => {
      quietWarnings();
      const line = await proxy();
      const cutBackend = backend({ connectionString: `127.0.0.1:${line.port}`, sessionTimeout: 2_000, commandTimeout: 500 });
      const stale = await service(cutBackend).acquire('silent', { ttl: 60_000 });
      const events: string[] = [];
      void lostReason(stale).then((reason) => events.push(`told (${reason})`));
      line.set({ kind: 'blackhole-up' }); // nothing reaches ZooKeeper, nothing comes back: no error to see
      const next = await service().acquire('silent', { wait: 20_000 });
      events.push('taken by another');
      expect(events).toEqual([expect.stringMatching(/^told \((backend-error|expired)\)$/), 'taken by another']);
      expect(next.fencingToken).toBeGreaterThan(stale.fencingToken!);
      const register = await raw();
      const path = `${fixture.root}-register`;
      expect(await write(register, path, next.fencingToken!, 'new holder')).toBe(true);
      fixture.cleanup(() => call<void>((cb) => register.remove(path, -1, cb)));
      expect(await write(register, path, stale.fencingToken!, 'stale holder')).toBe(false);
      await next.release();
    }, 30_000);
  });

  describe('operators and the parent-node clean-up', () => {
    it('a holder whose node an operator deleted is told at its next extension that the lock was taken', async () => {
      quietWarnings();
      const held = await service().acquire('deleted', { ttl: 60_000 });
      const reason = lostReason(held);
      const client = await raw();
      const [node] = await children(`${fixture.root}/deleted`);
      await call<void>((cb) => client.remove(`${fixture.root}/deleted/${node}`, -1, cb));
      const next = await service().acquire('deleted', { wait: 5_000 });
      // Not 'backend-error' at the lease's end: the extension sees the node gone.
      expect(await reason).toBe('taken');
      await next.release();
    });

    it('a waiter whose node an operator deleted does not take the key as the holder goes: the waiter behind it, moved up, does', async () => {
      const [h, w, x] = [backend(), backend(), backend()];
      const take = taking('bypassed');
      expect((await take(h, 'h')).acquired).toBe(true);
      // w stands just behind the holder, x just behind w.
      expect((await take(w, 'w')).acquired).toBe(false);
      let xWoken = false;
      await x.watch(['bypassed'], () => (xWoken = true), 'x');
      expect((await take(x, 'x')).acquired).toBe(false);
      // A forced release of w's place: x hears its node go, looks again, and stands just behind h.
      await backend().release(['bypassed'], 'w');
      await until(() => xWoken, 10_000, 'x to hear that w went');
      expect((await take(x, 'x')).acquired).toBe(false);
      let [wWoken, xWokenAgain] = [false, false];
      await w.watch(['bypassed'], () => (wWoken = true), 'w');
      await x.watch(['bypassed'], () => (xWokenAgain = true), 'x');
      await h.release(['bypassed'], 'h');
      await until(() => wWoken && xWokenAgain, 10_000, 'both to hear that h went');
      // w heard its own node go before h's: it must write first, which finds its node gone.
      expect((await take(w, 'w')).acquired).toBe(false);
      const xs = await take(x, 'x');
      expect(xs.acquired).toBe(true);
      expect((await h.inspect('bypassed'))?.holders?.map((holder) => holder.owner)).toEqual(['x']);
      await x.release(['bypassed'], 'x');
      await w.release(['bypassed'], 'w');
    });

    it('a waiter whose node an operator deleted with the holder’s, in one transaction after it, is told at its next extension, as after a forced release', async () => {
      const line = await proxy();
      const [h, w] = [backend(), backend({ connectionString: `127.0.0.1:${line.port}` })];
      const take = taking('wiped-both');
      expect((await take(h, 'h')).acquired).toBe(true);
      expect((await take(w, 'w')).acquired).toBe(false);
      let attempt: Promise<AcquireResult> | undefined;
      await w.watch(['wiped-both'], () => (attempt ??= take(w, 'w')), 'w');
      // One transaction deletes h's node, then w's (zkCli's deleteall sends one multi()). The
      // server sends w the two events back to back; the link brings them a few ms apart.
      line.set({ kind: 'split-down', ms: 20 });
      const parent = `${fixture.root}/wiped-both`;
      const names = await children(parent);
      const client = await raw();
      const transaction = client.transaction();
      for (const owner of ['h', 'w']) transaction.remove(`${parent}/${names.find((name) => name.startsWith(owner))!}`, -1);
      await call((cb) => transaction.commit(cb));
      await until(() => attempt !== undefined, 10_000, 'w to hear that h went');
      line.set({ kind: 'pass' });
      const result = await attempt!;
      // The key is free: y, another process, takes it.
      const y = backend();
      const ys = await take(y, 'y');
      expect(ys.acquired).toBe(true);
      expect((await y.inspect('wiped-both'))?.holders?.map((holder) => holder.owner)).toEqual(['y']);
      // w may have entered on h's event before its own node's came: as a holder whose node an
      // operator deleted right after the hand-over, which the transaction is to it. Then its next
      // extension tells it the lock was taken, and its token is below y's (docs/inspection.md,
      // "Force release").
      if (result.acquired) {
        expect((await w.extend(['wiped-both'], 'w', 60_000)).extended).toBe(false);
        expect(result.fencingToken!).toBeLessThan(ys.acquired ? ys.fencingToken! : 0);
      }
      await y.release(['wiped-both'], 'y');
      await w.release(['wiped-both'], 'w');
    }, 30_000);

    it('a holder released by force whose timed-out attempt lines up again behind the next holder is told at its next extension', async () => {
      // w's first look at the line, right behind its create, is answered after its caller gave up on it.
      const slow = slowFirstLook();
      const w = slow.backend;
      const h = backend();
      const take = taking('taken-twice');
      expect((await take(h, 'h')).acquired).toBe(true);
      // Its first attempt times out and goes on; the caller tries again (as the service does) and holds.
      await expect(take(w, 'w')).rejects.toThrow(/did not answer/);
      await h.release(['taken-twice'], 'h');
      expect((await take(w, 'w')).acquired).toBe(true);
      // A forced release of w, then y takes the free key.
      await backend().release(['taken-twice'], 'w');
      const y = backend();
      expect((await take(y, 'y')).acquired).toBe(true);
      // The first attempt resumes, finds w's node gone, and lines up again behind y.
      slow.open();
      await until(async () => (await children(`${fixture.root}/taken-twice`)).length === 2, 5_000, 'w to line up again');
      expect((await w.extend(['taken-twice'], 'w', 60_000)).extended).toBe(false);
      await w.release(['taken-twice'], 'w');
      await y.release(['taken-twice'], 'y');
    }, 30_000);

    it('a waiter whose whole line an operator deleted (deleteall) takes the lock, which is free', async () => {
      quietWarnings();
      const held = await service().acquire('wiped', { ttl: 60_000 });
      const waiting = service().acquire('wiped', { wait: 10_000 });
      const parent = `${fixture.root}/wiped`;
      await until(async () => (await children(parent)).length === 2, 10_000, 'the waiter in line');
      const client = await raw();
      const transaction = client.transaction();
      for (const name of await children(parent)) transaction.remove(`${parent}/${name}`, -1);
      transaction.remove(parent, -1);
      await call((cb) => transaction.commit(cb));
      const handle = await waiting;
      expect(handle.fencingToken).toBeGreaterThan(held.fencingToken!);
      await handle.release();
    }, 30_000);

    it('a parent node deleted by another process’s clean-up while a create is on its way: the create is sent again, the lock is taken', async () => {
      const parent = `${fixture.root}/swept`;
      const client = await raw();
      let holdCreates = false;
      const racing = backend(
        { commandTimeout: 20_000 },
        {
          // Holds the create back until the other process's clean-up deleted the parent this one knows.
          multi: (ops, send) => {
            if (ops[0]?.op !== 'create' || !holdCreates) return send();
            holdCreates = false;
            return until(async () => !(await call<unknown>((cb) => client.exists(parent, cb))), 20_000, 'the clean-up').then(send);
          },
        },
      );
      const cleaner = backend();
      expect(await cleaner.tryAcquire(['swept'], 'owner-a', 60_000)).toMatchObject({ acquired: true });
      // The racing process learns the parent exists, and never releases here: it has nothing to clean.
      expect(await racing.tryAcquire(['swept'], 'owner-b', 60_000, { willWait: false })).toEqual({ acquired: false });
      await cleaner.release(['swept'], 'owner-a');
      holdCreates = true;
      // The clean-up deletes the empty parent 5 to 10 s after the release.
      expect(await racing.tryAcquire(['swept'], 'owner-c', 60_000)).toMatchObject({ acquired: true });
      expect(await children(parent)).toHaveLength(1);
      await racing.release(['swept'], 'owner-c');
    }, 30_000);
  });

  describe('keys and requests of every shape', () => {
    it('keys with /, ., .., %2E, zookeeper and unicode each get a line of their own', async () => {
      const keys = ['a/b', 'a%2Fb', '.', '..', '%2E', 'zookeeper', '/zookeeper/quota', 'ключ', '😀', '中'.repeat(512)];
      const holder = service();
      const other = service();
      const handles = [];
      for (const key of keys) handles.push(await holder.acquire(key, { wait: 0 }));
      for (const key of keys) expect(await other.tryAcquire(key)).toBeUndefined();
      const lines = await children(fixture.root);
      expect(lines).toHaveLength(keys.length);
      for (const name of lines) expect(name).toMatch(/^[A-Za-z0-9%_!~*'()-]+$/);
      for (const handle of handles) await handle.release();
      for (const key of keys) await (await other.acquire(key, { wait: 5_000 })).release();
    });

    it('a request larger than ZooKeeper accepts is refused at once with InvalidLockKeyError, and the connection is not dropped', async () => {
      quietWarnings();
      const shared = backend();
      const locks = service(shared, { maxKeyLength: 2_000_000 });
      const held = await locks.acquire('small', { ttl: 60_000 });
      const states = [shared.state];
      const watcher = setInterval(() => states.at(-1) !== shared.state && states.push(shared.state), 2);
      fixture.cleanup(() => clearInterval(watcher));
      const huge = ['x'.repeat(1_100_000)];
      const many = Array.from({ length: 300 }, (_, i) => `${'中'.repeat(500)}${i}`);
      for (const keys of [huge, many]) {
        const error = await locks.acquire(keys, { wait: 5_000 }).catch((e: unknown) => e);
        expect(error).toBeInstanceOf(InvalidLockKeyError);
        expect((error as Error).message).toContain('jute.maxbuffer');
      }
      await held.extend();
      expect(states).toEqual(['connected']);
      expect(held.isHeld).toBe(true);
      await held.release();
    });
  });

  describe('multi-key lines', () => {
    it('overlapping multi-key callers in three processes never deadlock and never share a key', async () => {
      const services = [service(), service(), service()];
      const sets = [
        ['a', 'b'],
        ['b', 'c'],
        ['c', 'a'],
      ];
      const inside = new Map<string, number>();
      let overlaps = 0;
      let sections = 0;
      await Promise.all(
        services.flatMap((locks, i) =>
          [0, 1].map(async () => {
            for (let n = 0; n < 8; n++) {
              await locks.using(
                sets[i],
                async () => {
                  for (const key of sets[i]) if ((inside.get(key) ?? 0) > 0) overlaps++;
                  for (const key of sets[i]) inside.set(key, (inside.get(key) ?? 0) + 1);
                  await new Promise((resolve) => setTimeout(resolve, 2));
                  for (const key of sets[i]) inside.set(key, inside.get(key)! - 1);
                  sections++;
                },
                { wait: 25_000 },
              );
            }
          }),
        ),
      );
      expect(sections).toBe(48);
      expect(overlaps).toBe(0);
    }, 30_000);

    it('a single-key caller that came after a multi-key waiter takes the key the waiter is pending on; the waiter goes after it, with a greater token', async () => {
      const [first, multi, single] = [service(), service(), service()];
      const held = await first.acquire('m1', { ttl: 60_000 });
      const both = multi.acquire(['m1', 'm2'], { wait: 20_000 });
      await until(async () => (await children(`${fixture.root}/m2`)).length === 1, 10_000, 'the multi-key waiter in line');
      // Waiting for m1, its node in m2's line is pending: the caller of m2 alone passes it.
      const alone = await single.acquire('m2', { wait: 5_000 });
      await held.release();
      await alone.release();
      const handle = await both;
      expect(handle.fencingToken).toBeGreaterThan(alone.fencingToken!);
      await handle.release();
    });
  });

  describe('the fencing token', () => {
    it('is the czxid of the holder’s own node, though other callers wrote the line and its parent between its create and its look', async () => {
      const other = backend();
      let between: Promise<unknown> | undefined;
      const first = backend(
        {},
        {
          // Right after its create is applied, another process's caller makes and deletes a node in
          // the line (setting the parent, as every acquisition does) before this one reads anything.
          multi: async (ops, send) => {
            const answer = await send();
            if (ops[0]?.op === 'create' && !between) await (between = other.tryAcquire(['fenced'], 'other', 10_000, { willWait: false }));
            return answer;
          },
        },
      );
      const held = await first.tryAcquire(['fenced'], 'first', 10_000);
      expect(await between).toEqual({ acquired: false });
      // inspect reads the holder's node: its czxid.
      const state = await other.inspect('fenced');
      expect(state).toMatchObject({ owner: 'first' });
      expect(held).toMatchObject({ acquired: true, fencingToken: state!.fencingToken });
      await first.release(['fenced'], 'first');
      // The next holder's token is above it.
      const next = await other.tryAcquire(['fenced'], 'other', 10_000);
      const token = (result: typeof held) => (result.acquired ? result.fencingToken : undefined);
      expect(token(next)).toBeGreaterThan(token(held)!);
      await other.release(['fenced'], 'other');
    });
  });
});
