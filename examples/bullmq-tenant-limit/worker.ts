import { NestFactory } from '@nestjs/core';
import { TenantExportsModule } from './tenant-exports.module.js';

/** One worker process: `REDIS_URL=redis://127.0.0.1:6379 node worker.js`. Start as many as you like. */
const app = await NestFactory.createApplicationContext(
  TenantExportsModule.forRoot({ redisUrl: process.env.REDIS_URL ?? 'redis://127.0.0.1:6379' }),
);
// SIGTERM (Ctrl-C): the worker finishes its running jobs, then the module releases their permits.
app.enableShutdownHooks();
console.log(`worker ${process.pid} running`);
