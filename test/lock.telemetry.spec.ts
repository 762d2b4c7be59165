import 'reflect-metadata';
import { afterEach, beforeEach, describe, expect, it } from '@jest/globals';
import { Injectable } from '@nestjs/common';
import { Test } from '@nestjs/testing';
import { AsyncLocalStorage } from 'node:async_hooks';
import { context, ROOT_CONTEXT, SpanStatusCode, type Context, type ContextManager } from '@opentelemetry/api';
import {
  AggregationTemporality,
  InMemoryMetricExporter,
  MeterProvider,
  PeriodicExportingMetricReader,
  type DataPoint,
  type Histogram,
} from '@opentelemetry/sdk-metrics';
import { BasicTracerProvider, InMemorySpanExporter, SimpleSpanProcessor } from '@opentelemetry/sdk-trace-base';
import {
  DistributedLockModule,
  LOCK_TELEMETRY_SCOPE,
  LockBackendError,
  LockNotAcquiredError,
  LockService,
  Locked,
  type LockBackend,
  type LockTelemetryOptions,
} from '../lib/index.js';

/** The OpenTelemetry context carried by Node's AsyncLocalStorage, as the Node SDK's context manager does. */
class AsyncLocalStorageContext implements ContextManager {
  private readonly storage = new AsyncLocalStorage<Context>();
  active(): Context {
    return this.storage.getStore() ?? ROOT_CONTEXT;
  }
  with<A extends unknown[], F extends (...args: A) => ReturnType<F>>(ctx: Context, fn: F, thisArg?: ThisParameterType<F>, ...args: A) {
    return this.storage.run(ctx, () => fn.apply(thisArg, args));
  }
  bind<T>(_ctx: Context, target: T): T {
    return target;
  }
  enable(): this {
    return this;
  }
  disable(): this {
    this.storage.disable();
    return this;
  }
}

function stallUntil(at: number): void {
  while (performance.now() <= at) {
    // A synchronous stall, as a long computation or a GC pause makes one.
  }
}

describe('OpenTelemetry metrics and spans (telemetry option)', () => {
  let metricExporter: InMemoryMetricExporter;
  let reader: PeriodicExportingMetricReader;
  let meterProvider: MeterProvider;
  let spanExporter: InMemorySpanExporter;
  let tracerProvider: BasicTracerProvider;
  let locks: LockService | undefined;

  beforeEach(() => {
    metricExporter = new InMemoryMetricExporter(AggregationTemporality.CUMULATIVE);
    // Exported on demand (forceFlush), never by the timer.
    reader = new PeriodicExportingMetricReader({ exporter: metricExporter, exportIntervalMillis: 3_600_000 });
    meterProvider = new MeterProvider({ readers: [reader] });
    spanExporter = new InMemorySpanExporter();
    tracerProvider = new BasicTracerProvider({ spanProcessors: [new SimpleSpanProcessor(spanExporter)] });
  });

  afterEach(async () => {
    await locks?.onApplicationShutdown();
    locks = undefined;
    await meterProvider.shutdown();
    await tracerProvider.shutdown();
  });

  const telemetry = (extra: Partial<LockTelemetryOptions> = {}): LockTelemetryOptions => ({ meterProvider, tracerProvider, ...extra });

  /** Every data point of the metric `name`, as [attributes, value]. */
  async function points(name: string): Promise<[Record<string, unknown>, unknown][]> {
    await reader.forceFlush();
    const exported = metricExporter.getMetrics().at(-1);
    const scope = exported?.scopeMetrics.find((s) => s.scope.name === LOCK_TELEMETRY_SCOPE);
    const metric = scope?.metrics.find((m) => m.descriptor.name === name);
    return (metric?.dataPoints ?? []).map((p: DataPoint<unknown>) => [p.attributes, p.value]);
  }

  async function descriptor(name: string) {
    await reader.forceFlush();
    const scope = metricExporter
      .getMetrics()
      .at(-1)
      ?.scopeMetrics.find((s) => s.scope.name === LOCK_TELEMETRY_SCOPE);
    return scope?.metrics.find((m) => m.descriptor.name === name)?.descriptor;
  }

  it('counts acquisitions by outcome, times waits and holds in seconds, and tracks the locks held', async () => {
    locks = new LockService(undefined, { telemetry: telemetry(), pollInterval: 20 });
    const holder = await locks.acquire('k', { ttl: 5_000 });
    expect(await points('lock.held')).toEqual([[{ 'lock.backend': 'memory' }, 1]]);
    expect(await locks.tryAcquire('k')).toBeUndefined();
    await expect(locks.acquire('k', { wait: 30 })).rejects.toBeInstanceOf(LockNotAcquiredError);
    await holder.release();

    const acquisitions = await points('lock.acquisitions');
    expect(acquisitions).toEqual(
      expect.arrayContaining([
        [{ 'lock.backend': 'memory', 'lock.outcome': 'acquired' }, 1],
        [{ 'lock.backend': 'memory', 'lock.outcome': 'busy' }, 1],
        [{ 'lock.backend': 'memory', 'lock.outcome': 'timeout' }, 1],
      ]),
    );
    expect(acquisitions).toHaveLength(3);
    expect(await points('lock.held')).toEqual([[{ 'lock.backend': 'memory' }, 0]]);

    const waits = (await points('lock.wait.duration')) as [Record<string, unknown>, Histogram][];
    expect(waits.map(([attributes, value]) => [attributes['lock.outcome'], value.count])).toEqual(
      expect.arrayContaining([
        ['acquired', 1],
        ['busy', 1],
        ['timeout', 1],
      ]),
    );
    // The timed-out wait lasted at least its 30 ms: recorded in seconds.
    const timeout = waits.find(([attributes]) => attributes['lock.outcome'] === 'timeout')![1];
    expect(timeout.sum).toBeGreaterThanOrEqual(0.03);
    expect(timeout.sum).toBeLessThan(30);
    const holds = (await points('lock.hold.duration')) as [Record<string, unknown>, Histogram][];
    expect(holds.map(([attributes, value]) => [attributes, value.count])).toEqual([[{ 'lock.backend': 'memory' }, 1]]);
    expect(await descriptor('lock.wait.duration')).toEqual(expect.objectContaining({ unit: 's' }));
    expect(await descriptor('lock.hold.duration')).toEqual(expect.objectContaining({ unit: 's' }));
    expect(await descriptor('lock.acquisitions')).toEqual(expect.objectContaining({ unit: '{acquisition}' }));
  });

  it('counts re-entries as acquired with lock.reentrant, without timing them or counting them as held', async () => {
    locks = new LockService(undefined, { telemetry: telemetry() });
    await locks.using('k', () => locks!.using('k', () => undefined));
    expect(await points('lock.acquisitions')).toEqual([
      [{ 'lock.backend': 'memory', 'lock.outcome': 'acquired' }, 1],
      [{ 'lock.backend': 'memory', 'lock.outcome': 'acquired', 'lock.reentrant': true }, 1],
    ]);
    expect(((await points('lock.hold.duration')) as [unknown, Histogram][]).map(([, value]) => value.count)).toEqual([1]);
    expect(await points('lock.held')).toEqual([[{ 'lock.backend': 'memory' }, 0]]);
  });

  it('counts errors with error.type, leases lost by reason, and extensions', async () => {
    const down: LockBackend = {
      name: 'down',
      fencing: true,
      tryAcquire: async () => {
        throw new Error('ECONNREFUSED');
      },
      extend: async () => ({ extended: false }),
      release: async () => false,
      inspect: async () => undefined,
    };
    const failing = new LockService(down, { telemetry: telemetry() });
    await expect(failing.acquire('k', { wait: 0 })).rejects.toBeInstanceOf(LockBackendError);
    await failing.onApplicationShutdown();

    locks = new LockService(undefined, { telemetry: telemetry() });
    const lost = await locks.acquire('lost', { ttl: 100, autoExtend: false });
    stallUntil(performance.now() + 100);
    expect(lost.isHeld).toBe(false);
    const extended = await locks.acquire('extended', { autoExtend: false });
    await extended.extend(60_000);
    await extended.release();

    expect(await points('lock.acquisitions')).toEqual(
      expect.arrayContaining([[{ 'lock.backend': 'down', 'lock.outcome': 'error', 'error.type': 'LockBackendError' }, 1]]),
    );
    expect(await points('lock.lost')).toEqual([[{ 'lock.backend': 'memory', 'lock.lost.reason': 'expired' }, 1]]);
    expect(await points('lock.extensions')).toEqual([[{ 'lock.backend': 'memory', 'lock.extension.automatic': false }, 1]]);
    // The lost lock is still counted as held until its holder lets go.
    expect(await points('lock.held')).toEqual([[{ 'lock.backend': 'memory' }, 1]]);
    await lost.release();
    expect(await points('lock.held')).toEqual([[{ 'lock.backend': 'memory' }, 0]]);
  });

  it('records a span per acquisition, named by the @Locked template; the full key only with spanKeys', async () => {
    @Injectable()
    class Orders {
      @Locked('order:<id>', { wait: 0 })
      async pay(id: number): Promise<number> {
        return id;
      }
    }
    const app = async (extra: Partial<LockTelemetryOptions>) => {
      const moduleRef = await Test.createTestingModule({
        imports: [DistributedLockModule.forRoot({ telemetry: telemetry(extra) })],
        providers: [Orders],
      }).compile();
      return moduleRef.init();
    };

    const plain = await app({});
    const held = await plain.get(LockService).acquire('order:42');
    await expect(plain.get(Orders).pay(42)).rejects.toBeInstanceOf(LockNotAcquiredError);
    await held.release();
    await plain.get(Orders).pay(42);
    await plain.close();

    const spans = spanExporter.getFinishedSpans();
    expect(
      spans.map((span) => [span.name, span.attributes['lock.outcome'], span.attributes['lock.key.template'], span.status.code]),
    ).toEqual([
      ['lock.acquire', 'acquired', undefined, SpanStatusCode.UNSET],
      ['lock.acquire', 'busy', 'order:<id>', SpanStatusCode.UNSET],
      ['lock.acquire', 'acquired', 'order:<id>', SpanStatusCode.UNSET],
    ]);
    expect(spans[2].attributes).toEqual({
      'lock.backend': 'memory',
      'lock.key.template': 'order:<id>',
      'lock.outcome': 'acquired',
      'lock.reentrant': false,
      'lock.contended': false,
      'lock.fencing_token': expect.any(Number),
    });
    expect(spans.every((span) => span.instrumentationScope.name === LOCK_TELEMETRY_SCOPE)).toBe(true);
    expect(spans.some((span) => 'lock.key' in span.attributes)).toBe(false);

    spanExporter.reset();
    const withKeys = await app({ spanKeys: true });
    await withKeys.get(Orders).pay(7);
    await withKeys.close();
    expect(spanExporter.getFinishedSpans().map((span) => span.attributes['lock.key'])).toEqual(['lock:order:7']);
  });

  it("makes the acquisition span a child of the caller's active span", async () => {
    const manager = new AsyncLocalStorageContext();
    context.setGlobalContextManager(manager);
    try {
      locks = new LockService(undefined, { telemetry: telemetry() });
      const tracer = tracerProvider.getTracer('app');
      await tracer.startActiveSpan('handler', async (handler) => {
        await locks!.using('k', () => undefined);
        handler.end();
      });
    } finally {
      context.disable();
    }
    const [acquire, handler] = spanExporter.getFinishedSpans();
    expect([acquire.name, handler.name]).toEqual(['lock.acquire', 'handler']);
    expect(acquire.parentSpanContext?.spanId).toBe(handler.spanContext().spanId);
    expect(acquire.spanContext().traceId).toBe(handler.spanContext().traceId);
  });

  it('marks a timed-out or failed acquisition span as an error', async () => {
    locks = new LockService(undefined, { telemetry: telemetry(), pollInterval: 20 });
    const holder = await locks.acquire('k');
    await expect(locks.acquire('k', { wait: 30 })).rejects.toBeInstanceOf(LockNotAcquiredError);
    await holder.release();
    const timedOut = spanExporter.getFinishedSpans()[1];
    expect(timedOut.attributes).toEqual(expect.objectContaining({ 'lock.outcome': 'timeout', 'error.type': 'timeout' }));
    expect(timedOut.status.code).toBe(SpanStatusCode.ERROR);
    // Started back by the wait: the span lasts at least the 30 ms waited.
    const [seconds, nanos] = timedOut.duration;
    expect(seconds * 1000 + nanos / 1e6).toBeGreaterThanOrEqual(29);
  });
});
