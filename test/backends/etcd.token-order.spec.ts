import { describe, expect, it } from '@jest/globals';
import { EtcdLockBackend, LockService } from '../../lib/index.js';
import { useEtcdCluster } from '../support/etcd-fixture.js';
import { until } from '../support/wait.js';

/**
 * Fencing tokens of one key should grow in order of acquisition, whatever the mode. On etcd a
 * holder's token is its entry's create revision (the previous release's processes use it too), and
 * readers and permit callers may enter out of line order: a caller of several keys that is in on its
 * first key but waits for a later one keeps its entry `waiting` there; a reader or permit caller that
 * comes later enters that key beside it, with a greater token, and the caller of several keys then
 * enters after it with its older, smaller token. A known limitation (docs/etcd.md): this test runs
 * as it.failing, and turns red once it is fixed.
 */
const fixture = useEtcdCluster({ members: 1 });
const PREFIX = 'nest-distributed-lock/';

function service(): LockService {
  const backend = new EtcdLockBackend(fixture.endpoints[0]);
  const locks = new LockService(backend, { keyPrefix: '' });
  fixture.cleanup(async () => {
    await locks.onApplicationShutdown();
    await backend.close();
  });
  return locks;
}

async function lineLength(key: string): Promise<number> {
  return (await fixture.admin.getAll().prefix(`${PREFIX}${key}/`).keys()).length;
}

describe.each([
  ['shared', { mode: 'shared' as const }],
  ['permits 3', { permits: 3 }],
])('token order on etcd (%s)', (_kind, kind) => {
  // Fails today: the caller of both keys enters 'a' after the later caller, with a smaller token.
  it.failing('a caller of two keys that enters the first after a later caller of it gets a greater token than that caller', async () => {
    const [writer, several, later] = [service(), service(), service()];
    const blocker = await writer.acquire('b');
    const both = several.acquire(['a', 'b'], { ...kind, wait: 10_000 });
    await until(async () => (await lineLength('a')) === 1 && (await lineLength('b')) === 2, 10_000, 'the caller of both to wait');
    // In on 'a' as far as its line goes: a later caller of 'a' alone enters beside its entry.
    const single = await later.acquire('a', { ...kind, wait: 10_000 });
    // The later caller's section on 'a' is over before the caller of both gets in: no overlap.
    await single.release();
    await blocker.release();
    const handle = await both;
    fixture.cleanup(() => handle.release());
    // Acquired 'a' after `later` had held and released it: its token must be above `later`'s
    // (seen: 3 after 4 for shared, 11 after 12 for permits 3).
    expect(handle.fencingToken).toBeGreaterThan(single.fencingToken!);
  });
});
