import { describe, expect, it } from '@jest/globals';
import { SHARED } from '../../lib/backends/lock-backend.interface.js';
import { MysqlLockBackend } from '../../lib/backends/mysql/mysql.backend.js';
import { Holder } from '../support/lock-holder-process.js';
import { useMariadbServer } from '../support/mariadb-fixture.js';
import { until } from '../support/wait.js';

/**
 * Readers and permit holders on MariaDB that die, and the line that lets in everyone at its head
 * who can enter. The holder processes load dist/: run `npm run build` first.
 */
const fixture = useMariadbServer();

function backend(): MysqlLockBackend {
  const created = new MysqlLockBackend(fixture.url);
  fixture.cleanup(() => created.close());
  return created;
}

/** Waits in line for `key` as the service does (a failed attempt, then the wake-up), and resolves with the token. */
async function enter(b: MysqlLockBackend, key: string, owner: string, limit: number): Promise<number> {
  for (;;) {
    const result = await b.tryAcquire([key], owner, 60_000, { limits: [limit] });
    if (result.acquired) return result.fencingToken!;
    await new Promise<void>((resolve) => {
      const timer = setTimeout(resolve, 1_000);
      void b.watch([key], () => (clearTimeout(timer), resolve()), owner).then((stop) => setTimeout(stop, 1_000));
    });
  }
}

describe('MySQL backend: shared holders that die, and the line', () => {
  it.each([
    ['a reader', 'shared', SHARED],
    ['a permit holder', '2', 2],
  ] as const)('%s killed with SIGKILL frees its share within its ttl; alive, it kept it past the ttl', async (_, limitText, limit) => {
    const ttl = 1_500;
    const key = `killed-${limitText}`;
    const holder = await Holder.start('mysql-shared-holder.mjs', fixture.url, key, ttl, [limitText]);
    fixture.cleanup(() => holder.kill());
    const { token } = await holder.next('acquired');
    const b = backend();
    expect((await b.tryAcquire([key], 'beside', 60_000, { limits: [limit] })).acquired).toBe(true);
    let writerToken: number | undefined;
    const writer = enter(b, key, 'writer', 1).then((t) => (writerToken = t));
    // Alive, the child extends its lease: the writer still waits after more than a ttl.
    await until(() => holder.messages.filter((m) => m.type === 'extended').length >= 4, 10_000, 'four extensions (more than a ttl)');
    expect((await b.inspect(key))?.holders).toHaveLength(2);
    await b.release([key], 'beside');
    expect(writerToken).toBeUndefined();
    await holder.kill();
    const killedAt = Date.now();
    await writer;
    expect(Date.now() - killedAt).toBeLessThan(ttl + 1_500);
    expect(writerToken).toBeGreaterThan(token!);
    expect(await b.inspect(key)).toMatchObject({ owner: 'writer', fencingToken: writerToken });
  });

  it('a writer leaving hands the key to every reader at the head of the line at once, in its release, stops at the next writer, and wakes only them', async () => {
    const [a, b] = [backend(), backend()];
    expect((await a.tryAcquire(['rw'], 'writer', 60_000)).acquired).toBe(true);
    for (const [owner, limit] of [
      ['r1', SHARED],
      ['r2', SHARED],
      ['w2', 1],
      ['r3', SHARED],
    ] as const) {
      expect((await b.tryAcquire(['rw'], owner, 60_000, { limits: [limit] })).acquired).toBe(false);
    }
    // Their process's look wakes exactly the readers handed the key, in one pass: not the writer behind them, nor the reader behind it.
    const woken: string[] = [];
    const stops = await Promise.all(['r1', 'r2', 'w2', 'r3'].map((owner) => b.watch(['rw'], () => woken.push(owner), owner)));
    expect(await a.release(['rw'], 'writer')).toBe(true);
    await until(() => woken.includes('r1') && woken.includes('r2'), 5_000, 'the readers handed the key to be woken');
    expect([...new Set(woken)].sort()).toEqual(['r1', 'r2']);
    for (const stop of stops) stop();
    // Handed over in the release's own transaction: no attempt of the readers' process came in between.
    const state = await a.inspect('rw');
    expect(state).toMatchObject({ limit: SHARED });
    expect(state?.holders?.map((h) => h.owner).sort()).toEqual(['r1', 'r2']);
    expect((await a.tryAcquire(['rw'], 'r4', 60_000, { limits: [SHARED], willWait: false })).acquired).toBe(false);
    for (const owner of ['r1', 'r2']) await b.release(['rw'], owner);
    expect(await a.inspect('rw')).toMatchObject({ owner: 'w2' });
    expect(await b.release(['rw'], 'w2')).toBe(true);
    expect(await a.inspect('rw')).toMatchObject({ holders: [{ owner: 'r3' }] });
  });
});
