import 'reflect-metadata';
import { monitorEventLoopDelay, performance } from 'node:perf_hooks';
import { setTimeout as sleep } from 'node:timers/promises';
import { LockService, ZooKeeperLockBackend } from '../lib/index.js';
import { nodeZooKeeperClients, type ZooKeeperClient } from '../lib/backends/zookeeper/zookeeper.client.js';
import { ZooKeeperServer } from '../test/support/zookeeper-server.js';
import { percentile } from './harness.js';

/**
 * A probe, not a bench group: where an acquire's and a release's time go on one ZooKeeper server
 * and on an ensemble of three. Every request the backend sends is timed, with the member its
 * session talks to (leader or follower), then the floor's two writes on each member, then the
 * warnings in the members' logs. The JVMs' pids are printed first, to attach strace or jcmd.
 *
 *   npx tsc -p tsconfig.json   # compiles it to dist-dev, as npm run bench does
 *   node dist-dev/bench/zookeeper-release.probe.js [pairs=2000] [tickTime=2000] [requests|shape]
 *
 * `shape` runs the bench's own pattern instead (a LockService on any member, pairs for 600 ms, then
 * idle 2.4 s, `pairs` times) and prints every release over 100 ms with its requests, the event
 * loop's lag meanwhile and the session's changes of state.
 */
const pairs = Number(process.argv[2] ?? 2000);
const tickTime = Number(process.argv[3] ?? 2000);

interface Timed {
  op: string;
  at: number;
  ms: number;
}

function timedClients(connection: string, log: Timed[], port: { value?: number }): () => ZooKeeperClient {
  const make = nodeZooKeeperClients(connection, 10_000);
  return () => {
    const inner = make();
    const time =
      <T>(op: string, send: () => Promise<T>) =>
      async (): Promise<T> => {
        const at = performance.now();
        try {
          return await send();
        } finally {
          log.push({ op, at, ms: performance.now() - at });
          const socket = (inner as unknown as { client: { connectionManager: { socket?: { remotePort?: number } } } }).client
            .connectionManager.socket;
          port.value = socket?.remotePort;
        }
      };
    return {
      get sessionTimeout() {
        return inner.sessionTimeout;
      },
      connect: (onState) => inner.connect(onState),
      multi: (ops) => time(`multi(${ops.map((o) => o.op).join(',')})`, () => inner.multi(ops))(),
      create: (path, mode) => time('create', () => inner.create(path, mode))(),
      remove: (path) => time('remove', () => inner.remove(path))(),
      exists: (path, watcher) => time(watcher ? 'getData+watch' : 'exists', () => inner.exists(path, watcher))(),
      getChildren: (path) => time('getChildren', () => inner.getChildren(path))(),
      getData: (path) => time('getData', () => inner.getData(path))(),
      reconnect: () => inner.reconnect(),
      close: () => inner.close(),
    };
  };
}

function summary(name: string, values: number[]): string {
  const sorted = [...values].sort((a, b) => a - b);
  const f = (v: number) => v.toFixed(2);
  return `${name.padEnd(34)} n=${String(sorted.length).padStart(5)} p50=${f(percentile(sorted, 50))} p90=${f(percentile(sorted, 90))} p99=${f(percentile(sorted, 99))} max=${f(sorted[sorted.length - 1] ?? NaN)} ms`;
}

async function probe(server: ZooKeeperServer, label: string): Promise<void> {
  const log: Timed[] = [];
  const port: { value?: number } = {};
  const backend = new ZooKeeperLockBackend(server.connectionString, { root: '/probe' }, timedClients(server.connectionString, log, port));
  const acquires: number[] = [];
  const releases: number[] = [];
  const slow: string[] = [];
  // warm-up
  for (let i = 0; i < 100; i++) {
    await backend.tryAcquire(['k'], `w${i}`, 30_000, { willWait: false });
    await backend.release(['k'], `w${i}`);
  }
  log.length = 0;
  const leader = await server.leader();
  const started = performance.now();
  for (let i = 0; i < pairs; i++) {
    const a = performance.now();
    await backend.tryAcquire(['k'], `o${i}`, 30_000, { willWait: false });
    const r = performance.now();
    await backend.release(['k'], `o${i}`);
    const e = performance.now();
    acquires.push(r - a);
    releases.push(e - r);
    if (e - r > 50) slow.push(`release ${i} at +${(r - started).toFixed(0)} ms took ${(e - r).toFixed(1)} ms`);
  }
  const elapsed = performance.now() - started;
  const connectedTo = server.ports.indexOf(port.value ?? -1) + 1;
  console.log(
    `\n${label}: ${pairs} pairs in ${elapsed.toFixed(0)} ms (${((elapsed / pairs) * 1000).toFixed(0)} µs per pair); session on server ${connectedTo}, leader ${leader ?? 'standalone'}`,
  );
  console.log(summary('acquire (tryAcquire)', acquires));
  console.log(summary('release', releases));
  for (const op of [...new Set(log.map((t) => t.op))]) {
    console.log(
      summary(
        `  ${op}`,
        log.filter((t) => t.op === op).map((t) => t.ms),
      ),
    );
  }
  for (const line of slow.slice(0, 20)) console.log(`  slow: ${line}`);
  await backend.close();
}

/** The floor, request by request, on each member: one create ephemeral sequential, one delete. */
async function rawOn(server: ZooKeeperServer, label: string): Promise<void> {
  const leader = await server.leader();
  for (const [i, p] of server.ports.entries()) {
    const log: Timed[] = [];
    const client = timedClients(`127.0.0.1:${p}`, log, {})();
    await new Promise<void>((resolve) => client.connect((state) => state === 'connected' && resolve()));
    await client.create('/raw', 'persistent').catch(() => undefined);
    for (let n = 0; n < pairs / 2; n++) {
      const {
        created: [path],
      } = await client.multi([{ op: 'create', path: '/raw/n-', mode: 'ephemeral-sequential' }]);
      await client.multi([{ op: 'remove', path }]);
    }
    const role = leader === undefined ? 'standalone' : leader === i + 1 ? 'leader' : 'follower';
    console.log(`\n${label}, raw create+delete on server ${i + 1} (${role})`);
    for (const op of [...new Set(log.map((t) => t.op))]) {
      console.log(
        summary(
          `  ${op}`,
          log.filter((t) => t.op === op).map((t) => t.ms),
        ),
      );
    }
    client.close();
  }
}

/**
 * The bench's shape: one LockService on the ensemble (any member), pairs for 600 ms, then idle for
 * as long as the other implementations' turns (2.4 s), `rounds` times. Every release slower than
 * 100 ms is printed with the requests around it, the event loop's lag and the session's states.
 */
async function benchShape(server: ZooKeeperServer, rounds: number): Promise<void> {
  const log: Timed[] = [];
  const port: { value?: number } = {};
  const backend = new ZooKeeperLockBackend(server.connectionString, { root: '/shape' }, timedClients(server.connectionString, log, port));
  const states: string[] = [];
  const locks = new LockService(backend);
  const lag = monitorEventLoopDelay({ resolution: 5 });
  lag.enable();
  const releases: number[] = [];
  const t0 = performance.now();
  let stateWatch: string | undefined;
  const watchState = setInterval(() => {
    if (backend.state !== stateWatch) states.push(`+${(performance.now() - t0).toFixed(0)} ms ${(stateWatch = backend.state)}`);
  }, 5);
  for (let r = 0; r < rounds; r++) {
    const until = performance.now() + 600;
    while (performance.now() < until) {
      const handle = await locks.acquire('pair', { wait: 60_000 });
      const sent = performance.now();
      const from = log.length;
      lag.reset();
      await handle.release();
      const ms = performance.now() - sent;
      releases.push(ms);
      if (ms > 100) {
        console.log(
          `slow release at +${(sent - t0).toFixed(0)} ms: ${ms.toFixed(1)} ms; event loop lag max ${(lag.max / 1e6).toFixed(1)} ms; requests: ${log
            .slice(from)
            .map((t) => `${t.op} ${t.ms.toFixed(1)} ms`)
            .join(', ')}`,
        );
      }
    }
    await sleep(2_400);
  }
  clearInterval(watchState);
  const connectedTo = server.ports.indexOf(port.value ?? -1) + 1;
  console.log(
    `bench shape, ${rounds} rounds: session on server ${connectedTo}, leader ${await server.leader()}; states: ${states.join('; ')}`,
  );
  console.log(summary('release', releases));
  await locks.onApplicationShutdown();
}

const mode = process.argv[4] ?? 'requests';
const single = await ZooKeeperServer.start({ tickTime });
const ensemble = await ZooKeeperServer.startEnsemble({ tickTime });
console.log(
  `pids: single ${single.pid(1)}; ensemble ${[1, 2, 3].map((id) => `${id}=${ensemble.pid(id)}`).join(' ')}, leader ${await ensemble.leader()}`,
);
try {
  if (mode === 'shape') {
    await benchShape(ensemble, pairs);
  } else {
    await probe(single, 'one server');
    await probe(ensemble, 'three servers');
    await rawOn(single, 'one server');
    await rawOn(ensemble, 'three servers');
  }
  for (const [i, member] of (ensemble as unknown as { members: { log(): string }[] }).members.entries()) {
    const warnings = member
      .log()
      .split('\n')
      .filter((line) => / (WARN|ERROR) /.test(line));
    console.log(
      `server ${i + 1}: ${warnings.length} warnings in the log's tail${warnings.length ? `:\n  ${warnings.slice(-8).join('\n  ')}` : ''}`,
    );
  }
} finally {
  await single.stop();
  await ensemble.stop();
}
