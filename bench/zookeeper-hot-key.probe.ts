import 'reflect-metadata';
import { performance } from 'node:perf_hooks';
import { LockService, ZooKeeperLockBackend } from '../lib/index.js';
import { fourLetterWord, ZooKeeperServer } from '../test/support/zookeeper-server.js';
import { cpuSecondsOf, timedSections } from './harness.js';

/**
 * A probe, not a bench group: where the time of a hand-over on a ZooKeeper hot key goes. It runs
 * the bench's hot key (8 workers, a `LockService` and session each, sections of 1 ms) on a server
 * of its own, or an ensemble of three, and reads, over the measured sections only:
 * - the CPU this process spent (every worker's JavaScript and node-zookeeper-client) and the CPU
 *   the ZooKeeper JVMs spent, per section;
 * - the requests the servers received per section, from their own counters (`srvr`; pings
 *   included).
 *
 *   npx tsc -p tsconfig.json   # compiles it to dist-dev, as npm run bench does
 *   node dist-dev/bench/zookeeper-hot-key.probe.js [sections=100] [servers=1]
 */
const sections = Number(process.argv[2] ?? 100);
const servers = Number(process.argv[3] ?? 1);
const workers = 8;

/** Requests the members received so far, summed (`srvr`'s "Received"). */
async function received(server: ZooKeeperServer): Promise<number> {
  const answers = await Promise.all(server.ports.map((port) => fourLetterWord(port, 'srvr')));
  return answers.reduce((sum, answer) => sum + Number(/^Received: (\d+)/m.exec(answer)?.[1] ?? 0), 0);
}

async function main(): Promise<void> {
  const server = servers > 1 ? await ZooKeeperServer.startEnsemble({ tickTime: 2_000 }) : await ZooKeeperServer.start({ tickTime: 2_000 });
  const services = Array.from(
    { length: workers },
    () => new LockService(new ZooKeeperLockBackend(server.connectionString, { root: '/probe' }), { keyPrefix: '' }),
  );
  try {
    const lock = (w: number) => async () => {
      const handle = await services[w].acquire('hot', { wait: 60_000 });
      return () => handle.release();
    };
    const rounds = (count: number, inside: number[]) =>
      Promise.all(Array.from({ length: workers }, (_, w) => timedSections(lock(w), count, 1, [], inside)));
    await rounds(5, []);
    const pids = server.ports.map((_, i) => server.pid(i + 1)!);
    const before = { at: performance.now(), self: process.cpuUsage(), jvm: pids.map(cpuSecondsOf), requests: await received(server) };
    const inside: number[] = [];
    await rounds(sections, inside);
    const elapsed = performance.now() - before.at;
    const self = process.cpuUsage(before.self);
    const jvm = pids.map((pid, i) => cpuSecondsOf(pid) - before.jvm[i]).reduce((a, b) => a + b, 0);
    const requests = (await received(server)) - before.requests;
    const total = workers * sections;
    const section = inside.reduce((a, b) => a + b, 0) / inside.length;
    const per = (value: number) => Math.round((value / total) * 10) / 10;
    console.log(
      `${servers} server(s), ${total} sections in ${Math.round(elapsed)} ms: a hand-over every ${per(elapsed - section * total)} ms`,
    );
    console.log(`CPU per section: this process ${per((self.user + self.system) / 1000)} ms, ZooKeeper ${per(jvm * 1000)} ms`);
    console.log(`requests received per section: ${per(requests)}`);
  } finally {
    for (const service of services) await service.onApplicationShutdown();
    await server.stop();
  }
}

void main();
