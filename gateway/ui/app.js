// The Quarry console: a client of the gateway's public API and nothing else.
//
// The API key lives in sessionStorage (never localStorage, a cookie or a
// URL); every call carries it as `Authorization: Bearer`; the PTY WebSocket
// carries it in its subprotocol list. Nothing is fetched from another origin
// and nothing is written with innerHTML: every node is built with
// createElement and textContent. Pages are hash routes (#/pools,
// #/sandboxes?pool=…, #/sandbox/{id}/terminal): the hash never holds the key.

const KEY = 'quarry.apiKey';
const POLL_MS = 3000;
const PTY_PROTOCOL = 'quarry.pty.v1';

// ---------------------------------------------------------------- the key

function apiKey() { return sessionStorage.getItem(KEY) || ''; }

function signOut(message) {
  sessionStorage.removeItem(KEY);
  for (const k of Object.keys(sessionStorage)) {
    if (k.startsWith('quarry.')) sessionStorage.removeItem(k);
  }
  leavePage();
  location.hash = '#/signin';
  route(message);
}

// --------------------------------------------------------------- the API

class ApiError extends Error {
  constructor(status, code, message) {
    super(message || `HTTP ${status}`);
    this.status = status;
    this.code = code || '';
  }
}

// api calls the gateway. body: an object (sent as JSON), or a Blob/File/
// ArrayBuffer (sent raw). It answers the parsed JSON (null for 204), or the
// Response itself with {raw: true}. A 401 signs out; a network failure (the
// gateway restarting) is an ApiError with status 0.
async function api(method, path, { body, raw = false, headers = {}, signal } = {}) {
  const h = { Authorization: 'Bearer ' + apiKey(), ...headers };
  let payload = body;
  if (body !== undefined && !(body instanceof Blob) && !(body instanceof ArrayBuffer)) {
    h['Content-Type'] = 'application/json';
    payload = JSON.stringify(body);
  }
  let resp;
  try {
    resp = await fetch(path, { method, headers: h, body: payload, signal, cache: 'no-store' });
  } catch (err) {
    if (err.name === 'AbortError') throw err;
    setStatus('gateway unreachable, retrying…', true);
    throw new ApiError(0, 'unreachable', 'the gateway did not answer: ' + err.message);
  }
  setStatus('');
  if (resp.status === 401) {
    signOut('The gateway refused the API key: sign in again.');
    throw new ApiError(401, 'unauthorized', 'the API key was refused');
  }
  if (!resp.ok) {
    let detail = null;
    try { detail = (await resp.json()).error; } catch { /* not JSON */ }
    throw new ApiError(resp.status, detail && detail.code, detail && detail.message);
  }
  if (raw) return resp;
  if (resp.status === 204) return null;
  return resp.json();
}

const enc = encodeURIComponent;
const sbxPath = (id, rest = '') => `/v1/sandboxes/${enc(id)}${rest}`;

// ------------------------------------------------------------------- DOM

// h builds an element: h('a', {href: '#/x', class: 'y', onclick: f}, 'text', child…).
function h(tag, attrs = {}, ...children) {
  const el = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs || {})) {
    if (v === undefined || v === null || v === false) continue;
    if (k.startsWith('on')) el.addEventListener(k.slice(2), v);
    else if (k === 'class') el.className = v;
    else if (k === 'dataset') Object.assign(el.dataset, v);
    else if (v === true) el.setAttribute(k, '');
    else el.setAttribute(k, String(v));
  }
  for (const c of children.flat()) {
    if (c === undefined || c === null || c === false) continue;
    el.append(c instanceof Node ? c : document.createTextNode(String(c)));
  }
  return el;
}

function setStatus(text, bad = false) {
  const s = document.getElementById('status');
  s.textContent = text;
  s.classList.toggle('bad', bad);
}

function errorText(err) {
  if (err instanceof ApiError) return err.code ? `${err.status} ${err.code}: ${err.message}` : err.message;
  return String(err && err.message || err);
}

const fmtTime = (t) => (t ? new Date(t).toLocaleString() : '');
function fmtBytes(n) {
  if (n < 1024) return `${n} B`;
  const units = ['KiB', 'MiB', 'GiB', 'TiB'];
  let v = n / 1024, i = 0;
  while (v >= 1024 && i < units.length - 1) { v /= 1024; i++; }
  return `${v.toFixed(1)} ${units[i]}`;
}
function fmtLeft(t) {
  const s = Math.round((new Date(t) - Date.now()) / 1000);
  if (s <= 0) return 'expired';
  const m = Math.floor(s / 60);
  return m > 0 ? `${m} min ${s % 60} s left` : `${s} s left`;
}
const badge = (state) => h('span', { class: `badge ${state}` }, state);

// ---------------------------------------------------------------- pages

// page is the current page's lifetime: its abort signal ends its fetches,
// streams, timers and sockets when the route changes.
let page = null;

function leavePage() {
  if (page) page.abort();
  page = null;
}

function newPage() {
  leavePage();
  const ctl = new AbortController();
  const cleanups = [];
  page = {
    signal: ctl.signal,
    abort() { ctl.abort(); for (const f of cleanups.splice(0)) f(); },
    onLeave(f) { cleanups.push(f); },
  };
  return page;
}

// poll runs f now and every ms until the page is left, or until f calls the
// stop function it is given (what it polls has ended); a failure shows in
// show (when given) and polling goes on: the console rides out a gateway
// restart. It returns a function that polls at once (after an action); one
// poll runs at a time, and one asked for meanwhile runs right after it.
function poll(pg, ms, f, show) {
  let timer = null, running = false, again = false, stopped = false;
  const stop = () => { stopped = true; clearTimeout(timer); };
  const tick = async () => {
    clearTimeout(timer);
    timer = null;
    if (stopped) return;
    if (running) { again = true; return; }
    running = true;
    try {
      await f(stop);
      if (show) show('');
    } catch (err) {
      if (err.name !== 'AbortError' && !pg.signal.aborted && show) show(errorText(err));
    }
    running = false;
    if (pg.signal.aborted || stopped) return;
    if (again) { again = false; tick(); return; }
    timer = setTimeout(tick, ms);
  };
  pg.onLeave(() => clearTimeout(timer));
  tick();
  return tick;
}

function parseHash() {
  const raw = location.hash.replace(/^#\/?/, '');
  const [p, q = ''] = raw.split('?');
  return { parts: p.split('/').filter(Boolean).map(decodeURIComponent), query: new URLSearchParams(q) };
}

function route(message) {
  const main = document.getElementById('main');
  const { parts, query } = parseHash();
  const signedIn = apiKey() !== '';
  document.getElementById('nav').hidden = !signedIn;
  document.getElementById('signout').hidden = !signedIn;
  if (!signedIn) {
    leavePage();
    main.replaceChildren(signInPage(message));
    return;
  }
  const name = parts[0] || 'pools';
  for (const a of document.querySelectorAll('#nav a')) {
    a.classList.toggle('active', a.dataset.page === name || (name === 'sandbox' && a.dataset.page === 'sandboxes'));
  }
  const pg = newPage();
  switch (name) {
    case 'sandboxes': main.replaceChildren(sandboxesPage(pg, query)); break;
    case 'sandbox': main.replaceChildren(sandboxPage(pg, parts[1] || '', parts[2] || 'terminal')); break;
    case 'signin': location.hash = '#/pools'; break;
    default: main.replaceChildren(poolsPage(pg));
  }
}

// ---------------------------------------------------------------- sign in

function signInPage(message) {
  const input = h('input', { id: 'apikey', type: 'password', autocomplete: 'off', placeholder: 'API key', required: true });
  const err = h('p', { id: 'signin-error', class: 'error' }, message || '');
  const form = h('form', { id: 'signin', class: 'card', onsubmit: async (ev) => {
    ev.preventDefault();
    const key = input.value.trim();
    if (!key) return;
    err.textContent = '';
    // Check the key with one call before keeping it.
    let resp;
    try {
      resp = await fetch('/v1/pools', { headers: { Authorization: 'Bearer ' + key }, cache: 'no-store' });
    } catch (e) {
      err.textContent = 'The gateway did not answer: ' + e.message;
      return;
    }
    if (resp.status === 401) { err.textContent = 'The gateway refused this API key.'; return; }
    if (!resp.ok) { err.textContent = `The gateway answered ${resp.status}.`; return; }
    sessionStorage.setItem(KEY, key);
    input.value = '';
    location.hash = '#/pools';
    route();
  } },
  h('h1', {}, 'Sign in'),
  h('p', { class: 'muted' }, 'The API key stays in this tab (sessionStorage) and is sent only to this gateway, in the Authorization header.'),
  input,
  h('button', { id: 'signin-submit', class: 'primary', type: 'submit' }, 'Sign in'),
  err);
  setTimeout(() => input.focus(), 0);
  return form;
}

// ------------------------------------------------------------------ pools

function poolsPage(pg) {
  const err = h('p', { class: 'error' });
  const body = h('tbody', { id: 'pools-body' });
  const updated = h('span', { class: 'muted', id: 'pools-updated' });
  const view = h('section', {},
    h('div', { class: 'row' }, h('h1', {}, 'Pools'), h('span', { class: 'spacer' }), updated),
    err,
    h('table', { id: 'pools' },
      h('thead', {}, h('tr', {},
        h('th', {}, 'Pool'), h('th', {}, 'Provider'), h('th', {}, 'Image'),
        h('th', { class: 'num' }, 'Ready'), h('th', { class: 'num' }, 'Launching'),
        h('th', { class: 'num' }, 'Leased'), h('th', { class: 'num' }, 'Stopping'),
        h('th', { class: 'num' }, 'Warm / max'), h('th', {}, ''))),
      body));
  poll(pg, POLL_MS, async () => {
    const { pools } = await api('GET', '/v1/pools', { signal: pg.signal });
    body.replaceChildren(...pools.map((p) => h('tr', { dataset: { pool: p.name } },
      h('td', {}, h('a', { href: `#/sandboxes?pool=${enc(p.name)}&state=active` }, p.name)),
      h('td', {}, p.provider), h('td', { class: 'mono' }, p.image),
      h('td', { class: 'num', dataset: { count: 'ready' } }, p.ready),
      h('td', { class: 'num', dataset: { count: 'launching' } }, p.launching),
      h('td', { class: 'num', dataset: { count: 'leased' } }, p.leased),
      h('td', { class: 'num', dataset: { count: 'stopping' } }, p.stopping),
      h('td', { class: 'num' }, `${p.min_warm} / ${p.max_total}`),
      h('td', {}, h('button', { class: 'new-sandbox', dataset: { pool: p.name }, onclick: (ev) => createSandbox(ev.target, p.name, err) }, 'New sandbox')))));
    if (pools.length === 0) body.append(h('tr', {}, h('td', { colspan: 9, class: 'muted' }, 'No pools.')));
    updated.textContent = 'updated ' + new Date().toLocaleTimeString();
  }, (t) => { err.textContent = t; });
  return view;
}

async function createSandbox(button, pool, err) {
  button.disabled = true;
  try {
    const sbx = await api('POST', '/v1/sandboxes', { body: { pool, labels: { via: 'console' } } });
    location.hash = `#/sandbox/${enc(sbx.id)}/terminal`;
  } catch (e) {
    err.textContent = 'Lease in ' + pool + ': ' + errorText(e);
  } finally {
    button.disabled = false;
  }
}

// -------------------------------------------------------------- sandboxes

const STATES = ['active', 'released', 'expired', 'lost'];

function sandboxesPage(pg, query) {
  const err = h('p', { class: 'error' });
  const pool = h('select', { id: 'filter-pool' }, h('option', { value: '' }, 'any pool'));
  const state = h('select', { id: 'filter-state' }, h('option', { value: '' }, 'any state'), STATES.map((s) => h('option', { value: s }, s)));
  const label = h('input', { id: 'filter-label', placeholder: 'label k=v, k2=v2', class: 'wide' });
  const body = h('tbody', { id: 'sandboxes-body' });
  const count = h('span', { class: 'muted' });
  state.value = query.get('state') || '';
  label.value = query.getAll('label').join(', ');
  const wantPool = query.get('pool') || '';
  if (wantPool) pool.append(h('option', { value: wantPool }, wantPool));
  pool.value = wantPool;

  // The filters live in the hash (never the key), so a link or a reload keeps them.
  const apply = (ev) => {
    if (ev) ev.preventDefault();
    const q = new URLSearchParams();
    if (pool.value) q.set('pool', pool.value);
    if (state.value) q.set('state', state.value);
    for (const l of label.value.split(',').map((s) => s.trim()).filter(Boolean)) q.append('label', l);
    location.hash = '#/sandboxes' + (q.toString() ? '?' + q : '');
  };
  pool.addEventListener('change', apply);
  state.addEventListener('change', apply);

  api('GET', '/v1/pools', { signal: pg.signal }).then(({ pools }) => {
    for (const p of pools) if (p.name !== wantPool) pool.append(h('option', { value: p.name }, p.name));
  }).catch(() => { /* the list below shows the error */ });

  // Every filter is the API's own (pool, state, label): nothing is filtered here.
  const q = new URLSearchParams();
  if (wantPool) q.set('pool', wantPool);
  if (state.value) q.set('state', state.value);
  for (const l of query.getAll('label')) q.append('label', l);
  q.set('limit', '1000');
  poll(pg, POLL_MS, async () => {
    const { sandboxes } = await api('GET', '/v1/sandboxes?' + q, { signal: pg.signal });
    body.replaceChildren(...sandboxes.map((s) => h('tr', { dataset: { sandbox: s.id } },
      h('td', { class: 'mono' }, h('a', { href: `#/sandbox/${enc(s.id)}/terminal` }, s.id)),
      h('td', {}, s.pool), h('td', {}, badge(s.state), s.reason ? h('div', { class: 'muted' }, s.reason) : null),
      h('td', {}, fmtTime(s.created_at)),
      h('td', {}, s.state === 'active' ? fmtLeft(s.expires_at) : fmtTime(s.ended_at)),
      h('td', { class: 'mono' }, Object.entries(s.labels || {}).map(([k, v]) => `${k}=${v}`).join(' ')))));
    if (sandboxes.length === 0) body.append(h('tr', {}, h('td', { colspan: 6, class: 'muted' }, 'No sandboxes match.')));
    count.textContent = `${sandboxes.length} shown`;
  }, (t) => { err.textContent = t; });

  return h('section', {},
    h('div', { class: 'row' }, h('h1', {}, 'Sandboxes'), h('span', { class: 'spacer' }), count),
    h('form', { class: 'row card', id: 'filters', onsubmit: apply }, pool, state, label, h('button', { type: 'submit' }, 'Filter')),
    err,
    h('table', { id: 'sandboxes' },
      h('thead', {}, h('tr', {}, h('th', {}, 'Sandbox'), h('th', {}, 'Pool'), h('th', {}, 'State'),
        h('th', {}, 'Created'), h('th', {}, 'Expires / ended'), h('th', {}, 'Labels'))),
      body));
}

// ---------------------------------------------------------------- sandbox

const TABS = [['terminal', 'Terminal'], ['files', 'Files'], ['processes', 'Processes'], ['model', 'Model transcript'], ['checkpoints', 'Checkpoints']];

function sandboxPage(pg, id, tab) {
  const err = h('p', { class: 'error', id: 'lease-error' });
  const info = h('div', { class: 'row', id: 'lease' });
  const heartbeat = h('button', { id: 'heartbeat', hidden: true, onclick: () => leaseOp('POST', sbxPath(id, '/heartbeat')) }, 'Heartbeat');
  const release = h('button', { id: 'release', class: 'danger', hidden: true, onclick: () => leaseOp('DELETE', sbxPath(id)) }, 'Release');
  let current = null;

  const show = (s) => {
    current = s;
    const active = s.state === 'active';
    heartbeat.hidden = !active;
    release.hidden = !active;
    info.replaceChildren(
      h('span', { id: 'lease-state' }, badge(s.state)),
      h('span', {}, 'pool ', h('b', {}, s.pool)),
      h('span', { class: 'muted' }, `generation ${s.generation}`),
      active ? h('span', { id: 'lease-expiry', title: fmtTime(s.expires_at) }, `expires ${fmtTime(s.expires_at)} (${fmtLeft(s.expires_at)})`)
        : h('span', { id: 'lease-ended' }, `ended ${fmtTime(s.ended_at)}${s.reason ? ': ' + s.reason : ''}`),
      h('span', { class: 'mono muted' }, Object.entries(s.labels || {}).map(([k, v]) => `${k}=${v}`).join(' ')));
  };
  async function leaseOp(method, path) {
    err.textContent = '';
    try {
      show(await api(method, path));
    } catch (e) {
      err.textContent = errorText(e);
      refresh();
    }
  }
  const panel = h('div', { id: 'panel' });
  const tabs = h('nav', { class: 'tabs', id: 'sandbox-tabs' },
    TABS.map(([t, label]) => h('a', { href: `#/sandbox/${enc(id)}/${t}`, class: t === tab ? 'active' : '', dataset: { tab: t } }, label)));
  const view = h('section', {},
    h('div', { class: 'row' }, h('h1', { class: 'mono' }, id), h('span', { class: 'spacer' }), heartbeat, release),
    h('div', { class: 'card' }, info, err),
    tabs,
    panel);
  // A sandbox that does not exist (or not for this key, or ended more than
  // 24 h ago): the page says so, offers nothing and asks nothing again.
  const missing = (e) => {
    heartbeat.hidden = release.hidden = tabs.hidden = true;
    panel.replaceChildren();
    info.replaceChildren(h('span', { id: 'lease-missing', class: 'error' },
      `This sandbox does not exist (${errorText(e)}): no such id for this API key, or it ended more than 24 h ago.`));
    pg.abort(); // every poll, stream and socket of the page ends
  };
  const refresh = poll(pg, POLL_MS, async (stop) => {
    let s;
    try {
      s = await api('GET', sbxPath(id), { signal: pg.signal });
    } catch (e) {
      if (e.status !== 404) throw e;
      stop();
      missing(e);
      return;
    }
    show(s);
    if (s.state !== 'active') stop(); // an ended lease stays ended
  }, (t) => { err.textContent = t; });

  const tabFns = { terminal: terminalTab, files: filesTab, processes: processesTab, model: modelTab, checkpoints: checkpointsTab };
  panel.append((tabFns[tab] || terminalTab)(pg, id, () => current));
  return view;
}

// --------------------------------------------------------------- terminal

// installStyleShim lets xterm.js run under `style-src 'self'`. xterm.js
// injects <style> elements with run-time CSS (its theme, cell sizes, the
// scrollbar), which that CSP blocks. Instead of weakening the policy with
// 'unsafe-inline' (or a nonce any script could read), document.createElement
// ('style') answers a <quarry-style> element whose textContent goes into a
// constructable stylesheet adopted by the document while the element is
// connected: the same rules, applied through CSSOM, which the CSP allows.
// The console itself never creates <style> elements.
function installStyleShim() {
  if (customElements.get('quarry-style')) return;
  class QuarryStyle extends HTMLElement {
    #sheet = new CSSStyleSheet();
    #text = '';
    get textContent() { return this.#text; }
    set textContent(v) { this.#text = v == null ? '' : String(v); this.#sheet.replaceSync(this.#text); }
    get sheet() { return this.#sheet; }
    connectedCallback() {
      if (!document.adoptedStyleSheets.includes(this.#sheet)) document.adoptedStyleSheets = [...document.adoptedStyleSheets, this.#sheet];
    }
    disconnectedCallback() {
      document.adoptedStyleSheets = document.adoptedStyleSheets.filter((s) => s !== this.#sheet);
    }
  }
  customElements.define('quarry-style', QuarryStyle);
  const create = Document.prototype.createElement;
  document.createElement = function createElement(tag, options) {
    if (String(tag).toLowerCase() === 'style') return create.call(this, 'quarry-style');
    return create.call(this, tag, options);
  };
}

// b64url is the base64url (no padding) of a string's UTF-8 bytes.
function b64url(s) {
  let bin = '';
  for (const b of new TextEncoder().encode(s)) bin += String.fromCharCode(b);
  return btoa(bin).replace(/\+/g, '-').replace(/\//g, '_').replace(/=+$/, '');
}

// Close codes of the PTY socket (docs/ARCHITECTURE.md, "The framing"): 4000
// + the HTTP status the same request would have had.
const CLOSE_LEASE_GONE = 4410;
const CLOSE_NOT_FOUND = 4404;
const CLOSE_UNAUTHORIZED = 4401;

function terminalTab(pg, id) {
  const box = h('div', { id: 'terminal' });
  const state = h('span', { id: 'terminal-state', class: 'muted' }, 'connecting…');
  const again = h('button', { id: 'terminal-new', hidden: true, onclick: () => { sessionStorage.removeItem(ptyKey); again.hidden = true; start(); } }, 'New terminal');
  const view = h('div', {}, h('div', { class: 'row' }, state, h('span', { class: 'spacer' }), again), box);
  const ptyKey = 'quarry.pty.' + id;
  let term, fit, sock = null, ptyId = sessionStorage.getItem(ptyKey) || '', attempt = 0, timer = null, done = false;

  const setState = (t, bad = false) => { state.textContent = t; state.className = bad ? 'error' : 'muted'; };

  import('./vendor/xterm/xterm.mjs').then(async ({ Terminal }) => {
    const { FitAddon } = await import('./vendor/xterm/addon-fit.mjs');
    if (pg.signal.aborted) return;
    installStyleShim();
    term = new Terminal({ cursorBlink: true, fontSize: 13, scrollback: 5000, theme: { background: '#0b0f19' } });
    fit = new FitAddon();
    term.loadAddon(fit);
    term.open(box);
    fit.fit();
    term.onData((d) => { if (sock && sock.readyState === WebSocket.OPEN) sock.send(new TextEncoder().encode(d)); });
    term.onResize(({ cols, rows }) => {
      if (sock && sock.readyState === WebSocket.OPEN) sock.send(JSON.stringify({ type: 'resize', cols, rows }));
    });
    const onWindowResize = () => fit.fit();
    window.addEventListener('resize', onWindowResize);
    pg.onLeave(() => {
      window.removeEventListener('resize', onWindowResize);
      done = true;
      clearTimeout(timer);
      if (sock) sock.close(1000, 'page left');
      term.dispose();
    });
    start();
  }).catch((e) => setState('terminal: ' + e.message, true));

  // start attaches to this tab's PTY, creating one first (the REST
  // fallback) when there is none yet: its id is what a reconnect attaches
  // to, so the replay ring brings the screen back after a drop.
  async function start() {
    done = false;
    if (!ptyId) {
      try {
        const p = await api('POST', sbxPath(id, '/ptys'), { body: { cols: term.cols, rows: term.rows }, signal: pg.signal });
        ptyId = p.id;
        sessionStorage.setItem(ptyKey, ptyId);
      } catch (e) {
        if (e.name === 'AbortError') return;
        // Nothing to retry: the lease has ended, or there is no such sandbox.
        if (e.status === 410) { done = true; setState('the lease has ended: ' + errorText(e), true); return; }
        if (e.status === 404) { done = true; setState('no such sandbox: ' + errorText(e), true); return; }
        return retry('create a terminal: ' + errorText(e));
      }
    }
    connect();
  }

  function connect() {
    const proto = location.protocol === 'https:' ? 'wss:' : 'ws:';
    const url = `${proto}//${location.host}${sbxPath(id, '/pty')}?pty=${enc(ptyId)}`;
    setState(attempt ? `reconnecting (attempt ${attempt})…` : 'connecting…');
    const s = new WebSocket(url, [PTY_PROTOCOL, 'quarry.auth.' + b64url(apiKey())]);
    s.binaryType = 'arraybuffer';
    sock = s;
    s.onopen = () => {
      attempt = 0;
      setState(`connected: ${ptyId}`);
      term.reset(); // the replay ring repaints the recent screen
      s.send(JSON.stringify({ type: 'resize', cols: term.cols, rows: term.rows }));
      term.focus();
    };
    s.onmessage = (ev) => {
      if (typeof ev.data !== 'string') { term.write(new Uint8Array(ev.data)); return; }
      let msg;
      try { msg = JSON.parse(ev.data); } catch { return; }
      if (msg.type === 'exit') {
        done = true;
        sessionStorage.removeItem(ptyKey);
        ptyId = '';
        const how = msg.exit_code != null ? `with code ${msg.exit_code}` : `by ${msg.signal || 'a signal'}`;
        term.write(`\r\n[exited ${how}]\r\n`);
        setState(`exited ${how}`);
        again.hidden = false;
      }
    };
    s.onclose = (ev) => {
      if (sock !== s) return;
      sock = null;
      if (done || pg.signal.aborted) return;
      switch (ev.code) {
        case CLOSE_LEASE_GONE:
          done = true;
          setState('the lease has ended: ' + (ev.reason || 'lease_gone'), true);
          return;
        case CLOSE_NOT_FOUND:
          // The PTY is gone (its sandbox's agent restarted): offer a new one.
          done = true;
          sessionStorage.removeItem(ptyKey);
          ptyId = '';
          setState('the terminal is gone: ' + (ev.reason || 'not_found'), true);
          again.hidden = false;
          return;
        case CLOSE_UNAUTHORIZED:
          signOut('The gateway refused the API key: sign in again.');
          return;
      }
      retry(`disconnected (${ev.code}${ev.reason ? ' ' + ev.reason : ''})`);
    };
  }

  // retry reconnects with backoff: 0.5 s doubling to 10 s, while the page lasts.
  function retry(why) {
    attempt++;
    const ms = Math.min(10000, 500 * 2 ** Math.min(attempt - 1, 5));
    setState(`${why}; retrying in ${(ms / 1000).toFixed(1)} s`, true);
    clearTimeout(timer);
    timer = setTimeout(() => { if (!pg.signal.aborted && !done) start(); }, ms);
  }

  return view;
}

// ------------------------------------------------------------------ files

// utf8Text is bytes as text, or null when they are binary: a NUL byte, or a
// sequence that is not UTF-8. A character cut at the end (the first 256 KiB
// of a longer file) is not counted against it.
function utf8Text(bytes) {
  if (bytes.includes(0)) return null;
  try {
    return new TextDecoder('utf-8', { fatal: true }).decode(bytes, { stream: true });
  } catch {
    return null;
  }
}

function filesTab(pg, id) {
  const err = h('p', { class: 'error', id: 'files-error' });
  const pathInput = h('input', { id: 'files-path', class: 'wide', value: sessionStorage.getItem('quarry.files.' + id) || '.' });
  const body = h('tbody', { id: 'files-body' });
  const viewer = h('pre', { id: 'file-view', class: 'out', hidden: true });
  const binary = h('p', { id: 'file-binary', class: 'card row', hidden: true });
  const upload = h('input', { id: 'upload-file', type: 'file', multiple: true });
  const uploaded = h('span', { id: 'upload-state', class: 'muted' });

  const join = (dir, name) => (dir === '.' || dir === '' ? name : dir.replace(/\/+$/, '') + '/' + name);
  const parent = (p) => {
    const t = p.replace(/\/+$/, '');
    if (t === '' || t === '.' || t === '/') return t || '/';
    const i = t.lastIndexOf('/');
    return i < 0 ? '.' : i === 0 ? '/' : t.slice(0, i);
  };

  async function list(p = pathInput.value) {
    err.textContent = '';
    pathInput.value = p;
    sessionStorage.setItem('quarry.files.' + id, p);
    let res;
    try {
      res = await api('GET', sbxPath(id, '/files/list?path=' + enc(p)), { signal: pg.signal });
    } catch (e) {
      if (e.name !== 'AbortError') err.textContent = errorText(e);
      return;
    }
    const entries = (res.entries || []).slice().sort((a, b) => (b.is_dir - a.is_dir) || a.name.localeCompare(b.name));
    body.replaceChildren(
      h('tr', {}, h('td', { colspan: 5 }, h('a', { href: '#', onclick: (ev) => { ev.preventDefault(); list(parent(p)); } }, '..'), h('span', { class: 'muted' }, '  ' + res.path))),
      ...entries.map((f) => h('tr', { dataset: { file: f.name } },
        h('td', { class: 'mono' }, f.is_dir
          ? h('a', { href: '#', onclick: (ev) => { ev.preventDefault(); list(join(p, f.name)); } }, f.name + '/')
          : f.name, f.symlink ? h('span', { class: 'muted' }, ' → ' + f.symlink) : null),
        h('td', { class: 'num' }, f.is_dir ? '' : fmtBytes(f.size)),
        h('td', { class: 'mono' }, f.mode),
        h('td', {}, fmtTime(f.mod_time)),
        h('td', {}, f.is_dir ? null : h('span', { class: 'row' },
          h('button', { class: 'view', onclick: () => view(join(p, f.name), f.name, f.size) }, 'View'),
          h('button', { class: 'download', onclick: () => download(join(p, f.name), f.name) }, 'Download'),
          h('button', { class: 'delete danger', onclick: () => remove(join(p, f.name)) }, 'Delete'))))));
  }

  // view shows the first 256 KiB of a file as text, or, for a binary file
  // (a NUL byte or bytes that are not UTF-8 in them), says so and offers
  // the download instead.
  async function view(p, name, size) {
    err.textContent = '';
    try {
      const resp = await api('GET', sbxPath(id, '/files?path=' + enc(p) + '&length=262144'), { raw: true, signal: pg.signal });
      const text = utf8Text(new Uint8Array(await resp.arrayBuffer()));
      viewer.hidden = text === null;
      binary.hidden = text !== null;
      if (text === null) {
        viewer.textContent = '';
        binary.replaceChildren(h('span', {}, `${name} is binary (${fmtBytes(size)}): it is not shown as text.`),
          h('button', { id: 'file-binary-download', onclick: () => download(p, name) }, 'Download'));
        return;
      }
      viewer.textContent = text;
      viewer.dataset.path = p;
    } catch (e) { if (e.name !== 'AbortError') err.textContent = errorText(e); }
  }

  // download saves a file's exact bytes: fetched with the key (a plain link
  // could not carry it), then handed to the browser as a blob.
  async function download(p, name) {
    err.textContent = '';
    try {
      const resp = await api('GET', sbxPath(id, '/files?path=' + enc(p)), { raw: true, signal: pg.signal });
      const url = URL.createObjectURL(await resp.blob());
      const a = h('a', { href: url, download: name, hidden: true });
      document.body.append(a);
      a.click();
      a.remove();
      setTimeout(() => URL.revokeObjectURL(url), 60000);
    } catch (e) { if (e.name !== 'AbortError') err.textContent = errorText(e); }
  }

  async function remove(p) {
    err.textContent = '';
    try {
      await api('DELETE', sbxPath(id, '/files?path=' + enc(p)));
      await list();
    } catch (e) { err.textContent = errorText(e); }
  }

  async function send(ev) {
    ev.preventDefault();
    err.textContent = '';
    const dir = pathInput.value;
    let n = 0;
    for (const f of upload.files) {
      try {
        const res = await api('PUT', sbxPath(id, '/files?path=' + enc(join(dir, f.name))), { body: f });
        n++;
        uploaded.textContent = `uploaded ${res.path} (${res.bytes} bytes)`;
      } catch (e) {
        err.textContent = `upload ${f.name}: ${errorText(e)}`;
        break;
      }
    }
    if (n) { upload.value = ''; await list(); }
  }

  list();
  return h('div', {},
    h('form', { class: 'row card', onsubmit: (ev) => { ev.preventDefault(); list(); } },
      h('label', {}, 'Path', pathInput), h('button', { type: 'submit' }, 'List')),
    h('form', { class: 'row card', id: 'upload', onsubmit: send },
      h('label', {}, 'Upload into this directory', upload), h('button', { id: 'upload-submit', type: 'submit' }, 'Upload'), uploaded),
    err,
    h('table', { id: 'files' }, h('thead', {}, h('tr', {}, h('th', {}, 'Name'), h('th', { class: 'num' }, 'Size'), h('th', {}, 'Mode'), h('th', {}, 'Modified'), h('th', {}, ''))), body),
    binary, viewer);
}

// -------------------------------------------------------------- processes

// sse reads a server-sent event stream from a fetch Response (EventSource
// cannot send the Authorization header) and calls onEvent(name, data).
async function sse(resp, onEvent, signal) {
  const reader = resp.body.pipeThrough(new TextDecoderStream()).getReader();
  signal.addEventListener('abort', () => reader.cancel().catch(() => {}));
  let buf = '';
  for (;;) {
    const { value, done } = await reader.read();
    if (done) return;
    buf += value;
    let i;
    while ((i = buf.indexOf('\n\n')) >= 0) {
      const block = buf.slice(0, i);
      buf = buf.slice(i + 2);
      let name = 'message';
      const data = [];
      for (const line of block.split('\n')) {
        if (line.startsWith(':')) continue;
        const [field, ...rest] = line.split(':');
        const v = rest.join(':').replace(/^ /, '');
        if (field === 'event') name = v;
        else if (field === 'data') data.push(v);
      }
      if (data.length) onEvent(name, data.join('\n'));
    }
  }
}

function processesTab(pg, id) {
  const err = h('p', { class: 'error', id: 'processes-error' });
  const cmd = h('input', { id: 'process-command', class: 'wide', placeholder: 'command, e.g. python3 -m http.server 8000' });
  const body = h('tbody', { id: 'processes-body' });
  const out = h('pre', { id: 'process-output', class: 'out', hidden: true });
  const following = h('span', { id: 'process-following', class: 'muted' });
  let follow = null; // the AbortController of the followed output

  async function refreshList() {
    const { processes } = await api('GET', sbxPath(id, '/processes'), { signal: pg.signal });
    body.replaceChildren(...processes.map((p) => h('tr', { dataset: { process: p.id }, class: out.dataset.process === p.id ? 'selected' : '' },
      h('td', { class: 'mono' }, p.id), h('td', { class: 'num' }, p.pid),
      h('td', { class: 'mono' }, p.command || (p.argv || []).join(' ')),
      h('td', {}, badge(p.state), p.exit_code != null ? ` ${p.exit_code}` : '', p.signal ? ` ${p.signal}` : ''),
      h('td', {}, fmtTime(p.started_at)),
      h('td', { class: 'num' }, fmtBytes(p.output_bytes || 0)),
      h('td', {}, h('span', { class: 'row' },
        h('button', { class: 'follow', onclick: () => followOutput(p.id) }, 'Follow'),
        p.state === 'running' ? h('button', { class: 'danger', onclick: () => signal(p.id, 'TERM') }, 'TERM') : null,
        h('button', { class: 'danger', onclick: () => forget(p.id) }, p.state === 'running' ? 'Kill' : 'Forget'))))));
    if (processes.length === 0) body.append(h('tr', {}, h('td', { colspan: 7, class: 'muted' }, 'No processes.')));
  }
  const refresh = poll(pg, POLL_MS, refreshList, (t) => { err.textContent = t; });

  // followOutput streams a process's output from its start (offset 0) until it exits.
  async function followOutput(pid) {
    if (follow) follow.abort();
    const ctl = new AbortController();
    follow = ctl;
    pg.signal.addEventListener('abort', () => ctl.abort());
    out.hidden = false;
    out.textContent = '';
    out.dataset.process = pid;
    following.textContent = `following ${pid}…`;
    try {
      const resp = await api('GET', sbxPath(id, `/processes/${enc(pid)}/output?offset=0`), { raw: true, headers: { Accept: 'text/event-stream' }, signal: ctl.signal });
      await sse(resp, (name, data) => {
        const d = JSON.parse(data);
        if (name === 'output') {
          out.append(d.data);
          out.scrollTop = out.scrollHeight;
        } else if (name === 'exit') {
          following.textContent = `${pid} exited${d.exit_code != null ? ' with code ' + d.exit_code : ''}${d.signal ? ' (' + d.signal + ')' : ''}`;
          refresh();
        } else if (name === 'error') {
          err.textContent = `${d.code}: ${d.message}`;
        }
      }, ctl.signal);
    } catch (e) {
      if (e.name !== 'AbortError') err.textContent = 'follow: ' + errorText(e);
    }
  }

  async function signal(pid, sig) {
    try { await api('POST', sbxPath(id, `/processes/${enc(pid)}/signal`), { body: { signal: sig } }); } catch (e) { err.textContent = errorText(e); }
    refresh();
  }
  async function forget(pid) {
    try { await api('DELETE', sbxPath(id, `/processes/${enc(pid)}`)); } catch (e) { err.textContent = errorText(e); }
    refresh();
  }

  async function startProcess(ev) {
    ev.preventDefault();
    err.textContent = '';
    const command = cmd.value.trim();
    if (!command) return;
    try {
      const p = await api('POST', sbxPath(id, '/processes'), { body: { command } });
      cmd.value = '';
      refresh();
      followOutput(p.id);
    } catch (e) { err.textContent = errorText(e); }
  }

  return h('div', {},
    h('form', { class: 'row card', id: 'process-start', onsubmit: startProcess }, cmd, h('button', { id: 'process-submit', type: 'submit', class: 'primary' }, 'Start')),
    err,
    h('table', { id: 'processes' }, h('thead', {}, h('tr', {}, h('th', {}, 'Id'), h('th', { class: 'num' }, 'PID'), h('th', {}, 'Command'),
      h('th', {}, 'State'), h('th', {}, 'Started'), h('th', { class: 'num' }, 'Output'), h('th', {}, ''))), body),
    following, out);
}

// ------------------------------------------------------------------ model

function modelTab(pg, id) {
  const err = h('p', { class: 'error' });
  const list = h('div', { id: 'transcript' });
  const seen = new Map(); // exchange id → its element
  let after = '';
  const pretty = (v) => {
    if (v === undefined || v === null) return '';
    if (typeof v === 'string') { try { return JSON.stringify(JSON.parse(v), null, 2); } catch { return v; } }
    return JSON.stringify(v, null, 2);
  };
  const render = (x) => h('details', { class: 'card', dataset: { exchange: x.id } },
    h('summary', {}, h('span', { class: 'row' }, badge(x.state), h('span', { class: 'mono' }, x.route), h('span', { class: 'muted' }, fmtTime(x.received_at)),
      x.latency_ms != null ? h('span', { class: 'muted' }, `${x.latency_ms} ms`) : null,
      x.response ? h('span', {}, `→ ${x.response.status}`) : null, h('span', { class: 'mono muted' }, x.id))),
    h('h2', {}, 'Request'), h('pre', { class: 'json' }, pretty(x.request)),
    x.response ? [h('h2', {}, 'Response'), h('pre', { class: 'json' }, pretty(x.response.body))] : null);

  // after is the cursor past the settled prefix: every exchange up to it has
  // ended (its state no longer changes), so a poll reads from there: the
  // ones still open again, and the new ones. At most 10 pages a poll.
  const open = (x) => x.state === 'pending' || x.state === 'claimed';
  const order = []; // exchange ids, oldest first
  poll(pg, 5000, async () => {
    let cursor = after;
    for (let pages = 0; pages < 10; pages++) {
      const q = new URLSearchParams({ limit: '100' });
      if (cursor) q.set('after', cursor);
      const t = await api('GET', sbxPath(id, '/model/transcript?' + q), { signal: pg.signal });
      for (const x of t.exchanges || []) {
        const el = render(x);
        el.dataset.open = open(x) ? '1' : '';
        const old = seen.get(x.id);
        if (old) { el.open = old.open; old.replaceWith(el); } else { list.append(el); order.push(x.id); }
        seen.set(x.id, el);
      }
      if (!t.next_after) break;
      cursor = t.next_after;
    }
    for (const xid of order.slice(order.indexOf(after) + 1)) {
      if (seen.get(xid).dataset.open) break;
      after = xid;
    }
    if (seen.size === 0) list.replaceChildren(h('p', { class: 'muted', id: 'transcript-empty' }, 'No model calls from this sandbox yet.'));
    else { const e = document.getElementById('transcript-empty'); if (e) e.remove(); }
  }, (t) => { err.textContent = t; });
  return h('div', {}, h('p', { class: 'muted' }, 'The LLM calls this sandbox made through the model relay, oldest first.'), err, list);
}

// ------------------------------------------------------------ checkpoints

function checkpointsTab(pg, id) {
  const err = h('p', { class: 'error', id: 'checkpoints-error' });
  const ok = h('p', { class: 'ok', id: 'checkpoints-ok' });
  const paths = h('input', { id: 'checkpoint-paths', class: 'wide', placeholder: 'paths, comma-separated (empty: the work dir)' });
  const body = h('tbody', { id: 'checkpoints-body' });

  async function load() {
    // The API lists a key's checkpoints by label, not by sandbox: the newest
    // 1000 are read and this sandbox's kept.
    const { checkpoints } = await api('GET', '/v1/checkpoints?limit=1000', { signal: pg.signal });
    const mine = checkpoints.filter((c) => c.sandbox === id);
    body.replaceChildren(...mine.map((c) => h('tr', { dataset: { checkpoint: c.id } },
      h('td', { class: 'mono' }, c.id), h('td', {}, fmtTime(c.created_at)),
      h('td', { class: 'mono' }, (c.paths || []).join(' ')),
      h('td', { class: 'num' }, c.files), h('td', { class: 'num' }, fmtBytes(c.size_bytes)),
      h('td', {}, fmtTime(c.expires_at)),
      h('td', {}, h('span', { class: 'row' },
        h('button', { class: 'restore', onclick: () => op('restore', () => api('POST', sbxPath(id, '/restore'), { body: { checkpoint: c.id } }), (r) => `restored ${r.checkpoint}: ${r.files} files, ${fmtBytes(r.bytes)} in ${r.duration_ms} ms`) }, 'Restore'),
        h('button', { class: 'danger', onclick: () => op('delete', () => api('DELETE', '/v1/checkpoints/' + enc(c.id)), () => `deleted ${c.id}`) }, 'Delete'))))));
    if (mine.length === 0) body.append(h('tr', {}, h('td', { colspan: 7, class: 'muted' }, 'No checkpoints of this sandbox.')));
  }
  const refresh = poll(pg, 5000, load, (t) => { err.textContent = t; });

  async function op(what, f, say) {
    err.textContent = '';
    ok.textContent = '';
    try { ok.textContent = say(await f()); } catch (e) { err.textContent = `${what}: ${errorText(e)}`; }
    refresh();
  }
  const create = (ev) => {
    ev.preventDefault();
    const p = paths.value.split(',').map((s) => s.trim()).filter(Boolean);
    op('checkpoint', () => api('POST', sbxPath(id, '/checkpoints'), { body: p.length ? { paths: p } : {} }), (c) => `created ${c.id}: ${c.files} files, ${fmtBytes(c.size_bytes)}`);
  };
  return h('div', {},
    h('form', { class: 'row card', id: 'checkpoint-create', onsubmit: create }, paths, h('button', { id: 'checkpoint-submit', type: 'submit', class: 'primary' }, 'Checkpoint now')),
    err, ok,
    h('table', { id: 'checkpoints' }, h('thead', {}, h('tr', {}, h('th', {}, 'Checkpoint'), h('th', {}, 'Created'), h('th', {}, 'Paths'),
      h('th', { class: 'num' }, 'Files'), h('th', { class: 'num' }, 'Size'), h('th', {}, 'Expires'), h('th', {}, ''))), body));
}

// ------------------------------------------------------------------ start

document.getElementById('signout').addEventListener('click', () => signOut('Signed out.'));
window.addEventListener('hashchange', () => route());
route();
