import { Logger } from '@nestjs/common';
import type { LockEvents } from './lock.events.js';

const logger = new Logger('DistributedLock');

/**
 * The module's `debugLogs: true`: a debug line for each call that waited for a lock or was refused
 * one. Opt-in, because Nest's default logger prints debug lines: a busy key would flood the log of
 * every application that never asked. The app's logger levels still decide whether they show.
 */
export function logWaitsAndRefusals(events: LockEvents): () => void {
  const stops = [
    events.on('acquired', ({ keys, waitedMs, contended }) => {
      if (contended) logger.debug(`Acquired ${keys.join(', ')} after waiting ${ms(waitedMs)}: another holder had it.`);
    }),
    events.on('busy', ({ keys, waitedMs, timedOut, queueFull, retryAfterMs }) => {
      const holder = retryAfterMs === undefined ? '' : ` The holder's lease ends in ${ms(retryAfterMs)} at most.`;
      if (queueFull) {
        const cap = queueFull === 'perKey' ? 'maxWaitersPerKey' : 'maxWaiters';
        logger.debug(`Refused ${keys.join(', ')} without waiting: this process already has ${cap} callers waiting.`);
      } else if (timedOut) {
        logger.debug(`Gave up on ${keys.join(', ')} after waiting ${ms(waitedMs)}: held elsewhere all along.${holder}`);
      } else {
        logger.debug(`Refused ${keys.join(', ')}: held elsewhere, and the call does not wait (wait: 0).${holder}`);
      }
    }),
    events.on('failed', ({ keys, waitedMs, error }) => {
      logger.debug(`Acquisition of ${keys.join(', ')} failed after ${ms(waitedMs)}: ${String(error)}`);
    }),
  ];
  return () => stops.forEach((stop) => stop());
}

function ms(value: number): string {
  return `${Math.round(value)} ms`;
}
