// The global's status page: zones, their kinds and retry state, owner holds, a timeline chart
// per zone and the plugins, polled from the JSON API every second.
import {el, svg, table, token, getJSON, setServerNow, serverNow, duration, goDurationText, name, clock, ago, countdown, poll, badge} from './common.js';

const INTERVAL = 1000;
let plugins404 = false; // a global without a plugin runtime has no /api/plugins: stop asking
let stop = null;

const $ = (id) => document.getElementById(id);

// The zones shown: a filter and a page of GET /api/zones (its summary counts every zone).
const PAGE = 50;
const view = {state: '', zone: '', offset: 0};

function zonesPath() {
  const q = new URLSearchParams({offset: String(view.offset), limit: String(PAGE)});
  if (view.state) q.set('state', view.state);
  if (view.zone) q.set('zone', view.zone);
  return '/api/zones?' + q.toString();
}

function wireFilter() {
  $('zones-state').addEventListener('change', () => { view.state = $('zones-state').value; view.offset = 0; refresh(); });
  $('zones-q').addEventListener('input', () => { view.zone = $('zones-q').value.trim(); view.offset = 0; refresh(); });
  $('zones-prev').addEventListener('click', () => { view.offset = Math.max(0, view.offset - PAGE); refresh(); });
  $('zones-next').addEventListener('click', () => { view.offset += PAGE; refresh(); });
  $('zones-filter').addEventListener('submit', (ev) => ev.preventDefault());
}

async function main() {
  const cfg = await getJSON('/gui/config.json', false);
  wireFilter();
  $('signout').addEventListener('click', () => {
    token.clear();
    showLogin(cfg, '');
  });
  $('login-form').addEventListener('submit', (ev) => {
    ev.preventDefault();
    const t = $('token').value.trim();
    if (!t) return;
    token.set(t);
    $('token').value = '';
    start(cfg);
  });
  if (cfg.auth && !token.get()) showLogin(cfg, '');
  else start(cfg);
}

function showLogin(cfg, error) {
  if (stop) stop();
  stop = null;
  $('dashboard').hidden = true;
  $('signout').hidden = true;
  $('login').hidden = false;
  $('login-hint').textContent = 'This global needs an API token for its data: ' + (cfg.tokenHint || 'a user token') + '.';
  $('login-error').textContent = error;
  $('status').textContent = 'waiting for a token';
  $('token').focus();
}

function start(cfg) {
  $('login').hidden = true;
  $('dashboard').hidden = false;
  $('signout').hidden = !cfg.auth;
  if (stop) stop();
  stop = poll(refresh, INTERVAL, (err) => {
    if (cfg.auth && (err.status === 401 || err.status === 403)) {
      token.clear();
      showLogin(cfg, err.message);
      return false;
    }
    return true;
  });
}

async function refresh() {
  const [zones, timeline, unservable, plugins] = await Promise.all([
    getJSON(zonesPath(), true),
    getJSON('/api/timeline', true),
    getJSON('/api/unservable', true),
    plugins404 ? null : getJSON('/api/plugins', true).catch((err) => {
      if (err.status !== 404) throw err;
      plugins404 = true;
      return null;
    }),
  ]);
  setServerNow(timeline.now);
  renderCounts(zones);
  renderZones(zones.items || [], timeline);
  renderUnservable(unservable.items || []);
  renderPlugins(plugins);
}

// ---- stored resources the global cannot serve

function renderUnservable(items) {
  $('unservable-section').hidden = items.length === 0;
  const rows = items.map((u) => ({
    props: {class: 'unservable'},
    cells: [el('strong', null, name(`${u.key.kind} ${u.key.mesh ? u.key.mesh + '/' : ''}${u.key.name}`)), String(u.generation),
      u.column ? `${u.column} unreadable` : 'cannot be encoded', name(u.error)],
  }));
  $('unservable').replaceChildren(table(['resource', 'generation', 'column', 'error'], rows, {class: 'unservable'}));
}

// ---- zones

function renderCounts(zones) {
  const s = zones.summary || {};
  const parts = [`${s.zones || 0} zones`, `${s.connected || 0} connected`, `${s.disconnected || 0} disconnected`,
    `${s.failing || 0} failing`, `${s.withholding || 0} withholding`, `${s.givenUp || 0} given up`];
  $('zones-counts').textContent = parts.join(' · ');
  const total = zones.total || 0;
  const first = total ? view.offset + 1 : 0;
  const last = Math.min(view.offset + PAGE, total);
  $('zones-page').textContent = `${first}-${last} of ${total}`;
  $('zones-prev').disabled = view.offset === 0;
  $('zones-next').disabled = view.offset + PAGE >= total;
}

function failingKinds(zv) {
  return new Map(((zv.retry && zv.retry.failing) || []).map((k) => [k.kind, k]));
}

const names = (n) => `${n} name${n === 1 ? '' : 's'}`;

// heldBack counts the names of a zone's retry state that no round resends: the rejected names
// owner holds withhold (retryWithheld), and the names the retry policy parked; resendable are
// the rest of the rejected names.
function heldBack(zv) {
  const withheld = Object.values(zv.retryWithheld || {}).reduce((n, list) => n + list.length, 0);
  let rejected = 0, parked = 0;
  for (const k of (zv.retry && zv.retry.failing) || []) {
    rejected += (k.rejected || []).length;
    parked += (k.parked || []).length;
  }
  return {withheld, parked, resendable: rejected - withheld};
}

// pending says what a zone's failing names wait for while no round is armed and the policy has
// not given up: short for the zones table, long for the zone's retry line, held when every
// failing name is withheld or parked (a round is decided only for names a round would resend).
function pending(zv) {
  if (!((zv.retry && zv.retry.failing) || []).length) return {short: 'none pending', long: 'nothing failing'};
  const h = heldBack(zv);
  if (h.resendable > 0) return {short: 'deciding', long: 'deciding the next round'};
  const short = [], long = [];
  if (h.withheld) {
    short.push(`withheld: ${names(h.withheld)}`);
    long.push(`withheld: ${names(h.withheld)} held by owner holds until they let ${h.withheld === 1 ? 'it' : 'them'} go`);
  }
  if (h.parked) {
    short.push(`parked: ${names(h.parked)}`);
    long.push(`parked: ${names(h.parked)} held by the retry policy (each name's reason below)`);
  }
  return {short: short.join(', '), long: long.join('; ') + '; no round pending', held: true};
}

function retryCell(zv) {
  const r = zv.retry;
  if (!r) return zv.connected ? 'no stream state' : '-';
  if (r.givenUp) return el('span', {class: 'gaveup', text: 'gave up'});
  if (r.nextRetry) return countdown(r.nextRetry);
  const p = pending(zv);
  return el('span', {class: p.held ? 'pending held' : 'pending', text: p.short});
}

function renderZones(items, timeline) {
  const rows = items.map((zv) => ({
    props: {class: zv.connected ? 'zone-row' : 'zone-row disconnected', 'data-zone': zv.zone},
    cells: [
      el('strong', null, name(zv.zone)),
      badge(zv.connected, 'connected', 'disconnected'),
      ago(zv.since),
      zv.replica ? name(`${zv.replica}${zv.replicaAddress ? ' (' + zv.replicaAddress + ')' : ''}`) : '-',
      name([...failingKinds(zv).keys()].join(', ') || 'none'),
      zv.retry ? String(zv.retry.round) : '-',
      retryCell(zv),
      String((zv.kinds || []).reduce((n, k) => n + (k.nacks || 0), 0)),
    ],
  }));
  $('zones-summary').replaceChildren(items.length
    ? table(['zone', 'state', 'since', 'replica', 'failing kinds', 'round', 'next retry', 'NACKs'], rows, {class: 'summary'})
    : el('p', {class: 'note', text: 'No zone has connected yet.'}));
  const events = timeline.zones || {};
  $('zones').replaceChildren(...items.map((zv) => zoneCard(zv, events[zv.zone] || [], timeline.cap)));
}

function zoneCard(zv, events, cap) {
  const failing = failingKinds(zv);
  const meta = [`since ${ago(zv.since)}`];
  if (zv.stream) meta.push(`stream ${zv.stream}`);
  if (zv.replica) meta.push(`replica ${zv.replica}${zv.replicaAddress ? ' at ' + zv.replicaAddress : ''}`);
  if (zv.heartbeat) meta.push(`heartbeat ${ago(zv.heartbeat)}`);
  return el('section', {class: 'zone', 'data-zone': zv.zone},
    el('h2', null, 'Zone ', name(zv.zone), ' ', badge(zv.connected, 'connected', 'disconnected')),
    el('p', {class: 'meta'}, name(meta.join(' · '))),
    retryBlock(zv),
    kindsTable(zv, failing),
    rejectedBlock(zv, failing),
    withheldBlock(zv),
    giveUps(events),
    el('h3', {text: 'Timeline'}),
    timelineChart(events, cap),
  );
}

function retryBlock(zv) {
  const r = zv.retry;
  if (!r) return el('p', {class: 'retry note', text: zv.connected ? 'Retry: no state for this stream.' : 'Retry: the zone is not connected.'});
  const parts = [el('strong', {text: 'Retry'}), ` round ${r.round}`];
  if (r.nextRetry) parts.push(' · next retry ', countdown(r.nextRetry), ` (at ${clock(r.nextRetry)})`);
  else if (!r.givenUp) {
    const p = pending(zv);
    parts.push(' · ', el('span', {class: p.held ? 'pending held' : 'pending', text: p.long}));
  }
  if (r.lastDelay) parts.push(` · last delay ${goDurationText(r.lastDelay)}`);
  const block = el('div', {class: 'retry'}, el('p', null, parts));
  if (r.reason) block.append(el('p', {class: 'reason'}, el('span', {class: 'label', text: 'decision: '}), name(r.reason)));
  if (r.givenUp) block.append(el('p', {class: 'gaveup'}, el('span', {class: 'label', text: 'gave up: '}), name(r.givenUp)));
  return block;
}

function kindsTable(zv, failing) {
  const kinds = zv.kinds || [];
  if (!kinds.length) return el('p', {class: 'note', text: 'Nothing sent to this zone yet.'});
  const rows = kinds.map((k) => {
    const bad = failing.has(k.kind) || (k.rejected || []).length > 0;
    return {
      props: {class: bad ? 'kind failing' : 'kind', 'data-kind': k.kind},
      cells: [el('strong', {text: k.kind}), String(k.sent), String(k.responses), String(k.acks), String(k.nacks),
        String(k.withheld || 0), String((k.rejected || []).length), String(k.known), k.lastError ? name(k.lastError) : ''],
    };
  });
  return table(['kind', 'sent (resources)', 'responses', 'ACKed', 'NACKed', 'withheld', 'rejected', 'known', 'last error'], rows, {class: 'kinds'});
}

function rejectedBlock(zv, failing) {
  const withheld = new Map(Object.entries(zv.retryWithheld || {}).map(([kind, names]) => [kind, new Set(names)]));
  const none = new Set();
  const rows = [];
  for (const k of zv.kinds || []) {
    for (const r of k.rejected || []) {
      const held = (withheld.get(k.kind) || none).has(r.name);
      rows.push({props: {class: held ? 'rejected withheld-name' : 'rejected', 'data-kind': k.kind},
        cells: [k.kind, name(r.name), [r.cause || 'unspecified', held ? el('span', {class: 'tag', text: 'withheld'}) : null],
          r.reason ? name(r.reason) : '', r.missingOwner ? name(r.missingOwner) : '']});
    }
  }
  for (const [kind, ks] of failing) {
    for (const p of ks.parked || []) {
      rows.push({props: {class: 'parked-name', 'data-kind': kind}, cells: [kind, name(p.name), 'parked', p.reason ? name(p.reason) : '', '']});
    }
  }
  if (!rows.length) return el('p', {class: 'note', text: 'No rejected names.'});
  const failingRows = [...failing.values()].map((k) => {
    const held = withheld.get(k.kind) || none;
    const resent = (k.rejected || []).filter((n) => !held.has(n));
    const notes = [];
    if (held.size) notes.push(`${held.size} withheld`);
    if ((k.parked || []).length) notes.push(`${k.parked.length} parked`);
    return [k.kind, String(k.nacks), ago(k.firstNack),
      [name(resent.join(', ') || 'none'), notes.length ? el('span', {class: 'note', text: ` (${notes.join(', ')}: not resent)`}) : null]];
  });
  return el('div', null,
    el('h3', {text: 'Rejected and parked names'}),
    table(['kind', 'name', 'cause', 'reason', 'missing owner'], rows, {class: 'names'}),
    failingRows.length ? table(['failing kind', 'NACKs', 'first NACK', 'names resent by the next round'], failingRows, {class: 'failing-kinds'}) : null);
}

function withheldBlock(zv) {
  const withheld = zv.withheld || [];
  if (!withheld.length) return null;
  const key = (k) => `${k.kind || ''} ${k.mesh ? k.mesh + '/' : ''}${k.name || ''}`;
  return el('div', null,
    el('h3', {text: 'Withheld by owner holds'}),
    table(['resource', 'verdict', 'waiting for', 'reason'],
      withheld.map((h) => [name(key(h.key || {})), h.verdict, h.waitingFor ? name(h.waitingFor) : '', h.reason ? name(h.reason) : '']), {class: 'withheld'}));
}

function giveUps(events) {
  const g = events.filter((e) => e.type === 'gave-up');
  if (!g.length) return null;
  return el('div', null, el('h3', {text: 'Give-ups'}),
    table(['at', 'reason'], g.slice(-10).reverse().map((e) => [clock(e.at), e.detail ? name(e.detail) : '']), {class: 'giveups'}));
}

// ---- the timeline chart, drawn from the global's ring of the zone's latest events

const TICKS = [1, 2, 5, 10, 15, 30, 60, 120, 300, 600, 900, 1800, 3600, 7200].map((s) => s * 1000);

function timelineChart(events, cap) {
  const now = serverNow();
  const W = 960, left = 150, right = 20, top = 8, laneH = 20;
  const kinds = [...new Set(events.filter((e) => e.kind).map((e) => e.kind))].sort();
  const lanes = ['retry rounds', ...kinds];
  const H = top + lanes.length * laneH + 24;
  const first = events.length ? Date.parse(events[0].at) : now;
  const span = Math.max(10000, (now - first) * 1.1);
  const t0 = now - span;
  const x = (t) => left + ((t - t0) / span) * (W - left - right);
  const laneY = (i) => top + i * laneH + laneH / 2;
  const parts = [];
  lanes.forEach((name, i) => {
    parts.push(svg('text', {class: 'lane', x: left - 8, y: laneY(i) + 4, 'text-anchor': 'end', text: name}));
    parts.push(svg('line', {class: 'baseline', x1: left, x2: W - right, y1: laneY(i), y2: laneY(i)}));
  });
  const bottom = top + lanes.length * laneH;
  const step = TICKS.find((s) => span / s <= 8) || TICKS[TICKS.length - 1];
  for (let back = 0; back <= span; back += step) {
    const tx = x(now - back);
    parts.push(svg('line', {class: 'grid', x1: tx, x2: tx, y1: top, y2: bottom}));
    parts.push(svg('text', {class: 'tick', x: tx, y: bottom + 16, 'text-anchor': 'middle', text: back ? `-${duration(back)}` : 'now'}));
  }
  let nacks = 0, rounds = 0;
  for (const e of events) {
    const t = Date.parse(e.at);
    const ex = x(t);
    const when = clock(e.at);
    switch (e.type) {
      case 'nack': {
        nacks++;
        const y = laneY(lanes.indexOf(e.kind));
        parts.push(svg('circle', {class: 'nack', cx: ex, cy: y, r: 4},
          svg('title', {text: `${when} NACK of ${e.kind}: ${e.count || 0} rejected${e.detail ? ' — ' + e.detail : ''}`})));
        break;
      }
      case 'recovered': {
        const y = laneY(lanes.indexOf(e.kind));
        parts.push(svg('path', {class: 'recovered', d: `M${ex} ${y - 6}L${ex + 5} ${y}L${ex} ${y + 6}L${ex - 5} ${y}Z`},
          svg('title', {text: `${when} ${e.kind} ACKed again after its NACKs`})));
        break;
      }
      case 'round': {
        rounds++;
        const h = Math.min(laneH - 4, 4 + 2 * Math.log2(1 + (e.round || 1)) * 2);
        const resent = Object.entries(e.resent || {}).map(([k, n]) => `${k} ${n}`).join(', ');
        parts.push(svg('rect', {class: 'round', x: ex - 1.5, y: laneY(0) - h / 2, width: 3, height: h},
          svg('title', {text: `${when} round ${e.round} after ${goDurationText(e.delay)}: resent ${e.count || 0}${resent ? ' (' + resent + ')' : ''}`})));
        break;
      }
      default: // connected, disconnected, gave-up: a line across every lane
        parts.push(svg('line', {class: `mark ${e.type}`, x1: ex, x2: ex, y1: top, y2: bottom},
          svg('title', {text: `${when} ${e.type}${e.detail ? ': ' + e.detail : ''}`})));
    }
  }
  const caption = `Last ${events.length} events (a zone keeps at most ${cap}): ${nacks} NACKs, ${rounds} rounds. ` +
    'Red dots: NACKs; green diamonds: a kind ACKed again; blue bars: retry rounds (taller: later rounds); lines: connected (green), disconnected (grey), gave up (orange). Hover for details.';
  return el('figure', {class: 'timeline'},
    svg('svg', {class: 'chart', viewBox: `0 0 ${W} ${H}`, role: 'img', 'aria-label': `timeline of ${nacks} NACKs and ${rounds} rounds`}, parts),
    el('figcaption', {text: caption}));
}

// ---- plugins

// latency is a plugin's p50 / p90 / p99, or "-" before its first call (its percentiles are 0s).
function latency(p) {
  if (!p.latency || !p.calls) return '-';
  return [p.latency.p50, p.latency.p90, p.latency.p99].map(goDurationText).join(' / ');
}

function renderPlugins(report) {
  if (!report) {
    $('plugins').replaceChildren(el('p', {class: 'note', text: 'This global runs no plugin runtime (no /api/plugins).'}));
    return;
  }
  const rows = (report.items || []).map((p) => ({
    props: {class: p.state === 'running' || p.state === 'builtin' ? 'plugin' : 'plugin failing', 'data-plugin': p.name},
    cells: [el('strong', null, name(p.name)), name(p.path), name((p.serves || []).join(', ') + ((p.fallbackFor || []).length ? ` (fallback for ${p.fallbackFor.join(', ')})` : '')),
      p.state, ago(p.since), String(p.restarts), String(p.calls), String(p.errors), String(p.timeouts),
      el('span', {class: 'latency', text: latency(p)}),
      p.lastError ? name(`${p.lastError}${p.lastErrorAt ? ' (' + ago(p.lastErrorAt) + ')' : ''}`) : ''],
  }));
  const notes = [];
  if (report.config) notes.push(`config ${report.config}`);
  if (report.lastReload) notes.push(`last reload ${ago(report.lastReload.at)}${report.lastReload.error ? ': ' + report.lastReload.error : ''}`);
  const parts = [table(['plugin', 'path', 'serves', 'state', 'since', 'restarts', 'calls', 'errors', 'timeouts', 'latency p50 / p90 / p99', 'last error'], rows, {class: 'plugins'})];
  if (notes.length) parts.push(el('p', {class: 'note'}, name(notes.join(' · '))));
  $('plugins').replaceChildren(...parts);
}

main().catch((err) => {
  $('status').textContent = `the page could not start: ${err.message}`;
  $('status').classList.add('error');
});
