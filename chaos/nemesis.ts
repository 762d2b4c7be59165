import { setTimeout as sleep } from 'node:timers/promises';
import { now, type FaultKind, type HistoryEvent } from './history.js';
import type { ProxyMode } from '../test/support/tcp-proxy.js';
import type { ChaosStore, NetworkLink } from './chaos-store.interface.js';
import type { WorkerPool } from './worker-pool.js';

type Fault = () => Promise<void>;

/**
 * Injects faults one after another for the whole run, each chosen by the seeded generator: which
 * kind, which worker (a holder when there is one), how long. Every fault goes into the history as
 * a start and an end, so the checker can tell which overlaps the guarantees allow.
 */
export class Nemesis {
  private stopped = false;
  private readonly workerKinds: FaultKind[];
  private readonly storeKinds: FaultKind[];

  constructor(
    private readonly pool: WorkerPool,
    private readonly store: ChaosStore,
    private readonly next: () => number,
    private readonly ttl: number,
    /** After a fault of the store, the nemesis rests this long now and then: every key must be free again by its end. */
    private readonly livenessBoundMs = 0,
  ) {
    const workerKinds: FaultKind[] = store.singleProcess
      ? ['stall-event-loop']
      : [
          'kill-worker',
          'pause-worker',
          ...(store.links(pool.ids[0]).length > 0
            ? (['net-delay', 'net-drop', 'net-blackhole-up', 'net-blackhole-down', 'net-late-replay'] as const)
            : []),
        ];
    this.workerKinds = workerKinds;
    this.storeKinds = Object.keys(store.faults) as FaultKind[];
  }

  /** Runs until `stop()`; the fault in progress is finished and healed first. */
  async run(): Promise<void> {
    while (!this.stopped) {
      await sleep(200 + Math.floor(this.next() * this.ttl));
      if (this.stopped) break;
      // Half the faults hit the store, half a worker: the store's few kinds (the ones that lose
      // locks among them) would otherwise be drawn a third as often as the network's.
      const from = this.storeKinds.length > 0 && this.next() < 0.5 ? this.storeKinds : this.workerKinds;
      const kind = from[Math.floor(this.next() * from.length)];
      // A fault that could not be carried out (a failover that never came) is noted, and the run
      // goes on: its window is in the history all the same.
      await this.inject(kind).catch((error: unknown) =>
        this.pool.record({ t: now(), type: 'store', event: 'fault-failed', detail: `${kind}: ${String(error)}` }),
      );
      // Half the faults of the store are followed by a rest as long as the liveness bound: no other
      // fault then excuses a key still blocked at its end.
      if (kind in this.store.faults && this.next() < 0.5) await sleep(this.livenessBoundMs);
    }
  }

  stop(): void {
    this.stopped = true;
  }

  private record(kind: FaultKind, phase: 'start' | 'end', target: string): void {
    this.pool.record({ t: now(), type: 'fault', kind, phase, target } as HistoryEvent);
  }

  private pickWorker(): string {
    const holders = this.pool.holders();
    const from = holders.length > 0 ? holders : this.pool.ids;
    return from[Math.floor(this.next() * from.length)];
  }

  private async inject(kind: FaultKind): Promise<void> {
    const worker = this.pickWorker();
    const span = (min: number, max: number) => Math.floor(min + this.next() * (max - min));
    const around = async (target: string, fault: Fault) => {
      this.record(kind, 'start', target);
      try {
        await fault();
      } finally {
        this.record(kind, 'end', target);
      }
    };
    // One link of the worker's: a Redlock worker cut from one master, or from the whole store.
    const links = this.store.links(worker);
    const link = links.length > 1 ? links[Math.floor(this.next() * links.length)] : links[0];
    const network = `network:${worker}${links.length > 1 ? `/${link?.name}` : ''}`;
    switch (kind) {
      case 'kill-worker':
        return around(worker, () => this.pool.killAndRestart(worker));
      case 'pause-worker':
        // Longer than the ttl: the lease runs out under a holder that cannot know.
        return around(worker, async () => {
          this.pool.signal(worker, 'SIGSTOP');
          await sleep(span(this.ttl * 1.2, this.ttl * 2.5));
          this.pool.signal(worker, 'SIGCONT');
        });
      case 'stall-event-loop':
        // The worker records its own stall, from when it really starts.
        this.pool.send(worker, { stall: span(this.ttl * 0.5, this.ttl * 2) });
        return void (await sleep(this.ttl * 2));
      case 'net-delay':
        return around(network, () => this.withLink(link, { kind: 'delay', ms: span(20, this.ttl) }, span(300, this.ttl * 2)));
      case 'net-drop':
        return around(network, () => this.withLink(link, { kind: 'drop' }, span(300, this.ttl * 2)));
      case 'net-blackhole-up':
        return around(network, () => this.withLink(link, { kind: 'blackhole-up' }, span(300, this.ttl * 2)));
      case 'net-blackhole-down':
        return around(network, () => this.withLink(link, { kind: 'blackhole-down' }, span(300, this.ttl * 2)));
      case 'net-late-replay': {
        // Answers come after the request's deadline; each request runs again that much later.
        const late = this.store.commandTimeout + span(50, this.ttl / 2);
        return around(network, () => this.withLink(link, { kind: 'late-replay', ms: late }, span(300, this.ttl * 2)));
      }
      default: {
        const fault = this.store.faults[kind]!;
        this.record(kind, 'start', this.store.name);
        try {
          await fault({ next: this.next, ttl: this.ttl });
        } finally {
          this.record(kind, 'end', this.store.name);
        }
      }
    }
  }

  private async withLink(link: NetworkLink, mode: ProxyMode, ms: number): Promise<void> {
    for (const proxy of link.proxies) proxy.set(mode);
    await sleep(ms);
    for (const proxy of link.proxies) {
      // A blackholed connection has lost bytes mid-stream: cut it, as a real network would in time.
      if (mode.kind !== 'delay' && mode.kind !== 'late-replay') proxy.set({ kind: 'drop' });
      proxy.set({ kind: 'pass' });
    }
  }
}
