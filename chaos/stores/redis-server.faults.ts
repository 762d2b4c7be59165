import { Redis } from 'ioredis';
import { rmSync } from 'node:fs';
import { join } from 'node:path';
import { setTimeout as sleep } from 'node:timers/promises';
import type { RedisServer } from '../../test/support/redis-server.js';
import type { FaultKind } from '../history.js';
import type { StoreFault } from '../chaos-store.interface.js';

/** How long a Redis command of a worker may take before it fails. */
export const REDIS_COMMAND_TIMEOUT = 500;

/** Lets the harness send `DEBUG SLEEP`; redis-server refuses DEBUG unless started with it. */
export const DEBUG_ARGS = ['--enable-debug-command', 'yes'];

/** A client of the harness to a server it restarts: its connection errors are expected. */
export function adminClient(port: number): Redis {
  return new Redis(port, '127.0.0.1', { maxRetriesPerRequest: null }).on('error', () => undefined);
}

/** Faults of one redis-server the harness owns: restarts, stalls and freezes. */
export function redisServerFaults(server: () => RedisServer, admin: () => Redis, name: string): Partial<Record<FaultKind, StoreFault>> {
  return {
    'restart-store-empty': async () => {
      rmSync(join(server().dir, 'dump.rdb'), { force: true });
      await server().restart();
      return name;
    },
    'restart-store-snapshot': async ({ next, ttl }) => {
      await admin().call('SAVE');
      // Locks taken after the snapshot are the ones the restart forgets.
      await sleep(Math.floor(next() * ttl));
      await server().restart();
      return name;
    },
    'store-sleep': async ({ next, ttl }) => {
      const seconds = (0.2 + next() * 1.5 * (ttl / 1000)).toFixed(2);
      await admin()
        .call('DEBUG', 'SLEEP', seconds)
        .catch(() => undefined);
      return name;
    },
    'pause-store': async ({ next, ttl }) => {
      server().pause();
      await sleep(100 + Math.floor(next() * ttl * 1.5));
      server().resume();
      return name;
    },
  };
}
