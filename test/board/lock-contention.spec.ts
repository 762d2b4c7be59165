import { describe, expect, it } from '@jest/globals';
import { LockEvents } from 'nest-distributed-lock';
import { LockContention } from '../../lib/board/lock-contention.js';

const busy = (keys: string[]) => ({ keys, waitedMs: 0, timedOut: false });

describe('LockContention', () => {
  it('counts waits, busy answers and lost leases per key, under the keyPrefix only', () => {
    const events = new LockEvents();
    const contention = new LockContention(events, { windowMs: 60_000, maxKeys: 10, keyPrefix: 'lock:' });
    events.emit('acquired', { keys: ['lock:a', 'lock:b'], waitedMs: 5, contended: true, reentrant: false });
    events.emit('acquired', { keys: ['lock:a'], waitedMs: 0, contended: false, reentrant: false });
    events.emit('busy', busy(['lock:a']));
    events.emit('busy', busy(['other:a']));
    expect(contention.of('a')).toEqual({ waits: 1, busy: 1, lost: 0 });
    expect(contention.of('b')).toEqual({ waits: 1, busy: 0, lost: 0 });
    expect(contention.top(5).map((row) => row.key)).toEqual(['a', 'b']);
    contention.stop();
    events.emit('busy', busy(['lock:a']));
    expect(contention.of('a').busy).toBe(1);
  });

  it('forgets counts older than the window', () => {
    const events = new LockEvents();
    let now = 1_000_000;
    const contention = new LockContention(events, { windowMs: 10_000, maxKeys: 10, keyPrefix: '' }, () => now);
    events.emit('busy', busy(['a']));
    now += 5_000;
    events.emit('busy', busy(['a']));
    expect(contention.of('a').busy).toBe(2);
    now += 7_000;
    expect(contention.of('a').busy).toBe(1);
    now += 10_000;
    expect(contention.of('a').busy).toBe(0);
    expect(contention.top(5)).toEqual([]);
  });

  it('remembers at most maxKeys keys, whatever the number of keys locked', () => {
    const events = new LockEvents();
    const contention = new LockContention(events, { windowMs: 60_000, maxKeys: 100, keyPrefix: '' });
    for (let i = 0; i < 10_000; i++) events.emit('busy', busy([`order:${i}`]));
    expect(contention.size).toBe(100);
    // The most recent are kept.
    expect(contention.of('order:9999').busy).toBe(1);
    expect(contention.of('order:0').busy).toBe(0);
  });
});
