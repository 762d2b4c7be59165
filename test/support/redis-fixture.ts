import { afterAll, afterEach, beforeAll } from '@jest/globals';
import { Redis } from 'ioredis';
import { RedisServer } from './redis-server.js';

/** What a test file gets from useRedisServer(). */
export interface RedisFixture {
  /** The file's own redis-server, started once for the file. */
  readonly server: RedisServer;
  /** A plain client of that server (connected on first use), for looking at keys and for FLUSHALL. */
  readonly admin: Redis;
  /**
   * Runs `step` after the current test, before the server is emptied; steps run last-first, and a
   * failing one fails the test without stopping the others.
   */
  cleanup(step: () => unknown): void;
}

/**
 * One redis-server for the calling test file (started in beforeAll, stopped in afterAll). After
 * each test the cleanup steps run, then the server is emptied (`flush: false` keeps its data) and
 * resumed if a test paused it.
 */
export function useRedisServer(options: { flush?: boolean } = {}): RedisFixture {
  let server: RedisServer | undefined;
  let admin: Redis | undefined;
  const steps: (() => unknown)[] = [];

  beforeAll(async () => {
    server = await RedisServer.start();
  });
  afterEach(async () => {
    server?.resume();
    // Every step runs even if one fails (it must not leave the others' connections open); the
    // first failure then fails the test.
    let failure: { error: unknown } | undefined;
    while (steps.length > 0) {
      try {
        await steps.pop()!();
      } catch (error) {
        failure ??= { error };
      }
    }
    if (options.flush !== false) await fixture.admin.flushall();
    if (failure) throw failure.error;
  });
  afterAll(async () => {
    admin?.disconnect();
    await server?.stop();
  });

  const fixture: RedisFixture = {
    get server() {
      if (!server) throw new Error('useRedisServer(): the server starts in beforeAll; use it inside a test or hook');
      return server;
    },
    get admin() {
      admin ??= new Redis(fixture.server.port, '127.0.0.1');
      return admin;
    },
    cleanup(step) {
      steps.push(step);
    },
  };
  return fixture;
}
