import { Redis } from 'ioredis';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { setTimeout as sleep } from 'node:timers/promises';
import { RedisServer } from '../test/support/redis-server.js';
import { checkHistory, type CheckReport } from './history.checker.js';
import { now } from './history.js';
import { Nemesis } from './nemesis.js';
import { random } from './random.js';
import { STORES } from './store.registry.js';
import { WorkerPool } from './worker-pool.js';

/**
 * `npm run chaos -- [--seconds 60 | --minutes 10] [--backend memory,redis,sentinel,cluster,redlock,postgres]
 * [--seed 42] [--workers 5] [--keys 3] [--ttl 1000] [--jobs 1] [--json]`: worker processes run
 * @Locked read-modify-writes of a fenced register while a seeded nemesis injects faults; the history
 * is then checked. Exits 1 on anything the guarantees table does not allow. `--jobs 2` runs two
 * backends at a time, each on its own servers and ports: most of a run is spent waiting (faults,
 * leases running out, the rest before the liveness check), so two fit on two cores.
 */
const args = process.argv.slice(2);
const option = (name: string): string | undefined => (args.includes(`--${name}`) ? args[args.indexOf(`--${name}`) + 1] : undefined);
const seconds = option('minutes') ? Number(option('minutes')) * 60 : Number(option('seconds') ?? 60);
const backends = (option('backend') ?? 'redis').split(',');
const seed = Number(option('seed') ?? Math.floor(Math.random() * 2 ** 31));
const workers = Number(option('workers') ?? 5);
const keys = Number(option('keys') ?? 3);
const ttl = Number(option('ttl') ?? 1000);
const wait = ttl * 3;
const json = args.includes('--json');
const jobs = Math.max(1, Number(option('jobs') ?? 1));
/**
 * `--no-fencing`: the register takes every write and holders never check their lock, so the run
 * shows that the register's checks can fail: it must report violations (exits 1 when it finds none).
 */
const fencingOff = args.includes('--no-fencing');
/** How long after a failover's new master is announced a client may still lock on the old one. */
const FAILOVER_GRACE_MS = 1_000;

const unknown = backends.filter((name) => !(name in STORES));
if (unknown.length > 0 || !(seconds > 0)) {
  console.error(`Unknown backend(s) ${unknown.join(', ') || '(none)'} or bad duration. Backends: ${Object.keys(STORES).join(', ')}.`);
  process.exit(2);
}

interface RunResult {
  backend: string;
  seed: number;
  seconds: number;
  report: CheckReport;
}

async function runOne(backend: string): Promise<RunResult> {
  const store = new (await STORES[backend]()).default();
  let registerServer: RedisServer | undefined;
  let pool: WorkerPool | undefined;
  // Every server is started inside the clean-up: a store that fails to start leaves nothing running.
  try {
    registerServer = await RedisServer.start();
    await store.start();
    const historyFile = join(tmpdir(), `chaos-${backend}-${seed}-${process.pid}.jsonl`);
    const ids = store.singleProcess ? ['memory'] : Array.from({ length: workers }, (_, i) => `w${i + 1}`);
    const specs = new Map(await Promise.all(ids.map(async (id) => [id, await store.backendFor(id)] as const)));
    const workerPool = (pool = new WorkerPool(
      { registerPort: registerServer.port, keys, callers: 2, ttl, wait, workMs: Math.floor(ttl / 4), seed, fencing: !fencingOff },
      (id) => specs.get(id)!,
      historyFile,
    ));
    const livenessBoundMs = ttl + store.recoveryMs;
    await pool.start(ids);
    await store.observe?.((event) => workerPool.record(event));
    // Which proxy leads where: a hold's `server` is the port its worker's connection is on.
    for (const id of ids)
      for (const link of store.links(id))
        pool.record({
          t: now(),
          type: 'store',
          event: 'proxies',
          detail: `${id} ${link.name}: ${link.proxies.map((p) => `${p.port} -> ${p.targetPort}`).join(', ')}`,
        });
    const nemesis = new Nemesis(pool, store, random(seed), ttl, livenessBoundMs);
    const running = nemesis.run();
    note(`${backend}: ${ids.length} worker(s), seed ${seed}, ${seconds} s; history in ${historyFile}`);
    await sleep(seconds * 1000);
    nemesis.stop();
    await running;
    // A healed end: every key left blocked by the last fault must be free again within the bound.
    await sleep(livenessBoundMs + 500);
    await pool.stop();
    const report = checkHistory(pool.history, {
      fencing: store.fencing,
      waitSlackMs: store.commandTimeout * 1.25 + 1_000,
      failoverGraceMs: FAILOVER_GRACE_MS,
      ttl,
      reactionMs: store.commandTimeout * 1.25 + 1_000,
      livenessBoundMs,
    });
    await crossCheckRegister(registerServer, report, store.fencing);
    return { backend, seed, seconds, report };
  } finally {
    await pool?.stop().catch(() => undefined);
    await store.stop().catch(() => undefined);
    await registerServer?.stop();
  }
}

/**
 * The register's own account, which needs no history: every accepted write added one to the value
 * it read, so a register whose value is below its count of accepted writes lost an update (even
 * one whose worker was killed before logging it).
 */
async function crossCheckRegister(server: RedisServer, report: CheckReport, fencing: boolean): Promise<void> {
  const client = new Redis(server.port, '127.0.0.1');
  try {
    let lost = 0;
    for (const key of await client.keys('register:*')) {
      const [value, seq] = await client.hmget(key, 'value', 'seq');
      lost += Number(seq ?? 0) - Number(value ?? 0);
    }
    // Without fencing an overlap the guarantees table allows may lose an update.
    if (fencing || !report.overlaps.some((o) => o.allowedBy !== undefined)) report.violations['register-lost-update'] = lost;
  } finally {
    client.disconnect();
  }
}

function note(text: string): void {
  process.stderr.write(`${text}\n`);
}

function summary(result: RunResult): Record<string, unknown> {
  const { report } = result;
  const overlapsAllowed = report.overlaps.filter((o) => o.allowedBy !== undefined).length;
  const overlapsBy: Record<string, number> = {};
  for (const o of report.overlaps) overlapsBy[o.allowedBy ?? 'unexplained'] = (overlapsBy[o.allowedBy ?? 'unexplained'] ?? 0) + 1;
  return {
    backend: result.backend,
    seed: result.seed,
    seconds: result.seconds,
    faults: report.faults,
    failovers: report.failovers,
    operations: report.operations,
    acquisitions: report.acquisitions,
    acceptedWrites: report.acceptedWrites,
    refusedWrites: report.refusedWrites,
    overlapsAllowed,
    overlapsBy,
    errors: report.errors,
    violations: report.violations,
  };
}

function printTable(results: RunResult[]): void {
  const rows = results.map((r) => {
    const s = summary(r);
    const count = (o: Record<string, number>) => Object.values(o).reduce((a, b) => a + b, 0);
    return {
      backend: r.backend,
      faults: String(count(r.report.faults)),
      operations: String(r.report.operations),
      'accepted writes': String(r.report.acceptedWrites),
      'refused writes': String(r.report.refusedWrites),
      'overlaps (allowed)': String(s.overlapsAllowed),
      violations: String(count(r.report.violations)),
    };
  });
  const columns = Object.keys(rows[0]);
  const widths = columns.map((c) => Math.max(c.length, ...rows.map((row) => row[c as keyof typeof row].length)));
  const line = (cells: string[]) =>
    `| ${cells.map((cell, i) => (i === 0 ? cell.padEnd(widths[i]) : cell.padStart(widths[i]))).join(' | ')} |`;
  console.log(line(columns));
  console.log(`|${widths.map((w, i) => (i === 0 ? '-'.repeat(w + 2) : `${'-'.repeat(w + 1)}:`)).join('|')}|`);
  for (const row of rows) console.log(line(columns.map((c) => row[c as keyof typeof row])));
  for (const r of results) {
    console.log(`\n${r.backend}: faults ${JSON.stringify(r.report.faults)}, failovers seen by the store ${r.report.failovers}`);
    console.log(`  overlaps by cause ${JSON.stringify(summary(r).overlapsBy)}`);
    console.log(`  errors ${JSON.stringify(r.report.errors)}`);
    console.log(`  violations ${JSON.stringify(r.report.violations)}`);
    for (const b of r.report.blockedKeys.slice(0, 10))
      console.log(
        `  blocked key ${b.key}: wanted and held by nobody from ${b.from.toFixed(0)} to ${b.to.toFixed(0)}, no fault excusing it after ${b.since.toFixed(0)}`,
      );
    for (const o of r.report.overlaps.filter((o) => o.notTold).slice(0, 10))
      console.log(`  holder not told on ${o.key}: ${o.first}, after ${o.allowedBy}, acting past ${o.tellBy?.toFixed(0)}`);
    for (const o of r.report.overlaps.slice(0, 10))
      console.log(
        `  overlap on ${o.key}: ${o.first} then ${o.second}, ${o.ms.toFixed(1)} ms, ${o.allowedBy ? `after ${o.allowedBy}` : 'NOT ALLOWED'}`,
      );
  }
}

// In the order asked for, whatever order they finish in.
const results: RunResult[] = new Array(backends.length);
let next = 0;
await Promise.all(
  Array.from({ length: Math.min(jobs, backends.length) }, async () => {
    while (next < backends.length) {
      const i = next++;
      results[i] = await runOne(backends[i]);
    }
  }),
);
if (!json) printTable(results);
for (const result of results) console.log(JSON.stringify(summary(result)));
const failed = results.filter((r) => Object.values(r.report.violations).some((count) => count > 0));
if (fencingOff) {
  // The register's checks must be able to fail: with fencing off every backend must show violations.
  const passed = results.filter((r) => !failed.includes(r));
  console.error(
    passed.length === 0
      ? `\nFencing off: violations found on ${failed.map((r) => r.backend).join(', ')}, as they must be.`
      : `\nFencing off, yet no violation on ${passed.map((r) => r.backend).join(', ')}: the checks cannot see what they are for.`,
  );
  process.exit(passed.length === 0 ? 0 : 1);
}
if (failed.length > 0) {
  console.error(
    `\nViolations on ${failed.map((r) => r.backend).join(', ')}. Replay: npm run chaos -- --seconds ${seconds} --backend ${failed.map((r) => r.backend).join(',')} --seed ${seed}`,
  );
}
process.exit(failed.length > 0 ? 1 : 0);
