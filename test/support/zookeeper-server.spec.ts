import { afterAll, beforeAll, describe, expect, it } from '@jest/globals';
import { fourLetterWord, ZooKeeperServer } from './zookeeper-server.js';

describe('the test harness ZooKeeper', () => {
  let ensemble: ZooKeeperServer;
  beforeAll(async () => {
    ensemble = await ZooKeeperServer.startEnsemble();
  }, 90_000);
  afterAll(async () => {
    await ensemble?.stop();
  });

  it('runs three servers on ports of its own that elect one leader, and elects another when it is killed', async () => {
    expect(ensemble.ports).toHaveLength(3);
    expect(ensemble.ports).not.toContain(2181);
    expect(await fourLetterWord(ensemble.ports[0], 'ruok')).toBe('imok');
    const leader = await ensemble.leader();
    expect(leader).toBeDefined();
    await ensemble.kill(leader!);
    await ensemble.ready();
    const next = await ensemble.leader();
    expect(next).toBeDefined();
    expect(next).not.toBe(leader);
    await ensemble.restart(leader!);
  }, 90_000);
});
