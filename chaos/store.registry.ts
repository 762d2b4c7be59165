import type { ChaosStoreModule } from './chaos-store.interface.js';

/**
 * The stores `npm run chaos -- --backend <name>` knows. A new store is one file in chaos/stores/
 * (see docs/reliability.md) and one line here. Loaded on demand, so a run needs only the drivers
 * of the stores it runs.
 */
export const STORES: Record<string, () => Promise<ChaosStoreModule>> = {
  memory: () => import('./stores/memory.store.js'),
  redis: () => import('./stores/redis.store.js'),
  sentinel: () => import('./stores/sentinel.store.js'),
  redlock: () => import('./stores/redlock.store.js'),
  postgres: () => import('./stores/postgres.store.js'),
  mysql: () => import('./stores/mysql.store.js'),
  cluster: () => import('./stores/cluster.store.js'),
  etcd: () => import('./stores/etcd.store.js'),
  zookeeper: () => import('./stores/zookeeper.store.js'),
};
