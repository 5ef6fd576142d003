// `verifyRobot` on ARP sessions: the program opens the gateway with `?signed=<nonce>`, and
// every frame the robot sends carries a top-level `signature`, a detached JWS over the frame
// without it (canonical JSON) with header {alg, kid: robotId, nonce}. The test plays the
// gateway and the robot and signs frames itself with node:crypto (an implementation
// independent of the SDK's), then checks what is delivered and what is refused.
import { test, beforeEach } from 'node:test';
import assert from 'node:assert/strict';
import { generateKeyPairSync, sign as cryptoSign } from 'node:crypto';
import { readFileSync } from 'node:fs';
import { SignallingClient, SignallingError, ArpSession, ArpError, robotVerifier } from '../dist/signalling-client.js';
import { FakeSocket, FakeArpSocket, until } from './fakes.mjs';

const TOKEN = 'sct_abcDEF123-_';
const ROBOT = 'robot-1';
const URL_ = `ws://127.0.0.1:9/v1/robots/${ROBOT}/arp`;

beforeEach(() => {
  FakeSocket.reset();
  FakeArpSocket.reset();
});

// ---- the robot's side: keys and signing ----

function robot(kind) {
  const { publicKey, privateKey } = kind === 'ed25519' ? generateKeyPairSync('ed25519') : generateKeyPairSync('ec', { namedCurve: 'P-256' });
  const jwk = publicKey.export({ format: 'jwk' });
  const alg = kind === 'ed25519' ? 'EdDSA' : 'ES256';
  return { alg, privateKey, key: { robotId: ROBOT, credential: kind === 'ed25519' ? 'ed25519' : 'ecdsa-p256', jwk: { ...jwk, alg } } };
}

const ED = robot('ed25519');
const P256 = robot('p256');

/** A number written exactly as `text` (as the robot's serde_json would write it). */
class Raw {
  constructor(text) { this.text = text; }
}

/** JSON text of `v` with `Raw` numbers as written; `sorted`: canonical (keys sorted, no whitespace). */
function json(v, sorted) {
  if (v instanceof Raw) return v.text;
  if (Array.isArray(v)) return `[${v.map((x) => json(x, sorted)).join(',')}]`;
  if (v && typeof v === 'object') {
    let keys = Object.keys(v).filter((k) => v[k] !== undefined);
    if (sorted) keys = keys.sort((a, b) => (Buffer.from(a, 'utf8').compare(Buffer.from(b, 'utf8'))));
    return `{${keys.map((k) => `${JSON.stringify(k)}:${json(v[k], sorted)}`).join(',')}}`;
  }
  return JSON.stringify(v);
}

const b64url = (bytes) => Buffer.from(bytes).toString('base64url');

/**
 * The detached JWS of `frame` as the robot makes it. `header` overrides fields of the
 * header; `as` signs with another robot's private key.
 */
function signature(frame, nonce, { who = ED, header = {}, as } = {}) {
  const h = b64url(json({ alg: who.alg, kid: ROBOT, nonce, ...header }, true));
  const input = Buffer.from(`${h}.${b64url(json(frame, true))}`);
  const signer = as ?? who;
  const sig = signer.alg === 'EdDSA'
    ? cryptoSign(null, input, signer.privateKey)
    : cryptoSign('sha256', input, { key: signer.privateKey, dsaEncoding: 'ieee-p1363' });
  return `${h}..${b64url(sig)}`;
}

/** The frame's text with its signature, keys in the frame's own (not canonical) order. */
function signedText(frame, nonce, opts) {
  return json({ signature: signature(frame, nonce, opts), ...frame }, false);
}

/** The gateway socket, with the robot signing what it sends for this connection's nonce. */
function robotSide(gw, who = ED) {
  const nonce = new URL(gw.url).searchParams.get('signed');
  const raw = (text) => gw.onmessage?.({ data: text });
  const send = (frame, opts = {}) => raw(signedText(frame, opts.nonce ?? nonce, { who, ...opts }));
  return {
    nonce,
    raw,
    send,
    answer: (req, result, opts) => send({ jsonrpc: '2.0', id: req.id, result }, opts),
    fail: (req, error, opts) => send({ jsonrpc: '2.0', id: req.id, error }, opts),
    notify: (method, params, opts) => send({ jsonrpc: '2.0', method, params }, opts),
    /** The gateway's own (unsigned) error. */
    gatewayError: (req, code, message, data) => raw(JSON.stringify({ jsonrpc: '2.0', id: req?.id ?? null, error: { code, message, data } })),
  };
}

const INIT_RESULT = {
  protocolVersion: '0.1.0',
  serverInfo: { name: 'robot-agent', version: '0.1.0', robotType: 'mobile_base' },
  capabilities: { tools: true, context: true, constraints: true, planning: false, confirmation: true },
};

/** A fetch serving the robot key route (`status` other than 200: refused) and recording calls. */
function keyFetch(key, status = 200) {
  const calls = [];
  const f = async (url, init) => {
    calls.push({ url, init });
    if (url.endsWith('/key')) {
      const body = status === 200 ? key : { error: status === 403 ? 'FORBIDDEN' : 'NOT_FOUND', message: 'no key for you' };
      return { status, json: async () => body };
    }
    return { status: 200, json: async () => [] };
  };
  f.calls = calls;
  return f;
}

/** A session opened with verifyRobot and initialized by a signed answer. */
async function signedSession(who = ED, extra = {}) {
  const fetch = keyFetch(who.key);
  const pending = ArpSession.connect({ url: URL_, token: TOKEN, WebSocket: FakeArpSocket, fetch, timeoutMs: 500, verifyRobot: true, ...extra });
  const gw = await until('socket', () => FakeArpSocket.last());
  const r = robotSide(gw, who);
  r.answer(await gw.next('arp.initialize'), INIT_RESULT);
  const s = await pending;
  const errors = [];
  s.on('error', (e) => errors.push(e));
  return { s, gw, r, errors, fetch };
}

/** `p` rejects with the SDK's refusal of a frame whose check failed for `why`. */
async function refusedWith(p, why) {
  await assert.rejects(p, (e) => {
    assert.ok(e instanceof ArpError, String(e));
    assert.equal(e.reason, 'invalid_signature', e.message);
    assert.equal(e.data.signatureReason, why, e.message);
    assert.equal(e.signedByRobot, undefined);
    return true;
  });
}

// ---- delivered ----

for (const who of [ED, P256]) {
  test(`${who.alg}: the socket opens with ?signed=<fresh nonce>, the key is fetched with the token, signed frames are delivered`, async () => {
    const { s, gw, r, errors, fetch } = await signedSession(who);
    assert.match(r.nonce, /^[A-Za-z0-9_-]{22}$/);
    assert.equal(gw.url, `${URL_}?signed=${r.nonce}`);
    assert.equal(s.nonce, r.nonce);
    assert.equal(s.url, URL_);
    assert.deepEqual(gw.protocols, [`bearer.${TOKEN}`]);
    assert.deepEqual(fetch.calls.map((c) => [c.url, c.init.headers.authorization]), [[`http://127.0.0.1:9/v1/robots/${ROBOT}/key`, `Bearer ${TOKEN}`]]);
    assert.deepEqual(s.server, INIT_RESULT);

    const progress = [];
    const contexts = [];
    s.on('context', (u) => contexts.push(u.data));
    const call = s.callTool('drive', { linear: 0.2 }, { onProgress: (p) => progress.push(p.progress) });
    const req = await gw.next('arp.callTool');
    r.notify('arp.toolProgress', { callId: 'call_1', progress: 0, message: 'accepted', state: 'running' });
    r.notify('arp.toolProgress', { callId: 'call_1', progress: new Raw('0.5'), message: 'fährt', state: 'running' });
    r.notify('arp.contextUpdate', { name: 'odometry', timestamp: '2026-11-28T00:00:00Z', data: { x: new Raw('1.0'), tiny: new Raw('1e-7') } });
    r.answer(req, {
      callId: 'call_1', state: 'completed',
      result: { distance: new Raw('1.0'), tiny: new Raw('1e-7'), big: new Raw('1e+21'), neg: new Raw('-0.0'), label: 'Küche → 🚀 "quoted"\n', list: [new Raw('2.50'), null, true] },
    });
    assert.deepEqual(await call, {
      callId: 'call_1', state: 'completed',
      result: { distance: 1, tiny: 1e-7, big: 1e21, neg: -0, label: 'Küche → 🚀 "quoted"\n', list: [2.5, null, true] },
    });
    assert.deepEqual(progress, [0, 0.5], 'progress before the result, in order');
    assert.deepEqual(contexts, [{ x: 1, tiny: 1e-7 }]);
    assert.deepEqual(errors, []);
  });
}

test('each connection has its own nonce; an answer signed for one is refused on the other', async () => {
  const a = await signedSession();
  const b = await signedSession();
  assert.notEqual(a.r.nonce, b.r.nonce);
  assert.match(b.r.nonce, /^[A-Za-z0-9_-]{22}$/);
  // The same request id on both: the robot's genuine answer on A, replayed to B.
  const onA = a.s.listTools();
  const onB = b.s.listTools();
  const [reqA, reqB] = [await a.gw.next('arp.listTools'), await b.gw.next('arp.listTools')];
  assert.equal(reqA.id, reqB.id);
  const genuine = signedText({ jsonrpc: '2.0', id: reqA.id, result: { tools: [] } }, a.r.nonce);
  a.r.raw(genuine);
  b.r.raw(genuine);
  await Promise.all([onA.then((v) => assert.deepEqual(v, [])), refusedWith(onB, 'wrong_nonce')]);
  assert.deepEqual(b.errors.map((e) => e.data.signatureReason), ['wrong_nonce']);
});

test('a signed confirmation request reaches onConfirmation; an unsigned one is not answered', async () => {
  const asked = [];
  const { gw, r, errors } = await signedSession(ED, { onConfirmation: (q) => { asked.push(q.action); return { confirmed: true }; }, subject: 'planner' });
  const params = { action: 'navigate to dock', safetyLevel: 'elevated', details: { tool: 'navigate_to', arguments: {} }, timeout: 30 };
  r.raw(JSON.stringify({ jsonrpc: '2.0', id: 'c-0', method: 'arp.requestConfirmation', params: { ...params, action: 'forged' } }));
  r.send({ jsonrpc: '2.0', id: 'c-1', method: 'arp.requestConfirmation', params });
  const answer = await until('answer', () => gw.sent.find((m) => m.id === 'c-1'));
  assert.equal(answer.result.confirmed, true);
  assert.deepEqual(asked, ['navigate to dock']);
  assert.equal(gw.sent.find((m) => m.id === 'c-0'), undefined);
  assert.deepEqual(errors.map((e) => [e.reason, e.data.signatureReason, e.data.method, e.data.id]), [['invalid_signature', 'unsigned', 'arp.requestConfirmation', 'c-0']]);
});

test('connectArp(robotId, {verifyRobot}) uses client.robotKey and the client token', async () => {
  const fetch = keyFetch(P256.key);
  const pending = SignallingClient.connect({ url: 'ws://127.0.0.1:9/ws', token: TOKEN, WebSocket: FakeSocket, fetch });
  (await until('socket', () => FakeSocket.last())).welcome();
  const client = await pending;
  const arp = client.connectArp(ROBOT, { WebSocket: FakeArpSocket, verifyRobot: true });
  const gw = await until('arp socket', () => FakeArpSocket.last());
  const r = robotSide(gw, P256);
  assert.equal(gw.url, `ws://127.0.0.1:9/v1/robots/${ROBOT}/arp?signed=${r.nonce}`);
  r.answer(await gw.next('arp.initialize'), INIT_RESULT);
  const s = await arp;
  assert.equal(s.state, 'open');
  assert.equal(s.robotId, ROBOT);
  assert.deepEqual(fetch.calls.map((c) => c.url), [`http://127.0.0.1:9/v1/robots/${ROBOT}/key`]);
});

test('a token that is no subprotocol token follows the nonce in the query', async () => {
  const pending = ArpSession.connect({ url: URL_, token: 'a b', WebSocket: FakeArpSocket, fetch: keyFetch(ED.key), verifyRobot: true, initialize: false });
  const gw = await until('socket', () => FakeArpSocket.last());
  const s = await pending;
  assert.equal(gw.url, `${URL_}?signed=${s.nonce}&token=a%20b`);
  assert.equal(gw.protocols, undefined);
});

// ---- refused ----

for (const [what, why, forge] of [
  ['a tampered result', 'bad_signature', (r, req) => r.raw(signedText({ jsonrpc: '2.0', id: req.id, result: { tools: [] } }, r.nonce).replace('"tools":[]', '"tools":[{"name":"x"}]'))],
  ['an unsigned result', 'unsigned', (r, req) => r.raw(JSON.stringify({ jsonrpc: '2.0', id: req.id, result: { tools: [] } }))],
  ['a result signed for another nonce', 'wrong_nonce', (r, req) => r.answer(req, { tools: [] }, { nonce: 'AAAAAAAAAAAAAAAAAAAAAA' })],
  ['a result with no nonce in its header', 'wrong_nonce', (r, req) => r.answer(req, { tools: [] }, { header: { nonce: undefined } })],
  ['a result signed as another robot', 'wrong_robot', (r, req) => r.answer(req, { tools: [] }, { header: { kid: 'robot-2' } })],
  ['a result whose header says ES256 for the Ed25519 key (signed by a P-256 key)', 'wrong_algorithm', (r, req) => r.answer(req, { tools: [] }, { header: { alg: 'ES256' }, as: P256 })],
  ['a result signed by another key', 'bad_signature', (r, req) => r.answer(req, { tools: [] }, { as: robot('ed25519') })],
  ['a signature over another frame', 'bad_signature', (r, req) => r.raw(json({ jsonrpc: '2.0', id: req.id, result: { tools: [] }, signature: signature({ jsonrpc: '2.0', id: req.id, result: { tools: [{ name: 'x' }] } }, r.nonce) }, false))],
  ['a result whose numbers were rewritten (1.0 as 1)', 'bad_signature', (r, req) => r.raw(JSON.stringify(JSON.parse(signedText({ jsonrpc: '2.0', id: req.id, result: { tools: [], v: new Raw('1.0') } }, r.nonce))))],
  ['an error frame with a bogus signature', 'malformed', (r, req) => r.raw(JSON.stringify({ jsonrpc: '2.0', id: req.id, error: { code: -32603, message: 'x' }, signature: 'a.b.c' }))],
  ['an unsigned error frame with more than the gateway sends', 'unsigned', (r, req) => r.raw(JSON.stringify({ jsonrpc: '2.0', id: req.id, error: { code: -32603, message: 'x' }, result: { tools: [] } }))],
]) {
  test(`refused: ${what} (${why}); the call rejects, an error is emitted, a late genuine answer changes nothing`, async () => {
    const { s, gw, r, errors } = await signedSession();
    const tools = s.listTools();
    const req = await gw.next('arp.listTools');
    let settled = null;
    tools.then((v) => { settled = ['resolved', v]; }, (e) => { settled = ['rejected', e]; });
    forge(r, req);
    await refusedWith(tools, why);
    assert.equal(settled[0], 'rejected');
    assert.deepEqual(errors.map((e) => [e.reason, e.data.signatureReason, e.data.id]), [['invalid_signature', why, req.id]]);
    assert.equal(errors[0].data.robotId, ROBOT);
    // The robot's genuine answer afterwards has nothing left to resolve.
    r.answer(req, { tools: [{ name: 'late' }] });
    await new Promise((done) => setTimeout(done, 20));
    assert.equal(errors.length, 1);
    assert.equal(s.state, 'open');
  });
}

test('refused notifications are not delivered; the signed ones around them are, in order', async () => {
  const { s, gw, r, errors } = await signedSession(P256);
  const progress = [];
  const notes = [];
  s.on('notification', (m, p) => notes.push([m, p.progress ?? p.name]));
  const call = s.callTool('drive', {}, { onProgress: (p) => progress.push(p.progress) });
  const req = await gw.next('arp.callTool');
  r.notify('arp.toolProgress', { callId: 'c', progress: 0.1, message: '', state: 'running' });
  r.raw(JSON.stringify({ jsonrpc: '2.0', method: 'arp.toolProgress', params: { callId: 'c', progress: 0.9, message: 'forged', state: 'running' } }));
  r.notify('arp.toolProgress', { callId: 'c', progress: 0.2, message: '', state: 'running' }, { header: { kid: 'robot-2' } });
  r.notify('arp.contextUpdate', { name: 'forged', timestamp: 't', data: {} }, { nonce: 'BBBBBBBBBBBBBBBBBBBBBB' });
  r.notify('arp.toolProgress', { callId: 'c', progress: 0.3, message: '', state: 'running' });
  r.answer(req, { callId: 'c', state: 'completed' });
  assert.equal((await call).state, 'completed');
  assert.deepEqual(progress, [0.1, 0.3]);
  assert.deepEqual(notes, [['arp.toolProgress', 0.1], ['arp.toolProgress', 0.3]]);
  assert.deepEqual(errors.map((e) => [e.data.signatureReason, e.data.method]), [['unsigned', 'arp.toolProgress'], ['wrong_robot', 'arp.toolProgress'], ['wrong_nonce', 'arp.contextUpdate']]);
});

// ---- the gateway's own errors ----

test("the gateway's unsigned refusal of initialize rejects connect, marked as not the robot's", async () => {
  const pending = ArpSession.connect({ url: URL_, token: TOKEN, WebSocket: FakeArpSocket, fetch: keyFetch(ED.key), verifyRobot: true });
  const gw = await until('socket', () => FakeArpSocket.last());
  robotSide(gw).gatewayError(await gw.next('arp.initialize'), -40004, 'robot-1 is driven by another operator', { reason: 'robot_busy', lockedBy: 'alice' });
  await assert.rejects(pending, (e) => e instanceof ArpError && e.code === -40004 && e.reason === 'robot_busy' && e.data.lockedBy === 'alice' && e.signedByRobot === false);
  assert.equal(gw.closedWith, 1000);
});

test('errors: the robot-signed one says so, the gateway ones (answer or id-less) say not; a session end arrives before the close', async () => {
  const { s, gw, r, errors } = await signedSession();
  const failed = s.callTool('navigate_to', { location: 'dock' });
  r.fail(await gw.next('arp.callTool'), { code: -40007, message: 'emergency stop latched', data: { callId: 'call_3', state: 'failed' } });
  await assert.rejects(failed, (e) => e instanceof ArpError && e.code === -40007 && e.callId === 'call_3' && e.signedByRobot === true);

  const forbidden = s.callTool('drive');
  r.gatewayError(await gw.next('arp.callTool'), -40001, 'a viewer may not call arp.callTool', { reason: 'forbidden', role: 'viewer' });
  await assert.rejects(forbidden, (e) => e.reason === 'forbidden' && e.signedByRobot === false);

  r.gatewayError(null, -40001, 'frames dropped', { reason: 'rate_limited' });
  await until('error event', () => errors.length === 1);
  assert.deepEqual([errors[0].reason, errors[0].signedByRobot], ['rate_limited', false]);

  // The gateway's session_ended error and its close, back to back: the error still wins.
  const pending = s.callTool('drive');
  r.gatewayError(await gw.next('arp.callTool'), -32603, 'the session ended before the robot answered', { reason: 'session_ended', cause: 'grant_revoked' });
  gw.end(1000, 'session ended: grant_revoked');
  await assert.rejects(pending, (e) => e.reason === 'session_ended' && e.signedByRobot === false);
  await until('closed', () => s.state === 'closed');
});

test('a signed answer followed at once by the close still resolves', async () => {
  const { s, gw, r } = await signedSession();
  const tools = s.listTools();
  r.answer(await gw.next('arp.listTools'), { tools: [{ name: 'drive' }] });
  gw.end(1000, 'bye');
  assert.deepEqual((await tools).map((t) => t.name), ['drive']);
  await until('closed', () => s.state === 'closed');
  assert.equal(s.closeReason, 'bye');
});

// ---- the key ----

for (const [what, fetch, cause] of [
  ['no grant on the robot', keyFetch(null, 403), 'FORBIDDEN'],
  ['no key enrolled', keyFetch(null, 404), 'NOT_FOUND'],
  ['a key WebCrypto cannot use', keyFetch({ robotId: ROBOT, credential: 'rsa', jwk: { kty: 'RSA', crv: '', x: '' } }), 'NOT_SUPPORTED'],
]) {
  test(`without a usable key (${what}), connect rejects with not_supported and initializes nothing`, async () => {
    const pending = ArpSession.connect({ url: URL_, token: TOKEN, WebSocket: FakeArpSocket, fetch, verifyRobot: true });
    await assert.rejects(pending, (e) => e instanceof ArpError && e.reason === 'not_supported' && e.data.cause === cause && /verifyRobot/.test(e.message));
    const gw = FakeArpSocket.last();
    assert.equal(gw.readyState, 3);
    assert.equal(gw.requests('arp.initialize').length, 0);
  });
}

test('connectArp with verifyRobot and no grant on the key rejects with the cause', async () => {
  const pending = SignallingClient.connect({ url: 'ws://127.0.0.1:9/ws', token: TOKEN, WebSocket: FakeSocket, fetch: keyFetch(null, 403) });
  (await until('socket', () => FakeSocket.last())).welcome();
  const client = await pending;
  await assert.rejects(client.connectArp(ROBOT, { WebSocket: FakeArpSocket, verifyRobot: true }),
    (e) => e instanceof ArpError && e.reason === 'not_supported' && e.data.cause === 'FORBIDDEN' && e.data.status === 403);
});

test('a key given as robotKey is used without fetching', async () => {
  const fetch = keyFetch(null, 404);
  const pending = ArpSession.connect({ url: URL_, token: TOKEN, WebSocket: FakeArpSocket, fetch, verifyRobot: true, robotKey: ED.key });
  const gw = await until('socket', () => FakeArpSocket.last());
  robotSide(gw).answer(await gw.next('arp.initialize'), INIT_RESULT);
  await pending;
  assert.equal(fetch.calls.length, 0);
});

// ---- without verifyRobot ----

test('without verifyRobot: no signed parameter, no key fetched, unsigned frames delivered', async () => {
  const fetch = keyFetch(ED.key);
  const pending = ArpSession.connect({ url: URL_, token: TOKEN, WebSocket: FakeArpSocket, fetch });
  const gw = await until('socket', () => FakeArpSocket.last());
  assert.equal(gw.url, URL_);
  await gw.initialized();
  const s = await pending;
  assert.equal(s.nonce, null);
  const tools = s.listTools();
  gw.answer(await gw.next('arp.listTools'), { tools: [] });
  assert.deepEqual(await tools, []);
  const refused = s.getConstraint('x');
  gw.fail(await gw.next('arp.getConstraint'), -40008, 'no such constraint');
  await assert.rejects(refused, (e) => e.code === -40008 && e.signedByRobot === undefined);
  assert.equal(fetch.calls.length, 0);

  const client = SignallingClient.connect({ url: 'ws://127.0.0.1:9/ws', token: TOKEN, WebSocket: FakeSocket, fetch });
  (await until('socket', () => FakeSocket.last())).welcome();
  const arp = (await client).connectArp(ROBOT, { WebSocket: FakeArpSocket });
  const gw2 = await until('second arp socket', () => FakeArpSocket.instances[1]);
  assert.equal(gw2.url, URL_);
  await gw2.initialized();
  await arp;
  assert.equal(fetch.calls.length, 0);
});

// ---- verifyArpFrame on its own ----

test('robotVerifier(key).verifyArpFrame checks one frame text for a nonce', async () => {
  const nonce = 'n0nce-of-this_connection';
  for (const who of [ED, P256]) {
    const verifier = await robotVerifier(who.key);
    const frame = { jsonrpc: '2.0', id: 7, result: { x: new Raw('1.0'), s: 'ünï' } };
    const text = signedText(frame, nonce, { who });
    assert.deepEqual(await verifier.verifyArpFrame(text, nonce), JSON.parse(text));
    // Key order and whitespace do not matter; the numbers' text does.
    const spaced = text.replace('{', '{ ').replace(/,/g, ' ,\n ');
    await verifier.verifyArpFrame(spaced, nonce);
    const refuse = async (t, n, reason, id = 7) => assert.rejects(verifier.verifyArpFrame(t, n),
      (e) => e instanceof SignallingError && e.code === 'INVALID_SIGNATURE' && e.reason === reason && e.details.id === (id ?? undefined));
    await refuse(text, 'another-nonce-entirely', 'wrong_nonce');
    await refuse(text.replace('"x":1.0', '"x":1'), nonce, 'bad_signature');
    await refuse(JSON.stringify({ ...JSON.parse(text), signature: undefined }), nonce, 'unsigned');
    await refuse(text.replace('{', '{"id":8,'), nonce, 'malformed', null); // a duplicate key
    await assert.rejects(verifier.verifyArpFrame(text, ''), (e) => e.code === 'BAD_REQUEST');
  }
});

// Frames signed by the real robot-agent, when the fixture has them (robots[i].arp).
const fixture = JSON.parse(readFileSync(new URL('./fixtures/signed-replies.json', import.meta.url), 'utf8'));
const withArp = fixture.robots.filter((r) => r.arp);
test('robot-agent\'s signed ARP frames verify (fixture)', { skip: withArp.length === 0 && 'the fixture has no ARP frames yet' }, async () => {
  for (const r of withArp) {
    const verifier = await robotVerifier(r.key);
    for (const text of r.arp.frames) assert.deepEqual(await verifier.verifyArpFrame(text, r.arp.nonce), JSON.parse(text));
    await assert.rejects(verifier.verifyArpFrame(r.arp.frames[0], 'A'.repeat(22)), (e) => e.reason === 'wrong_nonce');
  }
});
