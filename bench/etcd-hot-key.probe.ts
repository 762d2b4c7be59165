import 'reflect-metadata';
import { performance } from 'node:perf_hooks';
import { EtcdLockBackend, LockService } from '../lib/index.js';
import { EtcdCluster } from '../test/support/etcd-server.js';
import { cpuSecondsOf, timedSections } from './harness.js';

/**
 * A probe, not a bench group: where the time of a hand-over on an etcd hot key goes. It runs the
 * bench's hot key (8 workers, a `LockService` and client each, sections of 1 ms) on a member of its
 * own, and reads, over the measured sections only:
 * - the CPU this process spent (every worker's JavaScript, the etcd3 client and gRPC) and the
 *   CPU the etcd member spent, per section;
 * - the requests etcd handled per section, by gRPC method, from its own counters.
 *
 *   npx tsc -p tsconfig.json   # compiles it to dist-dev, as npm run bench does
 *   node dist-dev/bench/etcd-hot-key.probe.js [sections=100] [members=1]
 */
const sections = Number(process.argv[2] ?? 100);
const members = Number(process.argv[3] ?? 1);
const workers = 8;

/** etcd's count of handled requests, by gRPC method. */
async function handled(endpoint: string): Promise<Map<string, number>> {
  const text = await (await fetch(`${endpoint}/metrics`)).text();
  const counts = new Map<string, number>();
  for (const match of text.matchAll(/^grpc_server_handled_total\{[^}]*grpc_method="(\w+)"[^}]*\} (\d+)/gm))
    counts.set(match[1], (counts.get(match[1]) ?? 0) + Number(match[2]));
  return counts;
}

async function main(): Promise<void> {
  const cluster = await EtcdCluster.start({ members });
  const services = Array.from({ length: workers }, () => new LockService(new EtcdLockBackend(cluster.endpoints)));
  try {
    const lock = (w: number) => async () => {
      const handle = await services[w].acquire('hot', { wait: 60_000 });
      return () => handle.release();
    };
    const rounds = (count: number, waits: number[], inside: number[]) =>
      Promise.all(Array.from({ length: workers }, (_, w) => timedSections(lock(w), count, 1, waits, inside)));
    await rounds(5, [], []);
    const pids = cluster.members.map((m) => m.pid!);
    const before = {
      at: performance.now(),
      self: process.cpuUsage(),
      etcd: pids.map(cpuSecondsOf),
      calls: await handled(cluster.endpoints[0]),
    };
    const inside: number[] = [];
    await rounds(sections, [], inside);
    const elapsed = performance.now() - before.at;
    const self = process.cpuUsage(before.self);
    const etcd = pids.map((pid, i) => cpuSecondsOf(pid) - before.etcd[i]).reduce((a, b) => a + b, 0);
    const calls = await handled(cluster.endpoints[0]);
    const total = workers * sections;
    const section = inside.reduce((a, b) => a + b, 0) / inside.length;
    const per = (value: number) => Math.round((value / total) * 10) / 10;
    console.log(
      `${members} member(s), ${total} sections in ${Math.round(elapsed)} ms: a hand-over every ${per(elapsed - section * total)} ms`,
    );
    console.log(`CPU per section: this process ${per((self.user + self.system) / 1000)} ms, etcd ${per(etcd * 1000)} ms`);
    const rows = [...calls].map(([method, count]) => [method, per(count - (before.calls.get(method) ?? 0))] as const);
    console.log(
      `requests per section (on the first member): ${rows
        .filter(([, n]) => n > 0)
        .map(([m, n]) => `${m} ${n}`)
        .join(', ')}`,
    );
  } finally {
    for (const service of services) await service.onApplicationShutdown();
    await cluster.stop();
  }
}

void main();
