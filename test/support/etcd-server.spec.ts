import { afterAll, beforeAll, describe, expect, it } from '@jest/globals';
import { Etcd3 } from 'etcd3';
import { EtcdCluster } from './etcd-server.js';

describe('the test harness etcd', () => {
  let cluster: EtcdCluster;
  beforeAll(async () => {
    cluster = await EtcdCluster.start({ members: 1 });
  }, 60_000);
  afterAll(async () => {
    await cluster?.stop();
  });

  it('runs a member on ports of its own, not 2379/2380, and a member killed and restarted keeps its data', async () => {
    const [member] = cluster.members;
    expect([member.clientPort, member.peerPort]).not.toContain(2379);
    expect([member.clientPort, member.peerPort]).not.toContain(2380);
    const client = new Etcd3({ hosts: cluster.endpoints });
    try {
      await client.put('kept').value('yes');
      expect(await cluster.leader()).toBe(0);
      await member.kill();
      expect(await member.healthy(500)).toBe(false);
      await cluster.restart(0);
      expect(await client.get('kept').string()).toBe('yes');
    } finally {
      client.close();
    }
  });
});
