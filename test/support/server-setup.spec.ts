import { describe, expect, it } from '@jest/globals';
import { readdirSync, readFileSync } from 'node:fs';
import { MariadbServer } from './mariadb-server.js';
import { PostgresServer } from './postgres-server.js';

/** The names (as /proc shows them, 15 characters at most) of this process's children now. */
function childNames(): string[] {
  const names: string[] = [];
  for (const entry of readdirSync('/proc')) {
    if (!/^\d+$/.test(entry)) continue;
    try {
      // "pid (comm) state ppid ...": the name may hold spaces and parentheses, the rest follows the last ')'.
      const stat = readFileSync(`/proc/${entry}/stat`, 'utf8');
      const close = stat.lastIndexOf(')');
      if (Number(stat.slice(close + 2).split(' ')[1]) === process.pid) names.push(stat.slice(stat.indexOf('(') + 1, close));
    } catch {
      // Gone meanwhile.
    }
  }
  return names;
}

/**
 * A chaos run with `--jobs 2` starts one store's servers while another run's workers reach their
 * store through proxies in the same process. A set-up command run synchronously (initdb,
 * mariadb-install-db) stops those proxies for its whole run: the other store looks frozen with no
 * fault injected, and its keys blocked past the liveness bound.
 */
describe('the test harness servers', () => {
  it.each([
    ['PostgreSQL', 'initdb', () => PostgresServer.start()],
    ['MariaDB', 'mariadb-install', () => MariadbServer.start()],
  ])(
    '%s runs its set-up command while this process goes on serving others',
    async (_store, command, start) => {
      const seen = new Set<string>();
      const timer = setInterval(() => {
        for (const name of childNames()) seen.add(name);
      }, 5);
      try {
        const server = await start();
        await server.stop();
      } finally {
        clearInterval(timer);
      }
      expect([...seen]).toContain(command);
    },
    60_000,
  );
});
