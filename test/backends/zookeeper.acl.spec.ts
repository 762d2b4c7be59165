import { describe, expect, it } from '@jest/globals';
import { createHash } from 'node:crypto';
// @ts-expect-error: node-zookeeper-client ships no types; the tests only use it as an operator's client.
import zookeeper from 'node-zookeeper-client';
import { ZooKeeperLockBackend } from '../../lib/backends/zookeeper/zookeeper.backend.js';
import { ZooKeeperError, type ZooKeeperMulti } from '../../lib/backends/zookeeper/zookeeper.client.js';
import type { ZooKeeperLockBackendOptions } from '../../lib/backends/zookeeper/zookeeper.options.js';
import { LockBackendError } from '../../lib/lock.errors.js';
import { LockService } from '../../lib/lock.service.js';
import { freePort } from '../support/redis-server.js';
import { TcpProxy } from '../support/tcp-proxy.js';
import { tappedClients } from '../support/zookeeper-client-tap.js';
import { until } from '../support/wait.js';
import { useZooKeeper } from '../support/zookeeper-fixture.js';

type Callback<T> = (error: (Error & { getName?(): string }) | null, value: T) => void;
interface Acl {
  permission: number;
  id: { scheme: string; id: string };
}
/** The part of node-zookeeper-client this file uses, as an operator's zkCli would. */
interface RawClient {
  addAuthInfo(scheme: string, auth: Buffer): void;
  create(path: string, data: Buffer | null, acls: unknown[], mode: number, callback: Callback<string>): void;
  getChildren(path: string, callback: Callback<string[]>): void;
  getACL(path: string, callback: Callback<Acl[]>): void;
  remove(path: string, version: number, callback: Callback<void>): void;
  once(event: 'connected', listener: () => void): void;
  connect(): void;
  close(): void;
}
interface RawPackage {
  createClient(connectionString: string, options: object): RawClient;
  ACL: new (permission: number, id: unknown) => unknown;
  Id: new (scheme: string, id: string) => unknown;
  Permission: { ALL: number; READ: number };
  CreateMode: { EPHEMERAL: number; PERSISTENT: number };
}
const zk = zookeeper as RawPackage;

const fixture = useZooKeeper();

const LOCKS = { username: 'locks', password: 'lock-secret:with@signs' };

/** ZooKeeper's digest id for `user:password`: `user:base64(sha1(user:password))`. */
function digestId(username: string, password: string): string {
  return `${username}:${createHash('sha1').update(`${username}:${password}`).digest('base64')}`;
}

function call<T>(send: (callback: Callback<T>) => void): Promise<T> {
  return new Promise((resolve, reject) => send((error, value) => (error ? reject(error) : resolve(value))));
}

/** A session of the test's own, as an operator's zkCli, authenticated as `digest` when given. */
async function raw(digest?: string): Promise<RawClient> {
  const client = zk.createClient(fixture.connectionString, { sessionTimeout: 4_000, spinDelay: 100 });
  if (digest) client.addAuthInfo('digest', Buffer.from(digest));
  await new Promise<void>((resolve) => {
    client.once('connected', resolve);
    client.connect();
  });
  fixture.cleanup(() => client.close());
  return client;
}

/** The lock root as an admin protects it: all rights to the lock identity (and the admin), none to anyone else. */
async function protectedRoot(): Promise<string> {
  const admin = await raw('admin:admin-secret');
  const acl = [
    new zk.ACL(zk.Permission.ALL, new zk.Id('digest', digestId('admin', 'admin-secret'))),
    new zk.ACL(zk.Permission.ALL, new zk.Id('digest', digestId(LOCKS.username, LOCKS.password))),
  ];
  await call<string>((cb) => admin.create(fixture.root, null, acl, zk.CreateMode.PERSISTENT, cb));
  return fixture.root;
}

function backend(options: ZooKeeperLockBackendOptions & { connectionString?: string } = {}): ZooKeeperLockBackend {
  const { connectionString = fixture.connectionString, ...rest } = options;
  const created = new ZooKeeperLockBackend(connectionString, { root: fixture.root, sessionTimeout: 4_000, commandTimeout: 1_000, ...rest });
  fixture.cleanup(() => created.close());
  return created;
}

function service(lockBackend: ZooKeeperLockBackend): LockService {
  const locks = new LockService(lockBackend, { keyPrefix: '' });
  fixture.cleanup(() => locks.onApplicationShutdown());
  return locks;
}

function codeOf(error: unknown): string | undefined {
  return (error as { getName?(): string }).getName?.();
}

describe('ZooKeeper backend on a digest-protected root', () => {
  it('with the lock identity, takes and hands over locks; its nodes give that identity all rights and nobody else any', async () => {
    const root = await protectedRoot();
    const locks = service(backend({ auth: LOCKS }));
    const handle = await locks.acquire('order:1');

    const own = await raw(`${LOCKS.username}:${LOCKS.password}`);
    const parent = `${root}/order%3A1`;
    const [node] = await call<string[]>((cb) => own.getChildren(parent, cb));
    const only = [{ permission: zk.Permission.ALL, id: { scheme: 'digest', id: digestId(LOCKS.username, LOCKS.password) } }];
    for (const path of [parent, `${parent}/${node}`]) {
      const acl = await call<Acl[]>((cb) => own.getACL(path, cb));
      expect(acl.map(({ permission, id }) => ({ permission, id: { scheme: id.scheme, id: id.id } }))).toEqual(only);
    }
    // Not even the admin who made the root may read the lines: nobody but the lock identity sees keys and owners.
    const admin = await raw('admin:admin-secret');
    expect(await call<string[]>((cb) => admin.getChildren(parent, cb)).catch(codeOf)).toBe('NO_AUTH');

    // A second process of the same identity waits for the first and gets the lock when it is released.
    const other = service(
      backend({ connectionString: `${LOCKS.username}:${encodeURIComponent(LOCKS.password)}@${fixture.connectionString}` }),
    );
    const waiting = other.acquire('order:1', { wait: 20_000 });
    await handle.release();
    await (await waiting).release();
  });

  it.each([
    ['without credentials', undefined],
    ['with another identity', 'intruder:guess'],
  ])("another client %s cannot delete a holder's node, nor stand in its line, nor delete the line", async (_, digest) => {
    const root = await protectedRoot();
    const locks = service(backend({ auth: LOCKS }));
    const handle = await locks.acquire('job');
    const own = await raw(`${LOCKS.username}:${LOCKS.password}`);
    const parent = `${root}/job`;
    const [node] = await call<string[]>((cb) => own.getChildren(parent, cb));

    const intruder = await raw(digest);
    const removed = await call<void>((cb) => intruder.remove(`${parent}/${node}`, -1, cb)).catch(codeOf);
    expect(removed).toBe('NO_AUTH');
    const created = await call<string>((cb) =>
      intruder.create(`${parent}/x-`, null, [new zk.ACL(zk.Permission.ALL, new zk.Id('world', 'anyone'))], 3, cb),
    ).catch(codeOf);
    expect(created).toBe('NO_AUTH');
    const parentRemoved = await call<void>((cb) => intruder.remove(parent, -1, cb)).catch(codeOf);
    expect(parentRemoved).toBe('NO_AUTH');

    // The holder still holds: its node is where it was, and its next extension finds it.
    expect(await call<string[]>((cb) => own.getChildren(parent, cb))).toEqual([node]);
    await handle.extend();
    expect(handle.isHeld).toBe(true);
    await handle.release();
  });

  it('the root the backend makes is its own too: an unauthenticated client cannot delete a line under it', async () => {
    const locks = service(backend({ auth: LOCKS }));
    const handle = await locks.acquire('job');
    const own = await raw(`${LOCKS.username}:${LOCKS.password}`);
    const acl = await call<Acl[]>((cb) => own.getACL(fixture.root, cb));
    expect(acl.map(({ permission, id }) => ({ permission, scheme: id.scheme }))).toEqual([
      { permission: zk.Permission.ALL, scheme: 'digest' },
    ]);
    const intruder = await raw();
    const [node] = await call<string[]>((cb) => own.getChildren(`${fixture.root}/job`, cb));
    expect(await call<void>((cb) => intruder.remove(`${fixture.root}/job/${node}`, -1, cb)).catch(codeOf)).toBe('NO_AUTH');
    await handle.release();
  });

  it.each([
    ['without credentials', undefined],
    ['with another identity', { username: 'intruder', password: 'guess' }],
  ])('a backend %s fails at once, with a permanent LockBackendError that names the cause and the fix', async (_, auth) => {
    await protectedRoot();
    /** Counts the service's attempts; the backend's own code runs. */
    class Recording extends ZooKeeperLockBackend {
      attempts = 0;
      override tryAcquire(...args: Parameters<ZooKeeperLockBackend['tryAcquire']>): ReturnType<ZooKeeperLockBackend['tryAcquire']> {
        this.attempts++;
        return super.tryAcquire(...args);
      }
    }
    const refused = new Recording(fixture.connectionString, { root: fixture.root, sessionTimeout: 4_000, commandTimeout: 1_000, auth });
    fixture.cleanup(() => refused.close());
    const locks = service(refused);

    // A wait of its own that the test would outlast if it were retried for the whole of it.
    const error = await locks.acquire('job', { wait: 3_000 }).catch((e: unknown) => e);
    expect(error).toBeInstanceOf(LockBackendError);
    expect((error as LockBackendError).permanent).toBe(true);
    expect((error as Error).message).toMatch(/NO_AUTH.*Give the backend the credentials of an identity the ACL allows \(the auth option/);
    expect(refused.attempts).toBe(1);
    // The same for a caller that does not wait.
    await expect(locks.tryAcquire('job')).rejects.toMatchObject({ permanent: true });
    await expect(refused.tryAcquire(['job'], 'owner-1', 5_000, { willWait: false })).rejects.toMatchObject({ permanent: true });
    // Nothing was made under the root, nothing is left to retry.
    const admin = await raw('admin:admin-secret');
    expect(await call<string[]>((cb) => admin.getChildren(fixture.root, cb))).toEqual([]);
  });

  describe('verify() at start-up', () => {
    it('resolves for the lock identity on a protected root, and leaves nothing behind', async () => {
      const root = await protectedRoot();
      await backend({ auth: LOCKS }).verify();
      const own = await raw(`${LOCKS.username}:${LOCKS.password}`);
      expect(await call<string[]>((cb) => own.getChildren(root, cb))).toEqual([]);
    });

    it.each([
      ['without credentials', undefined],
      ['with another identity', { username: 'intruder', password: 'guess' }],
    ])('rejects a backend %s with a permanent LockBackendError naming the root, the cause and the fix', async (_, auth) => {
      const root = await protectedRoot();
      const error = await backend({ auth })
        .verify()
        .catch((e: unknown) => e);
      expect(error).toBeInstanceOf(LockBackendError);
      expect(error).toMatchObject({ permanent: true });
      expect((error as Error).message).toContain(`start-up check of the lock root ${root} failed: ZooKeeper refused it (NO_AUTH)`);
      expect((error as Error).message).toContain('Give the backend the credentials');
    });

    it("makes a missing root, its identity's alone", async () => {
      await backend({ auth: LOCKS, root: `${fixture.root}/a/b` }).verify();
      const own = await raw(`${LOCKS.username}:${LOCKS.password}`);
      const acl = await call<Acl[]>((cb) => own.getACL(`${fixture.root}/a/b`, cb));
      expect(acl.map(({ id }) => id.scheme)).toEqual(['digest']);
      expect(await call<string[]>((cb) => own.getChildren(`${fixture.root}/a/b`, cb))).toEqual([]);
    });

    it('rejects a chroot that does not exist, saying so', async () => {
      const error = await backend({ connectionString: `${fixture.connectionString}${fixture.root}-missing` })
        .verify()
        .catch((e: unknown) => e);
      expect(error).toMatchObject({ permanent: true });
      expect((error as Error).message).toContain('the chroot of the connection string does not exist on ZooKeeper');
    });

    it('resolves when the ensemble cannot be reached (lock operations fail until it is back)', async () => {
      const nobody = await freePort();
      await expect(backend({ connectionString: `127.0.0.1:${nobody}`, commandTimeout: 300 }).verify()).resolves.toBeUndefined();
    });
  });

  describe('operations sent while the connection is down (the session lives on)', () => {
    /**
     * A backend of the lock identity behind a proxy the test cuts: the client queues what it is
     * asked while it has no connection, and on reconnection its credentials must reach the
     * server before those requests, or the server refuses them (NO_AUTH, INVALID_ACL) as
     * coming from nobody.
     */
    async function cutOffBackend(): Promise<{ proxy: TcpProxy; cutOff: ZooKeeperLockBackend }> {
      const proxy = await TcpProxy.start(Number(fixture.connectionString.split(':').at(-1)));
      fixture.cleanup(() => proxy.close());
      const cutOff = backend({ auth: LOCKS, connectionString: `127.0.0.1:${proxy.port}`, sessionTimeout: 10_000, commandTimeout: 8_000 });
      return { proxy, cutOff };
    }

    async function cut(proxy: TcpProxy, cutOff: ZooKeeperLockBackend): Promise<void> {
      proxy.set({ kind: 'drop' });
      await until(() => cutOff.state === 'suspended', 10_000, 'the backend to see its connection cut');
    }

    it('releases sent then free their keys once the connection is back', async () => {
      await protectedRoot();
      const { proxy, cutOff } = await cutOffBackend();
      // Many holders: the requests queued during the cut go out together on reconnection.
      const keys = Array.from({ length: 50 }, (_, i) => `order:${i}`);
      for (const key of keys) expect(await cutOff.tryAcquire([key], `holder-${key}`, 60_000)).toMatchObject({ acquired: true });

      await cut(proxy, cutOff);
      const released = keys.map((key) => cutOff.release([key], `holder-${key}`).catch((error: unknown) => error));
      proxy.set({ kind: 'pass' });
      await Promise.all(released);

      // Another process of the same identity takes each: the nodes went, the session lives on.
      const other = backend({ auth: LOCKS });
      for (const key of keys) {
        await until(async () => (await other.tryAcquire([key], 'next', 60_000, { willWait: false })).acquired, 8_000, `${key} to be free`);
      }
      expect(cutOff.state).toBe('connected');
    }, 60_000);

    /**
     * A backend behind a proxy the test cuts, whose multi requests (creates and deletes) go through
     * `multi`; every other request goes to the real server. No credentials: the tap plays the
     * server that refuses a request read before them.
     */
    async function tappedBackend(
      multi: (send: () => Promise<ZooKeeperMulti>) => Promise<ZooKeeperMulti>,
    ): Promise<{ proxy: TcpProxy; cutOff: ZooKeeperLockBackend }> {
      const proxy = await TcpProxy.start(Number(fixture.connectionString.split(':').at(-1)));
      fixture.cleanup(() => proxy.close());
      const options = { root: fixture.root, sessionTimeout: 10_000, commandTimeout: 8_000 };
      const connection = `127.0.0.1:${proxy.port}`;
      const cutOff = new ZooKeeperLockBackend(
        connection,
        options,
        tappedClients(connection, options.sessionTimeout, { multi: (_, send) => multi(send) }),
      );
      fixture.cleanup(() => cutOff.close());
      return { proxy, cutOff };
    }

    const noAuth = (): ZooKeeperError => new ZooKeeperError('NO_AUTH', 'NO_AUTH');

    async function freed(key: string): Promise<void> {
      const other = backend();
      await until(async () => (await other.tryAcquire([key], 'next', 60_000, { willWait: false })).acquired, 8_000, `${key} to be free`);
    }

    it('a release the server refuses as sent before the credentials is sent again after them, and frees the key', async () => {
      // The client queues its credentials on reconnection behind the requests made during the
      // cut: a server that reads such a request first refuses it as coming from nobody.
      const { proxy, cutOff } = await tappedBackend(async (send) => {
        if (cutOff.state !== 'suspended') return send();
        await until(() => cutOff.state === 'connected', 10_000, 'the connection to be back');
        throw noAuth();
      });
      expect(await cutOff.tryAcquire(['order:1'], 'first', 60_000)).toMatchObject({ acquired: true });

      await cut(proxy, cutOff);
      // Nothing goes out while the session is suspended: the release waits for the connection.
      const released = cutOff.release(['order:1'], 'first');
      proxy.set({ kind: 'pass' });
      expect(await released).toBe(true);
      await freed('order:1');
    }, 40_000);

    it('a refusal of a request whose connection dropped before the answer is not final: the caller may retry', async () => {
      let refuseAfterCut: { cut: Promise<void> } | undefined;
      let cutDone = (): void => undefined;
      const { proxy, cutOff } = await tappedBackend(async (send) => {
        if (!refuseAfterCut) return send();
        // Sent on a connection that then dropped: it reaches the server after the reconnection.
        await refuseAfterCut.cut;
        throw noAuth();
      });
      expect(await cutOff.tryAcquire(['order:1'], 'first', 60_000)).toMatchObject({ acquired: true });

      refuseAfterCut = { cut: new Promise<void>((resolve) => (cutDone = resolve)) };
      const released = cutOff.release(['order:1'], 'first').catch((error: unknown) => error);
      await cut(proxy, cutOff);
      refuseAfterCut = undefined;
      proxy.set({ kind: 'pass' });
      await until(() => cutOff.state === 'connected', 10_000, 'the connection to be back');
      cutDone();
      const error = await released;
      expect(error).toBeInstanceOf(LockBackendError);
      expect(error).toMatchObject({ permanent: false });
      await freed('order:1');
    }, 40_000);

    it('a release refused on an authenticated connection is still sent again, and frees the key once allowed', async () => {
      // An identity refused the delete (an ACL an admin fixes later): kept, and sent at the next answer.
      let refuse = false;
      const { cutOff } = await tappedBackend(async (send) => {
        if (!refuse) return send();
        refuse = false;
        throw noAuth();
      });
      expect(await cutOff.tryAcquire(['order:1'], 'first', 60_000)).toMatchObject({ acquired: true });

      refuse = true;
      expect(await cutOff.release(['order:1'], 'first').catch((error: unknown) => error)).toMatchObject({ permanent: true });
      await cutOff.health();
      await freed('order:1');
    }, 40_000);

    it('an acquire sent then takes the lock once the connection is back', async () => {
      await protectedRoot();
      const { proxy, cutOff } = await cutOffBackend();
      expect(await cutOff.tryAcquire(['order:0'], 'warm-up', 60_000)).toMatchObject({ acquired: true });

      await cut(proxy, cutOff);
      const acquired = cutOff.tryAcquire(['order:2'], 'first', 60_000);
      proxy.set({ kind: 'pass' });
      expect(await acquired).toMatchObject({ acquired: true });
    }, 40_000);
  });

  it('health() reports the session after the server answered', async () => {
    const lockBackend = backend({ auth: LOCKS });
    const health = await lockBackend.health();
    expect(health.up).toBe(true);
    expect(health.details).toMatchObject({ session: 'connected' });
    expect(health.details.sessionTimeoutMs).toBeGreaterThan(0);
  });
});
