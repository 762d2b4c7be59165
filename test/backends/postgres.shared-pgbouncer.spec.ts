import { afterAll, beforeAll, describe, expect, it, jest } from '@jest/globals';
import { Logger } from '@nestjs/common';
import { PgBouncer } from '../support/pgbouncer.js';
import { usePostgresServer } from '../support/postgres-fixture.js';
import { EXCLUSIVE, SHARED, sharedCallers } from '../support/postgres-shared-callers.js';
import { until } from '../support/wait.js';

// Shared locks and semaphores with every lock statement through a pgbouncer in transaction mode
// (each transaction may run on another server connection): LISTEN direct, as documented, or none.
const fixture = usePostgresServer();
let bouncer: PgBouncer;
let pooled: string;

beforeAll(async () => {
  bouncer = await PgBouncer.start(fixture.server.port);
  pooled = bouncer.url(new URL(fixture.url).pathname.slice(1));
}, 30_000);
afterAll(async () => {
  await bouncer?.stop();
});

describe.each([
  ['LISTEN on a direct connection', { listenConnection: () => fixture.url }],
  ['no LISTEN: waiters poll', { listenConnection: () => false as const }],
])('PostgreSQL shared locks and semaphores through pgbouncer (transaction mode), %s', (_, { listenConnection }) => {
  const callers = () => sharedCallers(fixture, { listenConnection: listenConnection() }, () => pooled);

  it('readers together, a queued writer blocks later readers, and its release lets them in', async () => {
    const warn = jest.spyOn(Logger.prototype, 'warn').mockImplementation(() => undefined);
    fixture.cleanup(() => warn.mockRestore());
    const { backend, enter, line } = callers();
    const [a, b] = [await backend(), await backend()];
    const readers = [enter(a, 'rw', SHARED), enter(b, 'rw', SHARED)];
    const readerTokens = await Promise.all(readers.map((r) => r.entered));
    const writer = enter(b, 'rw', EXCLUSIVE);
    await until(async () => (await line('rw')) === 1, 5_000, 'the writer in line');
    const late = enter(a, 'rw', SHARED);
    await until(async () => (await line('rw')) === 2, 5_000, 'the late reader in line');
    await readers[0].leave();
    await readers[1].leave();
    const writerToken = await writer.entered;
    expect(writerToken).toBeGreaterThan(Math.max(...readerTokens));
    expect(late.inside()).toBe(false);
    await writer.leave();
    expect(await late.entered).toBeGreaterThan(writerToken);
  });

  it('a semaphore never has more holders than permits', async () => {
    const { backend, enter } = callers();
    const processes = [await backend(), await backend()];
    let inside = 0;
    let most = 0;
    const worker = async (i: number) => {
      for (let round = 0; round < 3; round++) {
        const caller = enter(processes[i % 2], 'sem', 2);
        await caller.entered;
        most = Math.max(most, ++inside);
        await processes[i % 2].inspect('sem');
        inside--;
        await caller.leave();
      }
    };
    await Promise.all(Array.from({ length: 5 }, (_, i) => worker(i)));
    expect(most).toBeLessThanOrEqual(2);
    for (const owner of ['p1', 'p2']) expect((await processes[0].tryAcquire(['sem2'], owner, 30_000, { limits: [2] })).acquired).toBe(true);
    expect(await processes[1].tryAcquire(['sem2'], 'p3', 30_000, { limits: [2], willWait: false })).toMatchObject({ acquired: false });
  });
});
