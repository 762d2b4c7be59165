import { fork, type ChildProcess } from 'node:child_process';
import { createWriteStream, type WriteStream } from 'node:fs';
import { createInterface } from 'node:readline';
import type { BackendSpec } from './chaos-store.interface.js';
import type { WorkerConfig } from './chaos.worker.js';
import type { HistoryEvent } from './history.js';

const workerScript = new URL('./chaos.worker.js', import.meta.url);

interface Slot {
  id: string;
  incarnation: number;
  child?: ChildProcess;
  /** Holders of this worker inside a section. */
  holding: Set<string>;
}

/** The worker processes of a run, the history they print, and who holds a lock right now. */
export class WorkerPool {
  readonly history: HistoryEvent[] = [];
  private readonly slots = new Map<string, Slot>();
  private readonly file: WriteStream;

  constructor(
    private readonly base: Omit<WorkerConfig, 'id' | 'incarnation' | 'backend'>,
    private readonly backendOf: (worker: string) => BackendSpec,
    historyFile: string,
  ) {
    this.file = createWriteStream(historyFile);
  }

  get ids(): string[] {
    return [...this.slots.keys()];
  }

  /** Workers with a holder inside a section now; the nemesis likes to hit those. */
  holders(): string[] {
    return [...this.slots.values()].filter((slot) => slot.holding.size > 0).map((slot) => slot.id);
  }

  pid(id: string): number | undefined {
    return this.slots.get(id)?.child?.pid;
  }

  async start(ids: readonly string[]): Promise<void> {
    for (const id of ids) this.slots.set(id, { id, incarnation: 0, holding: new Set() });
    await Promise.all(ids.map((id) => this.launch(this.slots.get(id)!)));
  }

  record(event: HistoryEvent): void {
    this.history.push(event);
    this.file.write(`${JSON.stringify(event)}\n`);
    if (!('worker' in event)) return;
    const slot = this.slots.get(event.worker);
    if (event.type === 'acquired') slot?.holding.add(event.holder);
    if (event.type === 'released' || event.type === 'error' || event.type === 'lost') slot?.holding.delete(event.holder);
  }

  /** SIGKILL, then a new process in its place once the old one is gone. */
  async killAndRestart(id: string): Promise<void> {
    const slot = this.slots.get(id)!;
    const child = slot.child;
    if (child && child.exitCode === null && child.signalCode === null) {
      const exited = new Promise((resolve) => child.once('exit', resolve));
      child.kill('SIGKILL');
      await exited;
    }
    slot.holding.clear();
    slot.incarnation++;
    await this.launch(slot);
  }

  signal(id: string, signal: 'SIGSTOP' | 'SIGCONT'): void {
    this.slots.get(id)?.child?.kill(signal);
  }

  send(id: string, message: object): void {
    this.slots.get(id)?.child?.send(message);
  }

  /** Asks every worker to finish its sections and exit; kills those that do not within `timeoutMs`. */
  async stop(timeoutMs = 20_000): Promise<void> {
    await Promise.all(
      [...this.slots.values()].map(async (slot) => {
        const child = slot.child;
        if (!child || child.exitCode !== null || child.signalCode !== null) return;
        const exited = new Promise((resolve) => child.once('exit', resolve));
        child.kill('SIGCONT');
        child.send({ stop: true });
        const timer = setTimeout(() => child.kill('SIGKILL'), timeoutMs);
        await exited;
        clearTimeout(timer);
      }),
    );
    await new Promise((resolve) => this.file.end(resolve));
  }

  private async launch(slot: Slot): Promise<void> {
    const config: WorkerConfig = { ...this.base, id: slot.id, incarnation: slot.incarnation, backend: this.backendOf(slot.id) };
    const child = fork(workerScript, [JSON.stringify(config)], { stdio: ['ignore', 'pipe', 'inherit', 'ipc'] });
    slot.child = child;
    createInterface({ input: child.stdout! }).on('line', (line) => {
      if (line.startsWith('{')) this.record(JSON.parse(line) as HistoryEvent);
    });
    await new Promise<void>((resolve, reject) => {
      child.once('message', () => resolve());
      child.once('exit', (code, signal) => reject(new Error(`worker ${slot.id} exited (${code ?? signal}) before it was ready`)));
    });
  }
}
