import { createHash } from 'node:crypto';

/*
 * The lock board's one page: plain HTML, CSS and JS in this string, so there is nothing to build,
 * copy or fetch from elsewhere. Every value from the store (keys, instances, sites) reaches the
 * document as text (textContent), never as markup: a key such as `<img onerror=...>` shows as
 * those characters. The page learns its own URL from `location`, so it works under any path and
 * global prefix, and sends no credentials of its own: the browser's (cookies, basic auth) go with
 * each request, which is what the board's guard sees.
 */

const STYLE = `
  :root { --ink: #1d2330; --muted: #5d6678; --line: #e3e6ec; --bg: #f6f7f9; --bad: #c62828; --warn: #b26a00; --good: #2e7d32; --accent: #3949ab; }
  * { box-sizing: border-box; }
  body { margin: 0; font: 14px/1.45 system-ui, -apple-system, "Segoe UI", Roboto, sans-serif; color: var(--ink); background: var(--bg); }
  main { max-width: 1200px; margin: 0 auto; padding: 24px 20px 40px; }
  header { display: flex; align-items: baseline; gap: 16px; flex-wrap: wrap; }
  h1 { font-size: 22px; margin: 0; }
  h2 { font-size: 15px; margin: 28px 0 10px; }
  .muted { color: var(--muted); }
  code, .mono { font-family: ui-monospace, "SFMono-Regular", Menlo, monospace; font-size: 12.5px; }
  .bar { display: flex; gap: 12px; align-items: center; margin: 16px 0 12px; flex-wrap: wrap; }
  input { width: 320px; padding: 7px 10px; border: 1px solid var(--line); border-radius: 6px; font: inherit; }
  #status::before { content: "●"; margin-right: 6px; color: var(--muted); }
  #status[data-state="live"]::before { color: var(--good); }
  #status[data-state="down"]::before { color: var(--bad); }
  table { width: 100%; border-collapse: collapse; background: #fff; border: 1px solid var(--line); border-radius: 10px; overflow: hidden; }
  th, td { text-align: left; vertical-align: top; padding: 8px 12px; border-bottom: 1px solid var(--line); }
  th { font-size: 12px; color: var(--muted); font-weight: 600; background: #fafbfc; }
  td.key { font-weight: 600; word-break: break-all; max-width: 260px; }
  .holder + .holder { margin-top: 6px; padding-top: 6px; border-top: 1px dashed var(--line); }
  .who { font-weight: 600; }
  .site { color: var(--accent); }
  .facts { color: var(--muted); font-size: 12.5px; }
  .here { font-size: 11px; background: #e8eaf6; color: var(--accent); border-radius: 4px; padding: 0 5px; margin-left: 4px; }
  ol.waiters { margin: 0; padding-left: 20px; }
  .none { color: var(--muted); }
  .hot { color: var(--warn); font-weight: 600; }
  .lost { color: var(--bad); font-weight: 600; }
  button.release { background: #fff; color: var(--bad); border: 1px solid #f3b7b7; border-radius: 6px; padding: 3px 9px; font: inherit; font-size: 12px; cursor: pointer; margin-top: 4px; }
  #message { font-size: 13px; }
  #message:empty { display: none; }
  #message.bad { color: var(--bad); }
  .empty td { color: var(--muted); text-align: center; padding: 24px; }
`;

const SCRIPT = `
'use strict';
const base = location.pathname.replace(/\\/+$/, '');
const filter = document.getElementById('prefix');
const status = document.getElementById('status');
const message = document.getElementById('message');
filter.value = new URLSearchParams(location.search).get('prefix') || '';
let source;

/** An element whose string children become text nodes, never markup. */
function el(tag, attrs, ...children) {
  const node = document.createElement(tag);
  for (const [name, value] of Object.entries(attrs || {})) if (value !== undefined && value !== false) node.setAttribute(name, String(value));
  for (const child of children.flat()) if (child !== undefined && child !== null && child !== false) node.append(child instanceof Node ? child : document.createTextNode(String(child)));
  return node;
}

function duration(ms) {
  if (ms === undefined) return '?';
  if (ms < 10000) return (ms / 1000).toFixed(1) + ' s';
  const s = Math.round(ms / 1000);
  if (s < 120) return s + ' s';
  const m = Math.floor(s / 60);
  if (m < 120) return s % 60 ? m + ' min ' + (s % 60) + ' s' : m + ' min';
  return Math.floor(m / 60) + ' h ' + (m % 60) + ' min';
}

function modeText(row) {
  if (row.mode === 'shared') return 'shared';
  if (row.mode === 'permits') return row.limit + ' permits';
  return 'exclusive';
}

function holderCell(row, snapshot) {
  return row.holders.map((h) => el('div', { class: 'holder' },
    el('span', { class: 'who', 'data-field': 'instance' }, h.instance || 'unnamed instance'),
    h.here ? el('span', { class: 'here' }, 'this instance') : '',
    h.site ? [' · ', el('span', { class: 'site', 'data-field': 'site' }, h.site)] : '',
    el('div', { class: 'facts' },
      h.fencingToken !== undefined ? ['token ', el('span', { class: 'mono', 'data-field': 'token' }, h.fencingToken), ' · '] : '',
      'held ', el('span', { 'data-field': 'age' }, duration(h.ageMs)), ' · lease ', el('span', { 'data-field': 'ttl' }, duration(h.ttlMs)), ' left'),
    snapshot.forceRelease ? el('button', { class: 'release', type: 'button', 'data-holder': h.id }, 'Force release') : ''));
}

function waitersCell(row) {
  if (!row.waiters) return el('span', { class: 'none' }, 'not told by this backend');
  if (row.waiters.length === 0) return el('span', { class: 'none' }, 'none');
  return el('ol', { class: 'waiters' }, row.waiters.map((w) => el('li', {},
    el('span', { class: 'who', 'data-field': 'instance' }, w.instance || 'unnamed instance'),
    w.site ? [' · ', el('span', { class: 'site', 'data-field': 'site' }, w.site)] : '',
    el('span', { class: 'facts' }, ' · waiting ', duration(w.waitingMs), w.mode === 'exclusive' ? '' : ' (' + w.mode + ')'))));
}

function contentionCell(c) {
  if (c.waits + c.busy + c.lost === 0) return el('span', { class: 'none' }, 'quiet');
  return el('span', {},
    el('span', { class: c.waits ? 'hot' : '' }, c.waits + ' waited'), ' · ',
    el('span', { class: c.busy ? 'hot' : '' }, c.busy + ' busy'), ' · ',
    el('span', { class: c.lost ? 'lost' : '' }, c.lost + ' lost'));
}

function render(snapshot) {
  document.getElementById('backend').textContent = snapshot.backend;
  document.getElementById('instance').textContent = snapshot.instance;
  document.getElementById('mode').textContent = snapshot.forceRelease ? 'force release on' : 'read-only';
  document.getElementById('window').textContent = duration(snapshot.contentionWindowMs);
  document.getElementById('hint').textContent = snapshot.listing ? '' : 'This backend cannot list its keys: type an exact key to look it up.';
  const rows = snapshot.locks.map((row) => el('tr', { 'data-key': row.key },
    el('td', { class: 'key mono', 'data-field': 'key' }, row.key),
    el('td', { 'data-field': 'mode' }, modeText(row)),
    el('td', { class: 'holders' }, holderCell(row, snapshot)),
    el('td', { class: 'line' }, waitersCell(row)),
    el('td', { class: 'contention' }, contentionCell(row.contention))));
  const empty = snapshot.prefix ? 'No lock is held under this prefix.' : 'No lock is held.';
  document.getElementById('locks').replaceChildren(...(rows.length ? rows : [el('tr', { class: 'empty' }, el('td', { colspan: 5 }, empty))]));
  document.getElementById('count').textContent = snapshot.locks.length + (snapshot.more ? '+ (narrow with a prefix)' : '');
  document.getElementById('contended').replaceChildren(...(snapshot.contended.length
    ? snapshot.contended.map((c) => el('tr', { 'data-key': c.key }, el('td', { class: 'key mono' }, c.key), el('td', {}, contentionCell(c))))
    : [el('tr', { class: 'empty' }, el('td', { colspan: 2 }, 'No waits, busy answers or lost locks seen by this instance.'))]));
  status.dataset.state = 'live';
  status.dataset.at = String(snapshot.at);
  status.textContent = 'live · ' + new Date(snapshot.at).toLocaleTimeString();
}

function connect() {
  if (source) source.close();
  source = new EventSource(base + '/api/stream?prefix=' + encodeURIComponent(filter.value));
  source.onmessage = (event) => {
    const data = JSON.parse(event.data);
    if (data.error) {
      status.dataset.state = 'down';
      status.textContent = data.error;
    } else render(data);
  };
  source.onerror = () => {
    status.dataset.state = 'down';
    status.textContent = 'disconnected, retrying…';
  };
}

let typing;
filter.addEventListener('input', () => {
  clearTimeout(typing);
  typing = setTimeout(() => {
    const prefix = filter.value;
    history.replaceState(null, '', prefix ? '?prefix=' + encodeURIComponent(prefix) : location.pathname);
    connect();
  }, 250);
});

document.getElementById('locks').addEventListener('click', async (event) => {
  const button = event.target.closest('button.release');
  if (!button) return;
  const key = button.closest('tr').dataset.key;
  if (!confirm('Force release ' + key + '? Its holder loses the lock at its next extension.')) return;
  const holder = button.dataset.holder;
  button.disabled = true;
  const response = await fetch(base + '/api/release', {
    method: 'POST',
    headers: { 'content-type': 'application/json' },
    body: JSON.stringify({ key, holder }),
  });
  const body = await response.json().catch(() => ({}));
  message.className = response.ok ? '' : 'bad';
  message.textContent = response.ok ? 'Released ' + key + '.' : (body.message || 'Refused: HTTP ' + response.status);
});

connect();
`;

const sha256 = (text: string): string => `'sha256-${createHash('sha256').update(text).digest('base64')}'`;

/** Only the page's own inline style and script run, and it talks to its own origin only. */
export const LOCK_BOARD_CSP = [
  "default-src 'none'",
  `style-src ${sha256(STYLE)}`,
  `script-src ${sha256(SCRIPT)}`,
  "connect-src 'self'",
  "base-uri 'none'",
  "form-action 'none'",
  "frame-ancestors 'none'",
].join('; ');

export const LOCK_BOARD_PAGE = /* html */ `<!doctype html>
<html lang="en">
<head>
<meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<meta name="referrer" content="no-referrer">
<title>Locks · nest-distributed-lock</title>
<style>${STYLE}</style>
</head>
<body>
<main>
  <header>
    <h1>Locks</h1>
    <span class="muted">backend <b id="backend">…</b> · seen from <b id="instance">…</b> · <span id="mode">…</span></span>
  </header>
  <div class="bar">
    <input id="prefix" type="search" placeholder="Filter by key prefix, e.g. order:" autocomplete="off" spellcheck="false" aria-label="Key prefix">
    <span id="status" data-state="connecting">connecting…</span>
    <span class="muted" id="hint"></span>
  </div>
  <div id="message"></div>
  <h2>Held now · <span id="count">0</span></h2>
  <table>
    <thead><tr><th>Key</th><th>Mode</th><th>Holder</th><th>Waiting, in order</th><th>Contention</th></tr></thead>
    <tbody id="locks"></tbody>
  </table>
  <h2>Most contended over the last <span id="window">…</span> (this instance's calls)</h2>
  <table>
    <thead><tr><th>Key</th><th>Waits, busy answers, lost locks</th></tr></thead>
    <tbody id="contended"></tbody>
  </table>
</main>
<script>${SCRIPT}</script>
</body>
</html>
`;
