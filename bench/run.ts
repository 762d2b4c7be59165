import { etcdBench } from './etcd.bench.js';
import { Report } from './harness.js';
import { manyKeysBench } from './many-keys.bench.js';
import { memoryBench } from './memory.bench.js';
import { mysqlBench } from './mysql.bench.js';
import { postgresBench } from './postgres.bench.js';
import { redisBench } from './redis.bench.js';
import { redisMemoryBench } from './redis-memory.bench.js';
import { redisSharedBench } from './redis-shared.bench.js';
import { redlockBench } from './redlock.bench.js';
import { zookeeperBench } from './zookeeper.bench.js';

/**
 * `npm run bench [-- --json] [-- --only <name>]`: every scenario next to its peers in the same run.
 * Tables for people; with --json one object per line, {"scenario", "impl", ...figures}.
 */
const groups: Record<string, (report: Report) => Promise<void>> = {
  memory: memoryBench,
  redis: redisBench,
  'redis-memory': redisMemoryBench,
  'redis-shared': redisSharedBench,
  'redis-keys': manyKeysBench,
  redlock: redlockBench,
  postgres: postgresBench,
  mysql: mysqlBench,
  etcd: etcdBench,
  zookeeper: zookeeperBench,
};

const args = process.argv.slice(2);
const only = args.includes('--only') ? args[args.indexOf('--only') + 1]?.split(',') : undefined;
const unknown = only?.filter((name) => !(name in groups));
if (unknown?.length) {
  console.error(`Unknown bench group(s): ${unknown.join(', ')}. Known: ${Object.keys(groups).join(', ')}.`);
  process.exit(2);
}
const report = new Report(args.includes('--json'));
for (const [name, run] of Object.entries(groups)) {
  if (!only || only.includes(name)) await run(report);
}
report.printTables();
