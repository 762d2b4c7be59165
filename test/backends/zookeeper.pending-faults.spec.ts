import { describe, expect, it } from '@jest/globals';
import { SHARED } from '../../lib/backends/lock-backend.interface.js';
import { ZooKeeperLockBackend } from '../../lib/backends/zookeeper/zookeeper.backend.js';
import { ZooKeeperError, type ZooKeeperOp } from '../../lib/backends/zookeeper/zookeeper.client.js';
import { until } from '../support/wait.js';
import { tappedClients, type ZooKeeperTaps } from '../support/zookeeper-client-tap.js';
import { useZooKeeper } from '../support/zookeeper-fixture.js';

/**
 * Pending nodes (zookeeper.pending.ts) on a real ZooKeeper, with writes held back, failed or
 * answered late: interleavings that try to put two holders in one key, more permits than N in a semaphore, a writer beside anyone, or a
 * holder entering a key after another left it with a smaller token.
 */
const fixture = useZooKeeper();
let run = 0;

type Multi = NonNullable<ZooKeeperTaps['multi']>;

/** A backend of its own (a session, as another process); `multi` steps into its writes. */
function process(multi?: Multi): ZooKeeperLockBackend {
  const options = { root: fixture.root, sessionTimeout: 4_000, commandTimeout: 10_000 };
  const backend = multi
    ? new ZooKeeperLockBackend(fixture.connectionString, options, tappedClients(fixture.connectionString, 4_000, { multi }))
    : new ZooKeeperLockBackend(fixture.connectionString, options);
  fixture.cleanup(() => backend.close());
  return backend;
}

function keys(n = 2): string[] {
  run++;
  return Array.from({ length: n }, (_, i) => `faults${run}:${String.fromCharCode(97 + i)}`);
}

const lost = () => new ZooKeeperError('CONNECTION_LOSS', 'Exception: CONNECTION_LOSS[-4]');
const take = (backend: ZooKeeperLockBackend, keys: string[], owner: string, limits?: number[]) =>
  backend.tryAcquire(keys, owner, 60_000, limits ? { limits } : undefined);
const token = (result: { acquired: boolean; fencingToken?: number }) => (result.acquired ? result.fencingToken : undefined);
const isFlip = (ops: readonly ZooKeeperOp[]) => ops.some((op) => op.op === 'set' && op.version !== undefined);
const removesOnly = (ops: readonly ZooKeeperOp[]) => ops.length > 0 && ops.every((op) => op.op === 'remove' && op.version === undefined);
const creates = (ops: readonly ZooKeeperOp[]) => ops.some((op) => op.op === 'create' && op.mode === 'ephemeral-sequential');

/** A gate a tapped request waits at. */
function gate(): { wait: Promise<void>; open: () => void } {
  let open!: () => void;
  const wait = new Promise<void>((resolve) => (open = resolve));
  return { wait, open };
}

/**
 * A process whose writes that `which` matches (its flips, by default) can be held back at a gate:
 * `hold()` sets the gate, `heldBack()` resolves once a write waits at it, `open()` lets it through.
 */
function heldBackWrites(which: (ops: readonly ZooKeeperOp[]) => boolean = isFlip) {
  let closed: ReturnType<typeof gate> | undefined;
  let held = false;
  const backend = process(async (ops, send) => {
    if (closed && which(ops)) {
      held = true;
      await closed.wait;
    }
    return send();
  });
  return {
    backend,
    hold: () => void (closed = gate()),
    heldBack: (what: string) => until(() => held, 10_000, what),
    open: () => {
      const waiting = closed;
      closed = undefined;
      waiting?.open();
    },
  };
}

describe('ZooKeeper pending nodes under held-back, failed and late writes', () => {
  it('a pending caller passed, whose old nodes linger while its new create answer is lost, enters with a token above the passer', async () => {
    const [a, b] = keys();
    // x's writes: the removal of its old nodes after it was passed fails (a connection lost before
    // it was sent), and the answer of its next create is lost (applied, connection lost after).
    let failRemoval = false;
    let loseCreate = false;
    const x = process(async (ops, send) => {
      if (failRemoval && removesOnly(ops)) {
        failRemoval = false;
        throw lost();
      }
      if (loseCreate && creates(ops)) {
        loseCreate = false;
        await send();
        throw lost();
      }
      return send();
    });
    const [g, h] = [process(), process()];
    expect((await take(g, [a], 'g')).acquired).toBe(true);
    // x waits for a behind g: pending in b.
    expect((await take(x, [a, b], 'x')).acquired).toBe(false);
    const old = (await g.inspect(a))?.waiters?.[0];
    expect(old?.owner).toBe('x');
    // h takes b past x's pending node.
    const passer = await take(h, [b], 'h');
    expect(passer.acquired).toBe(true);
    // x looks: its node in b is gone, it starts over.
    failRemoval = true;
    loseCreate = true;
    await expect(take(x, [a, b], 'x')).rejects.toThrow();
    expect(failRemoval).toBe(false);
    expect(loseCreate).toBe(false);
    // x asks again (its service's retry).
    expect((await take(x, [a, b], 'x')).acquired).toBe(false);
    // h leaves b, g leaves a; x takes both, after h left b.
    await h.release([b], 'h');
    await g.release([a], 'g');
    let both: number | undefined;
    await until(async () => (both = token(await take(x, [a, b], 'x'))) !== undefined, 10_000, 'x to take both keys');
    // One request's nodes come from one multi(): one czxid in every line.
    const tokens = [(await g.inspect(a))?.fencingToken, (await g.inspect(b))?.fencingToken];
    // Entered b after h left it: its token must be above h's.
    expect({ both, tokens }).toEqual({ both: tokens[0], tokens: [tokens[1], tokens[1]] });
    expect(both!).toBeGreaterThan(token(passer)!);
    await x.release([a, b], 'x');
  }, 30_000);

  it('a flip held back while a caller passes the pending node fails: the pending caller starts over, above the passer', async () => {
    const [a, b] = keys();
    const writes = heldBackWrites();
    const x = writes.backend;
    const [g, h, operator] = [process(), process(), process()];
    expect((await take(g, [a], 'g')).acquired).toBe(true);
    expect((await take(h, [b], 'h')).acquired).toBe(true);
    expect((await take(x, [a, b], 'x')).acquired).toBe(false);
    writes.hold();
    await g.release([a], 'g');
    // x is in on a, and waits in b behind h: its flip of its node in b is held back.
    const flipping = take(x, [a, b], 'x');
    await writes.heldBack("x's flip to be held back");
    // y, behind x's still pending node, enters b once h leaves, passing it.
    const y = process();
    expect((await take(y, [b], 'y')).acquired).toBe(false);
    await h.release([b], 'h');
    let passer: number | undefined;
    await until(async () => (passer = token(await take(y, [b], 'y'))) !== undefined, 10_000, 'y to take b');
    writes.open();
    expect((await flipping).acquired).toBe(false);
    expect((await operator.inspect(b))?.holders?.map((holder) => holder.owner)).toEqual(['y']);
    await y.release([b], 'y');
    let both: number | undefined;
    await until(async () => (both = token(await take(x, [a, b], 'x'))) !== undefined, 10_000, 'x to take both keys');
    expect(both!).toBeGreaterThan(passer!);
    await x.release([a, b], 'x');
  }, 30_000);

  it('a flip applied whose answer was lost: the pending caller asks again, holds both, and a caller of b behind it waits', async () => {
    const [a, b] = keys();
    let loseFlip = false;
    const x = process(async (ops, send) => {
      if (loseFlip && isFlip(ops)) {
        loseFlip = false;
        await send();
        throw lost();
      }
      return send();
    });
    const [g, h, y, operator] = [process(), process(), process(), process()];
    expect((await take(g, [a], 'g')).acquired).toBe(true);
    expect((await take(h, [b], 'h')).acquired).toBe(true);
    expect((await take(x, [a, b], 'x')).acquired).toBe(false);
    loseFlip = true;
    await g.release([a], 'g');
    await expect(take(x, [a, b], 'x')).rejects.toThrow();
    expect(loseFlip).toBe(false);
    // The flip was applied: y behind x's node in b does not pass it.
    expect((await take(y, [b], 'y')).acquired).toBe(false);
    await h.release([b], 'h');
    expect((await take(y, [b], 'y')).acquired).toBe(false);
    const both = await take(x, [a, b], 'x');
    expect(both.acquired).toBe(true);
    expect((await take(y, [b], 'y')).acquired).toBe(false);
    expect((await operator.inspect(b))?.holders?.map((holder) => holder.owner)).toEqual(['x']);
    await x.release([a, b], 'x');
    let after: number | undefined;
    await until(async () => (after = token(await take(y, [b], 'y'))) !== undefined, 10_000, 'y to take b');
    expect(after!).toBeGreaterThan(token(both)!);
    await y.release([b], 'y');
  }, 30_000);

  it('a semaphore of 2: a multi-key permit caller flipping while a permit caller passes its pending node never makes three holders', async () => {
    const [a, sem] = keys();
    const writes = heldBackWrites((ops) => ops.some((op) => op.op === 'set'));
    const x = writes.backend;
    const [g, p1, s, operator] = [process(), process(), process(), process()];
    expect((await take(g, [a], 'g')).acquired).toBe(true);
    expect((await take(p1, [sem], 'p1', [2])).acquired).toBe(true);
    // x waits for a: its permit node in sem's line is pending.
    expect((await take(x, [a, sem], 'x', [1, 2])).acquired).toBe(false);
    writes.hold();
    await g.release([a], 'g');
    // x is in on a and on sem (p1 and itself): its write that turns its node held is held back.
    const going = take(x, [a, sem], 'x', [1, 2]);
    await writes.heldBack("x's write to be held back");
    // s behind x's pending node: p1 and s, two permits, passing x's node.
    const passer = await take(s, [sem], 's', [2]);
    expect(passer.acquired).toBe(true);
    writes.open();
    const xs = await going;
    const holders = (await operator.inspect(sem))?.holders?.map((holder) => holder.owner) ?? [];
    expect(holders.length).toBeLessThanOrEqual(2);
    expect(xs.acquired).toBe(false);
    await p1.release([sem], 'p1');
    let both: number | undefined;
    await until(async () => (both = token(await take(x, [a, sem], 'x', [1, 2]))) !== undefined, 10_000, 'x to take both');
    expect(both!).toBeGreaterThan(token(passer)!);
    for (const [backend, owner, ks] of [
      [x, 'x', [a, sem]],
      [s, 's', [sem]],
    ] as const)
      await backend.release([...ks], owner);
  }, 30_000);

  it('readers behind a pending writer node: the writer going in while a reader passes it never makes a writer beside a reader', async () => {
    const [a, b] = keys();
    const writes = heldBackWrites();
    const x = writes.backend;
    const [g, r1, r2, operator] = [process(), process(), process(), process()];
    expect((await take(g, [a], 'g')).acquired).toBe(true);
    expect((await take(x, [a, b], 'x')).acquired).toBe(false);
    writes.hold();
    await g.release([a], 'g');
    // x is in on both: its write (its node in b turns held) is held back.
    const going = take(x, [a, b], 'x');
    await writes.heldBack("x's write to be held back");
    const reader = { limits: [SHARED] };
    expect((await r1.tryAcquire([b], 'r1', 60_000, reader)).acquired).toBe(true);
    expect((await r2.tryAcquire([b], 'r2', 60_000, reader)).acquired).toBe(true);
    writes.open();
    const xs = await going;
    const state = await operator.inspect(b);
    const holders = state?.holders?.map((holder) => holder.owner) ?? [];
    expect(xs.acquired && holders.some((o) => o !== 'x')).toBe(false);
    expect(holders.sort()).toEqual(['r1', 'r2']);
    await r1.release([b], 'r1');
    await r2.release([b], 'r2');
    await until(async () => (await take(x, [a, b], 'x')).acquired, 10_000, 'x to take both');
    await x.release([a, b], 'x');
  }, 30_000);

  it('three keys, the middle one contended: a caller of the last passes the pending node; the caller of all three starts over above it', async () => {
    const [a, b, c] = keys(3);
    const [h, x, y, z, operator] = [process(), process(), process(), process(), process()];
    expect((await take(h, [b], 'h')).acquired).toBe(true);
    // x: in on a, waiting in b (its node there turned waiting), pending in c.
    expect((await take(x, [a, b, c], 'x')).acquired).toBe(false);
    // z waits for b behind x.
    expect((await take(z, [b], 'z')).acquired).toBe(false);
    const passer = await take(y, [c], 'y');
    expect(passer.acquired).toBe(true);
    // x's node in c went: z, behind x in b, gets b once h leaves (x starts over behind z).
    let woken = false;
    const stop = await z.watch([b], () => (woken = true), 'z');
    expect((await take(x, [a, b, c], 'x')).acquired).toBe(false);
    await h.release([b], 'h');
    await until(() => woken, 10_000, 'z to be woken');
    const zs = await take(z, [b], 'z');
    stop();
    expect(zs.acquired).toBe(true);
    expect((await operator.inspect(b))?.holders?.map((holder) => holder.owner)).toEqual(['z']);
    await z.release([b], 'z');
    await y.release([c], 'y');
    let all: number | undefined;
    await until(async () => (all = token(await take(x, [a, b, c], 'x'))) !== undefined, 10_000, 'x to take all three');
    expect(all!).toBeGreaterThan(token(passer)!);
    expect(all!).toBeGreaterThan(token(zs)!);
    await x.release([a, b, c], 'x');
  }, 30_000);

  it('a forced release of a pending caller whose flip is held back: the flip fails, nobody holds two ways', async () => {
    const [a, b] = keys();
    const writes = heldBackWrites();
    const x = writes.backend;
    const [g, h, y, operator] = [process(), process(), process(), process()];
    expect((await take(g, [a], 'g')).acquired).toBe(true);
    expect((await take(h, [b], 'h')).acquired).toBe(true);
    expect((await take(x, [a, b], 'x')).acquired).toBe(false);
    writes.hold();
    await g.release([a], 'g');
    const flipping = take(x, [a, b], 'x');
    await writes.heldBack("x's flip to be held back");
    // (It answers true: x's node in a was first in its line, though x held nothing.)
    await operator.release([a, b], 'x');
    expect((await take(y, [a], 'y')).acquired).toBe(true);
    writes.open();
    expect((await flipping).acquired).toBe(false);
    expect((await operator.inspect(a))?.holders?.map((holder) => holder.owner)).toEqual(['y']);
    await y.release([a], 'y');
    await h.release([b], 'h');
    await until(async () => (await take(x, [a, b], 'x')).acquired, 10_000, 'x to take both');
    await x.release([a, b], 'x');
  }, 30_000);

  it('a pending caller whose session ends while its flip is held back: the others go in, none beside another', async () => {
    const [a, b] = keys();
    const writes = heldBackWrites();
    const x = writes.backend;
    const [g, h, y, operator] = [process(), process(), process(), process()];
    expect((await take(g, [a], 'g')).acquired).toBe(true);
    expect((await take(h, [b], 'h')).acquired).toBe(true);
    expect((await take(x, [a, b], 'x')).acquired).toBe(false);
    expect((await take(y, [b], 'y')).acquired).toBe(false);
    writes.hold();
    await g.release([a], 'g');
    const flipping = take(x, [a, b], 'x').catch(() => ({ acquired: false }));
    await writes.heldBack("x's flip to be held back");
    await x.close();
    writes.open();
    expect((await flipping).acquired).toBe(false);
    await h.release([b], 'h');
    await until(async () => (await take(y, [b], 'y')).acquired, 10_000, 'y to take b');
    expect((await operator.inspect(b))?.holders?.map((holder) => holder.owner)).toEqual(['y']);
    await y.release([b], 'y');
  }, 30_000);

  it('a waiter of one key behind a node that turned waiting is woken when b is free (no wait until its timeout)', async () => {
    const [a, b] = keys();
    const [g, h, x, r] = [process(), process(), process(), process()];
    expect((await take(g, [a], 'g')).acquired).toBe(true);
    expect((await take(h, [b], 'h')).acquired).toBe(true);
    expect((await take(x, [a, b], 'x')).acquired).toBe(false);
    let woken = 0;
    const stop = await r.watch([b], () => woken++, 'r');
    expect((await take(r, [b], 'r')).acquired).toBe(false);
    // x flips its node in b (in on a), ahead of r.
    await g.release([a], 'g');
    expect((await take(x, [a, b], 'x')).acquired).toBe(false);
    await h.release([b], 'h');
    // r is told of h's release, and looks again (as its service does): x's node is ahead of it now.
    await until(() => woken > 0, 5_000, "r to be woken by h's release");
    expect((await take(r, [b], 'r')).acquired).toBe(false);
    expect((await take(x, [a, b], 'x')).acquired).toBe(true);
    const seen = woken;
    await x.release([a, b], 'x');
    await until(() => woken > seen, 5_000, 'r to be woken when x leaves');
    expect((await take(r, [b], 'r')).acquired).toBe(true);
    stop();
    await r.release([b], 'r');
  }, 30_000);

  it('a caller that starts over while the removal of its old nodes failed waits behind its own old node only until it goes', async () => {
    const [a, b, c] = keys(3);
    let failRemoval = false;
    const x = process(async (ops, send) => {
      if (failRemoval && removesOnly(ops)) {
        failRemoval = false;
        throw lost();
      }
      return send();
    });
    const [h, y, z, operator] = [process(), process(), process(), process()];
    expect((await take(h, [b], 'h')).acquired).toBe(true);
    // x: in on a, waiting in b (turned waiting), pending in c.
    expect((await take(x, [a, b, c], 'x')).acquired).toBe(false);
    expect((await take(z, [b], 'z')).acquired).toBe(false);
    const passer = await take(y, [c], 'y');
    expect(passer.acquired).toBe(true);
    failRemoval = true;
    expect((await take(x, [a, b, c], 'x')).acquired).toBe(false);
    expect(failRemoval).toBe(false);
    await h.release([b], 'h');
    // z, behind x's old node in b, gets b once that old node goes (at x's next answer).
    await until(async () => (await take(z, [b], 'z')).acquired, 5_000, 'z to take b');
    expect((await operator.inspect(a))?.waiters?.length ?? 0).toBeLessThanOrEqual(1);
    await z.release([b], 'z');
    await y.release([c], 'y');
    let all: number | undefined;
    await until(async () => (all = token(await take(x, [a, b, c], 'x'))) !== undefined, 5_000, 'x to take all three');
    expect(all!).toBeGreaterThan(token(passer)!);
    const tokens = await Promise.all([a, b, c].map(async (key) => (await operator.inspect(key))?.fencingToken));
    expect(tokens).toEqual([all, all, all]);
    await x.release([a, b, c], 'x');
  }, 30_000);
});
