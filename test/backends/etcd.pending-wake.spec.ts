import { describe, expect, it } from '@jest/globals';
import { Etcd3 } from 'etcd3';
import { EventEmitter } from 'node:events';
import { performance } from 'node:perf_hooks';
import { EtcdLockBackend, LockService } from '../../lib/index.js';
import { useEtcdCluster } from '../support/etcd-fixture.js';
import { EtcdRequestGate } from '../support/etcd-request-gate.js';
import { until } from '../support/wait.js';

/**
 * A waiter watches the entry ahead of it and takes "set pending" as its deletion
 * (etcd.predecessor-watch.ts). Its watch starts at the current revision, and when that is past
 * the revision it read its line at, it reads the entry once more: an entry set pending in that
 * gap must wake it as a deletion would, not leave it asleep until its next poll.
 */
const fixture = useEtcdCluster({ members: 1 });
const PREFIX = 'nest-distributed-lock/';

function client(): Etcd3 {
  const created = new Etcd3({ hosts: fixture.endpoints });
  fixture.cleanup(() => created.close());
  return created;
}

function service(etcd: Etcd3 | string, options: ConstructorParameters<typeof LockService>[1] = {}): LockService {
  const backend = new EtcdLockBackend(etcd);
  const locks = new LockService(backend, { keyPrefix: '', ...options });
  fixture.cleanup(async () => {
    await locks.onApplicationShutdown();
    await backend.close();
  });
  return locks;
}

/** Watches of `etcd` reach etcd only once the test lets them (a slow watch stream); events are passed on. */
function slowWatches(etcd: Etcd3): { requested: () => number; letGo: () => void } {
  let go!: () => void;
  const gate = new Promise<void>((resolve) => (go = resolve));
  let requested = 0;
  const original = etcd.watch.bind(etcd);
  etcd.watch = () => {
    const builder = original();
    const real = builder.watcher.bind(builder);
    builder.watcher = () => {
      requested++;
      const proxy = new EventEmitter() as EventEmitter & { cancel(): Promise<void> };
      let cancelled = false;
      let watcher: ReturnType<typeof real> | undefined;
      void gate.then(() => {
        if (cancelled) return;
        watcher = real();
        const source = watcher as unknown as EventEmitter;
        for (const event of ['put', 'delete', 'error', 'connected', 'disconnected', 'data', 'end'])
          source.on(event, (...args: unknown[]) => proxy.emit(event, ...args));
      });
      proxy.cancel = async () => {
        cancelled = true;
        await watcher?.cancel();
      };
      return proxy as unknown as ReturnType<typeof real>;
    };
    return builder;
  };
  return { requested: () => requested, letGo: () => go() };
}

async function line(key: string): Promise<string[]> {
  const { kvs } = await fixture.admin.getAll().prefix(`${PREFIX}${key}/`).sort('Create', 'Ascend').exec();
  return kvs.map((kv) => kv.value.toString());
}

describe('etcd wake-ups when the entry ahead is set pending', () => {
  it('wakes a writer whose predecessor was set pending between its look and the start of its watch', async () => {
    const holder = await service(fixture.endpoints[0]).acquire('a');
    // A caller of 'a' and 'b': waits for 'a', and is about to set its entry of 'b' pending.
    const severalClient = client();
    const gate = new EtcdRequestGate(severalClient);
    fixture.cleanup(() => gate.open());
    const repend = gate.slow<{ success?: { request_put?: { value?: Buffer } }[] }>('kv', 'txn', (request) =>
      (request.success ?? []).some((op) => op.request_put?.value?.toString().startsWith('pending') === true),
    );
    const both = service(severalClient).acquire(['a', 'b'], { wait: 20_000 });
    both.catch(() => undefined);
    await repend.caught;
    // A writer of 'b' looks while that entry still says waiting, and watches it; its watch starts late.
    const writerClient = client();
    const watches = slowWatches(writerClient);
    const writer = service(writerClient, { pollInterval: 2_500 }).acquire('b', { wait: 20_000 });
    await until(async () => (await line('b')).length === 2 && watches.requested() > 0, 10_000, 'the writer to watch');
    await repend.send();
    expect(await line('b')).toEqual(['pending', 'waiting handover']);
    const freed = performance.now();
    watches.letGo();
    const handle = await writer;
    // Nothing keeps it out once the entry ahead is pending: it enters at once, not at its next
    // poll (2 500 ms later).
    expect(performance.now() - freed).toBeLessThan(1_000);
    await handle.release();
    await holder.release();
  });
});
