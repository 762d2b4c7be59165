import { afterEach, describe, expect, it } from '@jest/globals';
import { spawn, type ChildProcessWithoutNullStreams } from 'node:child_process';
import { dirname, join } from 'node:path';
import { createInterface } from 'node:readline';
import { fileURLToPath } from 'node:url';

const fixture = join(dirname(fileURLToPath(import.meta.url)), '..', 'fixtures', 'graphql-mercurius-app.mjs');

/**
 * The app runs in a process of its own (see the fixture for why), built from dist/ by
 * `npm run pretest`. It answers each command line with one line.
 */
class MercuriusApp {
  private readonly lines: AsyncIterator<string>;

  private constructor(private readonly child: ChildProcessWithoutNullStreams) {
    this.lines = createInterface({ input: child.stdout })[Symbol.asyncIterator]();
  }

  static async start(): Promise<{ app: MercuriusApp; port: number }> {
    const app = new MercuriusApp(spawn(process.execPath, [fixture], { stdio: 'pipe' }));
    running.push(app);
    const { port } = JSON.parse(await app.next()) as { port: number };
    return { app, port };
  }

  async next(): Promise<string> {
    const { value, done } = await this.lines.next();
    if (done) throw new Error(`the Mercurius app exited (${this.child.exitCode}) before answering`);
    return value;
  }

  async command(line: string): Promise<string> {
    this.child.stdin.write(`${line}\n`);
    return this.next();
  }

  async stop(): Promise<void> {
    const exited = new Promise((resolve) => this.child.once('exit', resolve));
    this.child.stdin.end();
    await exited;
  }
}

const running: MercuriusApp[] = [];
afterEach(async () => {
  await Promise.all(running.splice(0).map((app) => app.stop()));
});

async function post(port: number, query: string) {
  const response = await fetch(`http://127.0.0.1:${port}/graphql`, {
    method: 'POST',
    headers: { 'content-type': 'application/json' },
    body: JSON.stringify({ query }),
  });
  return (await response.json()) as {
    data?: unknown;
    errors?: Array<{ message: string; path?: string[]; extensions?: Record<string, unknown> }>;
  };
}

describe('a busy lock over GraphQL (Mercurius on Fastify), with a real HTTP request', () => {
  it('is an error with extensions.code LOCK_CONFLICT and the retry hint', async () => {
    const { app, port } = await MercuriusApp.start();
    expect(await post(port, 'mutation { pay(id: "1") }')).toEqual({ data: { pay: 'paid 1' } });

    expect(await app.command('hold')).toBe('held');
    const busy = await post(port, 'mutation { pay(id: "1") }');
    const { errors } = JSON.parse(await app.command('release')) as { errors: string[] };

    expect(busy.errors).toEqual([
      expect.objectContaining({
        path: ['pay'],
        extensions: { code: 'LOCK_CONFLICT', statusCode: 409, error: 'Conflict', keys: ['lock:order:1'], retryAfterMs: expect.any(Number) },
      }),
    ]);
    expect(busy.errors?.[0].message).toMatch(/^Lock not acquired: lock:order:1/);
    // A busy lock is the client's to retry, not the app's failure: nothing logged as an error.
    expect(errors).toEqual([]);
  });
});
