import type * as otel from '@opentelemetry/api';
import type { Attributes, MeterProvider, TracerProvider } from '@opentelemetry/api';
import type { LockEventBase, LockEvents } from './lock.events.js';
import { InvalidLockOptionsError } from './lock.errors.js';
import { requirePeer } from './peer-require.cjs';

/** The module's `telemetry` option, as an object (`true` takes every default). */
export interface LockTelemetryOptions {
  /** Default: the global one, as the OpenTelemetry SDK registers it. */
  meterProvider?: MeterProvider;
  /** Default: the global one, as the OpenTelemetry SDK registers it. */
  tracerProvider?: TracerProvider;
  /**
   * Also put the full keys on spans (`lock.key`, e.g. `lock:order:42`): one value per locked
   * entity, so high cardinality, and possibly personal data in the key. Never on metrics.
   * Default false: spans and metrics name a lock by its @Locked template only.
   */
  spanKeys?: boolean;
}

/** The instrumentation scope: what a backend shows as the source of these metrics and spans. */
export const LOCK_TELEMETRY_SCOPE = 'nest-distributed-lock';

/** Seconds, for lock waits: from a free lock (sub-millisecond) to the default 10 s wait and beyond. */
const WAIT_BUCKETS = [0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30];
/** Seconds, for holds: request handlers to long jobs. */
const HOLD_BUCKETS = [0.001, 0.005, 0.01, 0.05, 0.1, 0.5, 1, 5, 10, 30, 60, 300, 1800];

const KNOWN = ['meterProvider', 'tracerProvider', 'spanKeys'];

type OpenTelemetryApi = typeof otel;

/**
 * Records OpenTelemetry metrics and a span per acquisition from a LockService's events, through
 * `@opentelemetry/api` (an optional peer: loaded here, so an application that never turns
 * telemetry on needs not install it). Without an SDK the API is a no-op. Returns the function that
 * stops recording.
 */
export function instrumentLocks(events: LockEvents, backendName: string, options: LockTelemetryOptions): () => void {
  const unknown = Object.keys(options).find((name) => !KNOWN.includes(name));
  if (unknown !== undefined) {
    throw new InvalidLockOptionsError(
      'telemetry',
      `DistributedLockModule: unknown telemetry option '${unknown}'. Accepted: ${KNOWN.join(', ')} (or telemetry: true for the defaults).`,
    );
  }
  const api = loadOpenTelemetry();
  // Instruments are made at the first event, not now: an SDK started after the LockService was
  // created still receives them (the API's global meter provider is not a proxy).
  let made: Instruments | undefined;
  const instruments = () => (made ??= makeInstruments(api, options));
  const backend = { 'lock.backend': backendName };
  // The kind of lock is bounded (three values), so it may label metrics; exclusive locks keep the labels they had.
  const named = (event: LockEventBase): Attributes => {
    const attributes: Attributes = event.template === undefined ? { ...backend } : { ...backend, 'lock.key.template': event.template };
    if (event.mode !== undefined) attributes['lock.mode'] = event.mode;
    return attributes;
  };

  const span = (event: LockEventBase & { waitedMs: number }, outcome: Outcome, extra: Attributes, error?: unknown): void => {
    const end = Date.now();
    const attributes: Attributes = { ...named(event), 'lock.outcome': outcome, ...extra };
    if (options.spanKeys) attributes['lock.key'] = event.keys.length === 1 ? event.keys[0] : [...event.keys];
    if (error !== undefined) attributes['error.type'] = errorType(error);
    else if (outcome === 'timeout') attributes['error.type'] = 'timeout';
    // Recorded when the acquisition ends, started back by its wait, under the caller's active span.
    const recorded = instruments().tracer.startSpan(
      'lock.acquire',
      { kind: api.SpanKind.INTERNAL, startTime: end - event.waitedMs, attributes },
      api.context.active(),
    );
    if (error !== undefined) {
      if (error instanceof Error) recorded.recordException(error);
      recorded.setStatus({ code: api.SpanStatusCode.ERROR, message: String(error) });
    } else if (outcome === 'timeout') {
      recorded.setStatus({ code: api.SpanStatusCode.ERROR, message: `no lock within the wait (${Math.round(event.waitedMs)} ms)` });
    }
    recorded.end(end);
  };

  const attempt = (event: LockEventBase & { waitedMs: number }, outcome: Outcome, error?: unknown): void => {
    const { acquisitions, wait } = instruments();
    const attributes: Attributes = { ...named(event), 'lock.outcome': outcome };
    if (error !== undefined) attributes['error.type'] = errorType(error);
    acquisitions.add(1, attributes);
    wait.record(event.waitedMs / 1000, attributes);
  };

  const stops = [
    events.on('acquired', (event) => {
      // A re-entry asks no backend and waits for nothing: counted, not timed.
      if (event.reentrant) instruments().acquisitions.add(1, { ...named(event), 'lock.outcome': 'acquired', 'lock.reentrant': true });
      else {
        attempt(event, 'acquired');
        instruments().held.add(1, named(event));
      }
      const extra: Attributes = { 'lock.reentrant': event.reentrant, 'lock.contended': event.contended };
      if (event.fencingToken !== undefined) extra['lock.fencing_token'] = event.fencingToken;
      span(event, 'acquired', extra);
    }),
    events.on('busy', (event) => {
      const outcome = event.timedOut ? 'timeout' : 'busy';
      attempt(event, outcome);
      span(event, outcome, event.queueFull ? { 'lock.queue_full': event.queueFull } : {});
    }),
    events.on('failed', (event) => {
      attempt(event, 'error', event.error);
      span(event, 'error', {}, event.error);
    }),
    events.on('released', (event) => {
      if (event.reentrant) return;
      const { hold, held } = instruments();
      hold.record(event.heldMs / 1000, named(event));
      held.add(-1, named(event));
    }),
    events.on('lost', (event) => instruments().lost.add(1, { ...backend, 'lock.lost.reason': event.reason })),
    events.on('extended', (event) => instruments().extensions.add(1, { ...backend, 'lock.extension.automatic': event.automatic })),
  ];
  return () => stops.forEach((stop) => stop());
}

type Outcome = 'acquired' | 'busy' | 'timeout' | 'error';

interface Instruments {
  tracer: otel.Tracer;
  acquisitions: otel.Counter;
  wait: otel.Histogram;
  hold: otel.Histogram;
  held: otel.UpDownCounter;
  lost: otel.Counter;
  extensions: otel.Counter;
}

function makeInstruments(api: OpenTelemetryApi, options: LockTelemetryOptions): Instruments {
  const meter = (options.meterProvider ?? api.metrics.getMeterProvider()).getMeter(LOCK_TELEMETRY_SCOPE);
  const tracer = (options.tracerProvider ?? api.trace.getTracerProvider()).getTracer(LOCK_TELEMETRY_SCOPE);
  return {
    tracer,
    acquisitions: meter.createCounter('lock.acquisitions', {
      unit: '{acquisition}',
      description: 'Lock acquisitions by outcome: acquired, busy (refused without waiting), timeout (the wait ran out), error.',
    }),
    wait: meter.createHistogram('lock.wait.duration', {
      unit: 's',
      description: 'From the call to its outcome: how long acquisitions waited for their lock.',
      advice: { explicitBucketBoundaries: WAIT_BUCKETS },
    }),
    hold: meter.createHistogram('lock.hold.duration', {
      unit: 's',
      description: 'From acquisition to release: how long locks were held.',
      advice: { explicitBucketBoundaries: HOLD_BUCKETS },
    }),
    held: meter.createUpDownCounter('lock.held', {
      unit: '{lock}',
      description: 'Locks this process holds now (re-entries not counted; a lost lock counts until its holder releases it).',
    }),
    lost: meter.createCounter('lock.lost', { unit: '{lock}', description: 'Leases lost while held, by reason.' }),
    extensions: meter.createCounter('lock.extensions', {
      unit: '{extension}',
      description: 'Lease extensions the backend granted: by the watchdog (automatic) or by LockHandle.extend().',
    }),
  };
}

function errorType(error: unknown): string {
  return error instanceof Error ? error.name : typeof error;
}

function loadOpenTelemetry(): OpenTelemetryApi {
  try {
    return requirePeer('@opentelemetry/api') as OpenTelemetryApi;
  } catch (error) {
    throw new InvalidLockOptionsError(
      'telemetry',
      `DistributedLockModule: option 'telemetry' needs the '@opentelemetry/api' package: npm install @opentelemetry/api ` +
        `(and an OpenTelemetry SDK to export what it records), or leave telemetry off ` +
        `(${error instanceof Error ? error.message : String(error)})`,
    );
  }
}
