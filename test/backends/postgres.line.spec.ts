import { describe, expect, it } from '@jest/globals';
import pg from 'pg';
import type { LockBackend } from '../../lib/backends/lock-backend.interface.js';
import { PostgresLockBackend } from '../../lib/backends/postgres/postgres.backend.js';
import type { PostgresLockBackendOptions } from '../../lib/backends/postgres/postgres.options.js';
import { LockService } from '../../lib/lock.service.js';
import { usePostgresServer } from '../support/postgres-fixture.js';
import { until } from '../support/wait.js';

const fixture = usePostgresServer();

/** A backend as one process has it: its own pool and its own LISTEN connection. */
function backend(options: PostgresLockBackendOptions = {}): PostgresLockBackend {
  const created = new PostgresLockBackend(fixture.url, { waiterTimeout: 120_000, ...options });
  fixture.cleanup(() => created.close());
  return created;
}

/** Hears every NOTIFY sent to the given backends' channels, as they would. */
async function eavesdrop(backends: readonly PostgresLockBackend[]): Promise<{ channel: string; payload?: string }[]> {
  const heard: { channel: string; payload?: string }[] = [];
  const client = new pg.Client({ connectionString: fixture.url });
  await client.connect();
  fixture.cleanup(() => client.end());
  client.on('notification', ({ channel, payload }) => heard.push({ channel, payload }));
  for (const b of backends) await client.query(`LISTEN "${b.channel}"`);
  return heard;
}

async function line(key: string): Promise<string[]> {
  const { rows } = await fixture.admin.query<{ owner: string }>(
    'SELECT owner FROM distributed_locks_waiters WHERE key = $1 ORDER BY place',
    [key],
  );
  return rows.map((r) => r.owner);
}

describe('the line of waiters in PostgreSQL', () => {
  it('a release tells only the next waiter, in its own process, and a free key goes to the waiters in the order they came', async () => {
    const [holder, ...waiters] = [backend(), backend(), backend(), backend()];
    const heard = await eavesdrop([holder, ...waiters]);
    expect((await holder.tryAcquire(['k'], 'holder', 60_000)).acquired).toBe(true);
    for (const [i, b] of waiters.entries()) expect((await b.tryAcquire(['k'], `waiter-${i}`, 60_000)).acquired).toBe(false);
    expect(await line('k')).toEqual(['waiter-0', 'waiter-1', 'waiter-2']);
    // A caller that does not wait stays out of the line.
    expect((await waiters[2].tryAcquire(['k'], 'passer-by', 60_000, { willWait: false })).acquired).toBe(false);
    expect(await line('k')).toEqual(['waiter-0', 'waiter-1', 'waiter-2']);

    const order: string[] = [];
    let previous = 'holder';
    let releasedBy = holder;
    for (const [i, b] of waiters.entries()) {
      const count = heard.length;
      expect(await releasedBy.release(['k'], previous)).toBe(true);
      // One message, on the channel of the next waiter's backend, naming it; nobody else hears.
      // The release handed it the lock, with a token taken then and its lease.
      await until(() => heard.length > count, 5_000, 'the release to be heard');
      expect(heard.slice(count)).toEqual([{ channel: b.channel, payload: expect.stringMatching(new RegExp(`^waiter-${i} \\d+ 60000$`)) }]);
      const handed = Number(heard.at(-1)!.payload!.split(' ')[1]);
      expect(await holder.inspect('k')).toMatchObject({ owner: `waiter-${i}`, fencingToken: handed });
      // Not for those behind in line, nor for a newcomer; its owner finds it its own.
      for (const [j, other] of waiters.entries()) {
        if (j > i) expect((await other.tryAcquire(['k'], `waiter-${j}`, 60_000)).acquired).toBe(false);
      }
      expect((await holder.tryAcquire(['k'], 'newcomer', 60_000, { willWait: false })).acquired).toBe(false);
      expect((await b.tryAcquire(['k'], `waiter-${i}`, 60_000)).acquired).toBe(true);
      order.push(`waiter-${i}`);
      [previous, releasedBy] = [`waiter-${i}`, b];
    }
    expect(order).toEqual(['waiter-0', 'waiter-1', 'waiter-2']);
    // The last release has nobody to tell. Messages reach a listener in the order they were
    // committed: once a message sent after it arrived, none from the release is on its way.
    await releasedBy.release(['k'], previous);
    await fixture.admin.query('SELECT pg_notify($1, $2)', [holder.channel, 'marker']);
    await until(() => heard.at(-1)?.payload === 'marker', 5_000, 'the marker');
    expect(heard.map((h) => h.payload!.split(' ')[0])).toEqual(['waiter-0', 'waiter-1', 'waiter-2', 'marker']);
  });

  it('waiters of several processes enter one after another in the order they queued, each woken once', async () => {
    const holder = new LockService(backend(), { keyPrefix: '' });
    // pollInterval: a wake-up that did not come is not covered by polling within the test.
    const backends = [backend(), backend(), backend()];
    const wakeUps = backends.map(() => 0);
    const counted = backends.map((b, i): LockBackend =>
      Object.assign(Object.create(b) as LockBackend, {
        watch: (keys: readonly string[], onRelease: () => void, owner?: string) =>
          b.watch(
            keys,
            () => {
              wakeUps[i]++;
              onRelease();
            },
            owner,
          ),
      }),
    );
    // Each process already listens, as after its first wait. (A waiter that asked before its
    // process listened is woken once more when it starts to listen: a release may have named it.)
    for (const b of backends) (await b.watch(['warm-up'], () => undefined, 'nobody'))();
    const services = counted.map((b) => new LockService(b, { keyPrefix: '', pollInterval: 60_000 }));
    fixture.cleanup(() => Promise.all([holder, ...services].map((s) => s.onApplicationShutdown())));
    const held = await holder.acquire('fair', { ttl: 60_000 });
    const entered: number[] = [];
    const waiting: Promise<void>[] = [];
    for (const [i, service] of services.entries()) {
      waiting.push(service.using('fair', () => void entered.push(i), { wait: 20_000 }));
      await until(async () => (await line('fair')).length === i + 1, 5_000, `waiter ${i} in line`);
    }
    await held.release();
    await Promise.all(waiting);
    expect(entered).toEqual([0, 1, 2]);
    expect(wakeUps).toEqual([1, 1, 1]);
  });

  it("a waiter ahead in PostgreSQL's line but behind in its process's queue takes its turn, though it was named before its process listened", async () => {
    // The first caller's first request fails before it reaches PostgreSQL, the second caller's
    // reaches it: the line has the second first, the process's queue the first. The release that
    // names the second comes while the process does not listen yet, so that message is lost.
    const inner = backend();
    let calls = 0;
    let openWatch: () => void = () => undefined;
    const watchOpen = new Promise<void>((resolve) => (openWatch = resolve));
    const flaky: LockBackend = Object.assign(Object.create(inner) as LockBackend, {
      tryAcquire: (...args: Parameters<LockBackend['tryAcquire']>) =>
        ++calls === 1 ? Promise.reject(new Error('connection reset (injected)')) : inner.tryAcquire(...args),
      watch: async (...args: Parameters<NonNullable<LockBackend['watch']>>) => {
        await watchOpen;
        return inner.watch(...args);
      },
    });
    const holder = new LockService(backend(), { keyPrefix: '' });
    const waiters = new LockService(flaky, { keyPrefix: '', pollInterval: 200 });
    fixture.cleanup(() => Promise.all([holder.onApplicationShutdown(), waiters.onApplicationShutdown()]));
    const held = await holder.acquire('k', { ttl: 60_000 });
    const entered: string[] = [];
    const both = ['first', 'second'].map((name) => waiters.using('k', async () => void entered.push(name), { wait: 5_000, ttl: 60_000 }));
    await until(async () => (await line('k')).length >= 1 && calls >= 2, 5_000, 'both callers to have asked');
    await held.release();
    openWatch();
    await Promise.all(both);
    expect(entered.sort()).toEqual(['first', 'second']);
  });

  it('a release hands the lock to the next waiter for one key: it enters with the token the release took, without asking again', async () => {
    const holder = new LockService(backend(), { keyPrefix: '' });
    const waiterBackend = backend();
    const waiter = new LockService(waiterBackend, { keyPrefix: '', pollInterval: 60_000 });
    fixture.cleanup(() => Promise.all([holder, waiter].map((s) => s.onApplicationShutdown())));
    // Its process already listens, as after its first wait, so it asks once and then waits.
    (await waiterBackend.watch(['warm-up'], () => undefined, 'nobody'))();
    const held = await holder.acquire('handed', { ttl: 60_000 });
    const entering = waiter.acquire('handed', { ttl: 10_000, wait: 20_000 });
    await until(async () => (await line('handed')).length === 1, 5_000, 'the waiter in line');
    const statements: string[] = [];
    const connection = (waiterBackend as unknown as { connection: { run(s: { op: string }): Promise<unknown> } }).connection;
    const run = connection.run.bind(connection);
    connection.run = (statement) => (statements.push(statement.op), run(statement));

    await held.release();
    const handle = await entering;
    const lease = await holder.backend.inspect('handed');
    expect(lease).toMatchObject({ owner: expect.any(String), fencingToken: handle.fencingToken });
    expect(handle.fencingToken).toBeGreaterThan(held.fencingToken!);
    // Its lease is its ttl, but no longer than its place in line would have lasted.
    expect(lease!.ttlMs).toBeLessThanOrEqual(10_000);
    expect(statements).toEqual([]);
    expect(await line('handed')).toEqual([]);
    await handle.release();
    expect(await holder.backend.inspect('handed')).toBeUndefined();
  });

  it("a hand-over that is not newer than the waiter's last failed attempt is not taken: it asks PostgreSQL", async () => {
    const b = backend();
    (await b.watch(['warm-up'], () => undefined, 'nobody'))();
    const holder = await b.tryAcquire(['stale'], 'holder', 60_000);
    expect(holder.acquired).toBe(true);
    const last = holder.acquired ? holder.fencingToken! : 0;
    expect((await b.tryAcquire(['stale'], 'waiter', 60_000)).acquired).toBe(false);
    let woken = 0;
    const stop = await b.watch(['stale'], () => woken++, 'waiter');
    fixture.cleanup(stop);
    const announce = async (token: number) => {
      const before = woken;
      await fixture.admin.query('SELECT pg_notify($1, $2)', [b.channel, `waiter ${token} 60000`]);
      await until(() => woken > before, 5_000, 'the message');
    };
    // A hand-over with the token the failed attempt saw as the last one came before that attempt:
    // the lock was no longer the waiter's when the attempt ran. It asks, and finds the key held.
    await announce(last);
    expect(await b.tryAcquire(['stale'], 'waiter', 60_000)).toMatchObject({ acquired: false });
    // A newer one is taken on the message alone (so a forged one is too: see docs/security.md).
    await announce(last + 1_000);
    expect(await b.tryAcquire(['stale'], 'waiter', 60_000)).toMatchObject({ acquired: true, fencingToken: last + 1_000 });
  });

  it('a waiter that had not listened yet when the LISTEN connection dropped is woken once it listens', async () => {
    const [holder, b] = [backend(), backend()];
    (await b.watch(['warm-up'], () => undefined, 'nobody'))();
    expect((await holder.tryAcquire(['k'], 'holder', 60_000)).acquired).toBe(true);
    expect((await b.tryAcquire(['k'], 'waiter', 60_000)).acquired).toBe(false);
    await fixture.admin.query('SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE query = $1', [`LISTEN "${b.channel}"`]);
    await until(() => !b.watching(), 5_000, 'the backend to notice');
    // Nobody listens on the waiter's channel now: the release's message is lost.
    await holder.release(['k'], 'holder');
    let woken = false;
    const stop = await b.watch(['k'], () => (woken = true), 'waiter');
    stop();
    expect(woken).toBe(true);
    expect(b.watching()).toBe(true);
  });

  it('a waiter for several keys stands in line up to the first key that keeps it out, and leaves every line when it gives up', async () => {
    const b = backend();
    expect((await b.tryAcquire(['c'], 'holder-c', 60_000)).acquired).toBe(true);
    expect((await b.tryAcquire(['d'], 'holder-d', 60_000)).acquired).toBe(true);
    // c keeps it out: no place in d's line, which would keep d from the holder of c.
    expect((await b.tryAcquire(['c', 'd'], 'first', 60_000)).acquired).toBe(false);
    expect([await line('c'), await line('d')]).toEqual([['first'], []]);
    const placeOf = async (key: string) =>
      (
        await fixture.admin.query<{ place: string }>(`SELECT place FROM distributed_locks_waiters WHERE owner = 'first' AND key = $1`, [
          key,
        ])
      ).rows[0]?.place;
    const inC = await placeOf('c');
    expect((await b.tryAcquire(['d'], 'second', 60_000)).acquired).toBe(false);
    // c is free, d held: 'first' joins d's line (behind 'second', who came first there) and keeps its place in c's.
    expect(await b.release(['c'], 'holder-c')).toBe(true);
    expect((await b.tryAcquire(['c', 'd'], 'first', 60_000)).acquired).toBe(false);
    expect(await placeOf('c')).toBe(inC);
    expect(await line('d')).toEqual(['second', 'first']);
    expect((await b.tryAcquire(['c'], 'third', 60_000)).acquired).toBe(false);
    expect(await line('c')).toEqual(['first', 'third']);
    // Giving up leaves every line: c goes to the next in its line.
    expect(await b.release(['c', 'd'], 'first')).toBe(false);
    expect([await line('c'), await line('d')]).toEqual([[], ['second']]);
    expect((await b.inspect('c'))?.owner).toBe('third');
  });

  it('a waiter for several keys that finds an earlier key taken again leaves the lines after it: the next there is let in', async () => {
    const b = backend();
    expect((await b.tryAcquire(['d'], 'holder-d', 60_000)).acquired).toBe(true);
    // c lets x in, d keeps it out: x stands in both lines, and y behind it in d's.
    expect((await b.tryAcquire(['c', 'd'], 'x', 60_000)).acquired).toBe(false);
    expect((await b.tryAcquire(['d'], 'y', 60_000)).acquired).toBe(false);
    expect(await line('d')).toEqual(['x', 'y']);
    expect(await b.release(['d'], 'holder-d')).toBe(true);
    // c is taken while x still has its place in both lines. The line lets nobody pass x, so the
    // test writes the lease itself, as any holder the line did not see would have.
    await fixture.admin.query(
      `INSERT INTO distributed_locks (key, owner, fencing_token, expires_at, max_holders) VALUES ('c', 'holder-c', 1, now() + interval '60 seconds', 1)`,
    );
    // x asks again: c keeps it out now, so it leaves d's line, and y, next there, is handed d.
    expect((await b.tryAcquire(['c', 'd'], 'x', 60_000)).acquired).toBe(false);
    expect([await line('c'), await line('d')]).toEqual([['x'], []]);
    expect((await b.inspect('d'))?.owner).toBe('y');
  });

  it('a waiter that stops asking loses its place after waiterTimeout, and the next one gets the key', async () => {
    const b = backend({ waiterTimeout: 300 });
    expect((await b.tryAcquire(['gone'], 'holder', 60_000)).acquired).toBe(true);
    expect((await b.tryAcquire(['gone'], 'crashed', 60_000)).acquired).toBe(false);
    await b.release(['gone'], 'holder');
    // 'crashed' never comes back; the release handed it the key, with a lease no longer than its
    // place in line lasts, and the key is kept for it until then.
    const handed = await b.inspect('gone');
    expect(handed?.owner).toBe('crashed');
    expect(handed?.ttlMs).toBeLessThanOrEqual(300);
    const refused = await b.tryAcquire(['gone'], 'next', 60_000);
    expect(refused).toMatchObject({ acquired: false });
    expect(refused.acquired === false && refused.retryAfterMs).toBeLessThanOrEqual(300);
    await until(async () => (await b.tryAcquire(['gone'], 'next', 60_000)).acquired, 5_000, "the crashed waiter's place to run out");
    expect((await b.inspect('gone'))?.owner).toBe('next');
  });

  it('deletes leases and places in line that ran out long ago, now and then, and leaves the others', async () => {
    const b = backend();
    await b.tryAcquire(['live'], 'holder', 60_000);
    await fixture.admin.query(`
      INSERT INTO distributed_locks VALUES
        ('gone', 'crashed holder', 1, clock_timestamp() - interval '2 minutes'),
        ('just-expired', 'late holder', 2, clock_timestamp() - interval '10 seconds');
      INSERT INTO distributed_locks_waiters VALUES
        ('gone', 'crashed waiter', 1, 'ndl_0', clock_timestamp() - interval '2 minutes'),
        ('live', 'waiter', 2, 'ndl_0', clock_timestamp() + interval '1 minute')`);
    // The last clean-up was long ago: the next acquire starts one.
    (b as unknown as { lastSweep: number }).lastSweep = Number.NEGATIVE_INFINITY;
    await b.tryAcquire(['other'], 'someone', 60_000);
    const rows = async () => ({
      locks: (await fixture.admin.query('SELECT key FROM distributed_locks ORDER BY key')).rows.map((r) => r.key as string),
      waiters: (await fixture.admin.query('SELECT owner FROM distributed_locks_waiters ORDER BY owner')).rows.map((r) => r.owner as string),
    });
    // The two tables are cleaned by two statements at once: wait for both.
    await until(async () => (await rows()).locks.length === 3 && (await rows()).waiters.length === 1, 5_000, 'the clean-up');
    expect(await rows()).toEqual({ locks: ['just-expired', 'live', 'other'], waiters: ['waiter'] });
  });
});
