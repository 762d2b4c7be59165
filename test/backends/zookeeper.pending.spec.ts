import { describe, expect, it } from '@jest/globals';
import { fork } from 'node:child_process';
import { once } from 'node:events';
import { resolve } from 'node:path';
import type { AcquireResult } from '../../lib/backends/lock-backend.interface.js';
import { ZooKeeperLockBackend } from '../../lib/backends/zookeeper/zookeeper.backend.js';
import type { ZooKeeperOp } from '../../lib/backends/zookeeper/zookeeper.client.js';
import { until } from '../support/wait.js';
import { tappedClients, type ZooKeeperTaps } from '../support/zookeeper-client-tap.js';
import { useZooKeeper } from '../support/zookeeper-fixture.js';
import { previousRelease } from '../support/previous-release.js';

/**
 * Pending nodes (zookeeper.pending.ts): a waiting caller of several keys has a node in the line of
 * each, those after the line that keeps it out pending. A caller that enters past one deletes it
 * at the version it read; the pending caller then starts over with a new token.
 */
const fixture = useZooKeeper();
let run = 0;

/** A backend of its own (a session, as another process). */
function process(taps?: ZooKeeperTaps): ZooKeeperLockBackend {
  const options = { root: fixture.root, sessionTimeout: 4_000, commandTimeout: 10_000 };
  const backend = taps
    ? new ZooKeeperLockBackend(fixture.connectionString, options, tappedClients(fixture.connectionString, 4_000, taps))
    : new ZooKeeperLockBackend(fixture.connectionString, options);
  fixture.cleanup(() => backend.close());
  return backend;
}

function keys(): [string, string] {
  run++;
  return [`pending${run}:a`, `pending${run}:b`];
}

const take = async (backend: ZooKeeperLockBackend, keys: string[], owner: string) => backend.tryAcquire(keys, owner, 60_000);
const token = (result: { acquired: boolean; fencingToken?: number }) => (result.acquired ? result.fencingToken : undefined);

describe('ZooKeeper pending nodes', () => {
  it("a caller that enters past a pending node deletes it, and the pending caller starts over with a token above the passer's", async () => {
    const [a, b] = keys();
    const [g, x, h] = [process(), process(), process()];
    expect((await take(g, [a], 'g')).acquired).toBe(true);
    // x waits for a behind g: pending in b.
    expect((await take(x, [a, b], 'x')).acquired).toBe(false);
    expect((await h.inspect(a))?.waiters?.map((w) => w.owner)).toEqual(['x']);
    // h takes b past x's pending node, which goes.
    const passer = await take(h, [b], 'h');
    expect(passer.acquired).toBe(true);
    expect((await g.inspect(b))?.waiters).toEqual([]);
    await h.release([b], 'h');
    await g.release([a], 'g');
    let both: number | undefined;
    await until(async () => (both = token(await take(x, [a, b], 'x'))) !== undefined, 10_000, 'x to take both keys');
    expect(both!).toBeGreaterThan(token(passer)!);
    await x.release([a, b], 'x');
  }, 30_000);

  it('a pending node that turned waiting between a look and the write that deletes it stays: the passer looks again and waits', async () => {
    const [a, b] = keys();
    let hold: Promise<void> | undefined;
    let held = false;
    const h = process({
      multi: async (ops: readonly ZooKeeperOp[], send) => {
        if (hold && ops.some((op) => op.op === 'remove')) {
          held = true;
          await hold;
        }
        return send();
      },
    });
    const [g, x] = [process(), process()];
    expect((await take(g, [a], 'g')).acquired).toBe(true);
    expect((await take(x, [a, b], 'x')).acquired).toBe(false);
    let open!: () => void;
    hold = new Promise((resolve) => (open = resolve));
    // h looked, found only x's pending node ahead, and its write (with the delete) is held back.
    const passer = take(h, [b], 'h');
    await until(() => held, 10_000, "h's write to be held back");
    // Meanwhile x is in on a, and so on b: its node there turns held.
    await g.release([a], 'g');
    expect((await take(x, [a, b], 'x')).acquired).toBe(true);
    hold = undefined;
    open();
    expect((await passer).acquired).toBe(false);
    expect((await g.inspect(b))?.holders?.map((holder) => holder.owner)).toEqual(['x']);
    await x.release([a, b], 'x');
    await h.release([b], 'h');
  }, 30_000);

  it('a waiter of one key behind a pending node does not take the key without a look when the node ahead of the pending one goes', async () => {
    const [a, b] = keys();
    const [g, h, x, r] = [process(), process(), process(), process()];
    expect((await take(g, [a], 'g')).acquired).toBe(true);
    expect((await take(h, [b], 'h')).acquired).toBe(true);
    expect((await take(x, [a, b], 'x')).acquired).toBe(false);
    // b's line: h, x (pending), r. r waits for h, the nearest node that counts.
    let woken = false;
    const stop = await r.watch([b], () => (woken = true), 'r');
    expect((await take(r, [b], 'r')).acquired).toBe(false);
    // x is in on a now, and waits in b's line: its node there turns waiting, ahead of r.
    await g.release([a], 'g');
    expect((await take(x, [a, b], 'x')).acquired).toBe(false);
    await h.release([b], 'h');
    await until(() => woken, 10_000, 'r to be woken by the release of b');
    expect((await take(r, [b], 'r')).acquired).toBe(false);
    expect((await take(x, [a, b], 'x')).acquired).toBe(true);
    stop();
    await x.release([a, b], 'x');
    await r.release([b], 'r');
  }, 30_000);

  it('a waiter of one key told that the node it watches went in does not take the key without a look when a pending node stands between them', async () => {
    const [a, b] = keys();
    const [g, h, y, x, r] = [process(), process(), process(), process(), process()];
    const who = { holder: { instance: 'y' } };
    expect((await take(g, [a], 'g')).acquired).toBe(true);
    expect((await take(h, [b], 'h')).acquired).toBe(true);
    // b's line: h, y, x (pending), r. r watches y, the nearest node that counts.
    expect((await y.tryAcquire([b], 'y', 60_000, who)).acquired).toBe(false);
    expect((await take(x, [a, b], 'x')).acquired).toBe(false);
    let woken = 0;
    const stop = await r.watch([b], () => woken++, 'r');
    expect((await take(r, [b], 'r')).acquired).toBe(false);
    // y goes in: its node is written (who asks), which r hears of.
    await h.release([b], 'h');
    await until(async () => (await y.tryAcquire([b], 'y', 60_000, who)).acquired, 10_000, 'y to take b');
    // x is in on a, and waits in b's line: its node there turns waiting, ahead of r.
    await g.release([a], 'g');
    expect((await take(x, [a, b], 'x')).acquired).toBe(false);
    await y.release([b], 'y');
    await until(() => woken > 0, 10_000, 'r to be woken by the release of b');
    expect((await take(r, [b], 'r')).acquired).toBe(false);
    expect((await take(x, [a, b], 'x')).acquired).toBe(true);
    stop();
    await x.release([a, b], 'x');
    await r.release([b], 'r');
  }, 30_000);

  it('a permit waiter behind a node that turned waiting does not take that write for its mark: it looks once, and waits', async () => {
    const [a, sem] = keys();
    let reads = 0;
    const c = process({ getChildren: (_path, send) => (reads++, send()) });
    const [h1, h2, b] = [process(), process(), process()];
    const permits = { limits: [2] };
    expect((await h1.tryAcquire([sem], 'h1', 60_000, permits)).acquired).toBe(true);
    expect((await h2.tryAcquire([sem], 'h2', 60_000, permits)).acquired).toBe(true);
    // b is in on a and waits for a permit: its node in sem's line turned waiting (its data was set).
    expect((await b.tryAcquire([a, sem], 'b', 60_000, { limits: [1, 2] })).acquired).toBe(false);
    // c, behind b, watches b for its mark: b's earlier write is none.
    expect((await c.tryAcquire([sem], 'c', 60_000, permits)).acquired).toBe(false);
    expect(reads).toBe(1);
    for (const [backend, owner, keys] of [
      [h1, 'h1', [sem]],
      [h2, 'h2', [sem]],
      [b, 'b', [a, sem]],
      [c, 'c', [sem]],
    ] as const)
      await backend.release([...keys], owner);
  }, 30_000);

  it('inspect, list and a forced release take a pending node for a waiter, not a holder', async () => {
    const [a, b] = keys();
    const [g, x, operator] = [process(), process(), process()];
    expect((await take(g, [a], 'g')).acquired).toBe(true);
    expect((await take(x, [a, b], 'x')).acquired).toBe(false);
    // b's line holds x's pending node only: nobody holds b.
    expect(await operator.inspect(b)).toBeUndefined();
    expect((await operator.list({ prefix: `pending${run}:`, limit: 10 })).keys).toEqual([a]);
    expect((await operator.inspect(a))?.waiters?.map((w) => w.owner)).toEqual(['x']);
    // x held nothing: its nodes go, and the release says so.
    expect(await operator.release([a, b], 'x')).toBe(false);
    expect((await operator.inspect(a))?.waiters).toEqual([]);
    await g.release([a], 'g');
  }, 30_000);

  it('a process of the previous release waits behind a pending node, and a caller of this one does not pass its node', async () => {
    const old = previousProcess();
    const [a, b] = keys();
    const [g, x, h] = [process(), process(), process()];
    expect((await take(g, [a], 'g')).acquired).toBe(true);
    expect((await take(x, [a, b], 'x')).acquired).toBe(false);
    // The old process reads names only: x's pending node is a waiter ahead of it.
    expect(((await old('tryAcquire', [b], 'old', 60_000)) as AcquireResult).acquired).toBe(false);
    // Its node (no data) counts for this release: h waits behind it, and passes nothing.
    expect((await take(h, [b], 'h')).acquired).toBe(false);
    await g.release([a], 'g');
    // x is in on a, then on b (the old node is behind it): it takes both.
    await until(async () => (await take(x, [a, b], 'x')).acquired, 10_000, 'x to take both keys');
    expect(((await old('tryAcquire', [b], 'old', 60_000)) as AcquireResult).acquired).toBe(false);
    await x.release([a, b], 'x');
    await until(async () => ((await old('tryAcquire', [b], 'old', 60_000)) as AcquireResult).acquired, 10_000, 'the old process to take b');
    expect((await take(h, [b], 'h')).acquired).toBe(false);
    await old('release', [b], 'old');
    await until(async () => (await take(h, [b], 'h')).acquired, 10_000, 'h to take b');
    await h.release([b], 'h');
  }, 30_000);
});

/** A backend of the previous release in a child process: a function that calls its methods. */
function previousProcess(): (method: string, ...args: unknown[]) => Promise<unknown> {
  const child = fork(resolve(import.meta.dirname, '../fixtures/zookeeper-backend-process.mjs'), [fixture.connectionString, fixture.root], {
    env: { ...globalThis.process.env, LOCK_LIBRARY: previousRelease('release-before-identity').entry },
    stdio: ['ignore', 'inherit', 'inherit', 'ipc'],
  });
  fixture.cleanup(async () => {
    const exited = once(child, 'exit');
    child.disconnect();
    await exited;
  });
  const ready = once(child, 'message');
  let next = 0;
  return async (method, ...args) => {
    await ready;
    const id = ++next;
    const answer = new Promise<{ result?: unknown; error?: string }>((resolve) => {
      const listen = (message: { id?: number; result?: unknown; error?: string }) => {
        if (message.id !== id) return;
        child.off('message', listen);
        resolve(message);
      };
      child.on('message', listen);
    });
    child.send({ id, method, args });
    const { result, error } = await answer;
    if (error !== undefined) throw new Error(error);
    return result;
  };
}
