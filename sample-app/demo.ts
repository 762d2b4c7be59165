import { spawn, type ChildProcess } from 'node:child_process';
import { join } from 'node:path';
import { parseArgs } from 'node:util';
import { DEMO_ENDPOINTS, runDemo, type DemoEndpoint, type DemoEvent, type DemoSummary } from './demo.runner.js';
import { baseUrl, createShopApp } from './shop.app.js';
import { configFromEnv, databaseKind, describeConfig, lockBackendKind } from './shop.config.js';

/**
 * `npm run demo [-- --instances N] [--buyers 500] [--stock 100]`
 *
 * One instance: the shop starts in this process on the embedded defaults (PGlite, in-process
 * locks) unless DATABASE_URL / REDIS_URL say otherwise. Several: N shop processes against the
 * PostgreSQL (or MySQL / MariaDB) in DATABASE_URL and the Redis in REDIS_URL (or, with
 * LOCK_BACKEND=postgres or mysql, locks in that same database), buyers spread over them in turn.
 * The last line printed is the result as one JSON object.
 */
const USAGE = 'usage: npm run demo [-- --instances N] [--buyers 500] [--stock 100]';

async function main(): Promise<number> {
  const { values } = parseArgs({
    options: {
      instances: { type: 'string', default: '1' },
      buyers: { type: 'string', default: '500' },
      stock: { type: 'string', default: '100' },
      help: { type: 'boolean' },
    },
  });
  if (values.help) {
    console.log(USAGE);
    return 0;
  }
  const instances = wholeNumber('--instances', values.instances, 1, 16);
  const buyers = wholeNumber('--buyers', values.buyers, 1, 5_000);
  const stock = wholeNumber('--stock', values.stock, 1, 100_000);
  const config = configFromEnv();

  if (instances > 1) {
    const missing = [
      !config.databaseUrl && 'DATABASE_URL (a PostgreSQL, MySQL or MariaDB they all share)',
      lockBackendKind(config) === 'memory' &&
        (config.lockBackend === 'memory'
          ? 'a shared lock backend (LOCK_BACKEND=memory keeps each process its own locks)'
          : `REDIS_URL (the Redis that holds their locks; or LOCK_BACKEND=${databaseKind(config) === 'mysql' ? 'mysql' : 'postgres'} to keep them in DATABASE_URL)`),
    ].filter(Boolean);
    if (missing.length > 0) {
      console.error(
        `--instances ${instances} runs ${instances} shop processes that must share a database and a lock backend, but ${missing.join(' and ')} ${missing.length > 1 ? 'are' : 'is'} not set.\n` +
          `For example: DATABASE_URL=postgres://postgres@127.0.0.1:5432/shop REDIS_URL=redis://127.0.0.1:6379 npm run demo -- --instances ${instances}\n` +
          `or, with no Redis: DATABASE_URL=postgres://postgres@127.0.0.1:5432/shop LOCK_BACKEND=postgres npm run demo -- --instances ${instances}\n` +
          `or, on MySQL or MariaDB: DATABASE_URL=mysql://shop:password@127.0.0.1:3306/shop LOCK_BACKEND=mysql npm run demo -- --instances ${instances}`,
      );
      return 2;
    }
  }

  console.log(`Shop: ${instances} instance${instances > 1 ? 's' : ''}; ${describeConfig(config)}`);
  const shop = instances === 1 ? await startInProcess(config) : await startProcesses(instances);
  let summary: DemoSummary;
  try {
    summary = await runDemo({ baseUrls: shop.urls, buyers, stock, onEvent: progressPrinter(buyers) });
  } finally {
    await shop.stop();
  }

  printTable(summary);
  const { unsafe, locked, atomic } = summary.results;
  const fine = locked.oversold === 0 && atomic.oversold === 0 && locked.sold === stock && atomic.sold === stock;
  console.log(
    fine
      ? `As expected: unsafe ${unsafe.oversold > 0 ? `oversold by ${unsafe.oversold}` : 'happened not to oversell this time'}; locked and atomic sold exactly the stock.`
      : 'NOT as expected: locked or atomic did not sell exactly the stock (see above).',
  );
  console.log(JSON.stringify(summary));
  return fine ? 0 : 1;
}

interface RunningShop {
  urls: string[];
  stop(): Promise<void>;
}

async function startInProcess(config: ReturnType<typeof configFromEnv>): Promise<RunningShop> {
  const app = await createShopApp(config);
  await app.listen(0, '127.0.0.1');
  return { urls: [baseUrl(app)], stop: () => app.close() };
}

/** N copies of main.js (this file's compiled sibling), each on a free port. */
async function startProcesses(count: number): Promise<RunningShop> {
  const children: ChildProcess[] = [];
  const stop = async () => {
    await Promise.all(
      children.map(
        (child) =>
          new Promise<void>((resolve) => {
            if (child.exitCode !== null || child.signalCode !== null) return resolve();
            child.once('exit', () => resolve());
            child.kill('SIGTERM');
          }),
      ),
    );
  };
  try {
    const urls = await Promise.all(
      Array.from({ length: count }, (_, index) => {
        const child = spawn(process.execPath, [join(import.meta.dirname, 'main.js')], {
          env: { ...process.env, PORT: '0' },
          stdio: ['ignore', 'pipe', 'pipe'],
        });
        children.push(child);
        return waitForListening(child, `instance ${index + 1}`);
      }),
    );
    urls.forEach((url, index) => console.log(`  instance ${index + 1}: ${url} (pid ${children[index].pid})`));
    return { urls, stop };
  } catch (error) {
    await stop();
    throw error;
  }
}

function waitForListening(child: ChildProcess, name: string): Promise<string> {
  return new Promise((resolve, reject) => {
    let output = '';
    const onData = (chunk: Buffer) => {
      output += chunk.toString();
      const match = /listening on (http:\/\/\S+)/.exec(output);
      if (match) {
        child.stdout!.off('data', onData);
        // Keep draining its output so a chatty child never blocks on a full pipe.
        child.stdout!.resume();
        child.stderr!.resume();
        resolve(match[1]);
      }
    };
    child.stdout!.on('data', onData);
    child.stderr!.on('data', (chunk: Buffer) => (output += chunk.toString()));
    child.once('exit', (code) => reject(new Error(`Shop ${name} exited (${code}) before it was listening:\n${output}`)));
  });
}

function progressPrinter(buyers: number): (event: DemoEvent) => void {
  const tty = process.stdout.isTTY;
  let lastPrinted = 0;
  return (event) => {
    if (event.type === 'endpoint') {
      console.log(`${event.endpoint.padEnd(7)} POST /products/${event.productId}/${DEMO_ENDPOINTS[event.endpoint]} × ${buyers}`);
      lastPrinted = 0;
    } else if (event.type === 'progress') {
      const bar = '#'.repeat(Math.round((20 * event.done) / buyers)).padEnd(20, '.');
      const line = `        [${bar}] ${String(event.done).padStart(String(buyers).length)}/${buyers} answered, ${event.sold} sold, ${event.outOfStock} out of stock${event.failed ? `, ${event.failed} failed` : ''}`;
      if (tty) process.stdout.write(`\r${line}`);
      else if (event.done === buyers || Date.now() - lastPrinted >= 500) {
        console.log(line);
        lastPrinted = Date.now();
      }
    } else if (event.type === 'result') {
      if (tty) process.stdout.write('\n');
      for (const failure of event.failures.slice(0, 5)) console.log(`        failed: ${failure}`);
    }
  };
}

function printTable(summary: DemoSummary): void {
  const rows = [['endpoint', 'sold', 'stock left', 'oversold', 'ms']];
  for (const endpoint of Object.keys(summary.results) as DemoEndpoint[]) {
    const r = summary.results[endpoint];
    rows.push([endpoint, String(r.sold), String(r.stockLeft), String(r.oversold), String(r.ms)]);
  }
  const widths = rows[0].map((_, column) => Math.max(...rows.map((row) => row[column].length)));
  console.log(`\n${summary.buyers} buyers of one item each, stock ${summary.stock}, per endpoint:`);
  for (const row of rows)
    console.log(row.map((cell, column) => (column === 0 ? cell.padEnd(widths[column]) : cell.padStart(widths[column]))).join('  '));
  console.log('');
}

function wholeNumber(name: string, value: string, min: number, max: number): number {
  const number = Number(value);
  if (!Number.isInteger(number) || number < min || number > max) {
    console.error(`${name} must be a whole number from ${min} to ${max}, got '${value}'.\n${USAGE}`);
    process.exit(2);
  }
  return number;
}

process.exitCode = await main().catch((error: Error) => {
  console.error(error.message);
  return 1;
});
