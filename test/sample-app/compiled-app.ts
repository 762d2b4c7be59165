import { execFile, spawn, type ChildProcess } from 'node:child_process';
import { existsSync } from 'node:fs';
import { join, resolve } from 'node:path';
import { promisify } from 'node:util';

const root = resolve(import.meta.dirname, '../..');

/**
 * The shop compiled as users run it (`npm test` builds it first, in pretest): plain JS that
 * loads the library through its package entry, dist/.
 */
export function compiledShop(file: 'main.js' | 'demo.js'): string {
  const path = join(root, 'dist-dev/sample-app', file);
  if (!existsSync(path)) throw new Error(`${path} is missing: run \`npm run build:sample\` (npm test does it in pretest).`);
  return path;
}

/** What the demo prints as its last line. */
export interface DemoSummary {
  demo: string;
  stock: number;
  buyers: number;
  results: Record<'unsafe' | 'locked' | 'atomic', { sold: number; stockLeft: number; oversold: number; ms: number }>;
}

/**
 * Runs `node dist-dev/sample-app/demo.js` (what `npm run demo` runs) with these arguments, on the
 * embedded defaults unless `env` names a database or lock backend; resolves to its output and
 * the summary of its last line.
 */
export async function runDemo(
  args: string[],
  env: Record<string, string>,
  timeoutMs: number,
): Promise<{ stdout: string; summary: DemoSummary }> {
  const { stdout } = await promisify(execFile)(process.execPath, [compiledShop('demo.js'), ...args], {
    env: { ...process.env, DATABASE_URL: '', REDIS_URL: '', REDLOCK_URLS: '', ...env },
    timeout: timeoutMs,
  }).catch((error: Error & { stdout?: string; stderr?: string }) => {
    // A demo that failed says why in its output (its table, "NOT as expected"): show its end.
    throw new Error(`${error.message}\n${`${error.stdout ?? ''}${error.stderr ?? ''}`.slice(-3_000)}`);
  });
  return { stdout, summary: JSON.parse(stdout.trim().split('\n').at(-1)!) as DemoSummary };
}

/** One `node dist-dev/sample-app/main.js` on a free port. */
export class ShopProcess {
  private output = '';

  private constructor(
    readonly child: ChildProcess,
    readonly url: string,
  ) {}

  static start(env: Record<string, string>): Promise<ShopProcess> {
    const child = spawn(process.execPath, [compiledShop('main.js')], {
      env: { ...process.env, DATABASE_URL: '', REDIS_URL: '', REDLOCK_URLS: '', ...env, PORT: '0' },
      stdio: ['ignore', 'pipe', 'pipe'],
    });
    return new Promise((resolvePromise, reject) => {
      let output = '';
      const collect = (chunk: Buffer) => {
        output += chunk.toString();
        const match = /listening on (http:\/\/\S+)/.exec(output);
        if (match && !shop) {
          shop = new ShopProcess(child, match[1]);
          shop.output = output;
          resolvePromise(shop);
        } else if (shop) shop.output += chunk.toString();
      };
      let shop: ShopProcess | undefined;
      child.stdout!.on('data', collect);
      child.stderr!.on('data', collect);
      child.once('exit', (code) => {
        if (!shop) reject(new Error(`The shop exited (${code}) before it was listening:\n${output}`));
      });
    });
  }

  get pid(): number {
    return this.child.pid!;
  }

  /** Everything it printed so far (logs: lost leases and the like). */
  get log(): string {
    return this.output;
  }

  pause(): void {
    this.child.kill('SIGSTOP');
  }

  resume(): void {
    this.child.kill('SIGCONT');
  }

  async stop(): Promise<void> {
    const child = this.child;
    if (child.exitCode !== null || child.signalCode !== null) return;
    child.kill('SIGCONT');
    const exited = new Promise<void>((resolveExit) => child.once('exit', () => resolveExit()));
    child.kill('SIGTERM');
    await exited;
  }
}
