// What both status pages use: DOM building that never parses markup (every value shown is set
// as text, names come from zones), the token kept in this tab, data calls to this origin only,
// the global's clock, and formatting.

const TOKEN_KEY = 'kds-host.token';
const SVG_NS = 'http://www.w3.org/2000/svg';

function fill(e, props, children) {
  for (const [k, v] of Object.entries(props || {})) {
    if (v === undefined || v === null || v === false) continue;
    if (k === 'class') e.setAttribute('class', v);
    else if (k === 'text') e.textContent = String(v);
    else if (k.startsWith('on')) e.addEventListener(k.slice(2), v);
    else e.setAttribute(k, String(v));
  }
  for (const c of children.flat(Infinity)) {
    if (c === undefined || c === null || c === false) continue;
    e.append(c instanceof Node ? c : String(c)); // a string becomes a text node
  }
  return e;
}

// el builds an HTML element; props are attributes (class, text, data-*), children nodes or text.
export function el(tag, props, ...children) {
  return fill(document.createElement(tag), props, children);
}

// svg builds an SVG element the same way.
export function svg(tag, props, ...children) {
  return fill(document.createElementNS(SVG_NS, tag), props, children);
}

// table builds a table of rows (headers null: none); a row is an array of cells (text or
// nodes), or {cells, props}.
export function table(headers, rows, props) {
  return el('table', props,
    headers ? el('thead', null, el('tr', null, headers.map((h) => el('th', {text: h})))) : null,
    el('tbody', null, rows.map((r) => {
      const cells = Array.isArray(r) ? r : r.cells;
      return el('tr', Array.isArray(r) ? null : r.props, cells.map((c) => el('td', null, c)));
    })));
}

export const token = {
  get: () => sessionStorage.getItem(TOKEN_KEY) || '',
  set: (t) => sessionStorage.setItem(TOKEN_KEY, t),
  clear: () => sessionStorage.removeItem(TOKEN_KEY),
};

export class HTTPError extends Error {
  constructor(status, title, details) {
    super(`${status} ${title}${details ? ': ' + details : ''}`);
    this.status = status;
    this.title = title;
    this.details = details;
  }
}

// getJSON fetches a path of this origin; with auth it sends the tab's token. It refuses
// anything but a path (no scheme, no other host), so the token goes nowhere else.
export async function getJSON(path, auth) {
  if (typeof path !== 'string' || !path.startsWith('/') || path.startsWith('//') || path.includes('\\')) {
    throw new Error('not a path of this origin: ' + path);
  }
  const headers = {Accept: 'application/json'};
  if (auth && token.get()) headers.Authorization = 'Bearer ' + token.get();
  const resp = await fetch(path, {headers, credentials: 'omit', cache: 'no-store', redirect: 'error'});
  const body = await resp.json().catch(() => null);
  if (!resp.ok) {
    throw new HTTPError(resp.status, (body && body.title) || resp.statusText, (body && body.details) || '');
  }
  return body;
}

// The global's clock: the page counts down against it, not against the browser's.
let clockOffset = 0;
export function setServerNow(iso) {
  const t = Date.parse(iso);
  if (!Number.isNaN(t)) clockOffset = t - Date.now();
}
export function serverNow() {
  return Date.now() + clockOffset;
}

// duration formats milliseconds as 850ms, 4.2s, 3m 05s, 2h 10m.
export function duration(ms) {
  ms = Math.max(0, ms);
  if (ms < 1000) return `${Math.round(ms)}ms`;
  if (ms < 60000) return `${(ms / 1000).toFixed(1)}s`;
  const s = Math.floor(ms / 1000);
  if (s < 3600) return `${Math.floor(s / 60)}m ${String(s % 60).padStart(2, '0')}s`;
  return `${Math.floor(s / 3600)}h ${String(Math.floor(s / 60) % 60).padStart(2, '0')}m`;
}

// clock formats a time as the browser's local HH:MM:SS.
export function clock(iso) {
  const t = Date.parse(iso);
  if (Number.isNaN(t) || t <= 0) return '-';
  return new Date(t).toLocaleTimeString([], {hour12: false});
}

// ago formats a time as "12:00:01 (3m 05s ago)".
export function ago(iso) {
  const t = Date.parse(iso);
  if (Number.isNaN(t) || t <= 0) return '-';
  return `${clock(iso)} (${duration(serverNow() - t)} ago)`;
}

// countdown is a span that counts down to deadline (an ISO time); tick() keeps it live.
export function countdown(deadline) {
  const e = el('span', {class: 'countdown', 'data-deadline': deadline});
  tickOne(e);
  return e;
}

function tickOne(e) {
  const left = Date.parse(e.getAttribute('data-deadline')) - serverNow();
  e.textContent = left > 0 ? `in ${duration(left)}` : 'due now';
  e.classList.toggle('due', left <= 0);
}

// tick refreshes every countdown on the page, between polls.
export function tick() {
  for (const e of document.querySelectorAll('.countdown[data-deadline]')) tickOne(e);
}

let ticking = 0;

// poll runs refresh now and every interval after it finished, and shows how it went.
export function poll(refresh, interval, onError) {
  let polls = 0;
  let timer = 0;
  let stopped = false;
  const status = document.getElementById('status');
  async function run() {
    try {
      await refresh();
      polls++;
      document.body.setAttribute('data-polls', String(polls));
      status.textContent = `live: updated ${new Date().toLocaleTimeString([], {hour12: false})}, every ${interval / 1000}s`;
      status.classList.remove('error');
    } catch (err) {
      status.textContent = `update failed: ${err.message}`;
      status.classList.add('error');
      if (onError && onError(err) === false) stopped = true;
    }
    if (!stopped) timer = setTimeout(run, interval);
  }
  run();
  if (!ticking) ticking = setInterval(tick, 200);
  return () => {
    stopped = true;
    clearTimeout(timer);
  };
}

export function badge(ok, yes, no) {
  return el('span', {class: ok ? 'badge ok' : 'badge bad', text: ok ? yes : no});
}
