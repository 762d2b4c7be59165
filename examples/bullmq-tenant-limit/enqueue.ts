import { Queue } from 'bullmq';
import { connectionOf } from './tenant-exports.module.js';
import { EXPORTS_QUEUE } from './tenant-exports.processor.js';

/** Adds `JOBS` exports (default 10) for each of the tenants named in argv (default acme, globex). */
const tenants = process.argv.slice(2).length > 0 ? process.argv.slice(2) : ['acme', 'globex'];
const count = Number(process.env.JOBS ?? 10);
const queue = new Queue(EXPORTS_QUEUE, { connection: connectionOf(process.env.REDIS_URL ?? 'redis://127.0.0.1:6379') });
await queue.addBulk(tenants.flatMap((tenantId) => Array.from({ length: count }, () => ({ name: 'export', data: { tenantId } }))));
console.log(`added ${count} exports for each of ${tenants.join(', ')}`);
await queue.close();
