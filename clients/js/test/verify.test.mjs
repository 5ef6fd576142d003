// `verifyRobot`: messages signed by a real robot-agent key (test/fixtures/signed-replies.json,
// made by robot-agent's `examples/signed_replies.rs` and checked by its own tests) verify
// with WebCrypto; tampered, unsigned or foreign ones are refused with INVALID_SIGNATURE.
import { test, beforeEach } from 'node:test';
import assert from 'node:assert/strict';
import { readFileSync } from 'node:fs';
import { SignallingClient, SignallingError, robotVerifier } from '../dist/signalling-client.js';
import { FakeSocket, FakePeer, until } from './fakes.mjs';

const fixture = JSON.parse(readFileSync(new URL('./fixtures/signed-replies.json', import.meta.url), 'utf8'));
const [ed, p256] = fixture.robots;
const TOKEN = 'sct_abcDEF123-_';

beforeEach(() => {
  FakeSocket.reset();
  FakePeer.reset();
});

const byType = (robot, type) => robot.messages.find((t) => JSON.parse(t).type === type);

/** Replaces `from` by `to` in a message text, checking it was there. */
function edit(text, from, to) {
  assert.ok(text.includes(from), `${from} in ${text}`);
  return text.replace(from, to);
}

async function refused(verifier, text, reason) {
  await assert.rejects(verifier.verify(text), (e) => {
    assert.ok(e instanceof SignallingError, String(e));
    assert.equal(e.code, 'INVALID_SIGNATURE');
    assert.equal(e.reason, reason, e.message);
    return true;
  });
}

test('the fixture holds both key types', () => {
  assert.deepEqual(fixture.robots.map((r) => r.key.jwk.alg), ['EdDSA', 'ES256']);
});

for (const robot of [ed, p256]) {
  const alg = robot.key.jwk.alg;

  test(`${alg}: every reply the agent signed verifies and comes back parsed`, async () => {
    const verifier = await robotVerifier(robot.key);
    for (const text of robot.messages) {
      assert.deepEqual(await verifier.verify(text), JSON.parse(text));
    }
  });

  test(`${alg}: numbers are checked as the robot wrote them (1.0, -0.0, 1e+21)`, async () => {
    const verifier = await robotVerifier(robot.key);
    const list = byType(robot, 'agent.location.response');
    for (const lexeme of ['"x":1.0', '"roll":-0.0', '"huge":1e+21', '"tiny":1e-7']) assert.ok(list.includes(lexeme), lexeme);
    await verifier.verify(list);
    // What JSON.parse + JSON.stringify would make of it no longer carries the robot's word.
    await refused(verifier, JSON.stringify(JSON.parse(list)), 'bad_signature');
  });

  test(`${alg}: key order and whitespace do not matter`, async () => {
    const verifier = await robotVerifier(robot.key);
    const m = JSON.parse(byType(robot, 'agent.error'));
    const reversed = (v) => Array.isArray(v) ? v.map(reversed)
      : v && typeof v === 'object' ? Object.fromEntries(Object.entries(v).reverse().map(([k, x]) => [k, reversed(x)])) : v;
    await verifier.verify(JSON.stringify(reversed(m), null, 2));
  });

  test(`${alg}: tampered, unsigned or malformed messages are refused`, async () => {
    const verifier = await robotVerifier(robot.key);
    const pong = byType(robot, 'agent.pong');
    const error = byType(robot, 'agent.error');
    await refused(verifier, edit(pong, '"req-ping"', '"req-other"'), 'bad_signature');
    await refused(verifier, edit(error, 'MOVEMENT_FAILED', 'INTERNAL_ERROR'), 'bad_signature');
    await refused(verifier, edit(error, '"meta":{', '"meta":{"injected":true,'), 'bad_signature');
    await refused(verifier, edit(byType(robot, 'agent.capabilities'), '"cameras":[]', '"cameras":[{"name":"x"}]'), 'bad_signature');
    const m = JSON.parse(pong);
    const sig = m.meta.signature;
    const flipped = sig.slice(0, -2) + (sig.at(-2) === 'A' ? 'B' : 'A') + sig.at(-1);
    await refused(verifier, JSON.stringify({ ...m, meta: { signature: flipped } }), 'bad_signature');
    await refused(verifier, JSON.stringify({ ...m, meta: undefined }), 'unsigned');
    await refused(verifier, JSON.stringify({ ...m, meta: { signature: 'a.b.c' } }), 'malformed');
    await refused(verifier, JSON.stringify({ ...m, meta: { signature: 42 } }), 'malformed');
    await refused(verifier, pong.replace('{', '{"id":"dup",'), 'malformed');
    // The error names the message it refused.
    await assert.rejects(verifier.verify(edit(pong, '"agent.pong"', '"agent.error"')), (e) => e.correlationId === 'req-ping');
  });
}

test("another robot's message, or the right robot's under the wrong key, is refused", async () => {
  const [edVerifier, p256Verifier] = await Promise.all([robotVerifier(ed.key), robotVerifier(p256.key)]);
  // Same algorithm, another robot id: an EdDSA signature by robot-ed25519 checked as robot-x.
  const impostor = await robotVerifier({ ...ed.key, robotId: 'robot-x' });
  await refused(impostor, byType(ed, 'agent.pong'), 'wrong_robot');
  await refused(p256Verifier, byType(ed, 'agent.pong'), 'wrong_algorithm');
  await refused(edVerifier, byType(p256, 'agent.pong'), 'wrong_algorithm');
  // The P-256 robot's message under a fresh P-256 key of the same name.
  const pair = await crypto.subtle.generateKey({ name: 'ECDSA', namedCurve: 'P-256' }, true, ['sign', 'verify']);
  const { x, y } = await crypto.subtle.exportKey('jwk', pair.publicKey);
  const other = await robotVerifier({ ...p256.key, jwk: { kty: 'EC', crv: 'P-256', x, y } });
  await refused(other, byType(p256, 'agent.pong'), 'bad_signature');
});

// ---- the session option ----

/** A fetch answering the robot key route with `key` (or `status` without one). */
function keyFetch(key, status = 200) {
  const calls = [];
  const f = async (url, init) => {
    calls.push({ url, init });
    const body = status === 200 ? key : { error: status === 403 ? 'FORBIDDEN' : 'NOT_FOUND', message: 'no' };
    return { status, json: async () => body };
  };
  f.calls = calls;
  return f;
}

async function signedSession(robot, fetch = keyFetch(robot.key)) {
  const pending = SignallingClient.connect({
    url: 'ws://127.0.0.1:9/ws', token: TOKEN, WebSocket: FakeSocket, RTCPeerConnection: FakePeer,
    fetch, initialDelayMs: 5, maxDelayMs: 20, timeoutMs: 500,
  });
  const ws = await until('socket', () => FakeSocket.last());
  ws.welcome('conn-1');
  const client = await pending;
  const opening = client.openSession(robot.key.robotId, { verifyRobot: true });
  const offer = await until('offer', () => ws.sentOf('signalling.offer').at(-1));
  ws.deliver({ type: 'signalling.answer', payload: { connectionId: offer.payload.connectionId, sdp: 'v=0 answer', sdpType: 'answer' } });
  const pc = FakePeer.last();
  await until('remote description', () => pc.remote.length === 1);
  pc.dc.open();
  const s = await opening;
  const seen = [];
  const errors = [];
  s.on('message', (m) => seen.push(m));
  s.on('error', (e) => errors.push(e));
  /** The robot sends this exact text. */
  const send = (text) => pc.dc.onmessage({ data: text });
  return { client, s, pc, seen, errors, send, fetch };
}

for (const robot of [ed, p256]) {
  test(`verifyRobot (${robot.key.jwk.alg}): the key is fetched once with the token; signed messages arrive in order`, async () => {
    const { s, seen, errors, send, fetch } = await signedSession(robot);
    assert.equal(fetch.calls.length, 1);
    assert.equal(fetch.calls[0].url, `http://127.0.0.1:9/v1/robots/${robot.key.robotId}/key`);
    assert.equal(fetch.calls[0].init.headers.authorization, `Bearer ${TOKEN}`);
    for (const text of robot.messages) send(text);
    await until('all delivered', () => seen.length === robot.messages.length);
    assert.deepEqual(seen.map((m) => m.id), robot.messages.map((t) => JSON.parse(t).id));
    assert.deepEqual(errors, []);
    assert.deepEqual(s.capabilities, JSON.parse(byType(robot, 'agent.capabilities')).payload);
    assert.equal(fetch.calls.length, 1, 'fetched once');
  });
}

test('verifyRobot: a signed reply resolves its request; a forged one rejects it with INVALID_SIGNATURE and is not delivered', async () => {
  const { s, pc, seen, errors, send } = await signedSession(ed);
  const pong = byType(ed, 'agent.pong');
  const ok = s.request({ type: 'agent.ping', id: 'req-ping' });
  assert.equal(pc.dc.sentOf('agent.ping')[0].id, 'req-ping');
  send(pong);
  assert.equal((await ok).id, JSON.parse(pong).id);

  const forged = s.request({ type: 'agent.ping', id: 'req-ping' });
  send(edit(pong, '"agent.pong"', '"agent.error"'));
  await assert.rejects(forged, (e) => e instanceof SignallingError && e.code === 'INVALID_SIGNATURE' && e.reason === 'bad_signature');
  assert.equal(errors.length, 1);
  assert.equal(errors[0].code, 'INVALID_SIGNATURE');
  assert.equal(seen.length, 1, 'only the genuine pong was delivered');
});

test('verifyRobot: an unsigned message is refused, and so is one signed by another robot', async () => {
  const { seen, errors, send } = await signedSession(ed);
  send(JSON.stringify({ type: 'agent.error', version: '0.5', id: 'x1', timestamp: new Date().toISOString(), payload: { code: 'INTERNAL_ERROR', message: 'not from the robot' } }));
  send(byType(p256, 'agent.pong'));
  send(byType(ed, 'agent.pong'));
  await until('the genuine one', () => seen.length === 1);
  assert.equal(seen[0].type, 'agent.pong');
  assert.deepEqual(errors.map((e) => [e.code, e.reason]), [['INVALID_SIGNATURE', 'unsigned'], ['INVALID_SIGNATURE', 'wrong_algorithm']]);
});

test('verifyRobot: without access to the key, openSession fails with the server\'s reason', async () => {
  const pending = SignallingClient.connect({
    url: 'ws://127.0.0.1:9/ws', token: TOKEN, WebSocket: FakeSocket, RTCPeerConnection: FakePeer,
    fetch: keyFetch(null, 403), timeoutMs: 500,
  });
  const ws = await until('socket', () => FakeSocket.last());
  ws.welcome('conn-1');
  const client = await pending;
  // Fails as soon as the server said no, without waiting for the robot.
  await assert.rejects(client.openSession('robot-ed25519', { verifyRobot: true }),
    (e) => e instanceof SignallingError && e.code === 'FORBIDDEN');
  assert.equal(FakePeer.last().closed, true);
  assert.equal(ws.sentOf('signalling.disconnected').length, 1, 'the offered session is ended');
});

test('without verifyRobot nothing is fetched and unsigned messages arrive as before', async () => {
  const fetch = keyFetch(ed.key);
  const pending = SignallingClient.connect({ url: 'ws://127.0.0.1:9/ws', token: TOKEN, WebSocket: FakeSocket, RTCPeerConnection: FakePeer, fetch, timeoutMs: 500 });
  const ws = await until('socket', () => FakeSocket.last());
  ws.welcome('conn-1');
  const client = await pending;
  const opening = client.openSession('robot-ed25519');
  const offer = await until('offer', () => ws.sentOf('signalling.offer').at(-1));
  ws.deliver({ type: 'signalling.answer', payload: { connectionId: offer.payload.connectionId, sdp: 'v=0 answer', sdpType: 'answer' } });
  await until('remote description', () => FakePeer.last().remote.length === 1);
  FakePeer.last().dc.open();
  const s = await opening;
  const seen = [];
  s.on('message', (m) => seen.push(m));
  FakePeer.last().dc.deliver({ type: 'agent.pong', correlationId: 'x' });
  assert.equal(seen.length, 1);
  assert.equal(fetch.calls.length, 0);
});
