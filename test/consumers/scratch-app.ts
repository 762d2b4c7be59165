import { execFile } from 'node:child_process';
import { mkdirSync, mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { dirname, join } from 'node:path';
import { promisify } from 'node:util';

const run = promisify(execFile);

/** The tarball `npm pack` made in the consumers' globalSetup (pack.mjs). */
export function packedTarball(): string {
  const tarball = process.env.NDL_TARBALL;
  if (!tarball) throw new Error('NDL_TARBALL is not set: run the consumer tests through their Jest project (npm run test:consumers).');
  return tarball;
}

/** The environment without what `npm test` sets for its own package (its prefix, its scripts). */
function cleanEnv(extra: Record<string, string> = {}): NodeJS.ProcessEnv {
  const env = Object.fromEntries(Object.entries(process.env).filter(([name]) => !/^npm_/i.test(name) && name !== 'INIT_CWD'));
  return { ...env, ...extra };
}

/**
 * A new app in a directory of its own under the OS temp dir, installed from the npm registry as a
 * user's would be; removed by `remove()`.
 */
export class ScratchApp {
  readonly dir = mkdtempSync(join(tmpdir(), 'ndl-consumer-'));

  constructor(files: Record<string, string | object>) {
    for (const [path, content] of Object.entries(files)) {
      mkdirSync(dirname(join(this.dir, path)), { recursive: true });
      writeFileSync(join(this.dir, path), typeof content === 'string' ? content : JSON.stringify(content, null, 2));
    }
  }

  async install(): Promise<void> {
    await this.exec('npm', ['install', '--no-audit', '--no-fund', '--loglevel=error']);
  }

  /** Runs a command in the app; rejects with its output when it fails. */
  async exec(command: string, args: string[], env: Record<string, string> = {}): Promise<string> {
    try {
      const { stdout } = await run(command, args, { cwd: this.dir, env: cleanEnv(env), maxBuffer: 64 * 1024 * 1024 });
      return stdout;
    } catch (error) {
      const { stdout, stderr } = error as { stdout?: string; stderr?: string };
      throw new Error(`\`${command} ${args.join(' ')}\` failed in ${this.dir}:\n${stdout ?? ''}\n${stderr ?? ''}`, { cause: error });
    }
  }

  /** Runs a node script of the app and parses the JSON on its last line of output. */
  async runJson<T>(script: string, env: Record<string, string> = {}): Promise<T> {
    const out = await this.exec(process.execPath, [script], env);
    return JSON.parse(out.trim().split('\n').at(-1)!) as T;
  }

  remove(): void {
    rmSync(this.dir, { recursive: true, force: true });
  }
}
