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

// NBSP joins a number to its unit and the parts of a duration, so that none is split over two
// lines.
const NBSP = '\u00a0';

// sig3 is a positive number with 3 significant digits at most, trailing zeros dropped.
const sig3 = (v) => String(Number(v.toPrecision(3)));

// The units of durations under a minute, largest first, in milliseconds.
const SMALL_UNITS = [['s', 1000], ['ms', 1], ['µs', 1e-3], ['ns', 1e-6]];

// duration formats milliseconds for a person, the unit chosen by magnitude: 850 ns, 41 µs,
// 3.63 ms, 1.12 s (3 significant digits at most under a minute), then 2 min 5 s, 1 h 2 min,
// 3 d 4 h. Every duration the pages show goes through it.
export function duration(ms) {
  if (!Number.isFinite(ms) || ms <= 0) return `0${NBSP}s`;
  const r = Number(ms.toPrecision(3)); // rounded first: 999.9 µs is 1 ms, 59.96 s is 1 min
  if (r < 60000) {
    const [unit, size] = SMALL_UNITS.find(([, size]) => r >= size) || SMALL_UNITS[SMALL_UNITS.length - 1];
    return sig3(r / size) + NBSP + unit;
  }
  const parts = (big, bigUnit, small, smallUnit) =>
    big + NBSP + bigUnit + (small ? NBSP + small + NBSP + smallUnit : '');
  const s = Math.round(ms / 1000);
  if (s < 3600) return parts(Math.floor(s / 60), 'min', s % 60, 's');
  const min = Math.round(ms / 60000);
  if (min < 24 * 60) return parts(Math.floor(min / 60), 'h', min % 60, 'min');
  const h = Math.round(ms / 3600000);
  return parts(Math.floor(h / 24), 'd', h % 24, 'h');
}

// The units of Go's time.Duration.String() and time.ParseDuration, in milliseconds.
const GO_UNITS = {h: 3600000, m: 60000, s: 1000, ms: 1, us: 1e-3, 'µs': 1e-3, 'μs': 1e-3, ns: 1e-6};
const GO_PART = /(\d+(?:\.\d*)?|\.\d+)(h|ms|m|s|us|µs|μs|ns)/y;

// goDuration reads a duration as Go writes it (time.Duration.String: "1.120755978s",
// "41.012µs", "1h2m3s", "0s"; the API's durations are such strings) into milliseconds; NaN for
// anything else.
export function goDuration(text) {
  if (typeof text !== 'string') return NaN;
  let s = text;
  let sign = 1;
  if (s[0] === '-' || s[0] === '+') {
    sign = s[0] === '-' ? -1 : 1;
    s = s.slice(1);
  }
  if (s === '0') return 0;
  if (s === '') return NaN;
  let ms = 0;
  GO_PART.lastIndex = 0;
  while (GO_PART.lastIndex < s.length) {
    const m = GO_PART.exec(s);
    if (!m) return NaN;
    ms += Number(m[1]) * GO_UNITS[m[2]];
  }
  return sign * ms;
}

// goDurationText formats a duration as Go writes it for a person (duration); what does not
// read as one is shown as it is.
export function goDurationText(text) {
  const ms = goDuration(text);
  return Number.isNaN(ms) ? String(text ?? '') : duration(ms);
}

// A run of more characters than this with no place to wrap (no space, hyphen or separator) may
// break anywhere: a long hash or name must not push its table wider than the page.
const LONG_TOKEN = 32;

// name shows a name, or a text full of them (a zone, a resource, a path, an error), so that it
// wraps at spaces, after hyphens and after the separators of names (/ . : _ , @ =; not inside a
// number such as 1.12 or 12:00:01), never inside a word; only a run of more than LONG_TOKEN
// characters between those may break inside (class long-token).
export function name(text) {
  const e = el('span', {class: 'name'});
  const chars = [...String(text ?? '')];
  let run = '';
  const flush = () => {
    if (run.length > LONG_TOKEN) e.append(el('span', {class: 'long-token', text: run}));
    else if (run) e.append(run);
    run = '';
  };
  chars.forEach((ch, i) => {
    if (/\s|-/.test(ch)) {
      flush();
      e.append(ch); // the browser wraps here
    } else if (/[/.:_,@=]/.test(ch) && !(/[.:,]/.test(ch) && /\d/.test(chars[i + 1] || ''))) {
      flush();
      e.append(ch, document.createElement('wbr'));
    } else {
      run += ch;
    }
  });
  flush();
  return e;
}

// clock formats a time as the browser's local HH:MM:SS.
export function clock(iso) {
  const t = Date.parse(iso);
  if (Number.isNaN(t) || t <= 0) return '-';
  return new Date(t).toLocaleTimeString([], {hour12: false});
}

// ago formats a time as "12:00:01 (3 min 5 s ago)".
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
      status.textContent = `live: updated ${new Date().toLocaleTimeString([], {hour12: false})}, every ${duration(interval)}`;
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
