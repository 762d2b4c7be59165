import { Agent, request } from 'node:http';
import { performance } from 'node:perf_hooks';

/** The three ways to sell, and where each is served. */
export const DEMO_ENDPOINTS = {
  unsafe: 'purchase/unsafe',
  locked: 'purchase',
  atomic: 'purchase/atomic',
} as const;
export type DemoEndpoint = keyof typeof DEMO_ENDPOINTS;

export interface EndpointResult {
  /** Buyers who got an order (201). */
  sold: number;
  /** Stock in the database afterwards. */
  stockLeft: number;
  /** Orders beyond the stock there was: sold - stock, at least 0. */
  oversold: number;
  /** Wall time for all buyers of this endpoint. */
  ms: number;
}

/** The demo's result: the last line `npm run demo` prints, as JSON. */
export interface DemoSummary {
  demo: 'oversell';
  stock: number;
  buyers: number;
  results: Record<DemoEndpoint, EndpointResult>;
}

export interface EndpointProgress {
  endpoint: DemoEndpoint;
  done: number;
  sold: number;
  outOfStock: number;
  /** Anything but a sale or "out of stock": busy lock, refused stale write, network error. */
  failed: number;
}

export type DemoEvent =
  | { type: 'start'; stock: number; buyers: number; instances: number }
  | { type: 'endpoint'; endpoint: DemoEndpoint; productId: number }
  | ({ type: 'progress' } & EndpointProgress)
  | ({ type: 'result'; endpoint: DemoEndpoint; outOfStock: number; failed: number; failures: string[] } & EndpointResult)
  | { type: 'done'; summary: DemoSummary };

export interface DemoOptions {
  /** One or more shop instances sharing a database; buyers are spread over them in turn. */
  baseUrls: readonly string[];
  stock?: number;
  buyers?: number;
  onEvent?: (event: DemoEvent) => void;
  /** Time between progress events while an endpoint runs. */
  progressEveryMs?: number;
}

/**
 * For each endpoint: a fresh product with `stock` items (so every run starts from the same
 * state, whatever ran before), then `buyers` concurrent purchases of one item each.
 */
export async function runDemo(options: DemoOptions): Promise<DemoSummary> {
  const { baseUrls, stock = 100, buyers = 500, onEvent = () => undefined, progressEveryMs = 100 } = options;
  if (baseUrls.length === 0) throw new Error('runDemo needs at least one shop URL.');
  // One socket per buyer, so all of them are in flight at once, as separate clients would be.
  const agent = new Agent({ keepAlive: true, maxSockets: buyers });
  const client = new ShopClient(agent);
  const results = {} as Record<DemoEndpoint, EndpointResult>;
  const label = new Date().toISOString().slice(11, 19);
  try {
    onEvent({ type: 'start', stock, buyers, instances: baseUrls.length });
    for (const endpoint of Object.keys(DEMO_ENDPOINTS) as DemoEndpoint[]) {
      const created = await client.send('POST', `${baseUrls[0]}/products`, { name: `Demo ${label} · ${endpoint}`, stock });
      if (created.status !== 201) throw new Error(`Creating the demo product failed: ${created.status} ${JSON.stringify(created.body)}`);
      const productId = (created.body as { id: number }).id;
      onEvent({ type: 'endpoint', endpoint, productId });

      // Every buyer's connection is opened first (a GET each), so the purchases below leave
      // together on open sockets, as from 500 browsers already on the page, rather than
      // trickling out at the pace this one process can open TCP connections.
      await Promise.all(
        Array.from({ length: buyers }, (_, buyer) => client.send('GET', `${baseUrls[buyer % baseUrls.length]}/products/${productId}`)),
      );

      const progress: EndpointProgress = { endpoint, done: 0, sold: 0, outOfStock: 0, failed: 0 };
      const failures = new Map<string, number>();
      const ticker = setInterval(() => onEvent({ type: 'progress', ...progress }), progressEveryMs);
      const started = performance.now();
      try {
        await Promise.all(
          Array.from({ length: buyers }, async (_, buyer) => {
            const url = `${baseUrls[buyer % baseUrls.length]}/products/${productId}/${DEMO_ENDPOINTS[endpoint]}`;
            const response = await client
              .send('POST', url, { quantity: 1 })
              .catch((error: Error) => ({ status: 0, body: { message: error.message } }));
            const body = response.body as { code?: string; message?: string } | undefined;
            if (response.status === 201) progress.sold++;
            else if (response.status === 409 && body?.code === 'OUT_OF_STOCK') progress.outOfStock++;
            else {
              progress.failed++;
              const reason = `${response.status} ${body?.code ?? ''} ${body?.message ?? ''}`.replace(/\s+/g, ' ').trim();
              failures.set(reason, (failures.get(reason) ?? 0) + 1);
            }
            progress.done++;
          }),
        );
      } finally {
        clearInterval(ticker);
      }
      const ms = Math.round(performance.now() - started);
      onEvent({ type: 'progress', ...progress });

      const product = await client.send('GET', `${baseUrls[0]}/products/${productId}`);
      const stockLeft = (product.body as { stock: number }).stock;
      results[endpoint] = { sold: progress.sold, stockLeft, oversold: Math.max(0, progress.sold - stock), ms };
      onEvent({
        type: 'result',
        endpoint,
        ...results[endpoint],
        outOfStock: progress.outOfStock,
        failed: progress.failed,
        failures: [...failures].map(([reason, count]) => `${count} × ${reason}`),
      });
    }
  } finally {
    agent.destroy();
  }
  const summary: DemoSummary = { demo: 'oversell', stock, buyers, results };
  onEvent({ type: 'done', summary });
  return summary;
}

/** Just enough HTTP for the demo, on node:http so the sockets are ours to close. */
class ShopClient {
  constructor(private readonly agent: Agent) {}

  send(method: 'GET' | 'POST', url: string, body?: unknown): Promise<{ status: number; body: unknown }> {
    const payload = body === undefined ? undefined : JSON.stringify(body);
    return new Promise((resolve, reject) => {
      const req = request(
        url,
        {
          method,
          agent: this.agent,
          headers: payload ? { 'content-type': 'application/json', 'content-length': Buffer.byteLength(payload) } : {},
        },
        (res) => {
          let text = '';
          res.setEncoding('utf8');
          res.on('data', (chunk: string) => (text += chunk));
          res.on('end', () => {
            let parsed: unknown = text;
            try {
              parsed = text ? JSON.parse(text) : undefined;
            } catch {
              // Not JSON: keep the text for the failure message.
            }
            resolve({ status: res.statusCode ?? 0, body: parsed });
          });
          res.on('error', reject);
        },
      );
      req.on('error', reject);
      req.end(payload);
    });
  }
}
