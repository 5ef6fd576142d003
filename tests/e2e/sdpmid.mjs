// Does Chromium accept ICE candidates with `sdpMid: ""` as the server relays
// them? The ModulrCloud robot agent (webrtc-rs) sends every candidate with an
// empty sdpMid and an sdpMLineIndex; the spec requires both fields.
//
// The real signalling-server (plain binary, loopback, temporary SQLite) and one
// headless Chromium page holding the two ends:
// - "robot": a token-less WebSocket that registers, answers the PKI challenge
//   (Ed25519, signed by node through an exposed function) and answers each
//   offer with its own RTCPeerConnection; it sends its candidates as the Modulr
//   agent does: `sdpMid: ""`, the candidate's sdpMLineIndex, no usernameFragment.
// - "browser": logged in with a client token, offers a data channel and passes
//   each relayed `signalling.ice_candidate` payload, exactly as received, to
//   addIceCandidate.
// Two sessions in a row: a data channel alone (one m-line), then recvonly
// video + data channel (two bundled m-lines, as the teleop client offers).
// Neither SDP carries candidates and the browser's own candidates are never
// sent to the robot: the robot only learns the browser's address from its
// connectivity checks, so ICE can only succeed if Chromium used the relayed
// candidates. Every server message is validated against the spec's schemas.
// Runs inside a loopback-only network namespace (see sdpmid.sh). No sleeps
// are used as synchronisation: every wait is bounded.

import { spawn } from 'node:child_process';
import { generateKeyPairSync, sign, randomUUID } from 'node:crypto';
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
const ADMIN = 'sdpmid-admin-token';
const ROBOT = 'sdpmid-robot';
const SUBJECT = 'sdpmid-operator';
const WAIT_MS = 15000;
const WATCHDOG_MS = 120000;

const t0 = Date.now();
const work = mkdtempSync(join(tmpdir(), 'sdpmid-e2e-'));
let server;
let browser;

function log(...args) {
  console.log(`[sdpmid ${new Date().toISOString().slice(11, 23)}]`, ...args);
}

function assert(cond, message) {
  if (!cond) throw new Error(`assertion failed: ${message}`);
}

// ---------- the server ----------

/** Starts the server on a port of its choosing; `address` resolves from its "listening" log line. */
function startServer() {
  const logFile = join(work, 'server.log');
  const env = { ...process.env, RUST_LOG: process.env.RUST_LOG || 'info' };
  delete env.REDIS_URL;
  const child = spawn(SERVER_BIN, ['--listen', '127.0.0.1:0', '--admin-token', ADMIN,
    '--database-url', `sqlite://${join(work, 'server.db')}`, '--log-format', 'json'],
  { env, stdio: ['ignore', 'pipe', 'pipe'] });
  child.logFile = logFile;
  child.stderr.on('data', (chunk) => writeFileSync(logFile, chunk, { flag: 'a' }));
  const address = new Promise((resolveAddr, reject) => {
    createInterface({ input: child.stdout }).on('line', (line) => {
      writeFileSync(logFile, `${line}\n`, { flag: 'a' });
      try {
        const entry = JSON.parse(line);
        if (entry.fields?.message === 'listening') resolveAddr(entry.fields.addr);
      } catch { /* not a JSON log line */ }
    });
    child.once('error', reject);
    child.once('exit', (code, signal) => reject(new Error(`server exited (${code ?? signal}) before listening`)));
    setTimeout(() => reject(new Error('server did not report its address')), WAIT_MS).unref();
  });
  return { child, address };
}

function stopChild(child, graceMs = 5000) {
  return new Promise((done) => {
    if (!child || child.exitCode !== null || child.signalCode !== null) return done();
    const kill = setTimeout(() => child.kill('SIGKILL'), graceMs);
    child.once('exit', () => { clearTimeout(kill); done(); });
    child.kill('SIGTERM');
  });
}

// ---------- the page: the robot and the browser ----------

const PAGE_SCRIPT = `
window.sdpmid = (() => {
  const s = {
    robot: { ws: null, sent: [], received: [], verified: false, sessions: {} },
    browser: { ws: null, sent: [], received: [], sessions: {} },
    failures: [],
  };
  const envelope = (type, payload, version, correlationId) => {
    const m = { type, version, id: crypto.randomUUID(), timestamp: new Date().toISOString() };
    if (correlationId) m.correlationId = correlationId;
    if (payload !== undefined) m.payload = payload;
    return m;
  };
  const sender = (side, version) => (type, payload, correlationId) => {
    const m = envelope(type, payload, version, correlationId);
    side.sent.push(m);
    side.ws.send(JSON.stringify(m));
  };
  // Messages are handled one at a time, in arrival order (an answer is set
  // before the candidates that follow it are added).
  const serially = (side, name, handle) => {
    let chain = Promise.resolve();
    return (e) => {
      const m = JSON.parse(e.data);
      side.received.push(m);
      chain = chain.then(() => handle(m)).catch((err) => s.failures.push(name + ' handling ' + m.type + ': ' + err));
    };
  };
  const opened = (ws) => new Promise((ok, fail) => { ws.onopen = ok; ws.onerror = () => fail(new Error('websocket error')); });

  // ----- robot: as the Modulr agent, version 0.3, no token -----
  let robotSend;
  async function robotLogin(wsUrl, agentId) {
    const r = s.robot;
    const ws = new WebSocket(wsUrl);
    r.ws = ws;
    robotSend = sender(r, '0.3');
    ws.onmessage = serially(r, 'robot', async (m) => {
      switch (m.type) {
        case 'signalling.welcome': break; // may come at any time, or never: not needed
        case 'signalling.pki_challenge': {
          const signature = await window.sdpmidSign(m.payload.challenge);
          robotSend('signalling.pki_response', { signature }, m.id);
          break;
        }
        case 'signalling.pki_verified': r.verified = true; break;
        case 'signalling.offer': await robotAnswer(m.payload); break;
        case 'signalling.disconnected': {
          const session = r.sessions[m.payload.connectionId];
          if (session) { session.pc.close(); session.ended = true; }
          break;
        }
        default: break; // errors and the rest are recorded and checked by the test
      }
    });
    await opened(ws);
    // Registers at once, never waiting for a welcome; asks for one (TURN credentials) as our agent does.
    robotSend('signalling.register', { agentId, metadata: { wantsWelcome: true } });
  }

  async function robotAnswer(offer) {
    const pc = new RTCPeerConnection({ iceServers: [] });
    const session = { pc, candidatesSent: [], dcOpen: false, echoed: 0, ended: false };
    s.robot.sessions[offer.connectionId] = session;
    pc.ondatachannel = (e) => {
      const dc = e.channel;
      dc.onopen = () => { session.dcOpen = true; };
      if (dc.readyState === 'open') session.dcOpen = true;
      dc.onmessage = (m) => { session.echoed += 1; dc.send('echo:' + m.data); };
    };
    pc.onicecandidate = (e) => {
      // The Modulr agent skips the end of gathering and sends every candidate
      // with sdpMid "" and the candidate's m-line index.
      if (!e.candidate || !e.candidate.candidate) return;
      const payload = {
        connectionId: offer.connectionId,
        candidate: e.candidate.candidate,
        sdpMid: '',
        sdpMLineIndex: e.candidate.sdpMLineIndex ?? 0,
      };
      session.candidatesSent.push(payload);
      robotSend('signalling.ice_candidate', payload);
    };
    await pc.setRemoteDescription({ type: 'offer', sdp: offer.sdp });
    const answer = await pc.createAnswer();
    // Sent before setLocalDescription: no candidate can precede it, and it carries none.
    robotSend('signalling.answer', { connectionId: offer.connectionId, sdpType: 'answer', sdp: answer.sdp });
    await pc.setLocalDescription(answer);
  }

  // ----- browser: token login, one offer per session -----
  let browserSend;
  async function browserLogin(wsUrl, token) {
    const b = s.browser;
    const ws = new WebSocket(wsUrl + '?token=' + encodeURIComponent(token));
    b.ws = ws;
    browserSend = sender(b, '0.5');
    ws.onmessage = serially(b, 'browser', async (m) => {
      const session = b.sessions[m.payload?.connectionId];
      if (!session) return;
      if (m.type === 'signalling.answer') {
        await session.pc.setRemoteDescription({ type: 'answer', sdp: m.payload.sdp });
      } else if (m.type === 'signalling.ice_candidate') {
        // Exactly what the server relayed (RTCIceCandidateInit ignores connectionId).
        const entry = { payload: m.payload, settled: false, ok: false, error: null };
        session.added.push(entry);
        try {
          await session.pc.addIceCandidate(m.payload);
          entry.ok = true;
        } catch (err) {
          entry.error = err.name + ': ' + err.message;
        }
        entry.settled = true;
      }
    });
    await opened(ws);
  }

  async function browserOffer(robotId, connectionId, withVideo) {
    const pc = new RTCPeerConnection({ iceServers: [] });
    const session = { pc, added: [], ownCandidates: 0, iceStates: [], dcOpen: false, echo: null,
      offerSdp: null, offerSentAt: null, dcOpenAt: null };
    s.browser.sessions[connectionId] = session;
    // Gathered but never sent: the robot must be reached through its relayed candidates.
    pc.onicecandidate = (e) => { if (e.candidate && e.candidate.candidate) session.ownCandidates += 1; };
    pc.oniceconnectionstatechange = () => session.iceStates.push(pc.iceConnectionState);
    if (withVideo) pc.addTransceiver('video', { direction: 'recvonly' });
    const dc = pc.createDataChannel('control');
    dc.onopen = () => { session.dcOpen = true; session.dcOpenAt = performance.now(); dc.send('hello'); };
    dc.onmessage = (e) => { session.echo = e.data; };
    const offer = await pc.createOffer();
    session.offerSdp = offer.sdp;
    await pc.setLocalDescription(offer);
    session.offerSentAt = performance.now();
    browserSend('signalling.offer', { robotId, connectionId, sdpType: 'offer', sdp: offer.sdp });
  }

  function browserEnd(connectionId) {
    s.browser.sessions[connectionId].pc.close();
    browserSend('signalling.disconnected', { connectionId, reason: 'closed' });
  }

  /** The browser's selected candidate pair, from getStats. */
  async function selectedPair(connectionId) {
    const stats = await s.browser.sessions[connectionId].pc.getStats();
    let pair;
    stats.forEach((r) => { if (r.type === 'transport' && r.selectedCandidatePairId) pair = stats.get(r.selectedCandidatePairId); });
    if (!pair) return null;
    const view = (c) => c && { address: c.address, port: c.port, protocol: c.protocol, candidateType: c.candidateType };
    return { state: pair.state, nominated: pair.nominated, local: view(stats.get(pair.localCandidateId)),
      remote: view(stats.get(pair.remoteCandidateId)) };
  }

  function snapshot() {
    const view = (side, extra) => Object.fromEntries(Object.entries(side.sessions).map(([id, x]) => {
      const { pc, ...rest } = x;
      return [id, { ...rest, ...extra(x), signalingState: pc.signalingState, iceGatheringState: pc.iceGatheringState,
        iceConnectionState: pc.iceConnectionState, connectionState: pc.connectionState }];
    }));
    return JSON.parse(JSON.stringify({
      robot: { sent: s.robot.sent, received: s.robot.received, verified: s.robot.verified, sessions: view(s.robot, () => ({})) },
      browser: { sent: s.browser.sent, received: s.browser.received,
        sessions: view(s.browser, (x) => ({ setupMs: x.dcOpenAt !== null ? x.dcOpenAt - x.offerSentAt : null })) },
      failures: s.failures,
    }));
  }

  function close() {
    for (const side of [s.browser, s.robot]) {
      for (const x of Object.values(side.sessions)) { try { x.pc.close(); } catch {} }
      try { side.ws && side.ws.close(); } catch {}
    }
  }
  return { robotLogin, browserLogin, browserOffer, browserEnd, selectedPair, snapshot, close };
})();
`;

// ---------- helpers ----------

/** Mid of each m-section of an SDP, by m-line index. */
function midsOf(sdp) {
  return sdp.split(/\r?\nm=/).slice(1).map((section) => (section.match(/\r?\na=mid:(\S+)/) || [])[1]);
}

/** Protocol, address and port of an ICE candidate ("candidate:foundation component protocol priority address port typ type ..."). */
function candidateAddress(candidate) {
  const f = candidate.replace(/^candidate:/, '').split(' ');
  return { protocol: f[2].toLowerCase(), address: f[4], port: Number(f[5]), type: f[7] };
}

function report(snap, connectionId) {
  const r = snap.robot.sessions[connectionId];
  const b = snap.browser.sessions[connectionId];
  if (r) log(`  robot peer: signaling ${r.signalingState}, gathering ${r.iceGatheringState}, ICE ${r.iceConnectionState}, ${r.candidatesSent.length} candidates sent`);
  if (b) {
    log(`  browser peer: signaling ${b.signalingState}, gathering ${b.iceGatheringState}, ICE ${b.iceStates.join(' > ') || b.iceConnectionState}, `
      + `${b.ownCandidates} own candidates gathered (not sent)`);
    for (const a of b.added) {
      const p = a.payload;
      log(`  addIceCandidate({sdpMid: ${JSON.stringify(p.sdpMid)}, sdpMLineIndex: ${p.sdpMLineIndex}, candidate: "${p.candidate}"}): ${a.ok ? 'ok' : a.error}`);
    }
  }
  for (const side of ['robot', 'browser']) {
    log(`  ${side} received: ${snap[side].received.map((m) => m.type.replace('signalling.', '')).join(', ')}`);
  }
  for (const m of [...snap.robot.received, ...snap.browser.received].filter((x) => x.type === 'signalling.error')) {
    log(`  server error: ${JSON.stringify(m.payload)}`);
  }
  for (const f of snap.failures) log(`  page failure: ${f}`);
}

// ---------- the test ----------

async function main() {
  const validate = loadSchemas();
  const started = startServer();
  server = started.child;
  const addr = await started.address;
  const HTTP = `http://${addr}`;
  const WS = `ws://${addr}/ws`;
  log(`server listening on ${addr}`);

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

  // Admin setup: a robot enrolled with an Ed25519 key, an operator grant, a client token.
  const { publicKey, privateKey } = generateKeyPairSync('ed25519');
  const rawPublicKey = Buffer.from(publicKey.export({ format: 'jwk' }).x, 'base64url').toString('base64');
  const created = await api('POST', '/v1/robots', { robotId: ROBOT });
  assert(created.status === 201, `create robot: ${JSON.stringify(created)}`);
  const enrolled = await api('POST', '/v1/enroll',
    { robotId: ROBOT, enrollmentToken: created.body.enrollmentToken, publicKey: rawPublicKey }, null);
  assert(enrolled.status === 201, `enroll: ${JSON.stringify(enrolled)}`);
  const granted = await api('PUT', `/v1/robots/${ROBOT}/grants/${SUBJECT}`, { role: 'operator' });
  assert(granted.status === 200, `grant: ${JSON.stringify(granted)}`);
  const issued = await api('POST', '/v1/tokens', { subject: SUBJECT });
  assert(issued.status === 201, `token: ${JSON.stringify(issued)}`);
  log('robot created and enrolled (Ed25519), operator granted, client token issued');

  browser = await chromium.launchPersistentContext(join(work, 'chromium-profile'), {
    executablePath: process.env.CHROMIUM || '/usr/bin/chromium',
    headless: true,
    args: CHROMIUM_ARGS,
  });
  // Without media permission Chromium gathers host candidates on the default
  // route only, and the namespace has no route but loopback (it gathers none):
  // with camera and microphone granted to the page's origin it gathers on
  // every interface, 127.0.0.1 included (--allow-loopback-in-peer-connection).
  await browser.grantPermissions(['camera', 'microphone'], { origin: HTTP });
  const page = await browser.newPage();
  page.on('console', (m) => { if (m.type() === 'error' && !m.text().startsWith('Failed to load resource')) log(`console: ${m.text()}`); });
  page.on('pageerror', (e) => log(`page error: ${e}`));
  await page.exposeFunction('sdpmidSign',
    (challenge) => sign(null, Buffer.from(challenge, 'base64'), privateKey).toString('base64'));
  // A page on the server's own (loopback) origin: Chromium's local network
  // access checks block about:blank from reaching 127.0.0.1.
  await page.goto(`${HTTP}/healthz`, { timeout: WAIT_MS });
  await page.evaluate(PAGE_SCRIPT);
  const chromiumVersion = await page.evaluate(async () => {
    const hints = await navigator.userAgentData.getHighEntropyValues(['fullVersionList']);
    const brand = hints.fullVersionList.find((x) => x.brand === 'Chromium') || hints.fullVersionList[0];
    return brand ? brand.version : navigator.userAgent;
  });
  log(`Chromium ${chromiumVersion}`);
  const snapshot = () => page.evaluate(() => window.sdpmid.snapshot());
  const noFailures = (snap) => assert(snap.failures.length === 0, `page failures: ${snap.failures.join('; ')}`);
  const serverErrors = (snap) => [...snap.robot.received, ...snap.browser.received].filter((m) => m.type === 'signalling.error');

  // The robot logs in; the browser connects with its token.
  await page.evaluate(([ws, robot]) => window.sdpmid.robotLogin(ws, robot), [WS, ROBOT]);
  const login = await waitFor('robot pki_verified', async () => {
    const snap = await snapshot();
    return snap.robot.verified || snap.failures.length || serverErrors(snap).length ? snap : undefined;
  }).catch(async (e) => { throw new Error(`${e.message}; robot received ${JSON.stringify((await snapshot()).robot.received)}`); });
  noFailures(login);
  assert(serverErrors(login).length === 0, `robot login refused: ${JSON.stringify(serverErrors(login))}`);
  assert((await api('GET', `/v1/robots/${ROBOT}`)).body?.online === true, 'robot online after pki_verified');
  log('robot registered and verified');
  await page.evaluate(([ws, token]) => window.sdpmid.browserLogin(ws, token), [WS, issued.body.token]);

  const results = [];
  for (const [label, withVideo] of [['data channel only (1 m-line)', false], ['recvonly video + data channel (2 bundled m-lines)', true]]) {
    const connectionId = `sdpmid-${randomUUID()}`;
    log(`session ${results.length + 1}: ${label}`);

    // The browser offers; the robot answers and trickles sdpMid "" candidates.
    await page.evaluate(([robot, id, video]) => window.sdpmid.browserOffer(robot, id, video), [ROBOT, connectionId, withVideo]);
    let snap;
    try {
      snap = await waitFor('data channel open on both ends, ICE connected, a message echoed', async () => {
        const s = await snapshot();
        if (serverErrors(s).length || s.failures.length) return s; // reported below
        const b = s.browser.sessions[connectionId];
        const r = s.robot.sessions[connectionId];
        if (b.added.some((a) => a.settled && !a.ok)) return s; // a refused candidate: reported below
        const ice = ['connected', 'completed'].includes(b.iceConnectionState);
        // Every candidate the robot gathered has been relayed and added (or refused).
        const allAdded = r?.iceGatheringState === 'complete' && b.added.length === r.candidatesSent.length
          && b.added.every((a) => a.settled);
        return ice && allAdded && b.dcOpen && r.dcOpen && b.echo ? s : undefined;
      });
    } catch (e) {
      snap = await snapshot();
      report(snap, connectionId);
      const b = snap.browser.sessions[connectionId];
      throw new Error(`${e.message}: browser ICE ${b.iceConnectionState}, browser data channel open ${b.dcOpen}, `
        + `robot data channel open ${snap.robot.sessions[connectionId]?.dcOpen}`);
    }
    report(snap, connectionId);
    noFailures(snap);
    assert(serverErrors(snap).length === 0, `no signalling.error: ${JSON.stringify(serverErrors(snap))}`);
    const b = snap.browser.sessions[connectionId];
    const r = snap.robot.sessions[connectionId];

    // Chromium accepted every relayed candidate.
    const refused = b.added.filter((a) => !a.ok);
    assert(refused.length === 0, `Chromium refused ${refused.length} of ${b.added.length} relayed candidates: `
      + refused.map((a) => `${JSON.stringify(a.payload)} -> ${a.error}`).join('; '));

    // Neither SDP carries a candidate: ICE used the relayed ones alone.
    const ofSession = (m, type) => m.type === type && m.payload?.connectionId === connectionId;
    const relayedOffer = snap.robot.received.find((m) => ofSession(m, 'signalling.offer'));
    const relayedAnswer = snap.browser.received.find((m) => ofSession(m, 'signalling.answer'));
    assert(relayedOffer && relayedAnswer, 'offer and answer relayed');
    assert(!/a=candidate/.test(relayedOffer.payload.sdp), 'the offer carries no candidate');
    assert(!/a=candidate/.test(relayedAnswer.payload.sdp), 'the answer carries no candidate');
    assert(!snap.browser.sent.some((m) => ofSession(m, 'signalling.ice_candidate')), 'the browser sent no candidate to the robot');
    const mids = midsOf(b.offerSdp);
    assert(mids.length === (withVideo ? 2 : 1), `offer m-lines: mids ${JSON.stringify(mids)}`);

    // Each candidate the robot sent arrived once, in order, unchanged but for
    // sdpMid, which is "" (relayed as sent) or the mid of the m-line at
    // sdpMLineIndex (filled in by the server).
    const sent = r.candidatesSent;
    const relayed = snap.browser.received.filter((m) => ofSession(m, 'signalling.ice_candidate')).map((m) => m.payload);
    assert(sent.length > 0, 'the robot gathered and sent candidates');
    assert(relayed.length === sent.length, `${relayed.length} candidates relayed of ${sent.length} sent`);
    const midModes = new Set();
    sent.forEach((mine, i) => {
      const got = relayed[i];
      assert(got.candidate === mine.candidate && got.sdpMLineIndex === mine.sdpMLineIndex,
        `candidate ${i} relayed unchanged: sent ${JSON.stringify(mine)}, relayed ${JSON.stringify(got)}`);
      assert(typeof got.sdpMid === 'string', `candidate ${i} keeps a string sdpMid (the spec requires one)`);
      if (got.sdpMid === '') midModes.add('"" (relayed as sent)');
      else if (got.sdpMid === mids[got.sdpMLineIndex]) midModes.add(`"${got.sdpMid}" (filled in from the offer)`);
      else throw new Error(`candidate ${i}: sdpMid ${JSON.stringify(got.sdpMid)} is neither "" nor the offer's mid ${JSON.stringify(mids[got.sdpMLineIndex])}`);
    });

    assert(b.added.length === relayed.length, `addIceCandidate called ${b.added.length} times for ${relayed.length} candidates`);

    // The pair ICE selected has a relayed candidate as its remote end.
    const pair = await page.evaluate((id) => window.sdpmid.selectedPair(id), connectionId);
    assert(pair && pair.remote, `a selected candidate pair: ${JSON.stringify(pair)}`);
    const relayedAddresses = relayed.map((p) => candidateAddress(p.candidate));
    assert(relayedAddresses.some((a) => a.address === pair.remote.address && a.port === pair.remote.port && a.protocol === pair.remote.protocol),
      `selected remote ${JSON.stringify(pair.remote)} is one of the relayed candidates ${JSON.stringify(relayedAddresses)}`);
    assert(pair.remote.candidateType === 'host',
      `selected remote candidate type ${pair.remote.candidateType} (prflx would mean it was learnt from checks, not from signalling)`);
    assert(r.echoed >= 1 && b.echo === 'echo:hello', 'a message round trip over the data channel');

    const record = (await api('GET', `/v1/sessions?robotId=${ROBOT}`)).body?.find((x) => x.connectionId === connectionId);
    assert(record && record.subject === SUBJECT && record.role === 'operator' && record.endedAt === null,
      `an open operator session record: ${JSON.stringify(record)}`);

    results.push(`${label}: ${relayed.length}/${relayed.length} candidates with sdpMid ${[...midModes].join(', ')}, `
      + `sdpMLineIndex ${[...new Set(relayed.map((p) => p.sdpMLineIndex))].join(',')} (offer mids ${mids.join(',')}) accepted; `
      + `ICE ${b.iceStates.join(' > ')} via remote ${pair.remote.candidateType} ${pair.remote.protocol} `
      + `${pair.remote.address}:${pair.remote.port}; data channel open ${b.setupMs.toFixed(1)} ms after the offer`);

    // The browser ends the session; the robot is told and closes its end.
    await page.evaluate((id) => window.sdpmid.browserEnd(id), connectionId);
    await waitFor('the robot told the session ended', async () => (await snapshot()).robot.sessions[connectionId].ended);
    await waitFor('the session record ended', async () => (await api('GET', `/v1/sessions?robotId=${ROBOT}`)).body
      ?.find((x) => x.connectionId === connectionId)?.endedAt);
  }

  // Every server message, and every message the page sent, follows the spec.
  const snap = await snapshot();
  noFailures(snap);
  assert(serverErrors(snap).length === 0, `no signalling.error: ${JSON.stringify(serverErrors(snap))}`);
  const serverMessages = [...snap.robot.received, ...snap.browser.received];
  for (const m of [...serverMessages, ...snap.robot.sent, ...snap.browser.sent]) validate(m);
  log(`${serverMessages.length} server messages and ${snap.robot.sent.length + snap.browser.sent.length} sent messages validate against the spec`);
  await page.evaluate(() => window.sdpmid.close());

  console.log('');
  for (const line of results) console.log(`RESULT Chromium ${chromiumVersion}, ${line}`);
}

// ---------- run, with a watchdog and cleanup ----------

let ok = false;
const watchdog = setTimeout(async () => {
  log(`FAIL: the whole test took over ${WATCHDOG_MS} ms`);
  if (browser) await Promise.race([browser.close().catch(() => {}), new Promise((r) => setTimeout(r, 2000))]);
  await stopChild(server, 1000);
  process.exit(1);
}, WATCHDOG_MS);
try {
  await main();
  ok = true;
} catch (e) {
  log(`FAIL ${e.stack || e}`);
  const logFile = join(work, 'server.log');
  if (existsSync(logFile)) {
    log(`--- ${logFile} (tail) ---`);
    console.log(readFileSync(logFile, 'utf8').split('\n').slice(-30).join('\n'));
  }
} finally {
  if (browser) await browser.close().catch(() => {});
  await stopChild(server);
  clearTimeout(watchdog);
}
if (ok) rmSync(work, { recursive: true, force: true });
else log(`work directory kept: ${work}`);
console.log(`sdpmid: ${ok ? 'passed' : 'FAILED'} in ${((Date.now() - t0) / 1000).toFixed(1)} s`);
process.exit(ok ? 0 : 1);
