import type { Etcd3, ITxnRequest } from 'etcd3';

/** The client calls a gate can hold: the ones the etcd backend makes. */
type Service = 'kv' | 'leaseClient';

/** A call the gate caught: what it was asked, and the step that lets it go on. */
export interface HeldCall<T = unknown> {
  /** Resolves once a matching call came, with its request; rejects if none came within 15 s. */
  readonly caught: Promise<T>;
  /** Lets the call reach etcd now; resolves with etcd's answer (or rejects with its error). */
  send(): Promise<unknown>;
}

interface Trap {
  service: Service;
  method: string;
  match: (request: never) => boolean;
  /**
   * 'late': the caller is told at once that the call timed out, and etcd gets it on send().
   * 'slow': sent and answered on send(). 'twice': sent at once and again after its answer, as by
   * a client that retries a call whose answer it lost; the caller gets the second answer.
   */
  mode: 'late' | 'slow' | 'twice';
  /** Called with the request and the call as it will go out on send(). */
  caught: (request: unknown, call: Promise<unknown>) => void;
  go: Promise<void>;
}

/**
 * Holds chosen calls of an etcd3 client on their way to etcd, to play a network that delays one
 * request and not the next: a call that is 'late' fails at once on the client as a gRPC timeout
 * (DEADLINE_EXCEEDED, what a deadline that passed looks like) and reaches etcd only when the test
 * sends it, after the requests that followed it; a 'slow' call is sent then and answered then.
 * The etcd is real; only the order in which it sees the requests is the test's.
 */
export class EtcdRequestGate {
  private readonly traps: Trap[] = [];
  /** Lets every call held so far go on, for the end of a test. */
  private readonly releases: (() => void)[] = [];

  constructor(client: Etcd3) {
    this.wrap(client.kv as unknown as Methods, 'kv', 'txn');
    for (const method of ['leaseRevoke', 'leaseGrant']) this.wrap(client.leaseClient as unknown as Methods, 'leaseClient', method);
  }

  /** The next transaction `match` picks times out on the client and reaches etcd on send(). */
  lateTxn(match: (request: ITxnRequest) => boolean): HeldCall<ITxnRequest> {
    return this.trap('kv', 'txn', 'late', match);
  }

  /** The next call of `method` that `match` picks times out on the client and reaches etcd on send(). */
  late<T>(service: Service, method: string, match: (request: T) => boolean): HeldCall<T> {
    return this.trap(service, method, 'late', match);
  }

  /** The next transaction `match` picks runs twice; the caller gets the second answer. */
  twiceTxn(match: (request: ITxnRequest) => boolean): HeldCall<ITxnRequest> {
    const held = this.trap('kv', 'txn', 'twice', match);
    void held.send();
    return held;
  }

  /** The next call of `method` that `match` picks is sent (and answered) only on send(). */
  slow<T>(service: Service, method: string, match: (request: T) => boolean): HeldCall<T> {
    return this.trap(service, method, 'slow', match);
  }

  private trap<T>(service: Service, method: string, mode: Trap['mode'], match: (request: T) => boolean): HeldCall<T> {
    let go!: () => void;
    let caught!: (held: { request: T; call: Promise<unknown> }) => void;
    const held = new Promise<{ request: T; call: Promise<unknown> }>((resolve) => (caught = resolve));
    this.traps.push({
      service,
      method,
      mode,
      match: match as (request: never) => boolean,
      caught: (request, call) => caught({ request: request as T, call }),
      go: new Promise<void>((resolve) => (go = resolve)),
    });
    this.releases.push(go);
    let timer: NodeJS.Timeout | undefined;
    const late = new Promise<never>((_, reject) => {
      timer = setTimeout(() => reject(new Error(`no ${service}.${method} call to hold came within 15 s`)), 15_000);
    });
    const caughtInTime = Promise.race([held.then(({ request }) => request), late]).finally(() => clearTimeout(timer));
    caughtInTime.catch(() => undefined);
    return {
      caught: caughtInTime,
      send: async () => {
        go();
        return (await held).call;
      },
    };
  }

  /** Lets every held call go on, and holds no more: the test is over. */
  open(): void {
    this.traps.length = 0;
    for (const go of this.releases) go();
  }

  private wrap(target: Methods, service: Service, method: string): void {
    const original = target[method].bind(target);
    target[method] = (request: unknown, ...rest: unknown[]) => {
      const index = this.traps.findIndex((t) => t.service === service && t.method === method && t.match(request as never));
      if (index < 0) return original(request, ...rest);
      const [trap] = this.traps.splice(index, 1);
      // Its deadline was set when it was asked: etcd gets it later, without one.
      const call = trap.go.then(() => original(request));
      call.catch(() => undefined);
      trap.caught(request, call);
      if (trap.mode === 'twice') return call.then(() => original(request, ...rest));
      if (trap.mode === 'slow') return call;
      return Promise.reject(new Error('4 DEADLINE_EXCEEDED: Deadline exceeded (held back by the test)'));
    };
  }
}

type Methods = Record<string, (...args: unknown[]) => Promise<unknown>>;

/** The first attempt of an acquisition: every line must be empty (create revision 0). */
export function isFirstAttempt(request: ITxnRequest): boolean {
  return request.compare?.some((c) => c.target === 'Create' && c.result === 'Equal' && Number(c.create_revision) === 0) === true;
}

/** Whether a transaction is about the lock key `key` (as the backend writes it, under any prefix). */
export function names(request: ITxnRequest, key: string): boolean {
  const needle = `/${key.replace(/%/g, '%25').replace(/\//g, '%2F')}/`;
  const ops = (request.success ?? []).map((op) => op.request_put ?? op.request_range ?? op.request_delete_range ?? {});
  return [...(request.compare ?? []), ...ops].some(
    (part) => 'key' in part && part.key !== undefined && Buffer.from(part.key).toString().includes(needle),
  );
}

/** A waiter's attempt to take its keys: it puts held entries when it is first in every line. */
export function isPromotion(request: ITxnRequest): boolean {
  return request.compare?.some((c) => c.target === 'Create' && c.result === 'Greater') === true && (request.success?.length ?? 0) > 0;
}

/** An extension with another ttl: the entries move to another lease if still on the old one. */
export function isLeaseMove(request: ITxnRequest): boolean {
  return request.compare?.some((c) => c.target === 'Lease') === true;
}

/** A release's deletion of its owner's entries. */
export function isDeletion(request: ITxnRequest): boolean {
  return !request.compare?.length && (request.success?.length ?? 0) > 0 && request.success!.every((op) => op.request_delete_range);
}
