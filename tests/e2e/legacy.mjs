// Modulr's older web app against our server (issue 11): a Chromium page
// written the way that app is written drives the real robot-agent through the
// real signalling-server, which runs with --legacy-clients.
//
// The page (an HTML string, served at the server's origin by Playwright):
// opens `ws://HOST/ws?token=…`, waits for the flat `{"type":"welcome",
// "connectionId":…}` and ignores frames of types it does not know (the spec
// welcome comes first); builds one RTCPeerConnection (`iceServers: []`) with a
// recvonly video transceiver and a data channel `control`; sends a flat
// `{"type":"offer","to":ROBOT,"from":CONNECTION_ID,"sdp":…}` and its candidates
// as flat `{"type":"candidate"|"ice-candidate","to","from","candidate":{…}}`
// (it alternates the two type names, both of which the app's versions use);
// applies the flat answer and candidates it gets back; once the data channel
// is open it sends `{"type":"MovementCommand","params":{"forward":0.5,"turn":0}}`
// every 100 ms for about a second, then stops.
//
// Checked: the data channel opens; the exec driver (driver.py) records moves
// (forward > 0) while the page sends and a watchdog stop after it stops; the
// session record names alice; every frame the page received is the spec
// welcome or one of the flat shapes (fields checked); a page for bob, who has
// no grant, gets a flat FORBIDDEN error for its flat offer.
//
// Runs inside a loopback-only network namespace (see legacy.sh). No sleeps
// are used as synchronisation: every wait is bounded, and a watchdog bounds
// the whole run.

import { spawn } from 'node:child_process';
import { mkdtempSync, writeFileSync, readFileSync, rmSync, existsSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join, dirname, resolve } from 'node:path';
import { createInterface } from 'node:readline';
import { fileURLToPath } from 'node:url';
import { chromium } from 'playwright-core';
import { loadSchemas, waitFor, CHROMIUM_ARGS } from './common.mjs';

const HERE = dirname(fileURLToPath(import.meta.url));
const ROOT = resolve(HERE, '../..');
const BIN = process.env.E2E_BIN_DIR || join(ROOT, 'target', 'debug');
const SERVER_BIN = process.env.SERVER_BIN || join(BIN, 'signalling-server');
const AGENT_BIN = process.env.AGENT_BIN || join(BIN, 'robot-agent');
const ADMIN = 'legacy-e2e-admin-token';
const ROBOT = 'robot-1';
const WAIT_MS = 15000;
const WATCHDOG_MS = 120000;
const AGENT_WATCHDOG_MS = 300;
const DRIVE_MS = 1000;
const DRIVE_EVERY_MS = 100;

const t0 = Date.now();
const work = mkdtempSync(join(tmpdir(), 'legacy-e2e-'));
const driverLog = join(work, 'driver.jsonl');
const children = [];
let browser;

function log(...args) {
  console.log(`[legacy ${new Date().toISOString().slice(11, 23)}]`, ...args);
}

function assert(cond, message) {
  if (!cond) throw new Error(`assertion failed: ${message}`);
}

async function step(name, fn) {
  const started = Date.now();
  const value = await fn();
  log(`ok   ${name} (${Date.now() - started} ms)`);
  return value;
}

// ---------- processes ----------

function start(name, cmd, args, onLine) {
  const env = { ...process.env, RUST_LOG: process.env.RUST_LOG || 'info' };
  delete env.REDIS_URL;
  const child = spawn(cmd, args, { env, stdio: ['ignore', 'pipe', 'pipe'] });
  child.logFile = join(work, `${name}.log`);
  const sink = (line) => writeFileSync(child.logFile, `${line}\n`, { flag: 'a' });
  createInterface({ input: child.stdout }).on('line', (line) => { sink(line); if (onLine) onLine(line); });
  createInterface({ input: child.stderr }).on('line', sink);
  // A binary that cannot start fails the run instead of crashing node.
  child.on('error', (e) => { child.spawnError = e; log(`${name}: ${e.message}`); });
  children.push(child);
  return child;
}

function stopChild(child, graceMs = 5000) {
  return new Promise((done) => {
    if (!child || child.exitCode !== null || child.signalCode !== null) return done();
    const kill = setTimeout(() => child.kill('SIGKILL'), graceMs);
    child.once('exit', () => { clearTimeout(kill); done(); });
    child.kill('SIGTERM');
  });
}

/** Runs a command to completion (bounded); resolves with its output. */
function run(cmd, args) {
  return new Promise((resolveRun, reject) => {
    const child = spawn(cmd, args, { stdio: ['ignore', 'pipe', 'pipe'] });
    let output = '';
    const timer = setTimeout(() => { child.kill('SIGKILL'); reject(new Error(`${cmd} ${args[0]} took over ${WAIT_MS} ms`)); }, WAIT_MS);
    child.stdout.on('data', (d) => { output += d; });
    child.stderr.on('data', (d) => { output += d; });
    child.on('exit', (code) => {
      clearTimeout(timer);
      if (code === 0) resolveRun(output); else reject(new Error(`${cmd} exited ${code}: ${output}`));
    });
  });
}

/** Starts the server on a port of its choosing; resolves with its address from the "listening" log line. */
function startServer() {
  let found;
  let failed;
  const address = new Promise((resolveAddr, reject) => {
    found = resolveAddr;
    failed = reject;
    setTimeout(() => reject(new Error('server did not report its address')), WAIT_MS).unref();
  });
  const child = start('server', SERVER_BIN, ['--listen', '127.0.0.1:0', '--admin-token', ADMIN,
    '--database-url', `sqlite://${join(work, 'server.db')}`, '--log-format', 'json', '--legacy-clients'],
  (line) => {
    try {
      const entry = JSON.parse(line);
      if (entry.fields?.message === 'listening') found(entry.fields.addr);
    } catch { /* not a JSON log line */ }
  });
  child.once('exit', (code, signal) => failed(new Error(`server exited (${code ?? signal}) before listening`)));
  child.once('error', (e) => failed(e));
  return address;
}

function driverMessages() {
  if (!existsSync(driverLog)) return [];
  return readFileSync(driverLog, 'utf8').split('\n').filter(Boolean).map((l) => JSON.parse(l));
}

// ---------- the page, as Modulr's web app writes it ----------

const PAGE_HTML = `<!doctype html>
<html><head><meta charset="utf-8"><title>teleop</title></head>
<body><video id="remote" autoplay playsinline muted></video>
<script>
// What the test reads back (the app itself keeps none of this).
window.teleop = { frames: [], sent: [], channel: [], failures: [], candidatesSent: 0, candidatesAdded: 0,
  connectionId: null, dcOpen: false, offerSentAt: null, dcOpenAt: null, commandsSent: 0 };

window.startTeleop = function (wsUrl, token, robotId) {
  const t = window.teleop;
  const socket = new WebSocket(wsUrl + '?token=' + encodeURIComponent(token));
  let pc = null;
  let channel = null;
  let candidateCount = 0;
  t.socket = socket;

  function send(frame) {
    t.sent.push(frame);
    socket.send(JSON.stringify(frame));
  }

  async function call() {
    pc = new RTCPeerConnection({ iceServers: [] });
    t.pc = pc;
    pc.addTransceiver('video', { direction: 'recvonly' });
    pc.ontrack = (e) => { document.getElementById('remote').srcObject = e.streams[0] || new MediaStream([e.track]); };
    channel = pc.createDataChannel('control');
    t.channel_ = channel;
    channel.onopen = () => { t.dcOpen = true; t.dcOpenAt = performance.now(); };
    channel.onmessage = (e) => t.channel.push(e.data);
    pc.onicecandidate = (e) => {
      if (!e.candidate || !e.candidate.candidate) return;
      // Both names are in use by the app's versions.
      const type = candidateCount++ % 2 === 0 ? 'candidate' : 'ice-candidate';
      t.candidatesSent += 1;
      send({ type, to: robotId, from: t.connectionId, candidate: {
        candidate: e.candidate.candidate, sdpMid: e.candidate.sdpMid, sdpMLineIndex: e.candidate.sdpMLineIndex } });
    };
    const offer = await pc.createOffer();
    await pc.setLocalDescription(offer);
    t.offerSentAt = performance.now();
    send({ type: 'offer', to: robotId, from: t.connectionId, sdp: pc.localDescription.sdp });
  }

  socket.onmessage = (e) => {
    t.frames.push(e.data);
    let msg;
    try { msg = JSON.parse(e.data); } catch (err) { t.failures.push('not JSON: ' + e.data); return; }
    switch (msg.type) {
      case 'welcome':
        t.connectionId = msg.connectionId;
        call().catch((err) => t.failures.push('call: ' + err));
        break;
      case 'answer':
        pc.setRemoteDescription({ type: 'answer', sdp: msg.sdp }).catch((err) => t.failures.push('answer: ' + err));
        break;
      case 'candidate':
        pc.addIceCandidate(msg.candidate).then(() => { t.candidatesAdded += 1; })
          .catch((err) => t.failures.push('addIceCandidate: ' + err));
        break;
      case 'error':
        console.warn('signalling error', msg.error, msg.message);
        break;
      case 'disconnected':
        if (pc) pc.close();
        break;
      default:
        break; // unknown types are ignored, as the app does
    }
  };
  socket.onerror = () => t.failures.push('websocket error');
};

/** MovementCommand every everyMs for forMs, then nothing; resolves with the count sent. */
window.drive = function (forward, turn, forMs, everyMs) {
  const t = window.teleop;
  return new Promise((done) => {
    const count = Math.round(forMs / everyMs);
    let sent = 0;
    const tick = () => {
      t.channel_.send(JSON.stringify({ type: 'MovementCommand', params: { forward, turn } }));
      t.commandsSent += 1;
      sent += 1;
      if (sent >= count) { clearInterval(timer); done(t.commandsSent); }
    };
    const timer = setInterval(tick, everyMs);
    tick();
  });
};

window.snapshot = function () {
  const t = window.teleop;
  const { socket, pc, channel_, ...plain } = t;
  return JSON.parse(JSON.stringify({ ...plain,
    iceConnectionState: pc ? pc.iceConnectionState : null,
    setupMs: t.dcOpenAt !== null ? t.dcOpenAt - t.offerSentAt : null }));
};

window.hangUp = function () {
  const t = window.teleop;
  try { t.pc && t.pc.close(); } catch {}
  try { t.socket.close(); } catch {}
};
</script></body></html>`;

// ---------- frame checks ----------

const exactKeys = (o, keys) => o && typeof o === 'object' && !Array.isArray(o)
  && JSON.stringify(Object.keys(o).sort()) === JSON.stringify([...keys].sort());
const str = (v) => typeof v === 'string' && v.length > 0;

/** Checks one frame the page received: the spec welcome, or a flat frame of a known shape. Returns its type. */
function checkFrame(raw, validate) {
  const m = JSON.parse(raw);
  const bad = (why) => new Error(`frame ${why}: ${raw.length > 300 ? `${raw.slice(0, 300)}…` : raw}`);
  switch (m.type) {
    case 'signalling.welcome':
      validate(m);
      return m.type;
    case 'welcome':
      if (!exactKeys(m, ['type', 'connectionId']) || !str(m.connectionId)) throw bad('welcome: fields');
      return m.type;
    case 'answer':
      if (!exactKeys(m, ['type', 'sdp']) || !str(m.sdp) || !m.sdp.startsWith('v=0')) throw bad('answer: fields');
      return m.type;
    case 'candidate': {
      const c = m.candidate;
      if (!exactKeys(m, ['type', 'candidate']) || !exactKeys(c, ['candidate', 'sdpMid', 'sdpMLineIndex'])
        || !str(c.candidate) || !c.candidate.startsWith('candidate:') || typeof c.sdpMid !== 'string'
        || !Number.isInteger(c.sdpMLineIndex) || c.sdpMLineIndex < 0) throw bad('candidate: fields');
      return m.type;
    }
    case 'error':
      // The web app reads the code from `error`; `code` is kept for other readers.
      if (!exactKeys(m, ['type', 'error', 'code', 'message']) || !str(m.error) || m.code !== m.error
        || !str(m.message)) throw bad('error: fields');
      return m.type;
    case 'session-locked':
      if (!exactKeys(m, ['type', 'robotId', 'lockedBy', 'message']) || !str(m.robotId)) throw bad('session-locked: fields');
      return m.type;
    case 'disconnected':
      if (!exactKeys(m, ['type', 'connectionId', 'reason']) || !str(m.connectionId)
        || !(m.reason === null || typeof m.reason === 'string')) throw bad('disconnected: fields');
      return m.type;
    default:
      throw bad('neither flat nor the spec welcome');
  }
}

/** Checks every frame a page received; a bad frame is recorded in `violations` (checked at the end) and typed `!type`. */
function checkFrames(who, frames, validate, violations) {
  return frames.map((raw) => {
    try {
      return checkFrame(raw, validate);
    } catch (e) {
      violations.push(`${who}: ${e.message}`);
      log(`BAD  ${who}: ${e.message} (recorded; fails the run at the end)`);
      try { return `!${JSON.parse(raw).type}`; } catch { return '!unparsable'; }
    }
  });
}

const tally = (list) => Object.entries(list.reduce((a, x) => ({ ...a, [x]: (a[x] || 0) + 1 }), {}))
  .map(([k, v]) => `${k} x${v}`).join(', ');

// ---------- the test ----------

const figures = {};
const violations = [];

async function main() {
  const validate = loadSchemas();
  const addr = await startServer();
  const HTTP = `http://${addr}`;
  const WS = `ws://${addr}/ws`;
  log(`server listening on ${addr} (--legacy-clients)`);
  const api = async (method, path, body, token = ADMIN) => {
    const response = await fetch(`${HTTP}${path}`, {
      method,
      headers: { 'content-type': 'application/json', ...(token ? { authorization: `Bearer ${token}` } : {}) },
      body: body === undefined ? undefined : JSON.stringify(body),
      signal: AbortSignal.timeout(WAIT_MS),
    });
    const text = await response.text();
    return { status: response.status, body: text ? JSON.parse(text) : null };
  };

  // ----- the robot: created, enrolled, running with the recording driver -----
  const configDir = join(work, 'agent');
  await step(`robot ${ROBOT} created and enrolled by robot-agent`, async () => {
    const created = await api('POST', '/v1/robots', { robotId: ROBOT });
    assert(created.status === 201, `create robot: ${JSON.stringify(created)}`);
    await run(AGENT_BIN, ['--config-dir', configDir, 'enroll', '--server', HTTP,
      '--robot-id', ROBOT, '--token', created.body.enrollmentToken]);
  });
  writeFileSync(join(configDir, 'agent.toml'), [
    `server = "${WS}"`,
    `robot_id = "${ROBOT}"`,
    'include_loopback_candidates = true',
    '[safety]',
    'max_linear_speed = 0.5',
    'max_angular_speed = 1.0',
    `watchdog_ms = ${AGENT_WATCHDOG_MS}`,
    '[reconnect]',
    'initial_delay_ms = 200',
    'max_delay_ms = 1000',
    '',
  ].join('\n'));
  // The agent's ICE never uses mDNS (peer.rs); Chromium's mDNS host names are off (CHROMIUM_ARGS).
  start('agent', AGENT_BIN, ['--config-dir', configDir, 'run',
    '--driver', `exec:python3 ${join(HERE, 'driver.py')} ${driverLog}`]);
  await step('agent online, driver ready', async () => {
    await waitFor('robot online', async () => (await api('GET', `/v1/robots/${ROBOT}`)).body?.online === true, WAIT_MS);
    await waitFor('driver ready', () => driverMessages().some((m) => m.method === 'stop' && m.params.reason === 'driver_started'), WAIT_MS);
  });

  const granted = await api('PUT', `/v1/robots/${ROBOT}/grants/alice`, { role: 'operator' });
  assert(granted.status === 200, `grant: ${JSON.stringify(granted)}`);
  const tokenFor = async (subject) => {
    const issued = await api('POST', '/v1/tokens', { subject });
    assert(issued.status === 201, `token: ${JSON.stringify(issued)}`);
    return issued.body.token;
  };

  // ----- Chromium -----
  browser = await chromium.launchPersistentContext(join(work, 'chromium-profile'), {
    executablePath: process.env.CHROMIUM || '/usr/bin/chromium',
    headless: true,
    args: CHROMIUM_ARGS,
  });
  // Without media permission Chromium gathers no host candidates in a
  // namespace whose only route is loopback (see sdpmid.mjs); with it, it
  // gathers on 127.0.0.1 and the page's flat candidates really flow.
  await browser.grantPermissions(['camera', 'microphone'], { origin: HTTP });
  const openPage = async (name) => {
    const page = await browser.newPage();
    page.on('console', (m) => {
      if (['error', 'warning'].includes(m.type()) && !m.text().startsWith('Failed to load resource')) log(`${name} console: ${m.text()}`);
    });
    page.on('pageerror', (e) => log(`${name} page error: ${e}`));
    // The HTML string, written into a page of the server's own (loopback)
    // origin: Chromium's local network access checks block about:blank (and
    // a response Playwright fulfils itself) from reaching 127.0.0.1.
    await page.goto(`${HTTP}/healthz`, { timeout: WAIT_MS });
    await page.setContent(PAGE_HTML, { timeout: WAIT_MS });
    return page;
  };

  // ----- alice: a full session, driving at 10 Hz -----
  const alice = await openPage('alice');
  const chromiumVersion = await alice.evaluate(async () => {
    const hints = await navigator.userAgentData.getHighEntropyValues(['fullVersionList']);
    const brand = hints.fullVersionList.find((x) => x.brand === 'Chromium') || hints.fullVersionList[0];
    return brand ? brand.version : navigator.userAgent;
  });
  log(`Chromium ${chromiumVersion}`);
  const snapshot = () => alice.evaluate(() => window.snapshot());
  await alice.evaluate(([ws, token, robot]) => window.startTeleop(ws, token, robot), [WS, await tokenFor('alice'), ROBOT]);
  let snap;
  try {
    snap = await step('alice: flat welcome, flat offer, flat answer and candidates, data channel "control" open', () =>
      waitFor('the data channel to open', async () => {
        const s = await snapshot();
        if (s.failures.length || s.frames.some((f) => f.includes('"type":"error"'))) return s;
        return s.dcOpen ? s : undefined;
      }, WAIT_MS));
  } catch (e) {
    const s = await snapshot();
    throw new Error(`${e.message}; ICE ${s.iceConnectionState}, frames ${JSON.stringify(s.frames.map((f) => f.slice(0, 120)))}, failures ${JSON.stringify(s.failures)}`);
  }
  assert(snap.failures.length === 0, `page failures: ${snap.failures.join('; ')}`);
  assert(snap.dcOpen, `data channel not open; frames ${JSON.stringify(snap.frames)}`);
  const setupMs = snap.setupMs;
  figures.setupMs = setupMs;
  const connectionId = snap.connectionId;

  // Drive: ~1 s of MovementCommand at 10 Hz, then silence.
  const before = driverMessages().length;
  const driveStart = Date.now();
  const sentCommands = await alice.evaluate(([ms, every]) => window.drive(0.5, 0, ms, every), [DRIVE_MS, DRIVE_EVERY_MS]);
  const driveEnd = Date.now();
  const watchdogStop = await step(`alice: ${sentCommands} MovementCommand sent over ${driveEnd - driveStart} ms reach the driver, then the watchdog stops it`, async () => {
    const stopMsg = await waitFor('watchdog stop after the moves', () => {
      const fresh = driverMessages().slice(before);
      const firstMove = fresh.findIndex((m) => m.method === 'move');
      if (firstMove < 0) return undefined;
      return fresh.slice(firstMove).find((m) => m.method === 'stop' && m.params.reason === 'watchdog');
    }, WAIT_MS);
    const moves = driverMessages().slice(before).filter((m) => m.method === 'move' && m.t <= stopMsg.t);
    assert(sentCommands >= 8, `the page sent ${sentCommands} commands in ${DRIVE_MS} ms`);
    assert(moves.length >= 3, `${moves.length} moves reached the driver of ${sentCommands} sent`);
    for (const m of moves) {
      assert(m.params.linear > 0 && m.params.angular === 0, `move forward only: ${JSON.stringify(m)}`);
      assert(m.params.linear === 0.25, `linear ${m.params.linear} = 0.5 * max_linear_speed 0.5 m/s`);
      // While the page was sending (the last one may land just after the page's timer stopped).
      assert(m.t * 1000 >= driveStart && m.t * 1000 <= driveEnd + AGENT_WATCHDOG_MS, `move at ${m.t} outside the drive (${driveStart}..${driveEnd})`);
    }
    const lastMove = moves[moves.length - 1];
    const gap = Math.round((stopMsg.t - lastMove.t) * 1000);
    assert(gap >= AGENT_WATCHDOG_MS - 50 && gap < 1000, `watchdog stop ${gap} ms after the last move`);
    return { moves: moves.length, gap, stopAt: stopMsg.t };
  });

  await step('alice: the session record names alice, operator, of the flat welcome\'s connection', async () => {
    const sessions = await api('GET', `/v1/sessions?robotId=${ROBOT}`);
    assert(sessions.status === 200, JSON.stringify(sessions));
    const record = sessions.body.find((x) => x.connectionId === connectionId);
    assert(record && record.subject === 'alice' && record.role === 'operator' && record.robotId === ROBOT,
      `session record for ${connectionId}: ${JSON.stringify(sessions.body)}`);
  });

  // Every frame alice's page received is the spec welcome or a known flat shape.
  snap = await snapshot();
  const aliceTypes = await step('alice: one flat welcome and answer, flat candidates both ways, no error', () => {
    const types = checkFrames('alice', snap.frames, validate, violations);
    const welcome = JSON.parse(snap.frames[types.indexOf('welcome')] ?? 'null');
    const spec = JSON.parse(snap.frames[types.indexOf('signalling.welcome')] ?? 'null');
    assert(welcome, 'a flat welcome arrived');
    assert(!spec || spec.payload.connectionId === welcome.connectionId,
      `both welcomes name one connection: ${spec?.payload.connectionId} vs ${welcome.connectionId}`);
    assert(types.filter((x) => x === 'welcome').length === 1, `one flat welcome: ${types.join(',')}`);
    assert(types.filter((x) => x === 'answer').length === 1, `one answer: ${types.join(',')}`);
    assert(types.includes('candidate'), `flat candidates arrived: ${types.join(',')}`);
    assert(!types.includes('error'), `no error: ${snap.frames.filter((f) => f.includes('"error"')).join(' ')}`);
    assert(snap.candidatesSent > 0, 'the page sent its own flat candidates');
    assert(snap.candidatesAdded === types.filter((x) => x === 'candidate').length, 'every relayed candidate was added');
    assert(snap.failures.length === 0, `page failures: ${snap.failures.join('; ')}`);
    return types;
  });
  // What the agent said on the data channel is the spec's (agent.capabilities, agent.error, …).
  const channelTypes = {};
  for (const raw of snap.channel) {
    const m = JSON.parse(raw);
    validate(m);
    const key = m.type === 'agent.error' ? `${m.type}(${m.payload.code}/${m.payload.details?.cause ?? m.payload.details?.reason ?? ''})` : m.type;
    channelTypes[key] = (channelTypes[key] || 0) + 1;
  }
  log(`alice received over the socket (in order: ${aliceTypes.join(' ')}): ${tally(aliceTypes)}`);
  log(`alice received over the data channel: ${Object.entries(channelTypes).map(([k, v]) => `${k} x${v}`).join(', ') || 'nothing'}`);
  log(`alice sent ${snap.candidatesSent} flat candidates, ${snap.sent.filter((f) => f.type === 'offer').length} offer`);

  // alice hangs up; her session ends (so bob's refusal below cannot be the robot being busy).
  await alice.evaluate(() => window.hangUp());
  await step('alice hangs up: the session record ends', () => waitFor('session ended', async () =>
    (await api('GET', `/v1/sessions?robotId=${ROBOT}`)).body?.find((x) => x.connectionId === connectionId)?.endedAt, WAIT_MS));

  // ----- bob: no grant; the same page gets a flat FORBIDDEN for its flat offer -----
  const bob = await openPage('bob');
  await bob.evaluate(([ws, token, robot]) => window.startTeleop(ws, token, robot), [WS, await tokenFor('bob'), ROBOT]);
  const refusal = await step('bob (no grant): a flat FORBIDDEN error for the flat offer', async () => {
    const s = await waitFor('an error frame for bob', async () => {
      const x = await bob.evaluate(() => window.snapshot());
      return x.frames.some((f) => JSON.parse(f).type === 'error') && x.sent.some((f) => f.type === 'offer') ? x : undefined;
    }, WAIT_MS);
    const types = checkFrames('bob', s.frames, validate, violations);
    log(`bob received over the socket: ${tally(types)}`);
    const errors = s.frames.map((f) => JSON.parse(f)).filter((m) => m.type === 'error');
    assert(errors[0].code === 'FORBIDDEN', `first error: ${JSON.stringify(errors[0])}`);
    assert(errors.every((e) => e.code === 'FORBIDDEN'), `every error FORBIDDEN: ${JSON.stringify(errors)}`);
    assert(!types.includes('answer') && !s.dcOpen, 'no answer, no data channel');
    const sessions = (await api('GET', `/v1/sessions?subject=bob`)).body;
    assert(Array.isArray(sessions) && sessions.length === 0, `no session for bob: ${JSON.stringify(sessions)}`);
    return errors[0];
  });
  log(`bob's error: ${JSON.stringify(refusal)}`);
  await bob.evaluate(() => window.hangUp());

  // No movement reached the driver after the watchdog stop.
  const late = driverMessages().filter((m) => m.method === 'move' && m.t > watchdogStop.stopAt);
  assert(late.length === 0, `moves after the watchdog stop: ${JSON.stringify(late)}`);

  figures.summary = `${sentCommands} MovementCommand at 10 Hz -> ${watchdogStop.moves} moves at the driver, `
    + `watchdog stop ${watchdogStop.gap} ms after the last; bob without a grant refused with a flat ${refusal.code}`;
  // Checked last so that one bad frame does not hide the rest of the run.
  assert(violations.length === 0, `${violations.length} frame(s) the page should not have received:\n  ${violations.join('\n  ')}`);

  console.log('');
  console.log(`RESULT Chromium ${chromiumVersion}, legacy web app page -> signalling-server --legacy-clients -> robot-agent: `
    + `session setup (flat offer sent -> data channel open) ${setupMs.toFixed(1)} ms; `
    + `${sentCommands} MovementCommand at 10 Hz -> ${watchdogStop.moves} moves at the driver, watchdog stop ${watchdogStop.gap} ms after the last; `
    + `bob without a grant refused with a flat ${refusal.code}`);
}

// ---------- run, with a watchdog and cleanup ----------

let ok = false;
const watchdog = setTimeout(async () => {
  log(`FAIL: the whole test took over ${WATCHDOG_MS} ms`);
  if (browser) await Promise.race([browser.close().catch(() => {}), new Promise((r) => setTimeout(r, 2000))]);
  for (const child of [...children].reverse()) await stopChild(child, 1000);
  process.exit(1);
}, WATCHDOG_MS);
try {
  await main();
  ok = true;
} catch (e) {
  log(`FAIL ${e.stack || e}`);
  if (figures.setupMs !== undefined) {
    console.log(`RESULT (FAILED run) session setup (flat offer sent -> data channel open) ${figures.setupMs.toFixed(1)} ms`
      + `${figures.summary ? `; ${figures.summary}` : ''}`);
  }
  for (const c of children) {
    if (existsSync(c.logFile)) {
      log(`--- ${c.logFile} (tail) ---`);
      console.log(readFileSync(c.logFile, 'utf8').split('\n').slice(-30).join('\n'));
    }
  }
} finally {
  if (browser) await browser.close().catch(() => {});
  for (const child of [...children].reverse()) await stopChild(child);
  clearTimeout(watchdog);
}
if (ok) rmSync(work, { recursive: true, force: true });
else log(`work directory kept: ${work}`);
console.log(`legacy: ${ok ? 'passed' : 'FAILED'} in ${((Date.now() - t0) / 1000).toFixed(1)} s`);
process.exit(ok ? 0 : 1);
