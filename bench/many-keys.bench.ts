import { Redis } from 'ioredis';
import { lineScriptKeys, lockKeyLayout } from '../lib/backends/redis/redis.keys.js';
import { ACQUIRE, RELEASE } from '../lib/backends/redis/redis.scripts.js';
import { fork, type ChildProcess } from 'node:child_process';
import { once } from 'node:events';
import { performance } from 'node:perf_hooks';
import { RedisCluster } from '../test/support/redis-cluster.js';
import { RedisServer } from '../test/support/redis-server.js';
import { median, percentile, round, type Report } from './harness.js';

/** Workers in several processes, each taking and releasing random keys out of 10 000 as fast as it can. */
const MANY_KEYS = { processes: 4, workersPerProcess: 8, keys: 10_000, ms: 2_000, rounds: 3 };
const SCENARIO = `redis: many keys, ${MANY_KEYS.processes} processes x ${MANY_KEYS.workersPerProcess} workers, random keys of 10 000`;

/** What one run of one implementation did, and what it cost Redis. */
interface Run {
  pairs: number;
  perSec: number;
  p99Ms: number;
  /** Redis CPU (user + sys, from INFO cpu) per acquisition+release, µs; summed over every node. */
  cpuUs: number;
  /** Commands Redis ran per acquisition+release (INFO commandstats), those run by scripts included. */
  commands: number;
  /** The busiest node's share of that CPU (1 on one server). */
  busiestShare: number;
}

/**
 * How many locks one Redis serves: ours next to redis-semaphore and redlock on one redis-server,
 * then ours and redis-semaphore on a Cluster of one master and of three, in the same run.
 */
export async function manyKeysBench(report: Report): Promise<void> {
  report.note('redis-keys: many keys, locks per second and Redis CPU per lock (starts its own redis-server and Clusters)');
  const server = await RedisServer.start();
  try {
    await scriptCost(report, server.port);
    const runs = await scenario([server.port], false, [
      'ours',
      'ours, the backend alone',
      'redis-semaphore',
      'redis-semaphore, 100 µs more JavaScript per lock',
      'redlock',
    ]);
    for (const [impl, run] of Object.entries(runs)) report.add(row('one redis-server', impl, run, runs));
  } finally {
    await server.stop();
  }
  const onCluster: Record<number, Record<string, Run>> = {};
  for (const masters of [1, 3]) {
    const cluster = await RedisCluster.start({ masters });
    try {
      // A lone master never met another node, so it does not know its address: CLUSTER SLOTS would
      // send clients to host ''.
      for (const node of cluster.servers) await cluster.admin(node.port).config('SET', 'cluster-announce-ip', '127.0.0.1');
      onCluster[masters] = await scenario(
        cluster.servers.map((s) => s.port),
        true,
        ['ours', 'redis-semaphore'],
      );
    } finally {
      await cluster.stop();
    }
    for (const [impl, run] of Object.entries(onCluster[masters])) {
      report.add(row(`Cluster, ${masters} master${masters > 1 ? 's' : ''}`, impl, run, onCluster[masters]));
    }
  }
  for (const impl of Object.keys(onCluster[3])) {
    const [one, three] = [onCluster[1][impl], onCluster[3][impl]];
    report.add({
      scenario: `${SCENARIO}: Cluster, 3 masters vs 1`,
      impl,
      // What this machine gave: clients and masters share its cores.
      measuredRatio: round(three.perSec / one.perSec),
      // What three masters on cores of their own would give: the busiest master bounds the rate.
      capacityRatio: round(one.cpuUs / (three.cpuUs * three.busiestShare)),
    });
  }
}

function row(
  where: string,
  impl: string,
  run: Run,
  all: Record<string, Run>,
): { scenario: string; impl: string; [k: string]: number | string } {
  const bestPeer = Math.max(
    ...Object.entries(all)
      .filter(([name]) => !name.startsWith('ours') && !name.includes('more JavaScript'))
      .map(([, r]) => 1e6 / r.cpuUs),
  );
  return {
    scenario: `${SCENARIO}: ${where}`,
    impl,
    pairsPerSec: Math.round(run.perSec),
    acquireP99Ms: round(run.p99Ms, 2),
    redisCpuUsPerPair: round(run.cpuUs, 1),
    redisCommandsPerPair: round(run.commands, 1),
    // Locks one Redis core could serve at this cost, against the best peer's.
    pairsPerRedisCore: Math.round(1e6 / run.cpuUs),
    vsBestPeerPerCore: round(1e6 / run.cpuUs / bestPeer),
  };
}

/** Every implementation `rounds` times, in turn (the order rotates), the median run of each. */
async function scenario(ports: number[], cluster: boolean, impls: string[]): Promise<Record<string, Run>> {
  const { processes, workersPerProcess, keys, ms, rounds } = MANY_KEYS;
  const admins = ports.map((port) => new Redis(port, '127.0.0.1'));
  const worker = new URL('./many-keys.worker.js', import.meta.url);
  const children: ChildProcess[] = Array.from({ length: processes }, () =>
    fork(worker, [ports.join(','), String(workersPerProcess), String(keys)], {
      env: { ...process.env, BENCH_CLUSTER: cluster ? '1' : '0' },
    }),
  );
  const results: Record<string, Run[]> = Object.fromEntries(impls.map((impl) => [impl, []]));
  try {
    await Promise.all(children.map((child) => once(child, 'message')));
    const all = (message: unknown) =>
      Promise.all(
        children.map((child) => {
          const answer = once(child, 'message');
          child.send(message as object);
          return answer.then(([reply]) => reply as { pairs: number; latencies: number[] });
        }),
      );
    for (const impl of impls) await all({ impl, ms: 300 }); // warm: connections, scripts, JIT
    for (let round = 0; round < rounds; round++) {
      for (let i = 0; i < impls.length; i++) {
        const impl = impls[(i + round) % impls.length];
        const before = await Promise.all(admins.map(usage));
        const started = performance.now();
        const replies = await all({ impl, ms });
        const elapsed = performance.now() - started;
        const after = await Promise.all(admins.map(usage));
        const pairs = replies.reduce((sum, r) => sum + r.pairs, 0);
        const cpu = after.map((a, node) => a.cpu - before[node].cpu);
        const commands = after.reduce((sum, a, node) => sum + a.calls - before[node].calls, 0);
        const lat = replies.flatMap((r) => r.latencies).sort((a, b) => a - b);
        const totalCpu = cpu.reduce((sum, c) => sum + c, 0);
        results[impl].push({
          pairs,
          perSec: (pairs * 1000) / elapsed,
          p99Ms: percentile(lat, 99),
          cpuUs: (totalCpu * 1e6) / pairs,
          commands: commands / pairs,
          busiestShare: Math.max(...cpu) / totalCpu,
        });
      }
    }
    await Promise.all(children.map((child) => (child.send('stop'), once(child, 'exit'))));
  } finally {
    for (const child of children) child.kill();
    for (const admin of admins) admin.disconnect();
  }
  // The median run by rate, whole (its figures belong together).
  return Object.fromEntries(
    Object.entries(results).map(([impl, list]) => {
      const mid = median(list.map((r) => r.perSec));
      return [impl, list.reduce((best, r) => (Math.abs(r.perSec - mid) < Math.abs(best.perSec - mid) ? r : best))];
    }),
  );
}

/** A node's CPU seconds (user + sys) and the commands it ran so far (INFO itself not counted). */
async function usage(admin: Redis): Promise<{ cpu: number; calls: number }> {
  const [cpu, stats] = [await admin.info('cpu'), await admin.info('commandstats')];
  const field = (name: string) => Number(new RegExp(`^${name}:([\\d.]+)`, 'm').exec(cpu)?.[1] ?? 0);
  let calls = 0;
  for (const match of stats.matchAll(/^cmdstat_(\S+?):calls=(\d+),/gm)) if (match[1] !== 'info') calls += Number(match[2]);
  return { cpu: field('used_cpu_user') + field('used_cpu_sys'), calls };
}

/** Releases only if the value is ours: redis-semaphore's release, and the raw floor's. */
const CAS_DELETE = "if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('DEL', KEYS[1]) else return 0 end";

/**
 * What Redis itself spends on one acquire+release of a free key, apart from the network: 200 pairs
 * pipelined at a time, so reading and writing sockets is shared by many; the median of 7 runs,
 * taking turns. Ours are its two scripts as the backend sends them.
 */
async function scriptCost(report: Report, port: number): Promise<void> {
  const redis = new Redis(port, '127.0.0.1');
  const admin = new Redis(port, '127.0.0.1');
  try {
    const sha = {
      acquire: (await redis.script('LOAD', ACQUIRE.lua)) as string,
      release: (await redis.script('LOAD', RELEASE.lua)) as string,
      cas: (await redis.script('LOAD', CAS_DELETE)) as string,
    };
    const id = 'bench';
    const impls: Record<string, (pipeline: ReturnType<Redis['pipeline']>, key: string, owner: string) => void> = {
      'ours (its acquire and release scripts)': (p, key, owner) => {
        const layout = lockKeyLayout(key);
        const keys = lineScriptKeys([layout]);
        p.evalsha(sha.acquire, keys.length, ...keys, owner, 30_000, `3000 0 ${id} PUBLISH`);
        // The release's short form: nobody waited for the key (see RELEASE).
        p.evalsha(sha.release, 2, layout.lock, layout.line, owner);
      },
      'SET NX PX + compare-and-delete script (redis-semaphore)': (p, key, owner) => {
        p.set(key, owner, 'PX', 30_000, 'NX');
        p.evalsha(sha.cas, 1, key, owner);
      },
    };
    const costs: Record<string, number[]> = {};
    const pairs = 20_000;
    for (let round = 0; round < 7; round++) {
      for (const [impl, pair] of Object.entries(impls)) {
        const before = await usage(admin);
        for (let i = 0; i < pairs; i += 200) {
          const pipeline = redis.pipeline();
          for (let j = i; j < i + 200; j++) pair(pipeline, `cost:${j % 10_000}`, `owner-${round}-${j}`);
          await pipeline.exec();
        }
        (costs[impl] ??= []).push((((await usage(admin)).cpu - before.cpu) * 1e6) / pairs);
      }
    }
    const floor = median(costs['SET NX PX + compare-and-delete script (redis-semaphore)']);
    for (const [impl, list] of Object.entries(costs)) {
      report.add({
        scenario: 'redis: Redis CPU per acquire+release of a free key, 200 pipelined at a time',
        impl,
        redisCpuUsPerPair: round(median(list), 2),
        vsSetNx: round(median(list) / floor),
      });
    }
  } finally {
    redis.disconnect();
    admin.disconnect();
  }
}
