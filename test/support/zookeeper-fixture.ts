import { afterAll, afterEach, beforeAll } from '@jest/globals';
import { ZooKeeperServer, type ZooKeeperServerOptions } from './zookeeper-server.js';

/** What a test file gets from useZooKeeper(). */
export interface ZooKeeperFixture {
  /** The file's own ZooKeeper (one server or three), started once for the file. */
  readonly server: ZooKeeperServer;
  /** Its connection string. */
  readonly connectionString: string;
  /** A lock root of the current test's own, so tests never see each other's lines. */
  readonly root: string;
  /** Runs `step` after the current test; steps run last-first, and a failing one fails the test without stopping the others. */
  cleanup(step: () => unknown): void;
}

/**
 * One ZooKeeper for the calling test file (a JVM starts in about a second, an ensemble elects in
 * a few): started in beforeAll, stopped in afterAll. Each test gets a lock root of its own.
 */
export function useZooKeeper(options: ZooKeeperServerOptions & { ensemble?: boolean } = {}): ZooKeeperFixture {
  let server: ZooKeeperServer | undefined;
  let test = 0;
  const steps: (() => unknown)[] = [];

  beforeAll(async () => {
    server = options.ensemble ? await ZooKeeperServer.startEnsemble(options) : await ZooKeeperServer.start(options);
  }, 90_000);
  afterEach(async () => {
    test++;
    let failure: { error: unknown } | undefined;
    while (steps.length > 0) {
      try {
        await steps.pop()!();
      } catch (error) {
        failure ??= { error };
      }
    }
    if (failure) throw failure.error;
  }, 30_000);
  afterAll(async () => {
    await server?.stop();
  });

  const fixture: ZooKeeperFixture = {
    get server() {
      if (!server) throw new Error('useZooKeeper(): the server starts in beforeAll; use it inside a test or hook');
      return server;
    },
    get connectionString() {
      return fixture.server.connectionString;
    },
    get root() {
      return `/test-${process.pid}-${test}`;
    },
    cleanup(step) {
      steps.push(step);
    },
  };
  return fixture;
}
