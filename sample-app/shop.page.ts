import { DEMO_MAX_BUYERS, DEMO_MAX_STOCK } from './demo.controller.js';

/** The three ways to buy, one result card each. */
const ENDPOINTS = [
  {
    endpoint: 'unsafe',
    title: 'Unsafe',
    what: 'Read stock, subtract in the program, write it back. No lock: buyers who read the same stock all sell.',
  },
  {
    endpoint: 'locked',
    title: 'Locked',
    what: "The same code under <code>@Locked('product:&lt;id&gt;')</code>, its write fenced by the lock's token.",
  },
  { endpoint: 'atomic', title: 'Atomic', what: 'The database decrements, refusing to go below zero. One statement, no lock needed.' },
];

function card({ endpoint, title, what }: (typeof ENDPOINTS)[number]): string {
  return `    <section class="card" data-endpoint="${endpoint}">
      <h3>${title}</h3>
      <div class="what">${what}</div>
      <div class="bar"><div></div></div>
      <dl><dt>Sold</dt><dd data-field="sold">–</dd><dt>Stock left</dt><dd data-field="stockLeft">–</dd>
        <dt>Oversold</dt><dd data-field="oversold">–</dd><dt>Time</dt><dd data-field="ms">–</dd></dl>
      <div class="verdict"></div>
    </section>`;
}

/** What the controls say when POST /demo is not served: the button would only get a 404. */
const DEMO_OFF =
  'The demo is off on this shop. Start it with <code>SHOP_DEMO=on npm run shop</code> to run it here, ' +
  'or run <code>npm run demo</code> in a terminal.';

/**
 * The shop's one page: products and their stock, and a button that runs the demo on this
 * instance, filling in each endpoint's numbers as the events stream in; with `demo` off, the
 * button is disabled and says how to switch it on. Plain HTML and JS, served as a string so there
 * is nothing to build or copy next to the compiled app.
 */
export const shopPage = ({ demo }: { demo: boolean }): string => /* html */ `<!doctype html>
<html lang="en">
<head>
<meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<title>Shop · nest-distributed-lock demo</title>
<style>
  :root { --ink: #1d2330; --muted: #5d6678; --line: #e3e6ec; --bg: #f6f7f9; --bad: #c62828; --good: #2e7d32; --accent: #3949ab; }
  * { box-sizing: border-box; }
  body { margin: 0; font: 15px/1.5 system-ui, -apple-system, "Segoe UI", Roboto, sans-serif; color: var(--ink); background: var(--bg); }
  main { max-width: 980px; margin: 0 auto; padding: 28px 20px 48px; }
  h1 { font-size: 24px; margin: 0 0 4px; }
  h2 { font-size: 17px; margin: 32px 0 12px; }
  p.lead { color: var(--muted); margin: 0 0 20px; }
  code { font-family: ui-monospace, "SFMono-Regular", Menlo, monospace; font-size: 13px; background: #eceef3; padding: 1px 5px; border-radius: 4px; }
  .controls { display: flex; gap: 14px; align-items: center; flex-wrap: wrap; }
  .controls label { color: var(--muted); font-size: 14px; }
  .controls input { width: 80px; padding: 6px 8px; border: 1px solid var(--line); border-radius: 6px; font: inherit; }
  button { background: var(--accent); color: #fff; border: 0; border-radius: 8px; padding: 10px 18px; font: inherit; font-weight: 600; cursor: pointer; }
  button:disabled { opacity: .55; cursor: progress; }
  #status { color: var(--muted); font-size: 14px; }
  .cards { display: grid; grid-template-columns: repeat(3, 1fr); gap: 14px; margin-top: 18px; }
  .card { background: #fff; border: 1px solid var(--line); border-radius: 10px; padding: 16px; }
  .card h3 { margin: 0; font-size: 16px; }
  .card .what { color: var(--muted); font-size: 13px; margin: 2px 0 12px; min-height: 60px; }
  .bar { height: 8px; background: #eceef3; border-radius: 4px; overflow: hidden; margin-bottom: 12px; }
  .bar > div { height: 100%; width: 0; background: var(--accent); transition: width .1s linear; }
  dl { display: grid; grid-template-columns: 1fr auto; gap: 4px 10px; margin: 0; }
  dt { color: var(--muted); }
  dd { margin: 0; text-align: right; font-variant-numeric: tabular-nums; font-weight: 600; }
  .card.bad { border-color: #f3b7b7; box-shadow: inset 0 3px 0 var(--bad); }
  .card.good { border-color: #b9dcbb; box-shadow: inset 0 3px 0 var(--good); }
  dd.bad { color: var(--bad); }
  dd.good { color: var(--good); }
  .verdict { margin-top: 10px; font-size: 13px; font-weight: 600; min-height: 20px; }
  .bad .verdict { color: var(--bad); }
  .good .verdict { color: var(--good); }
  table { width: 100%; border-collapse: collapse; background: #fff; border: 1px solid var(--line); border-radius: 10px; overflow: hidden; }
  th, td { text-align: left; padding: 8px 12px; border-bottom: 1px solid var(--line); }
  th { font-size: 13px; color: var(--muted); font-weight: 600; background: #fafbfc; }
  td.num, th.num { text-align: right; font-variant-numeric: tabular-nums; }
  tr:last-child td { border-bottom: 0; }
  @media (max-width: 760px) { .cards { grid-template-columns: 1fr; } }
</style>
</head>
<body>
<main>
  <h1>The shop that must not oversell</h1>
  <p class="lead">Many buyers, one product, three ways to take an item off the shelf.
    Built on <code>nest-distributed-lock</code>; every buyer is a real HTTP request to this server.
    <a href="locks" id="lock-board">Lock board</a>: who holds which lock and who waits, live.</p>

  <div class="controls">
    <button id="run" type="button"${demo ? '' : ' disabled'}>Run the demo</button>
    <label>buyers <input id="buyers" type="number" min="1" max="${DEMO_MAX_BUYERS}" value="500"${demo ? '' : ' disabled'}></label>
    <label>stock <input id="stock" type="number" min="1" max="${DEMO_MAX_STOCK}" value="100"${demo ? '' : ' disabled'}></label>
    ${demo ? '<span id="status" data-state="idle">Each endpoint gets a fresh product.</span>' : `<span id="status" data-state="off">${DEMO_OFF}</span>`}
  </div>

  <div class="cards">
${ENDPOINTS.map(card).join('\n')}
  </div>

  <h2>Products</h2>
  <table>
    <thead><tr><th class="num">id</th><th>name</th><th class="num">stock</th><th class="num">last fencing token</th></tr></thead>
    <tbody id="products"><tr><td colspan="4">Loading…</td></tr></tbody>
  </table>
</main>
<script>
  const $ = (selector, root = document) => root.querySelector(selector);
  const status = $('#status');
  let buyers = 500;

  function setStatus(text, state) {
    status.textContent = text;
    if (state) status.dataset.state = state;
  }

  async function loadProducts() {
    const products = await (await fetch('/products')).json();
    const body = $('#products');
    body.replaceChildren(...products.map((p) => {
      const row = document.createElement('tr');
      for (const [value, numeric] of [[p.id, true], [p.name, false], [p.stock, true], [p.lastToken || '–', true]]) {
        const cell = document.createElement('td');
        cell.textContent = value;
        if (numeric) cell.className = 'num';
        row.append(cell);
      }
      return row;
    }));
  }

  function card(endpoint) { return $('.card[data-endpoint="' + endpoint + '"]'); }

  function reset() {
    for (const el of document.querySelectorAll('.card')) {
      el.classList.remove('bad', 'good');
      for (const dd of el.querySelectorAll('dd')) { dd.textContent = '–'; dd.className = ''; }
      $('.bar > div', el).style.width = '0';
      $('.verdict', el).textContent = '';
    }
  }

  function show(event) {
    if (event.type === 'start') {
      buyers = event.buyers;
      setStatus(event.buyers + ' buyers, stock ' + event.stock + ' per endpoint…', 'running');
    } else if (event.type === 'endpoint') {
      setStatus('Selling product ' + event.productId + ' through ' + event.endpoint + '…', 'running');
    } else if (event.type === 'progress') {
      const el = card(event.endpoint);
      $('.bar > div', el).style.width = (100 * event.done / buyers) + '%';
      $('[data-field="sold"]', el).textContent = event.sold;
    } else if (event.type === 'result') {
      const el = card(event.endpoint);
      $('.bar > div', el).style.width = '100%';
      for (const field of ['sold', 'stockLeft', 'oversold']) $('[data-field="' + field + '"]', el).textContent = event[field];
      $('[data-field="ms"]', el).textContent = event.ms + ' ms';
      const oversold = $('[data-field="oversold"]', el);
      oversold.className = event.oversold > 0 ? 'bad' : 'good';
      el.classList.add(event.oversold > 0 ? 'bad' : 'good');
      $('.verdict', el).textContent = event.oversold > 0
        ? 'Sold ' + event.oversold + ' items that did not exist.'
        : 'Sold exactly what was in stock.' + (event.failed ? ' (' + event.failed + ' requests failed)' : '');
      loadProducts();
    } else if (event.type === 'done') {
      setStatus('Done. Run it again for fresh products.', 'done');
    } else if (event.type === 'error') {
      setStatus('The demo failed: ' + event.message, 'error');
    }
  }

  $('#run').addEventListener('click', async () => {
    const button = $('#run');
    button.disabled = true;
    reset();
    setStatus('Starting…', 'running');
    try {
      const response = await fetch('/demo', {
        method: 'POST',
        headers: { 'content-type': 'application/json' },
        body: JSON.stringify({ buyers: Number($('#buyers').value), stock: Number($('#stock').value) }),
      });
      if (!response.ok) throw new Error((await response.json()).message);
      const reader = response.body.pipeThrough(new TextDecoderStream()).getReader();
      let buffered = '';
      for (;;) {
        const { value, done } = await reader.read();
        if (done) break;
        buffered += value;
        const lines = buffered.split('\\n');
        buffered = lines.pop();
        for (const line of lines) if (line) show(JSON.parse(line));
      }
    } catch (error) {
      setStatus('The demo failed: ' + error.message, 'error');
    } finally {
      button.disabled = false;
      loadProducts();
    }
  });

  loadProducts();
</script>
</body>
</html>
`;
