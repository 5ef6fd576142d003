// Shared pieces of the end-to-end tests (e2e.mjs on loopback, outage.mjs
// across two network namespaces): process and API helpers, the spec's
// schemas, the teleop page script run in Chromium, and a Client driving it.
//
// No sleeps are used as synchronisation: every wait polls for a condition
// with a bounded deadline.

import { spawn } from 'node:child_process';
import { mkdtempSync, readFileSync, writeFileSync, existsSync, readdirSync, statSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join, dirname, resolve } from 'node:path';
import { fileURLToPath } from 'node:url';
import { chromium } from 'playwright-core';
import Ajv2020 from 'ajv/dist/2020.js';
import addFormats from 'ajv-formats';

export const HERE = dirname(fileURLToPath(import.meta.url));
export const ROOT = resolve(HERE, '../..');
const BIN = process.env.E2E_BIN_DIR || join(ROOT, 'target', 'debug');
export const SERVER_BIN = process.env.SERVER_BIN || join(BIN, 'signalling-server');
export const AGENT_BIN = process.env.AGENT_BIN || join(BIN, 'robot-agent');
export const WAIT_MS = 15000;
export const CHROMIUM_ARGS = ['--headless', '--no-sandbox', '--disable-gpu', '--disable-quic', '--no-first-run',
  '--disable-background-networking', '--disable-component-update', '--disable-sync',
  '--allow-loopback-in-peer-connection', '--disable-features=WebRtcHideLocalIpsWithMdns'];


export function log(...args) {
  console.log(`[e2e ${new Date().toISOString().slice(11, 23)}]`, ...args);
}

export async function waitFor(what, fn, timeoutMs = WAIT_MS, everyMs = 25) {
  const deadline = Date.now() + timeoutMs;
  for (;;) {
    let value;
    try { value = await fn(); } catch { value = undefined; }
    if (value) return value;
    if (Date.now() > deadline) throw new Error(`timed out waiting for ${what}`);
    await new Promise((r) => setTimeout(r, everyMs));
  }
}


export function assert(cond, message) {
  if (!cond) throw new Error(`assertion failed: ${message}`);
}


export function stop(child) {
  return new Promise((resolveStop) => {
    if (child.exitCode !== null || child.signalCode !== null) return resolveStop();
    child.once('exit', () => resolveStop());
    child.kill('SIGTERM');
  });
}



export function run(cmd, args) {
  return new Promise((resolveRun, reject) => {
    const child = spawn(cmd, args, { stdio: ['ignore', 'pipe', 'pipe'] });
    let output = '';
    child.stdout.on('data', (d) => { output += d; });
    child.stderr.on('data', (d) => { output += d; });
    child.on('exit', (code) => (code === 0 ? resolveRun(output) : reject(new Error(`${cmd} exited ${code}: ${output}`))));
  });
}

/** One test run: its work folder, child processes, server API and verdict. */
export class Harness {
  constructor({ prefix, http, admin }) {
    this.work = mkdtempSync(join(tmpdir(), prefix));
    this.http = http;
    this.admin = admin;
    this.children = [];
    this.passed = 0;
    this.failed = 0;
  }

  check = async (name, fn) => {
    const started = Date.now();
    try {
      await fn();
      this.passed += 1;
      log(`ok   ${name} (${Date.now() - started} ms)`);
    } catch (e) {
      this.failed += 1;
      log(`FAIL ${name}: ${e.stack || e}`);
      throw e;
    }
  };

  /** Starts a child whose output goes to `<work>/<name>.log`. */
  start = (name, cmd, args, env = {}) => {
    const child = spawn(cmd, args, {
      env: { ...process.env, RUST_LOG: process.env.RUST_LOG || 'info', ...env },
      stdio: ['ignore', 'pipe', 'pipe'],
    });
    const out = join(this.work, `${name}.log`);
    const sink = (chunk) => { writeFileSync(out, chunk, { flag: 'a' }); };
    child.stdout.on('data', sink);
    child.stderr.on('data', sink);
    child.logFile = out;
    this.children.push(child);
    return child;
  };

  api = async (method, path, body, token = this.admin) => {
    const response = await fetch(`${this.http}${path}`, {
      method,
      headers: { 'content-type': 'application/json', ...(token ? { authorization: `Bearer ${token}` } : {}) },
      body: body === undefined ? undefined : JSON.stringify(body),
    });
    const text = await response.text();
    return { status: response.status, body: text ? JSON.parse(text) : null };
  };

  /** A fresh Chromium profile per run (playwright refuses --user-data-dir in args). */
  browser = () => chromium.launchPersistentContext(join(this.work, 'chromium-profile'), {
    executablePath: process.env.CHROMIUM || '/usr/bin/chromium',
    headless: true,
    args: CHROMIUM_ARGS,
  });

  /** A page on the server's own origin with the teleop script loaded. */
  newClient = async (browser, name, validate, { ws, robot }) => {
    const page = await browser.newPage();
    page.on('console', (m) => {
      if (m.type() === 'error' && !m.text().startsWith('Failed to load resource')) log(`${name} console: ${m.text()}`);
    });
    // Chromium's local network access checks block about:blank from
    // reaching a private or loopback server; the server's origin may.
    await page.goto(`${this.http}/healthz`);
    await page.evaluate(PAGE_SCRIPT);
    return new Client(page, name, validate, { ws, robot });
  };

  /** On failure, the tail of every child's log. */
  dumpLogs = () => {
    for (const c of this.children) {
      if (c.logFile && existsSync(c.logFile)) {
        log(`--- ${c.logFile} (tail) ---`);
        console.log(readFileSync(c.logFile, 'utf8').split('\n').slice(-40).join('\n'));
      }
    }
  };

  cleanup = async () => {
    for (const child of this.children.reverse()) await stop(child);
  };
}

/** Every JSON line the recording exec driver (driver.py) logged. */
export function driverMessages(path) {
  if (!existsSync(path)) return [];
  return readFileSync(path, 'utf8').split('\n').filter(Boolean).map((l) => JSON.parse(l));
}

// ---------- schema validation ----------

export function loadSchemas() {
  const ajv = new Ajv2020({ strict: false, allErrors: true });
  addFormats(ajv);
  const base = join(ROOT, 'crates', 'protocol', 'spec', 'schemas');
  const byType = {};
  const walk = (dir) => {
    for (const entry of readdirSync(dir)) {
      const path = join(dir, entry);
      if (statSync(path).isDirectory()) { walk(path); continue; }
      if (!entry.endsWith('.json') || entry === 'index.json' || entry.includes('supported.keys')) continue;
      const schema = JSON.parse(readFileSync(path, 'utf8'));
      ajv.addSchema(schema);
      const rel = path.slice(base.length + 1).replace(/\.json$/, '').split('/');
      // agent/v0/location/create -> agent.location.create
      const type = [rel[0], ...rel.slice(2)].join('.');
      byType[type] = schema.$id;
    }
  };
  walk(base);
  return (message) => {
    const id = byType[message.type];
    if (!id) throw new Error(`no schema for ${message.type}`);
    const validate = ajv.getSchema(id);
    if (!validate(message)) {
      throw new Error(`${message.type} breaks the spec: ${JSON.stringify(validate.errors)}\n${JSON.stringify(message)}`);
    }
  };
}

// ---------- browser side (runs in Chromium) ----------

export const PAGE_SCRIPT = `
window.robotClient = (() => {
  const state = { ws: null, pc: null, dc: null, inbox: [], signals: [], setupMs: null, answerSdp: null };
  // crypto.randomUUID needs a secure context; a page served over plain
  // http from a private address is not one.
  const uuid = () => {
    const b = crypto.getRandomValues(new Uint8Array(16));
    b[6] = (b[6] & 0x0f) | 0x40;
    b[8] = (b[8] & 0x3f) | 0x80;
    const h = [...b].map((x) => x.toString(16).padStart(2, '0')).join('');
    return [h.slice(0, 8), h.slice(8, 12), h.slice(12, 16), h.slice(16, 20), h.slice(20)].join('-');
  };
  const envelope = (type, payload, correlationId) => {
    const m = { type, version: '0.5', id: uuid(), timestamp: new Date().toISOString() };
    if (payload !== undefined) m.payload = payload;
    if (correlationId) m.correlationId = correlationId;
    return m;
  };
  async function connect(wsUrl, token, robotId, sessionId) {
    const ws = new WebSocket(wsUrl + '?token=' + encodeURIComponent(token));
    state.ws = ws;
    await new Promise((ok, fail) => {
      ws.onmessage = (e) => { const m = JSON.parse(e.data); if (m.type === 'signalling.welcome') ok(); };
      ws.onerror = () => fail(new Error('websocket error'));
    });
    const pc = new RTCPeerConnection({ iceServers: [] });
    state.pc = pc;
    const dc = pc.createDataChannel('control');
    state.dc = dc;
    pc.addTransceiver('video', { direction: 'recvonly' });
    dc.onmessage = (e) => state.inbox.push(JSON.parse(e.data));
    pc.onicecandidate = (e) => {
      if (!e.candidate || !e.candidate.candidate) return;
      ws.send(JSON.stringify(envelope('signalling.ice_candidate', {
        connectionId: sessionId, candidate: e.candidate.candidate,
        sdpMid: e.candidate.sdpMid ?? '0', sdpMLineIndex: e.candidate.sdpMLineIndex ?? 0,
      })));
    };
    const opened = new Promise((ok) => { dc.onopen = ok; });
    ws.onmessage = async (e) => {
      const m = JSON.parse(e.data);
      state.signals.push(m);
      if (m.type === 'signalling.answer' && m.payload.connectionId === sessionId) {
        state.answerSdp = m.payload.sdp;
        await pc.setRemoteDescription({ type: 'answer', sdp: m.payload.sdp });
      } else if (m.type === 'signalling.ice_candidate' && m.payload.connectionId === sessionId) {
        await pc.addIceCandidate({ candidate: m.payload.candidate, sdpMid: m.payload.sdpMid, sdpMLineIndex: m.payload.sdpMLineIndex });
      }
    };
    const offer = await pc.createOffer();
    await pc.setLocalDescription(offer);
    const t0 = performance.now();
    ws.send(JSON.stringify(envelope('signalling.offer', { robotId, connectionId: sessionId, sdpType: 'offer', sdp: pc.localDescription.sdp })));
    await Promise.race([opened, new Promise((_, fail) => setTimeout(() => fail(new Error('data channel did not open: ' + JSON.stringify(state.signals.filter(s => s.type === 'signalling.error')))), 15000))]);
    state.setupMs = performance.now() - t0;
    return { setupMs: state.setupMs, answerSdp: state.answerSdp };
  }
  function send(type, payload, correlationId) {
    const m = envelope(type, payload, correlationId);
    state.dc.send(JSON.stringify(m));
    return m.id;
  }
  // Holds the stick: one movement command every 100 ms, in the spec form or
  // the legacy MovementCommand form. Each carries its sequence number in
  // turn (seq / 10000), so the driver's log tells which command it ran;
  // sentAt[seq] is the page's clock when it was sent (ms).
  const hold = { timer: null, seq: 0, sentAt: {} };
  function startHolding(form, forward) {
    hold.timer = setInterval(() => {
      if (state.dc.readyState !== 'open') return;
      hold.seq += 1;
      const params = { forward, turn: hold.seq / 10000 };
      const m = form === 'legacy'
        ? { type: 'MovementCommand', params }
        : envelope('agent.movement', params);
      hold.sentAt[hold.seq] = Date.now();
      state.dc.send(JSON.stringify(m));
    }, 100);
  }
  function stopHolding() { clearInterval(hold.timer); hold.timer = null; return hold.sentAt; }
  function held() { return { seq: hold.seq, sentAt: hold.sentAt, buffered: state.dc.bufferedAmount }; }
  function take() { const all = state.inbox; state.inbox = []; return all; }
  function signals() { return state.signals.map((s) => s.type + ':' + JSON.stringify(s.payload)); }
  function close() { try { state.pc.close(); } catch {} try { state.ws.close(); } catch {} }
  return { connect, send, take, signals, close, state, startHolding, stopHolding, held };
})();
`;

export class Client {
  constructor(page, name, validate, { ws, robot }) {
    this.page = page;
    this.name = name;
    this.validate = validate;
    this.ws = ws;
    this.robot = robot;
    this.received = [];
  }

  async connect(token, sessionId) {
    return this.page.evaluate(
      ([ws, token, robot, session]) => window.robotClient.connect(ws, token, robot, session),
      [this.ws, token, this.robot, sessionId],
    );
  }

  send(type, payload, correlationId) {
    return this.page.evaluate(([t, p, c]) => window.robotClient.send(t, p, c), [type, payload, correlationId]);
  }

  async pull() {
    const fresh = await this.page.evaluate(() => window.robotClient.take());
    for (const m of fresh) this.validate(m);
    this.received.push(...fresh);
  }

  /** The first not-yet-consumed message matching `pred`. */
  async expect(what, pred, timeoutMs = WAIT_MS) {
    return waitFor(`${this.name}: ${what}`, async () => {
      await this.pull();
      const i = this.received.findIndex(pred);
      if (i < 0) return undefined;
      return this.received.splice(i, 1)[0];
    }, timeoutMs);
  }
}

