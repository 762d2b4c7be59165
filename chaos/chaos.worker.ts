import 'reflect-metadata';
import { Logger, Module, type INestApplicationContext } from '@nestjs/common';
import { NestFactory } from '@nestjs/core';
import { Redis } from 'ioredis';
import { setTimeout as sleep } from 'node:timers/promises';
import { DistributedLockModule, type LockBackend, type LockService } from '../lib/index.js';
import type { BackendSpec } from './chaos-store.interface.js';
import { FencedRegister } from './fenced-register.js';
import { now, type HistoryEvent } from './history.js';
import { random } from './random.js';
import { STORES } from './store.registry.js';
import { oneCall, registerWriter, type CallContext } from './worker-calls.js';

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
  /** Longest pause between the read and the write of the register, and between two rounds. */
  workMs: number;
  seed: number;
  /** Off (`--no-fencing`): the register takes stale writes and holders never check their lock. */
  fencing: boolean;
}

/**
 * One process of the run: Nest application contexts (one, or several over one in-memory backend)
 * whose callers loop over calls under a lock (worker-calls.ts) doing read-modify-writes of a
 * fenced register, printing every step as a JSON line on stdout.
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

/** How long this process could not run since `since` (a reading of this function, or 0), with the lateness of the tick still due. */
function stalledSince(since: number): number {
  return stalledMs + Math.max(0, performance.now() - lastTick - TICK_MS) - since;
}

/**
 * The port of the Redis server the backend's connection is on (with Sentinel, the master it was
 * told of), so an overlap shows whether its two holders locked on one server or on two. Read from
 * the backend's own client: not public API, the harness looks inside.
 */
function serverOf(backend: LockBackend): number | undefined {
  const client = (backend as unknown as { connection?: { client?: { stream?: { remotePort?: number } } } }).connection?.client;
  return client?.stream?.remotePort;
}

/** How long each cold key is the one in use; four take turns, so each rests three times this. */
const COLD_TURN_MS = 2_500;

/**
 * The keys of one call: a hot key (`r0`..), two of them for a multi-key call, or now and then the
 * cold key whose turn it is. A cold key rests long enough (7.5 s) for a store to forget its line
 * (ZooKeeper deletes a parent node left empty 5 s) and make it again on its next turn, so tokens
 * are checked across a line made twice.
 */
function drawKeys(): string[] {
  if (next() < 0.1) return [`c${Math.floor(now() / COLD_TURN_MS) % 4}`];
  const first = Math.floor(next() * config.keys);
  if (config.keys < 2) return [`r${first}`];
  const second = (first + 1 + Math.floor(next() * (config.keys - 1))) % config.keys;
  return [`r${first}`, `r${second}`].sort();
}

async function caller(writer: { locks: LockService }, holder: string, worker: string): Promise<void> {
  const ctx: CallContext = {
    ttl: config.ttl,
    wait: config.wait,
    workMs: config.workMs,
    fencing: config.fencing,
    register,
    next,
    log,
    stalledSince,
    server: () => serverOf(writer.locks.backend),
    // A backend that cannot hold a key for several holders yet runs exclusive calls only.
    shared: writer.locks.backend.sharedHolders === true,
  };
  while (!stopping) {
    const keys = drawKeys();
    // A single-key call takes the first of two drawn keys at random.
    if (keys.length > 1 && next() < 0.5) keys.reverse();
    await oneCall(ctx, writer, holder, worker, keys);
    await sleep(Math.floor(next() * 20));
  }
}

/**
 * How long a waiter's place outlives its last request, on backends that keep a line: 1.5 ttl,
 * so a place left by a worker killed, paused or cut off while it waited goes within the liveness
 * bound the checker holds every key to (ttl plus the store's recovery, after the fault), as a
 * lock it left does. The backends' default (3 s) is longer than that bound; a waiter asks again
 * at least every pollInterval (500 ms), well within it.
 */
function waiterTimeout(ttl: number): number {
  return Math.max(1_000, 1.5 * ttl);
}

async function main(): Promise<void> {
  // Lost locks and reconnections are the point of the run; the history records them.
  Logger.overrideLogger(false);
  const store = await STORES[config.backend.store]();
  const contexts = config.backend.contexts ?? 1;
  const apps: INestApplicationContext[] = [];
  const loops: Promise<void>[] = [];
  for (let i = 0; i < contexts; i++) {
    const backend = store.createBackend(config.backend.options, waiterTimeout(config.ttl));
    @Module({
      imports: [DistributedLockModule.forRoot({ backend, ttl: config.ttl, wait: config.wait })],
      // The shared-lock and semaphore methods only on a backend that holds them: on any other, a
      // @Locked method that asks for them stops the application at start-up.
      providers: [{ provide: 'writer', useClass: registerWriter(config.ttl, backend.sharedHolders === true) }],
    })
    class WorkerModule {}
    const app = await NestFactory.createApplicationContext(WorkerModule, { logger: false });
    app.enableShutdownHooks();
    apps.push(app);
    // Several contexts in one process: several services of one backend, one process to pause.
    const name = contexts > 1 ? `${config.id}.s${i}` : config.id;
    for (let c = 0; c < config.callers; c++) loops.push(caller(app.get('writer'), `${name}#${config.incarnation}.${c}`, config.id));
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
