// The jobguard dashboard: polls the JSON API under /api (docs/dashboard.md)
// and draws it. No libraries and no inline script (the server's CSP forbids
// both); plots are hand-drawn SVG. The lock list is virtualized: only the
// rows in view exist in the DOM, so 10,000 locks cost one JSON parse a
// second, not 10,000 elements.
'use strict';

const $ = (id) => document.getElementById(id);
const SVG = 'http://www.w3.org/2000/svg';
const ROW_H = 26;
const LOCKS_EVERY_MS = 1000;
const OTHERS_EVERY_MS = 2000;

const state = {
  config: null,
  locks: [],           // the last listing, sorted by resource
  fetchedAt: 0,        // performance.now() when it arrived
  classTtl: new Map(), // class -> declared ttl ms (catalog)
  classFenced: new Map(),
  seen: new Map(),     // resource|holder -> {ttl, at, max, renewals}
  selected: null,
  detailHeld: false,
  token: sessionStorage.getItem('jobguard-admin-token') || '',
  pendingAction: null,
};
// Measurements the browser test reads: when each listing was drawn (ms since
// navigation, and how many locks), the last update's fetch + parse + render time.
window.__jobguard = { paints: [], lastUpdateMs: null, lastRenderMs: null, updates: 0, lockCount: 0 };

// --- helpers -------------------------------------------------------------------

function el(tag, attrs, ...children) {
  const e = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs || {})) {
    if (v === undefined || v === null || v === false) continue;
    if (k === 'class') e.className = v;
    else if (k.startsWith('on')) e.addEventListener(k.slice(2), v);
    else e.setAttribute(k, v === true ? '' : String(v));
  }
  for (const c of children) if (c !== null && c !== undefined) e.append(c instanceof Node ? c : String(c));
  return e;
}

function svg(tag, attrs) {
  const e = document.createElementNS(SVG, tag);
  for (const [k, v] of Object.entries(attrs || {})) e.setAttribute(k, String(v));
  return e;
}

function duration(ms) {
  if (ms === null || ms === undefined || !isFinite(ms)) return '-';
  if (ms < 0) return '0s';
  if (ms < 1000) return `${Math.round(ms)}ms`;
  const s = ms / 1000;
  if (s < 60) return `${s < 10 ? s.toFixed(1) : Math.round(s)}s`;
  const m = Math.floor(s / 60);
  if (m < 60) return `${m}m${String(Math.floor(s % 60)).padStart(2, '0')}s`;
  return `${Math.floor(m / 60)}h${String(m % 60).padStart(2, '0')}m`;
}

function when(ms) {
  const d = new Date(ms);
  return d.toISOString().replace('T', ' ').replace('Z', ' UTC');
}

function num(v, digits = 2) {
  if (v === null || v === undefined) return '-';
  return Number(v).toFixed(digits);
}

function toast(text, bad) {
  const t = $('toast');
  t.textContent = text;
  t.className = bad ? 'bad' : '';
  t.hidden = false;
  clearTimeout(toast.timer);
  toast.timer = setTimeout(() => { t.hidden = true; }, 6000);
}

async function api(path, options = {}) {
  const ctl = new AbortController();
  const timer = setTimeout(() => ctl.abort(), 8000);  // every call has a deadline
  try {
    const r = await fetch(path, { ...options, signal: ctl.signal, cache: 'no-store' });
    const body = await r.json().catch(() => ({ error: `HTTP ${r.status}` }));
    if (!r.ok) {
      const e = new Error(body.error || `HTTP ${r.status}`);
      e.status = r.status;
      throw e;
    }
    return body;
  } finally {
    clearTimeout(timer);
  }
}

function setConn(ok, text) {
  const c = $('conn');
  c.textContent = text;
  c.className = `pill ${ok ? 'ok' : 'bad'}`;
}

// Runs `fn` now and then every `every` ms, counted from each start, so a
// slow answer does not stretch the period (never two runs at once).
function poll(fn, every) {
  let timer = null, running = false, again = false;
  const run = async () => {
    // A refresh asked for while one is in flight runs right after it: one
    // timer chain, whatever the callers do.
    if (running) { again = true; return; }
    running = true;
    clearTimeout(timer);
    const started = performance.now();
    try { await fn(); } catch (e) { setConn(false, e.message); }
    running = false;
    if (again) { again = false; run(); return; }
    timer = setTimeout(run, Math.max(100, every - (performance.now() - started)));
  };
  run();
  return run;  // call it to refresh at once
}

// "web-3/4121/invoice-run" -> host, pid, job; another client's value stays whole.
function splitHolder(h) {
  const parts = (h || '').split('/');
  if (parts.length >= 3 && /^\d+$/.test(parts[1])) return [parts[0], parts[1], parts.slice(2).join('/')];
  return [h || '-', '-', '-'];
}

// --- locks ---------------------------------------------------------------------------

function lockQuery() {
  const q = new URLSearchParams();
  const cls = $('f-class').value, prefix = $('f-prefix').value;
  if (cls) q.set('class', cls);
  if (prefix) q.set('prefix', prefix);
  return q.toString();
}

async function refreshLocks() {
  const t0 = performance.now();
  const data = await api(`/api/locks?${lockQuery()}`);
  const now = performance.now();
  state.classTtl = new Map(data.classes.map((c) => [c.class, c.ttl_ms]));
  state.classFenced = new Map(data.classes.map((c) => [c.class, c.fenced]));
  fillClassFilter(data.classes);
  // Renewals are not stored in Redis (that would cost every renewal a
  // write): the page counts the TTL jumps it sees while it is open.
  const seen = new Map();
  for (const l of data.locks) {
    const key = `${l.resource}|${l.holder}`;
    const prev = state.seen.get(key);
    const s = { ttl: l.ttl_left_ms, at: now, max: Math.max(l.ttl_left_ms, prev ? prev.max : 0), renewals: prev ? prev.renewals : 0 };
    if (prev && l.ttl_left_ms > prev.ttl - (now - prev.at) + 250) s.renewals += 1;
    seen.set(key, s);
  }
  state.seen = seen;
  state.locks = data.locks;
  state.fetchedAt = now;
  $('lock-count').textContent = `${data.count}${data.truncated ? '+' : ''}`;
  $('locks-meta').textContent = `${data.scan_calls} SCAN round trips, ${data.keys_matched} keys · updated ${new Date().toLocaleTimeString()}`;
  $('locks-empty').hidden = data.locks.length > 0;
  $('lock-spacer').style.height = `${data.locks.length * ROW_H}px`;
  const r0 = performance.now();
  renderRows();
  const t1 = performance.now();
  const m = window.__jobguard;
  if (m.paints.length < 100) m.paints.push({ at: t1, count: data.locks.length });
  m.lastUpdateMs = t1 - t0;
  m.lastRenderMs = t1 - r0;
  m.updates += 1;
  m.lockCount = data.locks.length;
  setConn(true, 'live');
  // The lock in the detail panel went away: say so (once).
  if (state.selected && state.detailHeld && !data.locks.some((l) => l.resource === state.selected)) showDetail(state.selected);
}

function fillClassFilter(classes) {
  const sel = $('f-class');
  if (sel.options.length - 1 === classes.length) return;
  const keep = sel.value;
  sel.replaceChildren(el('option', { value: '' }, 'all'), ...classes.map((c) => el('option', { value: c.class }, c.class)));
  sel.value = keep;
}

const rowPool = [];
function makeRow() {
  const bar = el('i');
  const row = el('div', { class: 'lockrow' },
    el('span', { class: 'res' }), el('span', { class: 'cls' }), el('span', { class: 'host' }), el('span', { class: 'pid num' }),
    el('span', { class: 'job' }), el('span', { class: 'age num' }),
    el('span', { class: 'ttl' }, el('span', { class: 'ttlbar' }, bar), el('span', { class: 'ttltext' })),
    el('span', { class: 'fence num' }), el('span', { class: 'renewals num' }), el('span', { class: 'waiters num' }));
  row.addEventListener('click', () => showDetail(row.dataset.resource));
  return row;
}

// Draws the rows in view, with TTLs and ages advanced to this moment.
function renderRows() {
  const scroll = $('lock-scroll');
  const first = Math.max(0, Math.floor(scroll.scrollTop / ROW_H));
  const n = Math.min(state.locks.length - first, Math.ceil(scroll.clientHeight / ROW_H) + 2);
  const rows = $('lock-rows');
  rows.style.top = `${first * ROW_H}px`;
  while (rowPool.length < n) rowPool.push(makeRow());
  const elapsed = performance.now() - state.fetchedAt;
  const wanted = rowPool.slice(0, Math.max(0, n));
  if (rows.childElementCount !== wanted.length) rows.replaceChildren(...wanted);
  for (let i = 0; i < wanted.length; ++i) {
    const l = state.locks[first + i];
    const row = wanted[i];
    const c = row.children;
    const [host, pid, job] = splitHolder(l.holder);
    const s = state.seen.get(`${l.resource}|${l.holder}`) || { max: l.ttl_left_ms, renewals: 0 };
    const cls = l.class || '';
    const total = state.classTtl.get(cls) || s.max || 1;
    const left = l.ttl_left_ms < 0 ? -1 : Math.max(0, l.ttl_left_ms - elapsed);
    row.dataset.resource = l.resource;
    row.dataset.holder = l.holder;
    row.classList.toggle('sel', l.resource === state.selected);
    c[0].textContent = l.resource; c[0].title = l.resource;
    c[1].textContent = cls || '-';
    c[2].textContent = host; c[3].textContent = pid; c[4].textContent = job; c[4].title = l.holder;
    const fenced = cls ? state.classFenced.get(cls) !== false : true;
    c[5].textContent = l.fence_age_ms === null || !fenced ? '-' : duration(l.fence_age_ms + elapsed);
    const bar = c[6].firstChild;
    const frac = left < 0 ? 1 : Math.min(1, left / total);
    bar.firstChild.style.width = `${(frac * 100).toFixed(1)}%`;
    bar.className = `ttlbar${frac < 0.1 ? ' crit' : frac < 0.3 ? ' low' : ''}`;
    c[6].lastChild.textContent = left < 0 ? 'none' : duration(left);
    c[7].textContent = l.fence === null ? '-' : String(l.fence);
    c[8].textContent = String(s.renewals);
    c[9].textContent = String(l.waiters);
  }
}

async function showDetail(resource) {
  state.selected = resource;
  const box = $('lock-detail');
  box.hidden = false;
  let d;
  try {
    d = await api(`/api/lock?resource=${encodeURIComponent(resource)}`);
  } catch (e) {
    box.replaceChildren(el('p', { class: 'error' }, e.message));
    return;
  }
  state.detailHeld = d.held;
  const [host, pid, job] = splitHolder(d.holder);
  const dl = el('dl', {},
    el('dt', {}, 'resource'), el('dd', {}, d.resource),
    el('dt', {}, 'key'), el('dd', {}, d.key),
    el('dt', {}, 'held'), el('dd', { id: 'detail-held' }, d.held ? 'yes' : 'no (released or expired)'),
    el('dt', {}, 'holder'), el('dd', {}, d.held ? `${host} pid ${pid} job ${job}` : '-'),
    el('dt', {}, 'class'), el('dd', {}, d.class || '-'),
    el('dt', {}, 'declared TTL'), el('dd', {}, d.declared_ttl_ms ? duration(d.declared_ttl_ms) : '-'),
    el('dt', {}, 'TTL left'), el('dd', {}, d.held ? duration(d.ttl_left_ms) : '-'),
    el('dt', {}, 'fence'), el('dd', {}, d.fence === null ? '-' : String(d.fence)),
    el('dt', {}, 'fair queue'), el('dd', {}, d.queue.length ? d.queue.join(' → ') : `${d.waiters} waiting`));
  const actions = el('div', {});
  if (state.config && state.config.actions && d.held)
    actions.append(el('button', { class: 'danger', id: 'btn-release', onclick: () => openAction({
      title: `Force release ${d.resource}`,
      what: `Deletes the lock held by ${d.holder}, advances its fence and wakes waiters. The holder is not stopped: only a downstream that checks fences refuses its late writes.`,
      path: '/api/locks/release',
      body: { resource: d.resource, holder: d.holder },
      done: (r) => `${r.resource}: ${r.outcome}${r.fence ? `, fence → ${r.fence}` : ''}`,
    }) }, 'Force release…'));
  actions.append(' ', el('button', { onclick: () => { state.selected = null; box.hidden = true; renderRows(); } }, 'Close'));
  box.replaceChildren(el('h3', {}, 'Lock'), dl, actions);
}

// --- actions -------------------------------------------------------------------------

function openAction(a) {
  state.pendingAction = a;
  $('action-title').textContent = a.title;
  $('action-what').textContent = a.what;
  $('action-reason').value = '';
  $('action-token').value = state.token;
  $('action-error').textContent = '';
  $('action-dialog').showModal();
  $('action-reason').focus();
}

async function submitAction(ev) {
  ev.preventDefault();
  const a = state.pendingAction;
  if (!a) return;
  const reason = $('action-reason').value.trim();
  if (!reason) { $('action-error').textContent = 'a reason is required'; return; }
  const token = $('action-token').value;
  const headers = { 'Content-Type': 'application/x-www-form-urlencoded' };
  if (token) headers.Authorization = `Bearer ${token}`;
  $('action-submit').disabled = true;
  try {
    const r = await api(a.path, { method: 'POST', headers, body: new URLSearchParams({ ...a.body, reason }) });
    state.token = token;
    sessionStorage.setItem('jobguard-admin-token', token);
    $('action-dialog').close();
    toast(a.done(r));
    refreshers.forEach((f) => f());
  } catch (e) {
    $('action-error').textContent = `refused${e.status ? ` (${e.status})` : ''}: ${e.message}`;
  } finally {
    $('action-submit').disabled = false;
  }
}

// --- classes -------------------------------------------------------------------------

// A line plot of `series` (nulls are gaps) over the hour; `ref` draws a
// horizontal reference (the declared TTL) in the same unit.
function plot(series, opts = {}) {
  const W = 240, H = 54, pad = 2;
  const s = svg('svg', { class: 'plot', viewBox: `0 0 ${W} ${H}`, preserveAspectRatio: 'none' });
  const all = series.flatMap((x) => x.values).filter((v) => v !== null && v !== undefined);
  if (opts.ref) all.push(opts.ref);
  const max = Math.max(1e-9, ...all);
  const n = Math.max(2, series[0] ? series[0].values.length : 2);
  const x = (i) => pad + (i * (W - 2 * pad)) / (n - 1);
  const y = (v) => H - pad - (v / max) * (H - 2 * pad - 8);
  s.append(svg('line', { class: 'axis', x1: 0, y1: H - pad, x2: W, y2: H - pad }));
  if (opts.ref) s.append(svg('line', { class: 'ttlline', x1: 0, y1: y(opts.ref), x2: W, y2: y(opts.ref) }));
  series.forEach((ser, k) => {
    let d = '';
    ser.values.forEach((v, i) => {
      if (v === null || v === undefined) return;
      d += `${d && ser.values[i - 1] !== null && ser.values[i - 1] !== undefined ? 'L' : 'M'}${x(i).toFixed(1)},${y(v).toFixed(1)}`;
    });
    if (d) s.append(svg('path', { class: k ? 'line2' : 'line', d }));
    // A minute with no neighbour (the first minute of a class) is a dot, not an invisible line.
    const gap = (i) => ser.values[i] === null || ser.values[i] === undefined;
    ser.values.forEach((v, i) => {
      if (!gap(i) && (i === 0 || gap(i - 1)) && (i === ser.values.length - 1 || gap(i + 1)))
        s.append(svg('circle', { class: k ? 'dot2' : 'dot', cx: x(i), cy: y(v), r: 2 }));
    });
  });
  const label = svg('text', { x: W - 2, y: 9, 'text-anchor': 'end' });
  label.textContent = opts.label ? opts.label(max) : '';
  s.append(label);
  return s;
}

async function refreshClasses() {
  const data = await api(`/api/classes?window=${$('f-window').value}`);
  $('classes-empty').hidden = data.classes.length > 0;
  const list = data.classes.map((c) => {
    const se = c.series;
    const contention = se.attempts.map((a, i) => (a ? se.contended[i] / a : null));
    const ttl = c.declared_ttl_ms;
    const p99 = c.hold_p99_seconds === null ? null : c.hold_p99_seconds * 1000;
    const cell = (cls, label, value, p) => el('div', { class: cls }, el('div', { class: 'label' }, label), el('div', { class: 'big' }, value), p);
    return el('div', { class: 'class', 'data-class': c.class },
      el('div', {}, el('div', { class: 'name' }, c.class),
        el('div', { class: 'label' }, ttl ? `declared TTL ${duration(ttl)} · observed p99 ${duration(p99)}` : 'no catalog entry'),
        el('div', { class: 'label counters' }, `${c.acquisitions} acquired · ${c.releases} released · ${c.renewals} renewals · ${c.expired} expired`),
        // A worker's limits (jobs work --rate / --concurrency-per): jobs held back for their turn, never failed.
        c.rate_limited || c.concurrency_limited
          ? el('div', { class: 'label limits' },
            `limits: ${c.rate_limited} rate-limited (waited ${duration(c.rate_limit_wait_seconds * 1000)}) · ` +
            `${c.concurrency_limited} concurrency-limited (waited ${duration(c.concurrency_limit_wait_seconds * 1000)})`)
          : null,
        ttl && p99 !== null && p99 > ttl ? el('div', { class: 'error' }, 'p99 hold exceeds the declared TTL') : null),
      cell('acq', 'acquisitions/s', num(c.acquisitions_per_second, 3),
        plot([{ values: se.acquisitions.map((v) => v / 60) }], { label: (m) => `${num(m, 2)}/s` })),
      cell('cont', 'contention', c.contention_ratio === null ? '-' : `${(c.contention_ratio * 100).toFixed(1)}%`,
        plot([{ values: contention }], { label: (m) => `${(m * 100).toFixed(0)}%` })),
      cell('hold', 'hold p50 / p99', `${duration(c.hold_p50_seconds === null ? null : c.hold_p50_seconds * 1000)} / ${duration(p99)}`,
        plot([{ values: se.hold_p50_ms }, { values: se.hold_p99_ms }], { ref: ttl, label: (m) => duration(m) })),
      cell('exp', 'expired/min', num(c.expired_per_minute, 2),
        plot([{ values: se.expired }], { label: (m) => `${num(m, 0)}/min` })));
  });
  $('class-list').replaceChildren(...list);
}

// --- incidents -----------------------------------------------------------------------

const KIND_TEXT = {
  lease_lost: 'lease lost', stale_fence_rejected: 'stale fence rejected', fail_open: 'fail-open run',
  force_release: 'force release', retry_dead_letter: 'dead letter retried',
};

async function refreshIncidents() {
  const data = await api('/api/incidents?limit=200');
  const items = data.incidents;
  $('incidents-empty').hidden = items.length > 0 || data.counts.length > 0;
  $('incident-list').replaceChildren(...items.map((i) => {
    const what = i.who !== undefined
      ? `${i.key}${i.job ? ` · ${i.job}` : ''} · by ${i.who}: ${i.reason}`
      : `${i.key} · ${i.job}${i.class ? ` · class ${i.class}` : ''}${i.detail ? ` · ${i.detail}` : ''}`;
    return el('li', { 'data-kind': i.kind, 'data-key': i.key || '' },
      el('span', { class: 'num' }, when(i.at_ms)), el('span', { class: `kind ${i.kind}` }, KIND_TEXT[i.kind] || i.kind),
      el('span', {}, what));
  }));
  // The strip: the fleet's counts per minute (every event, recorded or not)
  // as bars, the single records as dots.
  const strip = $('incident-strip');
  const now = Date.now(), hour = 3600 * 1000;
  const x = (at) => (600 * (hour - (now - at))) / hour;
  const marks = [];
  for (let m = 0; m <= 60; m += 10) marks.push(svg('line', { class: 'tick', x1: m * 10, y1: 0, x2: m * 10, y2: 40 }));
  const total = {};
  for (const c of data.counts) {
    total[c.kind] = (total[c.kind] || 0) + c.count;
    if (now - c.at_ms > hour) continue;
    const h = Math.min(36, 6 + 6 * Math.log2(c.count));
    marks.push(svg('rect', { class: c.kind, x: x(c.at_ms), y: 40 - h, width: 9, height: h }));
  }
  for (const i of items) if (now - i.at_ms <= hour) marks.push(svg('circle', { class: i.kind, cx: x(i.at_ms), cy: 12, r: 4 }));
  strip.replaceChildren(...marks);
  $('incident-counts').textContent = Object.keys(total).length
    ? `the fleet counted in the last hour: ${Object.entries(total).map(([k, n]) => `${n} ${KIND_TEXT[k] || k}`).join(', ')}`
    : 'the fleet counted no lost lease, stale fence or fail-open run in the last hour';
}

// --- semaphores and read-write locks ----------------------------------------------------

// A waiting writer this long behind its readers is drawn as a problem (doctor's rwlocks check).
const WRITER_WAIT_WARN_MS = 60000;

function holderText(h) { return `${h.holder} · ${duration(h.ttl_left_ms)} left`; }

async function refreshPrimitives() {
  const data = await api(`/api/primitives?${lockQuery()}`);
  const more = data.truncated ? '+' : '';
  $('sem-count').textContent = `${data.semaphores.length}${more}`;
  $('rw-count').textContent = `${data.rwlocks.length}${more}`;
  $('sem-list').tBodies[0].replaceChildren(...data.semaphores.map((s) => {
    const permits = s.stored_permits ?? s.declared_permits;
    const over = permits !== null && permits !== undefined && s.holders.length > permits;
    const count = permits === null || permits === undefined ? `${s.holders.length}` : `${s.holders.length} / ${permits}`;
    return el('tr', { 'data-resource': s.resource },
      el('td', {}, s.resource), el('td', { class: 'cls' }, s.class || '-'),
      el('td', { class: `held num${over ? ' over' : ''}`, title: s.stored_permits !== null ? 'stored count' : 'declared by the class' }, count),
      el('td', { class: 'holders' }, ...s.holders.map((h) => el('span', { class: 'slot', 'data-slot': h.slot }, el('b', {}, `#${h.slot} `), holderText(h)))),
      el('td', { class: 'waiting num' }, String(s.waiters)), el('td', { class: 'fence num' }, s.fence ?? '-'));
  }));
  $('sems-empty').hidden = data.semaphores.length > 0;
  $('rw-list').tBodies[0].replaceChildren(...data.rwlocks.map((r) => {
    const waited = r.writer_waiting_ms;
    const waiting = r.waiting_writers > 0
      ? el('span', { class: waited >= WRITER_WAIT_WARN_MS ? 'long' : '' }, `${r.waiters} (${r.waiting_writers} writer${r.waiting_writers === 1 ? '' : 's'}, first for ${duration(waited)})`)
      : String(r.waiters);
    return el('tr', { 'data-resource': r.resource },
      el('td', {}, r.resource), el('td', { class: 'cls' }, r.class || '-'),
      el('td', { class: 'writer' }, r.writer ? holderText(r.writer) : '-'),
      el('td', { class: 'readers', 'data-count': r.readers.length }, r.readers.length ? null : '-',
        ...r.readers.map((h) => el('span', { class: 'reader' }, holderText(h)))),
      el('td', { class: 'waiting' }, waiting), el('td', { class: 'fence num' }, r.fence ?? '-'));
  }));
  $('rws-empty').hidden = data.rwlocks.length > 0;
}

// --- lock state ------------------------------------------------------------------------

function mib(bytes) { return `${Math.round(bytes / 1048576)} MiB`; }

async function refreshLockState() {
  const data = await api('/api/lock-state');
  $('state-list').tBodies[0].replaceChildren(...data.servers.map((s) => {
    const quarantine = s.quarantined
      ? `quarantined for ${duration(s.quarantine_left_ms)} more (until ${when(s.quarantine_until_ms)}): ${s.reason}`
      : (s.record ? 'none: grants are served' : 'none yet (no lock-state record: the next lock client checks)');
    const steps = s.clock_steps > 0
      ? `${s.clock_steps}, the last +${s.last_step_ms} ms${s.last_step_at_ms ? ` at ${when(s.last_step_at_ms)}` : ''}`
      : 'none found';
    const eviction = `${s.maxmemory_policy}${s.maxmemory > 0 ? ` (maxmemory ${mib(s.maxmemory)})` : ''}, ${s.evicted_keys} evicted`;
    return el('tr', { 'data-address': s.address },
      el('td', {}, s.address),
      el('td', { class: `quarantine${s.quarantined ? ' quarantined' : ''}` }, quarantine),
      el('td', { class: `steps num${s.clock_steps > 0 ? ' over' : ''}` }, steps),
      el('td', { class: `eviction${s.evicting || s.evicted_keys > 0 ? ' over' : ''}` }, eviction));
  }));
}

// --- jobs ----------------------------------------------------------------------------

async function refreshJobs() {
  const data = await api('/api/jobs?count=50');
  $('jobs-meta').textContent = data.streams.length ? `group ${state.config.group}` : 'no stream shown: start serve with --stream NAME';
  $('stream-list').replaceChildren(...data.streams.map((s) => {
    const pending = el('table', {}, el('tr', {}, el('th', {}, 'pending id'), el('th', {}, 'consumer'), el('th', {}, 'idle'), el('th', {}, 'deliveries')),
      ...s.pending.map((p) => el('tr', {}, el('td', {}, p.id), el('td', {}, p.consumer), el('td', {}, duration(p.idle_ms)), el('td', {}, String(p.deliveries)))));
    const dead = el('table', {}, el('tr', {}, el('th', {}, 'dead letter'), el('th', {}, 'job id'), el('th', {}, 'attempts'), el('th', {}, 'last error'), el('th', {}, '')),
      ...s.dead.map((d) => el('tr', { 'data-dead': d.id }, el('td', {}, d.id), el('td', {}, d.source_id), el('td', {}, String(d.attempts)), el('td', {}, d.last_error),
        el('td', {}, el('button', { onclick: () => showDead(s.stream, d.id) }, 'fields'),
          state.config.actions ? el('button', { class: 'danger', onclick: () => openAction({
            title: `Retry dead letter ${d.id}`,
            what: `Puts the job back on ${s.stream} with its fields (deliveries start again) and removes it from ${s.dead_letter}.`,
            path: '/api/jobs/retry', body: { stream: s.stream, id: d.id },
            done: (r) => `${r.dead_id} retried as ${r.new_id}`,
          }) }, 'retry…') : null))));
    return el('div', { class: 'stream', 'data-stream': s.stream },
      el('div', {}, el('b', {}, s.stream), ` · length ${s.length} · pending ${s.pending_count} · dead letters ${s.dead_count}`,
        s.error ? el('span', { class: 'error' }, ` · ${s.error}`) : null),
      s.pending.length ? pending : null, s.dead.length ? dead : null);
  }));
}

async function showDead(stream, id) {
  const box = $('dead-detail');
  box.hidden = false;
  try {
    const d = await api(`/api/dead?stream=${encodeURIComponent(stream)}&id=${encodeURIComponent(id)}`);
    box.replaceChildren(el('h3', {}, `Dead letter ${d.id} of ${d.stream}`),
      el('dl', {}, el('dt', {}, 'job id'), el('dd', {}, d.source_id), el('dt', {}, 'attempts'), el('dd', {}, String(d.attempts)),
        el('dt', {}, 'last error'), el('dd', {}, d.last_error),
        ...Object.entries(d.fields).flatMap(([k, v]) => [el('dt', {}, k), el('dd', {}, v)])),
      el('button', { onclick: () => { box.hidden = true; } }, 'Close'));
  } catch (e) {
    box.replaceChildren(el('p', { class: 'error' }, e.message));
  }
}

// --- start -----------------------------------------------------------------------------

const refreshers = [];

async function start() {
  state.config = await api('/api/config');
  const mode = $('mode');
  mode.textContent = state.config.actions ? 'actions enabled (admin token)' : 'read-only';
  mode.className = `pill${state.config.actions ? ' admin' : ''}`;
  $('action-form').addEventListener('submit', submitAction);
  $('action-cancel').addEventListener('click', (e) => { e.preventDefault(); $('action-dialog').close(); });
  $('lock-scroll').addEventListener('scroll', () => requestAnimationFrame(renderRows), { passive: true });
  let debounce = null;
  const refilter = () => { clearTimeout(debounce); debounce = setTimeout(() => { refreshers[0](); refreshers[4](); }, 200); };
  $('f-prefix').addEventListener('input', refilter);
  $('f-class').addEventListener('change', refilter);
  refreshers.push(poll(refreshLocks, LOCKS_EVERY_MS));
  refreshers.push(poll(refreshClasses, OTHERS_EVERY_MS));
  refreshers.push(poll(refreshIncidents, OTHERS_EVERY_MS));
  refreshers.push(poll(refreshJobs, OTHERS_EVERY_MS));
  refreshers.push(poll(refreshPrimitives, LOCKS_EVERY_MS));
  refreshers.push(poll(refreshLockState, OTHERS_EVERY_MS));
  $('f-window').addEventListener('change', () => refreshers[1]());
  // TTL bars and ages move between polls.
  setInterval(() => { if (state.locks.length) renderRows(); }, 250);
}

start().catch((e) => setConn(false, `cannot start: ${e.message}`));
