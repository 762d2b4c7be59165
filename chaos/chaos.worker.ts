import 'reflect-metadata';
import { Injectable, Logger, Module, type INestApplicationContext } from '@nestjs/common';
import { NestFactory } from '@nestjs/core';
import { Redis } from 'ioredis';
import { setTimeout as sleep } from 'node:timers/promises';
import { DistributedLockModule, LockService, Locked, type LockBackend, type LockHandle } from '../lib/index.js';
import type { BackendSpec } from './chaos-store.interface.js';
import { FencedRegister } from './fenced-register.js';
import { now, type HistoryEvent } from './history.js';
import { random } from './random.js';
import { STORES } from './store.registry.js';

export interface WorkerConfig {
  id: string;
  incarnation: number;
  backend: BackendSpec;
  registerPort: number;
  keys: number;
  /** Concurrent callers per application context. */
  callers: number;
  ttl: number;
  wait: number;
  /** Longest pause between the read and the write of the register. */
  workMs: number;
  seed: number;
}

/**
 * One process of the run: Nest application contexts (one, or several over one in-memory backend)
 * whose callers loop over @Locked read-modify-writes of a fenced register, printing every step as
 * a JSON line on stdout.
 */
const config = JSON.parse(process.argv[2]) as WorkerConfig;
const next = random(config.seed * 1000 + config.incarnation);
const register = new FencedRegister(new Redis(config.registerPort, '127.0.0.1'));
let stopping = false;

/**
 * How long this process could not run, in ms: the lateness of a ticker's timer, summed. On a
 * machine short of CPU the library's timers fire late too, and a wait's bound is on the time the
 * process had.
 */
let stalledMs = 0;
const TICK_MS = 50;
let lastTick = performance.now();
setInterval(() => {
  const t = performance.now();
  stalledMs += Math.max(0, t - lastTick - TICK_MS);
  lastTick = t;
}, TICK_MS).unref();

function log(event: HistoryEvent): void {
  process.stdout.write(`${JSON.stringify(event)}\n`);
}

/** A deadline as `now()` reads it; the handle gives it on the wall clock. */
function deadlineOf(handle: LockHandle): number {
  return now() + (handle.expiresAt.getTime() - Date.now());
}

type Section = (handle: LockHandle) => Promise<void>;

/**
 * The port of the Redis server the backend's connection is on (with Sentinel, the master it was
 * told of), so an overlap shows whether its two holders locked on one server or on two. Read from
 * the backend's own client: not public API, the harness looks inside.
 */
function serverOf(backend: LockBackend): number | undefined {
  const client = (backend as unknown as { connection?: { client?: { stream?: { remotePort?: number } } } }).connection?.client;
  return client?.stream?.remotePort;
}

@Injectable()
class RegisterWriter {
  constructor(readonly locks: LockService) {}

  @Locked('register:<key>')
  async update(key: string, section: Section): Promise<void> {
    const handle = this.locks.current(`register:${key}`);
    // Undefined when the lease ran out between the acquisition and this line (a stall longer than
    // the ttl): the section must not run, and the history records why.
    if (!handle) throw new Error('the lock was lost before the section started');
    await section(handle);
  }
}

async function caller(writer: RegisterWriter, holder: string, worker: string): Promise<void> {
  while (!stopping) {
    const key = `r${Math.floor(next() * config.keys)}`;
    const base = { holder, worker, key };
    log({ t: now(), type: 'attempt', ...base, waitMs: config.wait });
    // With the lateness of the tick still due, which the timers that ran first have not seen counted.
    const stalledNow = () => stalledMs + Math.max(0, performance.now() - lastTick - TICK_MS);
    const stalledBefore = stalledNow();
    const stalled = () => Math.round(stalledNow() - stalledBefore);
    try {
      await writer.update(key, async (handle) => {
        const token = handle.fencingToken;
        log({
          t: now(),
          type: 'acquired',
          ...base,
          token,
          deadline: deadlineOf(handle),
          server: serverOf(writer.locks.backend),
          stalledMs: stalled(),
        });
        const onLost = () => {
          const reason = (handle.signal.reason as { reason?: string }).reason ?? 'unknown';
          log({ t: now(), type: 'lost', ...base, reason, deadline: deadlineOf(handle) });
        };
        handle.signal.addEventListener('abort', onLost, { once: true });
        try {
          const sentAt = now();
          const value = await register.read(key, token);
          if (value === undefined) {
            log({ t: sentAt, type: 'write', ...base, token, read: -1, wrote: -1, accepted: false });
            return;
          }
          await sleep(Math.floor(next() * config.workMs));
          // What a careful holder does before each write under the lock.
          if (!handle.isHeld) return;
          const writtenAt = now();
          const seq = await register.write(key, token, value + 1);
          log({ t: writtenAt, type: 'write', ...base, token, read: value, wrote: value + 1, accepted: seq !== undefined, seq });
        } finally {
          handle.signal.removeEventListener('abort', onLost);
          // Stamped before the release goes out: the next holder may get the lock (and say so)
          // before this process's code after the release runs.
          log({ t: now(), type: 'released', ...base });
        }
      });
    } catch (error) {
      const name = (error as Error)?.constructor?.name ?? typeof error;
      const message = String((error as Error)?.message ?? error).slice(0, 200);
      log({ t: now(), type: 'error', ...base, error: name, message, stalledMs: stalled() });
    }
    await sleep(Math.floor(next() * 20));
  }
}

async function main(): Promise<void> {
  // Lost locks and reconnections are the point of the run; the history records them.
  Logger.overrideLogger(false);
  const store = await STORES[config.backend.store]();
  const contexts = config.backend.contexts ?? 1;
  const apps: INestApplicationContext[] = [];
  const loops: Promise<void>[] = [];
  for (let i = 0; i < contexts; i++) {
    @Module({
      imports: [
        DistributedLockModule.forRoot({ backend: store.createBackend(config.backend.options), ttl: config.ttl, wait: config.wait }),
      ],
      providers: [RegisterWriter],
    })
    class WorkerModule {}
    const app = await NestFactory.createApplicationContext(WorkerModule, { logger: false });
    app.enableShutdownHooks();
    apps.push(app);
    // Several contexts in one process: several services of one backend, one process to pause.
    const name = contexts > 1 ? `${config.id}.s${i}` : config.id;
    for (let c = 0; c < config.callers; c++) loops.push(caller(app.get(RegisterWriter), `${name}#${config.incarnation}.${c}`, config.id));
  }
  process.on('message', async (message: { stop?: true; stall?: number }) => {
    if (message.stall !== undefined) {
      // A stop-the-world pause of this process (a long GC): nothing runs, timers fire late.
      log({ t: now(), type: 'fault', kind: 'stall-event-loop', phase: 'start', target: config.id });
      const until = Date.now() + message.stall;
      while (Date.now() < until);
      log({ t: now(), type: 'fault', kind: 'stall-event-loop', phase: 'end', target: config.id });
    }
    if (message.stop) {
      stopping = true;
      await Promise.all(loops);
      for (const app of apps) await app.close();
      process.exit(0);
    }
  });
  process.send!('ready');
}

void main();
