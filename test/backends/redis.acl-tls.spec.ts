import { afterAll, afterEach, beforeAll, describe, expect, it, jest } from '@jest/globals';
import { Logger } from '@nestjs/common';
import { Cluster, Redis, type RedisOptions } from 'ioredis';
import { randomBytes } from 'node:crypto';
import { mkdtempSync, readFileSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { dirname, join } from 'node:path';
import { inspect } from 'node:util';
import { fileURLToPath } from 'node:url';
import { lockKeyLayout } from '../../lib/backends/redis/redis.keys.js';
import { RedlockLockBackend } from '../../lib/backends/redlock/redlock.backend.js';
import { LockBackendError, LockService, RedisLockBackend, type DistributedLockModuleOptions } from '../../lib/index.js';
import { RedisCluster } from '../support/redis-cluster.js';
import { useRedisServer } from '../support/redis-fixture.js';
import { RedisServer } from '../support/redis-server.js';
import { createTestCertificates, type TestCertificates } from '../support/tls-certificates.js';
import { until } from '../support/wait.js';

/**
 * The least-privilege set-up docs/redis.md gives operators, run as written there: its ACL lines
 * are read from the page, so the advice cannot drift from what is tested. A rule is enough when
 * the library does everything it does under it and Redis's ACL LOG recorded no refusal (ioredis
 * ignores some refusals, e.g. of INFO, so working alone would not show it).
 */

const fixture = useRedisServer();
const docs = readFileSync(join(dirname(fileURLToPath(import.meta.url)), '../../docs/redis.md'), 'utf8');
/** Looked for in everything an error or a log line shows. */
const password = `pw-${randomBytes(8).toString('hex')}`;

type Rule = 'standalone' | 'cluster' | 'redlock';

/** The rules of one documented `user locks ...` line, with this run's password. */
function documentedRule(rule: Rule): string[] {
  const lines = docs.split('\n').filter((line) => line.startsWith('user locks on '));
  const kind = (line: string): Rule =>
    line.includes('&lock-released:') ? 'redlock' : line.includes('+spublish') ? 'cluster' : 'standalone';
  const matching = lines.filter((line) => kind(line) === rule);
  expect(matching).toHaveLength(1);
  return matching[0]
    .split(/\s+/)
    .slice(2)
    .map((word) => (word === '>change-me' ? `>${password}` : word));
}

/** The user `locks`, made anew with exactly `rules` (as a `user` line of an ACL file does). */
async function createUser(admin: Redis, rules: readonly string[]): Promise<void> {
  await admin.call('ACL', 'SETUSER', 'locks', 'reset', ...rules);
  await admin.call('ACL', 'LOG', 'RESET');
}

/** What ACL LOG recorded: `<reason> <object> (<context>)` per refusal. */
async function refusals(admin: Redis): Promise<string[]> {
  const entries = (await admin.call('ACL', 'LOG')) as unknown[][];
  return entries.map((entry) => {
    const field = (name: string) => String(entry[entry.indexOf(name) + 1]);
    return `${field('reason')} ${field('object')} (${field('context')})`;
  });
}

/** Everything an operator's logs or an error response could show of an error. */
function shown(error: unknown): string {
  return `${inspect(error, { depth: 10, showHidden: true })}\n${JSON.stringify(error)}\n${String(error)}`;
}

/** Nest's log lines while the test runs, kept rather than printed. */
function captureLogs(): string[] {
  const lines: string[] = [];
  for (const level of ['log', 'warn', 'error'] as const) {
    jest.spyOn(Logger.prototype, level).mockImplementation((message: unknown) => void lines.push(String(message)));
  }
  return lines;
}

afterEach(() => {
  jest.restoreAllMocks();
});

/**
 * Waiters poll every 20 s and wait 10 s, and holders take 60 s leases: a waiter that gets a lock
 * was woken by its release (pub/sub), as a poll or the lease's end would come after its wait.
 */
const HOLD = { ttl: 60_000 };
const WOKEN_ONLY = { wait: 10_000 };
const SLOW_POLLS: DistributedLockModuleOptions = { pollInterval: 20_000 };
/** A place in the Redis backend's line outlasts the polls. */
const KEEP_PLACE = { waiterTimeout: 30_000 };

/**
 * What two processes (a service each) do with locks: take one in turn (the waiter woken, or handed
 * the lock, by the release), extend, inspect, try a busy one, take several keys together in turn
 * (`together`: on Cluster they must share a slot), and keys with braces of their own. `waiting(key)`:
 * whether the second service waits for the key, as Redis shows it.
 */
async function takeTurns(
  a: LockService,
  b: LockService,
  waiting: (key: string) => Promise<boolean>,
  together: readonly [string, string] = ['stock:7', 'payment:7'],
): Promise<void> {
  const first = await a.acquire('order:42', HOLD);
  const second = b.acquire('order:42', WOKEN_ONLY);
  await until(() => waiting('order:42'), 5_000, 'the second service to wait for order:42');
  await first.extend(60_000);
  expect(await b.tryAcquire('order:42')).toBeUndefined();
  await first.release();
  const next = await second;
  expect(await b.inspect('order:42')).toMatchObject({ heldHere: true });
  if (first.fencingToken !== undefined) expect(next.fencingToken).toBeGreaterThan(first.fencingToken);
  await next.release();

  const both = await a.acquire(together, HOLD);
  const later = b.acquire([...together].reverse(), WOKEN_ONLY);
  // A caller of several keys waits in the line of the first busy one in sorted order, not after it.
  await until(() => waiting([...together].sort()[0]), 5_000, 'the second service to wait for both keys');
  await both.release();
  await (await later).release();

  for (const key of ['order:{42}:payment', 'a}b']) await (await a.acquire(key)).release();
  expect(await a.inspect('order:42')).toBeUndefined();
}

/** Whether someone waits in the Redis backend's line for `key` (LockService and ioredis prefixes as given). */
function lineOf(admin: Redis, keyPrefix = 'lock:', clientPrefix = ''): (key: string) => Promise<boolean> {
  return async (key) => (await admin.zcard(clientPrefix + lockKeyLayout(keyPrefix + key, clientPrefix).line)) > 0;
}

describe('the Redis backend under the documented ACL user', () => {
  /** Two processes' services; the second, the waiter, polls slowly unless `second` says otherwise. */
  function services(
    connect: () => ConstructorParameters<typeof RedisLockBackend>[0],
    { keyPrefix = 'lock:', second = SLOW_POLLS }: { keyPrefix?: string; second?: DistributedLockModuleOptions } = {},
  ): [LockService, LockService] {
    const create = (options: DistributedLockModuleOptions) => {
      const service = new LockService(new RedisLockBackend(connect(), KEEP_PLACE), { ...options, keyPrefix });
      fixture.cleanup(() => service.onApplicationShutdown());
      return service;
    };
    return [create({}), create(second)];
  }

  it('locks, waits, is woken, hands over, extends, inspects and shuts down, refused nothing', async () => {
    await createUser(fixture.admin, documentedRule('standalone'));
    const [a, b] = services(() => `redis://locks:${password}@127.0.0.1:${fixture.server.port}`);
    await takeTurns(a, b, lineOf(fixture.admin));
    // Scripts lost (a restart): sent again whole, by EVAL.
    await fixture.admin.script('FLUSH');
    await (await a.acquire('after-restart')).release();
    await a.onApplicationShutdown();
    await b.onApplicationShutdown();
    expect(await refusals(fixture.admin)).toEqual([]);
  });

  it('does so with its own keyPrefix, an ioredis keyPrefix and database, by the patterns the page derives', async () => {
    // ~K* ~{K* ~{*}:K* become ~PK* ~P{PK* ~P{*}:PK*, and database 3 needs SELECT.
    const [K, P] = ['jobs:', 'app:'];
    const rules = documentedRule('standalone').map(
      (word) => ({ '~lock:*': `~${P}${K}*`, '~{lock:*': `~${P}{${P}${K}*`, '~{*}:lock:*': `~${P}{*}:${P}${K}*` })[word] ?? word,
    );
    await createUser(fixture.admin, [...rules, '+select']);
    const clients: Redis[] = [];
    fixture.cleanup(() => clients.forEach((client) => client.disconnect()));
    const connect = () => {
      const client = new Redis(`redis://locks:${password}@127.0.0.1:${fixture.server.port}/3`, { keyPrefix: P });
      clients.push(client);
      return client;
    };
    const admin = fixture.admin.duplicate({ db: 3 });
    fixture.cleanup(() => admin.disconnect());
    const [a, b] = services(connect, { keyPrefix: K });
    // Its lines are seen in database 3, under both prefixes.
    await takeTurns(a, b, lineOf(admin, K, P));
    expect(await refusals(fixture.admin)).toEqual([]);
  });

  it.each([
    [
      'a key pattern',
      (rules: string[]) => rules.filter((word) => word !== '~{lock:*'),
      /NOPERM this user has no permissions to access one of the keys/,
    ],
    [
      'a command inside the scripts',
      (rules: string[]) => rules.filter((word) => word !== '+time'),
      /The user executing the script can't run this command|ACL failure in script/,
    ],
  ])('fails with a LockBackendError that says so when the user lacks %s, without the password', async (_what, narrow, redisSays) => {
    await createUser(fixture.admin, narrow(documentedRule('standalone')));
    const logs = captureLogs();
    const [a] = services(() => `redis://locks:${password}@127.0.0.1:${fixture.server.port}`);
    const error = await a.acquire('order:1', { wait: 0 }).catch((e: unknown) => e);
    expect(error).toBeInstanceOf(LockBackendError);
    const message = (error as Error).message;
    expect(message).toMatch(redisSays);
    expect(message).toContain(`The Redis user's ACL refused it`);
    expect(message).toContain('the keys lock:order:1, {lock:order:1}:fence, {lock:order:1}:queue, {lock:order:1}:waiters');
    expect(message).toContain('"Least privilege and TLS" in the Redis backend\'s docs');
    expect(shown(error)).not.toContain(password);
    expect(logs.join('\n')).not.toContain(password);
  });

  it('logs once that waiters poll when the user may not SUBSCRIBE, and still locks', async () => {
    await createUser(
      fixture.admin,
      documentedRule('standalone').filter((word) => word !== '+subscribe'),
    );
    const logs = captureLogs();
    // The waiter polls often: only a poll lets it in.
    const [a, b] = services(() => `redis://locks:${password}@127.0.0.1:${fixture.server.port}`, { second: {} });
    const held = await a.acquire(['order:1', 'order:2']);
    const waiters = [b.acquire('order:1', { wait: 10_000 }), b.acquire('order:2', { wait: 10_000 })];
    await until(() => logs.some((line) => line.includes('refused SUBSCRIBE')), 5_000, 'the refused SUBSCRIBE to be logged');
    await held.release();
    for (const handle of await Promise.all(waiters)) await handle.release();
    const refused = logs.filter((line) => line.includes('refused SUBSCRIBE'));
    expect(refused).toHaveLength(1);
    expect(refused[0]).toMatch(/^Redis refused SUBSCRIBE nest-distributed-lock:\S+: NOPERM .*find out by polling \(pollInterval\)/);
  });

  it('never shows the password of a URL Redis refuses (WRONGPASS)', async () => {
    await createUser(fixture.admin, documentedRule('standalone'));
    const logs = captureLogs();
    for (const url of [
      `redis://locks:not-${password}@127.0.0.1:${fixture.server.port}`,
      `redis://127.0.0.1:${fixture.server.port}/0?username=locks&password=not-${password}`,
    ]) {
      const [a] = services(() => url);
      const error = await a.acquire('order:1', { wait: 0 }).catch((e: unknown) => e);
      expect(error).toBeInstanceOf(LockBackendError);
      expect((error as Error).message).toMatch(/WRONGPASS/);
      expect(shown(error)).not.toContain(password);
    }
    expect(logs.join('\n')).toMatch(/WRONGPASS/);
    expect(logs.join('\n')).not.toContain(password);
  });
});

describe('the Redis backend on a TLS-only Redis, certified by a throwaway CA', () => {
  let dir: string;
  let certificates: TestCertificates;
  let server: RedisServer;
  /** The default user, over TLS: the harness's view of the server. */
  let admin: Redis;

  beforeAll(async () => {
    dir = mkdtempSync(join(tmpdir(), 'ndl-tls-'));
    certificates = createTestCertificates(dir);
    server = await RedisServer.start({ tls: certificates });
    admin = new Redis(server.url, { tls: { ca: certificates.ca } });
  });

  afterAll(async () => {
    admin?.disconnect();
    await server?.stop();
    rmSync(dir, { recursive: true, force: true });
  });

  afterEach(() => admin.flushall());

  it('locks, waits and hands over as the documented ACL user, on a client or on options given tls: { ca }', async () => {
    await createUser(admin, documentedRule('standalone'));
    const tls = { ca: certificates.ca };
    const clients: Redis[] = [];
    const services: LockService[] = [];
    const service = (connection: ConstructorParameters<typeof RedisLockBackend>[0], options: DistributedLockModuleOptions) => {
      const created = new LockService(new RedisLockBackend(connection, KEEP_PLACE), options);
      services.push(created);
      return created;
    };
    try {
      const client = new Redis(`rediss://locks:${password}@127.0.0.1:${server.port}`, { tls });
      clients.push(client);
      const options: RedisOptions = { host: '127.0.0.1', port: server.port, username: 'locks', password, tls };
      await takeTurns(service(client, {}), service(options, SLOW_POLLS), lineOf(admin));
    } finally {
      await Promise.all(services.map((s) => s.onApplicationShutdown()));
      clients.forEach((client) => client.disconnect());
    }
    expect(await refusals(admin)).toEqual([]);
  });

  it('fails with a LockBackendError that names the certificate problem, not the password, when the CA is not trusted', async () => {
    await createUser(admin, documentedRule('standalone'));
    const logs = captureLogs();
    const service = new LockService(new RedisLockBackend(`rediss://locks:${password}@127.0.0.1:${server.port}`));
    try {
      const error = await service.acquire('order:1', { wait: 0 }).catch((e: unknown) => e);
      expect(error).toBeInstanceOf(LockBackendError);
      expect((error as Error).message).toMatch(/certificate/);
      expect(shown(error)).not.toContain(password);
      expect(logs.join('\n')).toMatch(/certificate/);
      expect(logs.join('\n')).not.toContain(password);
    } finally {
      await service.onApplicationShutdown();
    }
  });
});

describe('Redlock under the documented ACL user, over TLS with client certificates', () => {
  let dir: string;
  let certificates: TestCertificates;
  let masters: RedisServer[];
  let admins: Redis[];
  const clients: Redis[] = [];

  beforeAll(async () => {
    dir = mkdtempSync(join(tmpdir(), 'ndl-tls-'));
    certificates = createTestCertificates(dir);
    masters = await Promise.all(
      [0, 1, 2].map(() => RedisServer.start({ tls: { ...certificates, clientCertificate: certificates.client } })),
    );
    admins = masters.map((master) => new Redis(master.url, { tls: { ca: certificates.ca, ...certificates.client } }));
  });

  afterAll(async () => {
    admins?.forEach((admin) => admin.disconnect());
    await Promise.all((masters ?? []).map((master) => master.stop()));
    rmSync(dir, { recursive: true, force: true });
  });

  afterEach(async () => {
    clients.splice(0).forEach((client) => client.disconnect());
    await Promise.all(admins.map((admin) => admin.flushall()));
  });

  /** A service on its own clients, one per master, as another process would have. */
  function service(options: DistributedLockModuleOptions = {}): LockService {
    const tls = { ca: certificates.ca, ...certificates.client };
    const own = masters.map((master) => new Redis({ host: '127.0.0.1', port: master.port, username: 'locks', password, tls }));
    clients.push(...own);
    return new LockService(new RedlockLockBackend({ clients: own, masterTimeout: 2_000 }), options);
  }

  it('locks, waits, is woken by the release, extends, inspects and shuts down, refused nothing', async () => {
    await Promise.all(admins.map((admin) => createUser(admin, documentedRule('redlock'))));
    const [a, b] = [service(), service(SLOW_POLLS)];
    try {
      // Redlock has no line: a waiter is one that subscribed to the key's release channel.
      const subscribed = async (key: string) => {
        const counts = await Promise.all(admins.map((admin) => admin.pubsub('NUMSUB', `lock-released:lock:${key}`)));
        return counts.every((reply) => Number(reply[1]) > 0);
      };
      await takeTurns(a, b, subscribed);
      // Scripts lost (a restart): sent again whole, by EVAL.
      await Promise.all(admins.map((admin) => admin.script('FLUSH')));
      await (await a.acquire('after-restart')).release();
    } finally {
      await a.onApplicationShutdown();
      await b.onApplicationShutdown();
    }
    for (const admin of admins) expect(await refusals(admin)).toEqual([]);
  });

  it('logs once that waiters poll when the user may not SUBSCRIBE, and still locks', async () => {
    await Promise.all(
      admins.map((admin) =>
        createUser(
          admin,
          documentedRule('redlock').filter((word) => word !== '+subscribe'),
        ),
      ),
    );
    const logs = captureLogs();
    const [a, b] = [service(), service()];
    try {
      const held = await a.acquire(['order:1', 'order:2']);
      const waiters = [b.acquire('order:1', { wait: 10_000 }), b.acquire('order:2', { wait: 10_000 })];
      await until(() => logs.some((line) => line.includes('refused SUBSCRIBE')), 5_000, 'the refused SUBSCRIBE to be logged');
      await held.release();
      for (const handle of await Promise.all(waiters)) await handle.release();
    } finally {
      await a.onApplicationShutdown();
      await b.onApplicationShutdown();
    }
    const refused = logs.filter((line) => line.includes('refused SUBSCRIBE'));
    expect(refused).toHaveLength(1);
    expect(refused[0]).toMatch(
      /^RedlockLockBackend: master 127\.0\.0\.1:\d+ refused SUBSCRIBE lock-released:lock:order:\d: NOPERM .*polling/,
    );
  });

  it('says which permission a release lacked in its RedlockQuorumError, without the password', async () => {
    await Promise.all(
      admins.map((admin) =>
        createUser(
          admin,
          documentedRule('redlock').filter((word) => word !== '+publish'),
        ),
      ),
    );
    const logs = captureLogs();
    const a = service();
    try {
      const held = await a.acquire('order:1');
      const error = await held.release().catch((e: unknown) => e);
      expect(error).toBeInstanceOf(LockBackendError);
      expect((error as Error).message).toMatch(/The user executing the script can't run this command|ACL failure in script/);
      expect((error as Error).message).toContain("3 of them refused it by the Redis user's ACL");
      expect(shown(error)).not.toContain(password);
      expect(logs.join('\n')).not.toContain(password);
    } finally {
      await a.onApplicationShutdown();
    }
  });
});

describe('the Redis backend on a Cluster under the documented ACL user', () => {
  let cluster: RedisCluster;
  const clients: Cluster[] = [];

  beforeAll(async () => {
    cluster = await RedisCluster.start({ masters: 3 });
  }, 30_000);

  afterAll(async () => {
    clients.forEach((client) => client.disconnect());
    await cluster?.stop();
  });

  it('locks, waits, is woken by sharded pub/sub, hands over and shuts down, refused nothing', async () => {
    const nodeAdmins = cluster.servers.map((server) => cluster.admin(server.port));
    await Promise.all(nodeAdmins.map((admin) => createUser(admin, documentedRule('cluster'))));
    const service = (options: DistributedLockModuleOptions) => {
      const client = new Cluster(cluster.nodes, { redisOptions: { username: 'locks', password } });
      clients.push(client);
      return new LockService(new RedisLockBackend(client, KEEP_PLACE), options);
    };
    const [a, b] = [service({}), service(SLOW_POLLS)];
    // A key's line lives on the node of its slot.
    const waiting = async (key: string) => {
      const line = lockKeyLayout(`lock:${key}`).line;
      return (await cluster.admin(await cluster.portOf(line)).zcard(line)) > 0;
    };
    try {
      await takeTurns(a, b, waiting, ['order:{7}:stock', 'order:{7}:payment']);
    } finally {
      await a.onApplicationShutdown();
      await b.onApplicationShutdown();
    }
    for (const admin of nodeAdmins) expect(await refusals(admin)).toEqual([]);
  });
});
