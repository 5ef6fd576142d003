// Unit tests of the built SDK (dist/) with a fake socket and a fake peer connection: the
// test plays the server and the robot and asserts on what the SDK sends and resolves.
import { test, beforeEach } from 'node:test';
import assert from 'node:assert/strict';
import { SignallingClient, SignallingError, backoffDelay, httpBase } from '../dist/signalling-client.js';
import { FakeSocket, FakePeer, fakeFetch, until } from './fakes.mjs';

beforeEach(() => {
  FakeSocket.reset();
  FakePeer.reset();
});

const TOKEN = 'sct_abcDEF123-_';

function options(extra = {}) {
  return {
    url: 'ws://127.0.0.1:9/ws', token: TOKEN, WebSocket: FakeSocket, RTCPeerConnection: FakePeer,
    fetch: fakeFetch(200), initialDelayMs: 5, maxDelayMs: 20, timeoutMs: 500, ...extra,
  };
}

async function connected(extra) {
  const pending = SignallingClient.connect(options(extra));
  const ws = await until('socket', () => FakeSocket.last());
  ws.welcome('conn-1');
  return { client: await pending, ws };
}

/** Opens a session: answers the offer, opens the data channel. */
async function session(client, ws, robot = 'robot-1', opts = {}) {
  const pending = client.openSession(robot, opts);
  const offer = await until('offer', () => ws.sentOf('signalling.offer').at(-1));
  ws.deliver({ type: 'signalling.answer', payload: { connectionId: offer.payload.connectionId, sdp: 'v=0 answer', sdpType: 'answer' } });
  const pc = FakePeer.last();
  await until('remote description', () => pc.remote.length === 1);
  pc.dc.open();
  return { s: await pending, pc, offer };
}

test('connect resolves on the welcome and sends the token as a bearer subprotocol', async () => {
  const { client, ws } = await connected();
  assert.equal(client.state, 'open');
  assert.equal(client.connectionId, 'conn-1');
  assert.deepEqual(ws.protocols, [`bearer.${TOKEN}`]);
  assert.equal(ws.url, 'ws://127.0.0.1:9/ws');
  assert.deepEqual(client.iceServers, [{ urls: ['stun:127.0.0.1:3478'] }]);
});

test('a token that is no subprotocol token goes in the query', async () => {
  const pending = SignallingClient.connect(options({ token: 'a b/c' }));
  const ws = await until('socket', () => FakeSocket.last());
  assert.equal(ws.url, 'ws://127.0.0.1:9/ws?token=a%20b%2Fc');
  assert.equal(ws.protocols, undefined);
  ws.welcome();
  await pending;
});

test('several URLs are tried in turn', async () => {
  const pending = SignallingClient.connect(options({ url: ['ws://a.invalid/ws', 'ws://b.invalid/ws'] }));
  const first = await until('first socket', () => FakeSocket.instances[0]);
  assert.equal(first.url, 'ws://a.invalid/ws');
  first.drop(1006);
  const second = await until('second socket', () => FakeSocket.instances[1]);
  assert.equal(second.url, 'ws://b.invalid/ws');
  second.welcome();
  const client = await pending;
  assert.equal(client.url, 'ws://b.invalid/ws');
});

test('a refused token fails with UNAUTHORIZED and tries no other URL', async () => {
  const fetch = fakeFetch(401);
  const pending = SignallingClient.connect(options({ url: ['ws://a.invalid:1/ws', 'ws://b.invalid/ws'], fetch }));
  (await until('socket', () => FakeSocket.last())).drop(1006);
  await assert.rejects(pending, (e) => e instanceof SignallingError && e.code === 'UNAUTHORIZED');
  assert.equal(FakeSocket.instances.length, 1);
  assert.equal(fetch.calls[0].url, 'http://a.invalid:1/v1/me');
  assert.equal(fetch.calls[0].init.headers.authorization, `Bearer ${TOKEN}`);
});

test('openSession sends a spec offer and resolves when the data channel opens', async () => {
  const { client, ws } = await connected();
  const { s, pc, offer } = await session(client, ws, 'robot-1', { video: true });
  assert.equal(offer.version, '0.5');
  assert.equal(offer.payload.robotId, 'robot-1');
  assert.equal(offer.payload.sdpType, 'offer');
  assert.equal(offer.payload.sdp, 'v=0 fake offer 1');
  assert.equal(offer.payload.connectionId, s.id);
  assert.deepEqual(pc.transceivers, [{ kind: 'video', direction: 'recvonly' }]);
  assert.equal(pc.dc.label, 'control');
  assert.equal(s.state, 'open');
  assert.deepEqual(pc.config.iceServers, [{ urls: ['stun:127.0.0.1:3478'] }]);
});

test('no video transceiver unless asked', async () => {
  const { client, ws } = await connected();
  const { pc } = await session(client, ws);
  assert.deepEqual(pc.transceivers, []);
});

test('ICE candidates flow both ways, remote ones held until the answer is set', async () => {
  const { client, ws } = await connected();
  const pending = client.openSession('robot-1');
  const offer = await until('offer', () => ws.sentOf('signalling.offer')[0]);
  const id = offer.payload.connectionId;
  const pc = FakePeer.last();
  ws.deliver({ type: 'signalling.ice_candidate', payload: { connectionId: id, candidate: 'candidate:1 1 udp 1 127.0.0.1 5000 typ host', sdpMid: '0', sdpMLineIndex: 0 } });
  assert.equal(pc.candidates.length, 0);
  ws.deliver({ type: 'signalling.answer', payload: { connectionId: id, sdp: 'v=0 answer', sdpType: 'answer' } });
  await until('candidate added', () => pc.candidates.length === 1);
  pc.onicecandidate({ candidate: { candidate: 'candidate:2 1 udp 1 127.0.0.1 6000 typ host', sdpMid: '0', sdpMLineIndex: 0 } });
  const sent = ws.sentOf('signalling.ice_candidate')[0];
  assert.deepEqual(sent.payload, { connectionId: id, candidate: 'candidate:2 1 udp 1 127.0.0.1 6000 typ host', sdpMid: '0', sdpMLineIndex: 0 });
  pc.dc.open();
  await pending;
});

for (const [code, reason] of [['FORBIDDEN', 'no_grant'], ['FORBIDDEN', 'robot_busy'], ['CONNECTION_FAILED', 'robot_offline']]) {
  test(`a refused offer rejects with ${code}/${reason}`, async () => {
    const { client, ws } = await connected();
    const pending = client.openSession('robot-1');
    const offer = await until('offer', () => ws.sentOf('signalling.offer')[0]);
    ws.deliver({ type: 'signalling.error', correlationId: offer.id, payload: { code, message: 'refused', details: { reason } } });
    await assert.rejects(pending, (e) => e instanceof SignallingError && e.code === code && e.reason === reason);
    assert.equal(FakePeer.last().closed, true);
    assert.equal(ws.sentOf('signalling.disconnected').length, 0, 'no session to end');
  });
}

test('openSession times out when the robot never answers', async () => {
  const { client } = await connected({ timeoutMs: 30 });
  await assert.rejects(client.openSession('robot-1'), (e) => e.code === 'TIMEOUT');
});

test('request resolves with the reply correlated by id; agent.error rejects', async () => {
  const { client, ws } = await connected();
  const { s, pc } = await session(client, ws);
  const reply = s.request({ type: 'agent.ping' });
  const ping = pc.dc.sentOf('agent.ping')[0];
  pc.dc.deliver({ type: 'agent.pong', correlationId: 'someone-else' });
  pc.dc.deliver({ type: 'agent.pong', correlationId: ping.id });
  const pong = await reply;
  assert.equal(pong.correlationId, ping.id);

  const refused = s.request({ type: 'agent.movement', payload: { forward: 1, turn: 0 } });
  const move = pc.dc.sentOf('agent.movement')[0];
  pc.dc.deliver({ type: 'agent.error', correlationId: move.id, payload: { code: 'MOVEMENT_FAILED', message: 'no', details: { reason: 'forbidden' } } });
  await assert.rejects(refused, (e) => e.code === 'MOVEMENT_FAILED' && e.reason === 'forbidden');
});

test('messages and capabilities from the robot reach listeners', async () => {
  const { client, ws } = await connected();
  const { s, pc } = await session(client, ws);
  const seen = [];
  s.on('message', (m) => seen.push(m.type));
  pc.dc.deliver({ type: 'agent.capabilities', payload: { versions: ['0.5'] } });
  assert.deepEqual(seen, ['agent.capabilities']);
  assert.deepEqual(s.capabilities, { versions: ['0.5'] });
});

test('move clamps, stop sends zero, emergencyStop stops, cancels and latches', async () => {
  const { client, ws } = await connected();
  const { s, pc } = await session(client, ws);
  s.move({ forward: 3, turn: -0.25 });
  s.move({ forward: NaN, turn: 0 });
  s.stop();
  assert.deepEqual(pc.dc.sentOf('agent.movement').map((m) => m.payload),
    [{ forward: 1, turn: -0.25 }, { forward: 0, turn: 0 }, { forward: 0, turn: 0 }]);
  s.emergencyStop();
  assert.deepEqual(pc.dc.sent.slice(-2).map((m) => [m.type, m.payload]),
    [['agent.movement', { forward: 0, turn: 0 }], ['agent.navigation.cancel', {}]]);
  assert.equal(s.move({ forward: 0.5, turn: 0 }), null);
  assert.equal(s.emergencyStopped, true);
  await s.resetEmergencyStop();
  assert.ok(s.move({ forward: 0.5, turn: 0 }));
});

test('the server ending the session closes it with the reason', async () => {
  const { client, ws } = await connected();
  const { s, pc } = await session(client, ws);
  const states = [];
  s.on('state', (st, reason) => states.push([st, reason]));
  ws.deliver({ type: 'signalling.disconnected', payload: { connectionId: s.id, reason: 'closed', details: { reason: 'grant_revoked' } } });
  assert.deepEqual(states, [['closed', 'grant_revoked']]);
  assert.equal(pc.closed, true);
  assert.equal(ws.sentOf('signalling.disconnected').length, 0, 'the server already knows');
});

test('close tells the server and closes the peer connection', async () => {
  const { client, ws } = await connected();
  const { s, pc } = await session(client, ws);
  await s.close();
  const d = ws.sentOf('signalling.disconnected')[0];
  assert.deepEqual(d.payload, { connectionId: s.id, reason: 'closed' });
  assert.equal(pc.closed, true);
  assert.throws(() => s.move({ forward: 0, turn: 0 }), (e) => e.code === 'CLOSED');
});

test('the socket reconnects with backoff and the session keeps its peer connection', async () => {
  const { client, ws } = await connected();
  const { s, pc } = await session(client, ws);
  const states = [];
  client.on('state', (st) => states.push(st));
  ws.drop(1006);
  assert.equal(client.state, 'reconnecting');
  const again = await until('new socket', () => FakeSocket.instances.length === 2 && FakeSocket.instances[1]);
  again.welcome('conn-2');
  await until('open again', () => client.state === 'open');
  assert.deepEqual(states, ['reconnecting', 'open']);
  assert.equal(client.connectionId, 'conn-2');
  assert.equal(s.state, 'open');
  assert.equal(pc.closed, false);
  // Data keeps flowing on the peer connection.
  s.move({ forward: 0.1, turn: 0 });
  assert.equal(pc.dc.sentOf('agent.movement').length, 1);
  // The new socket re-offers on the same session id: how the server hands it over.
  const reoffer = await until('re-offer', () => again.sentOf('signalling.offer')[0]);
  assert.equal(reoffer.payload.connectionId, s.id);
  assert.equal(reoffer.payload.iceRestart, true);
});

test('a revoked token (close 4003) ends reconnecting', async () => {
  const { client, ws } = await connected();
  const errors = [];
  client.on('error', (e) => errors.push(e.code));
  ws.drop(4003);
  assert.equal(client.state, 'closed');
  assert.deepEqual(errors, ['UNAUTHORIZED']);
  assert.equal(FakeSocket.instances.length, 1);
});

test('ICE disconnected longer than the limit re-offers with iceRestart on the same session', async () => {
  const { client, ws } = await connected();
  const { s, pc } = await session(client, ws, 'robot-1', { iceRestartAfterMs: 10 });
  pc.setIce('connected');
  pc.setIce('disconnected');
  assert.equal(s.state, 'reconnecting');
  const restart = await until('restart offer', () => ws.sentOf('signalling.offer')[1]);
  assert.equal(restart.payload.connectionId, s.id);
  assert.deepEqual(pc.offers[1], { iceRestart: true });
  ws.deliver({ type: 'signalling.answer', payload: { connectionId: s.id, sdp: 'v=0 answer 2', sdpType: 'answer' } });
  await until('answer set', () => pc.remote.length === 2);
  pc.setIce('connected');
  assert.equal(s.state, 'open');
});

test('a short ICE blip does not restart', async (t) => {
  const { client, ws } = await connected();
  const { pc } = await session(client, ws, 'robot-1', { iceRestartAfterMs: 50 });
  t.mock.timers.enable({ apis: ['setTimeout'] });
  pc.setIce('disconnected');
  pc.setIce('connected');
  t.mock.timers.tick(1000); // far past the limit: no restart timer was left running
  await Promise.resolve();
  assert.equal(ws.sentOf('signalling.offer').length, 1);
});

test('stats reads RTT, candidate types and frames from getStats', async () => {
  const { client, ws } = await connected();
  const { s } = await session(client, ws);
  const st = await s.stats();
  assert.equal(st.rttMs, 12);
  assert.equal(st.localCandidateType, 'host');
  assert.equal(st.remoteCandidateType, 'relay');
  assert.equal(st.framesPerSecond, 30);
});

test('ping resolves with the correlated pong', async () => {
  const { client, ws } = await connected();
  const rtt = client.ping();
  const ping = await until('ping', () => ws.sentOf('signalling.ping')[0]);
  ws.deliver({ type: 'signalling.pong', correlationId: ping.id });
  assert.ok((await rtt) >= 0);
});

test('backoff grows, is capped and jittered', () => {
  assert.equal(backoffDelay(0, 100, 1000, () => 0), 50);
  assert.equal(backoffDelay(0, 100, 1000, () => 1), 100);
  assert.equal(backoffDelay(3, 100, 1000, () => 1), 800);
  assert.equal(backoffDelay(10, 100, 1000, () => 1), 1000);
  assert.equal(backoffDelay(10, 100, 1000, () => 0), 500);
});

test('httpBase maps ws to http origins', () => {
  assert.equal(httpBase('wss://example.org/ws'), 'https://example.org');
  assert.equal(httpBase('ws://127.0.0.1:8080/ws?x=1'), 'http://127.0.0.1:8080');
});

test('robots and me ask the HTTP API of the connected server with the token', async () => {
  const calls = [];
  const fetch = async (url, init) => {
    calls.push([url, init.headers.authorization]);
    if (url.endsWith('/v1/me/robots')) {
      return { status: 200, json: async () => [{ robotId: 'r1', name: null, online: true, lastSeenAt: null, role: 'operator' }] };
    }
    return { status: 401, json: async () => ({ error: 'UNAUTHORIZED', message: 'token expired' }) };
  };
  const { client } = await connected({ url: 'wss://example.org/ws', fetch });
  const robots = await client.robots();
  assert.equal(robots[0].role, 'operator');
  assert.deepEqual(calls[0], ['https://example.org/v1/me/robots', `Bearer ${TOKEN}`]);
  await assert.rejects(client.me(), (e) => e.code === 'UNAUTHORIZED' && e.message === 'token expired');
});
