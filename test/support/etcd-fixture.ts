import { afterAll, afterEach, beforeAll } from '@jest/globals';
import { Etcd3 } from 'etcd3';
import { EtcdCluster } from './etcd-server.js';

/** What a test file gets from useEtcdCluster(). */
export interface EtcdFixture {
  /** The file's own etcd cluster, started once for the file. */
  readonly cluster: EtcdCluster;
  /** Every member's client URL. */
  readonly endpoints: string[];
  /** A client of every member (opened on first use), for looking at keys and compacting. */
  readonly admin: Etcd3;
  /**
   * Runs `step` after the current test; steps run last-first, and a failing one fails the test
   * without stopping the others.
   */
  cleanup(step: () => unknown): void;
}

/**
 * One etcd cluster of `members` members for the calling test file (started in beforeAll, stopped
 * in afterAll). After each test the cleanup steps run, every member a test paused resumes, and
 * every key is deleted (`wipe: false` keeps them).
 */
export function useEtcdCluster(options: { members?: number; wipe?: boolean } = {}): EtcdFixture {
  let cluster: EtcdCluster | undefined;
  let admin: Etcd3 | undefined;
  const steps: (() => unknown)[] = [];

  beforeAll(async () => {
    cluster = await EtcdCluster.start({ members: options.members ?? 1 });
  }, 60_000);
  afterEach(async () => {
    for (const member of cluster?.members ?? []) member.resume();
    let failure: { error: unknown } | undefined;
    while (steps.length > 0) {
      try {
        await steps.pop()!();
      } catch (error) {
        failure ??= { error };
      }
    }
    if (options.wipe !== false && cluster?.members.every((member) => member.running)) await fixture.admin.delete().all();
    if (failure) throw failure.error;
  }, 60_000);
  afterAll(async () => {
    admin?.close();
    await cluster?.stop();
  });

  const fixture: EtcdFixture = {
    get cluster() {
      if (!cluster) throw new Error('useEtcdCluster(): the cluster starts in beforeAll; use it inside a test or hook');
      return cluster;
    },
    get endpoints() {
      return fixture.cluster.endpoints;
    },
    get admin() {
      admin ??= new Etcd3({ hosts: fixture.endpoints });
      return admin;
    },
    cleanup(step) {
      steps.push(step);
    },
  };
  return fixture;
}
