// A zone's read-only status page: its connection to the global, what it refused (NACKs by
// kind, the last error, why it is blocked) and what it has ACKed (its resources), polled from its API every second
// (the resource lists every fifth second).
import {el, table, getJSON, ago, name, poll, badge} from './common.js';

const INTERVAL = 1000;
const LIST_EVERY = 5;
const NAMES_SHOWN = 50;
const $ = (id) => document.getElementById(id);

let polls = 0;
let acked = null; // [{kind, scope, items, total}] from the last list

async function refresh() {
  const stats = await getJSON('/api/zone', false);
  if (polls++ % LIST_EVERY === 0) {
    const kinds = await getJSON('/_resources', false);
    acked = await Promise.all((kinds.resources || []).map(async (k) => {
      const list = await getJSON('/' + encodeURIComponent(k.path), false);
      return {kind: k.name, scope: k.scope, items: list.items || [], total: list.total || 0};
    }));
  }
  render(stats);
}

function render(s) {
  const rows = [
    ['state', badge(s.connected, 'connected', 'not connected')],
    ['global', s.global ? name(s.global) : '-'],
    ['since', ago(s.since)],
    ['sessions', String(s.sessions)],
    ['responses / ACKs / NACKs', `${s.responses} / ${s.acks} / ${s.nacks}`],
    ['re-requests (a refusal\'s cause cleared)', String(s.reRequests)],
  ];
  const conn = [table(null, rows, {class: 'facts'})];
  if (s.blocked) conn.push(el('p', {class: 'blocked'}, el('strong', {text: 'Blocked: '}), name(s.blocked)));
  $('connection').replaceChildren(...conn);

  const byKind = Object.entries(s.nacksByKind || {}).sort((a, b) => b[1] - a[1] || a[0].localeCompare(b[0]));
  const refused = [];
  if (byKind.length) {
    refused.push(table(['kind', 'NACKs'], byKind.map(([k, n]) => ({props: {class: 'kind failing', 'data-kind': k}, cells: [el('strong', {text: k}), String(n)]})), {class: 'kinds'}));
  } else {
    refused.push(el('p', {class: 'note', text: 'Nothing refused.'}));
  }
  if (s.lastError) refused.push(el('p', {class: 'last-error'}, el('span', {class: 'label', text: 'last error: '}), name(s.lastError)));
  $('refused').replaceChildren(...refused);

  if (!acked) return;
  $('acked').replaceChildren(table(['kind', 'count', 'names'], acked.map((h) => {
    const names = h.items.slice(0, NAMES_SHOWN).map((r) => (r.mesh ? r.mesh + '/' : '') + r.name);
    if (h.total > NAMES_SHOWN) names.push(`… and ${h.total - NAMES_SHOWN} more`);
    return {props: {class: 'kind', 'data-kind': h.kind}, cells: [el('strong', {text: h.kind}), String(h.total), name(names.join(', '))]};
  }), {class: 'acked'}));
}

poll(refresh, INTERVAL);
