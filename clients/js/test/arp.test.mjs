// Unit tests of the SDK's ARP session (dist/) against a fake gateway socket: the test plays
// the gateway and the robot, and asserts on the JSON-RPC frames the SDK sends and on what
// its promises resolve or reject with.
import { test, beforeEach } from 'node:test';
import assert from 'node:assert/strict';
import { SignallingClient, ArpSession, ArpError, ArpErrorCode, arpUrl } from '../dist/signalling-client.js';
import { FakeSocket, FakePeer, FakeArpSocket, fakeFetch, until } from './fakes.mjs';

beforeEach(() => {
  FakeSocket.reset();
  FakePeer.reset();
  FakeArpSocket.reset();
});

const TOKEN = 'sct_abcDEF123-_';
const URL_ = 'ws://127.0.0.1:9/v1/robots/robot-1/arp';

/** An initialized session; `extra` are connect options. */
async function session(extra = {}) {
  const pending = ArpSession.connect({ url: URL_, token: TOKEN, WebSocket: FakeArpSocket, fetch: fakeFetch(200), timeoutMs: 500, ...extra });
  const gw = await until('socket', () => FakeArpSocket.last());
  const init = await gw.initialized();
  return { s: await pending, gw, init };
}

test('connect opens the gateway with the token as a bearer subprotocol and initializes', async () => {
  const { s, gw, init } = await session();
  assert.equal(gw.url, URL_);
  assert.deepEqual(gw.protocols, [`bearer.${TOKEN}`]);
  assert.deepEqual(init, {
    jsonrpc: '2.0', id: 1, method: 'arp.initialize',
    params: {
      protocolVersion: '0.1.0',
      clientInfo: { name: '@signalling/client', version: '0.1.0' },
      capabilities: { planning: false, confirmation: false },
    },
  });
  assert.equal(s.state, 'open');
  assert.equal(s.server.serverInfo.name, 'robot-agent');
});

test('a token that is no subprotocol token goes in the query; initialize can be left to the caller', async () => {
  const s = await ArpSession.connect({ url: URL_, token: 'a b', WebSocket: FakeArpSocket, initialize: false });
  const gw = FakeArpSocket.last();
  assert.equal(gw.url, `${URL_}?token=a%20b`);
  assert.equal(gw.protocols, undefined);
  assert.equal(gw.sent.length, 0);
  const init = s.initialize({ clientInfo: { name: 'planner', version: '2' } });
  const req = await gw.initialized();
  assert.deepEqual(req.params.clientInfo, { name: 'planner', version: '2' });
  assert.equal((await init).protocolVersion, '0.1.0');
});

test('connectArp reaches the gateway of the connected server with the client token', async () => {
  const pending = SignallingClient.connect({ url: 'wss://example.org/ws', token: TOKEN, WebSocket: FakeSocket, fetch: fakeFetch(200) });
  (await until('socket', () => FakeSocket.last())).welcome();
  const client = await pending;
  const arp = client.connectArp('robot 1', { WebSocket: FakeArpSocket });
  const gw = await until('arp socket', () => FakeArpSocket.last());
  assert.equal(gw.url, 'wss://example.org/v1/robots/robot%201/arp');
  assert.deepEqual(gw.protocols, [`bearer.${TOKEN}`]);
  await gw.initialized();
  assert.equal((await arp).state, 'open');
  assert.equal(arpUrl('http://127.0.0.1:8080', 'r'), 'ws://127.0.0.1:8080/v1/robots/r/arp');
});

test('request ids are unique in the session and answers are matched by id', async () => {
  const { s, gw } = await session();
  const tools = s.listTools();
  const sources = s.listContext();
  const constraints = s.listConstraints();
  const [t, c, k] = [await gw.next('arp.listTools'), await gw.next('arp.listContext'), await gw.next('arp.listConstraints')];
  assert.deepEqual([t.id, c.id, k.id], [2, 3, 4]);
  gw.answer(k, { constraints: [{ name: 'velocity_limit', type: 'velocity_limit', enabled: true, priority: 100, parameters: {}, violation_action: 'reject' }] });
  gw.answer(t, { tools: [{ name: 'drive', description: 'drive', parameters: { type: 'object' }, safety: { level: 'elevated', requiresConfirmation: false, reversible: true, description: '' } }] });
  gw.answer(c, { sources: [{ name: 'odometry', description: 'pose', dataType: 'pose' }] });
  assert.equal((await tools)[0].name, 'drive');
  assert.equal((await sources)[0].name, 'odometry');
  assert.equal((await constraints)[0].name, 'velocity_limit');
});

test('callTool reports progress, then resolves with the call result', async () => {
  const { s, gw } = await session();
  const seen = [];
  const events = [];
  s.on('progress', (p) => events.push(p.progress));
  const call = s.callTool('drive', { linear: 0.2, angular: 0, durationSecs: 1 }, { idempotencyKey: 'k-1', onProgress: (p) => seen.push([p.callId, p.progress, p.message]) });
  const req = await gw.next('arp.callTool');
  assert.deepEqual(req.params, { name: 'drive', arguments: { linear: 0.2, angular: 0, durationSecs: 1 }, idempotencyKey: 'k-1' });
  gw.notify('arp.toolProgress', { callId: 'call_1', progress: 0, message: 'accepted', state: 'running' });
  gw.notify('arp.toolProgress', { callId: 'call_1', progress: 0.5, message: 'driving', state: 'running' });
  gw.answer(req, { callId: 'call_1', state: 'completed', result: { distance: 0.2 } });
  assert.deepEqual(await call, { callId: 'call_1', state: 'completed', result: { distance: 0.2 } });
  assert.deepEqual(seen, [['call_1', 0, 'accepted'], ['call_1', 0.5, 'driving']]);
  assert.deepEqual(events, [0, 0.5]);
});

test('aborting a call cancels it by the callId from its progress; the call answers cancelled', async () => {
  const { s, gw } = await session();
  const abort = new AbortController();
  const call = s.callTool('drive', { linear: 0.1, angular: 0, durationSecs: 5 }, { signal: abort.signal });
  const req = await gw.next('arp.callTool');
  abort.abort();
  assert.equal(gw.requests('arp.cancelTool').length, 0, 'no callId known yet');
  gw.notify('arp.toolProgress', { callId: 'call_9', progress: 0, message: 'accepted', state: 'running' });
  const cancel = await gw.next('arp.cancelTool');
  assert.deepEqual(cancel.params, { callId: 'call_9' });
  gw.answer(cancel, { callId: 'call_9', cancelled: true });
  gw.answer(req, { callId: 'call_9', state: 'cancelled' });
  assert.equal((await call).state, 'cancelled');
  await assert.rejects(s.callTool('drive', {}, { signal: abort.signal }), (e) => e instanceof ArpError && e.reason === 'aborted');
});

test('a failed call rejects with an ArpError naming the call', async () => {
  const { s, gw } = await session();
  const call = s.callTool('navigate_to', { location: 'dock' });
  const req = await gw.next('arp.callTool');
  gw.fail(req, -40007, 'emergency stop latched', { callId: 'call_3', state: 'failed' });
  await assert.rejects(call, (e) => e instanceof ArpError && e.code === ArpErrorCode.EmergencyStopped && e.callId === 'call_3' && e.data.state === 'failed');
});

test('the gateway refusals map to ArpError with their reason', async () => {
  const { s, gw } = await session();
  const call = s.callTool('drive', { linear: 0.1, angular: 0, durationSecs: 1 });
  gw.fail(await gw.next('arp.callTool'), -40001, 'a viewer may not call arp.callTool', { reason: 'forbidden', role: 'viewer' });
  await assert.rejects(call, (e) => e instanceof ArpError && e.code === -40001 && e.reason === 'forbidden' && e.data.role === 'viewer' && e.message === 'a viewer may not call arp.callTool');

  const limited = s.callTool('stop');
  gw.fail(await gw.next('arp.callTool'), -40001, 'too many tool calls; slow down', { reason: 'rate_limited' });
  await assert.rejects(limited, (e) => e.reason === 'rate_limited');

  const errors = [];
  s.on('error', (e) => errors.push(e.reason));
  gw.frame({ jsonrpc: '2.0', id: null, error: { code: -40001, message: 'frames dropped', data: { reason: 'rate_limited' } } });
  assert.deepEqual(errors, ['rate_limited']);
});

for (const [code, reason, extra] of [[-40004, 'robot_busy', { lockedBy: 'alice' }], [-32603, 'robot_offline', {}]]) {
  test(`connect rejects and closes when initialize is refused (${reason})`, async () => {
    const pending = ArpSession.connect({ url: URL_, token: TOKEN, WebSocket: FakeArpSocket });
    const gw = await until('socket', () => FakeArpSocket.last());
    gw.fail(await gw.next('arp.initialize'), code, 'refused', { reason, robotId: 'robot-1', ...extra });
    await assert.rejects(pending, (e) => e instanceof ArpError && e.code === code && e.reason === reason && e.data.lockedBy === extra.lockedBy);
    assert.equal(gw.closedWith, 1000);
  });
}

test('a refused upgrade is told apart: no grant, a refused token, the network', async () => {
  const robots = (status, list) => async () => ({ status, json: async () => list });
  FakeArpSocket.refuseWith = 1006;
  await assert.rejects(ArpSession.connect({ url: URL_, token: TOKEN, WebSocket: FakeArpSocket, fetch: robots(200, [{ robotId: 'robot-2' }]) }),
    (e) => e instanceof ArpError && e.reason === 'no_grant' && e.data.status === 403);
  await assert.rejects(ArpSession.connect({ url: URL_, token: TOKEN, WebSocket: FakeArpSocket, fetch: robots(401, {}) }),
    (e) => e.reason === 'unauthorized');
  await assert.rejects(ArpSession.connect({ url: URL_, token: TOKEN, WebSocket: FakeArpSocket, fetch: robots(200, [{ robotId: 'robot-1' }]) }),
    (e) => e.reason === 'connect_failed' && e.data.code === 1006);
});

test('confirmation requests go to onConfirmation and are answered with the subject', async () => {
  const asked = [];
  const { s, gw, init } = await session({
    subject: 'planner@example.org',
    onConfirmation: async (request) => { asked.push(request.action); return { confirmed: true }; },
  });
  assert.equal(init.params.capabilities.confirmation, true);
  const call = s.callTool('navigate_to', { location: 'dock' });
  const req = await gw.next('arp.callTool');
  gw.frame({ jsonrpc: '2.0', id: 'confirm-1', method: 'arp.requestConfirmation', params: { action: 'navigate to dock', safetyLevel: 'elevated', details: { tool: 'navigate_to', arguments: { location: 'dock' } }, timeout: 30 } });
  const answer = await until('confirmation answer', () => gw.sent.find((m) => m.id === 'confirm-1'));
  assert.deepEqual(asked, ['navigate to dock']);
  assert.equal(answer.jsonrpc, '2.0');
  assert.equal(answer.result.confirmed, true);
  assert.equal(answer.result.confirmedBy, 'planner@example.org');
  assert.ok(!Number.isNaN(Date.parse(answer.result.timestamp)));
  gw.answer(req, { callId: 'c', state: 'completed' });
  await call;
});

test('a throwing confirmation handler refuses; connectArp names the token subject', async () => {
  const fetch = async (url) => ({ status: 200, json: async () => (url.endsWith('/v1/me') ? { subject: 'alice', expiresAt: null } : []) });
  const pending = SignallingClient.connect({ url: 'ws://127.0.0.1:9/ws', token: TOKEN, WebSocket: FakeSocket, fetch });
  (await until('socket', () => FakeSocket.last())).welcome();
  const client = await pending;
  const arp = client.connectArp('robot-1', { WebSocket: FakeArpSocket, onConfirmation: () => { throw new Error('nobody there'); } });
  const gw = await until('arp socket', () => FakeArpSocket.last());
  await gw.initialized();
  await arp;
  gw.frame({ jsonrpc: '2.0', id: 7, method: 'arp.requestConfirmation', params: { action: 'x', safetyLevel: 'critical', details: { tool: 't', arguments: {} }, timeout: 5 } });
  const answer = await until('answer', () => gw.sent.find((m) => m.id === 7 && m.result));
  assert.deepEqual([answer.result.confirmed, answer.result.confirmedBy], [false, 'alice']);
});

test('without onConfirmation nothing is declared, and a stray confirmation request is refused', async () => {
  const { gw, init } = await session();
  assert.equal(init.params.capabilities.confirmation, false);
  gw.frame({ jsonrpc: '2.0', id: 3, method: 'arp.requestConfirmation', params: { action: 'x', safetyLevel: 'critical', details: { tool: 't', arguments: {} }, timeout: 5 } });
  const answer = await until('answer', () => gw.sent.find((m) => m.id === 3 && m.result));
  assert.equal(answer.result.confirmed, false);
  gw.frame({ jsonrpc: '2.0', id: 4, method: 'arp.requestPlan', params: {} });
  const plan = await until('plan refusal', () => gw.sent.find((m) => m.id === 4 && m.error));
  assert.equal(plan.error.code, -32601);
});

test('context updates reach the subscription and the context event', async () => {
  const { s, gw } = await session();
  const updates = [];
  const events = [];
  s.on('context', (u) => events.push(u.name));
  const sub = s.subscribeContext('odometry', { maxRate: 5 }, (u) => updates.push(u.data.position.x));
  const req = await gw.next('arp.subscribeContext');
  assert.deepEqual(req.params, { name: 'odometry', maxRate: 5 });
  gw.answer(req, { name: 'odometry', subscribed: true });
  assert.deepEqual(await sub, { name: 'odometry', subscribed: true });
  const pose = (x) => ({ position: { x, y: 0, z: 0 }, orientation: { x: 0, y: 0, z: 0, w: 1 }, frame: 'odom' });
  gw.notify('arp.contextUpdate', { name: 'odometry', timestamp: new Date().toISOString(), data: pose(1) });
  gw.notify('arp.contextUpdate', { name: 'status', timestamp: new Date().toISOString(), data: {} });
  const unsub = s.unsubscribeContext('odometry');
  gw.answer(await gw.next('arp.unsubscribeContext'), { name: 'odometry', subscribed: false });
  await unsub;
  gw.notify('arp.contextUpdate', { name: 'odometry', timestamp: new Date().toISOString(), data: pose(2) });
  assert.deepEqual(updates, [1]);
  assert.deepEqual(events, ['odometry', 'status', 'odometry']);
});

test('emergencyStop sends the reason; the robot e-stop notification is an event', async () => {
  const { s, gw } = await session();
  const stops = [];
  s.on('emergencyStop', (p) => stops.push(p.reason));
  const stop = s.emergencyStop('obstacle');
  const req = await gw.next('arp.emergencyStop');
  assert.deepEqual(req.params, { reason: 'obstacle' });
  gw.answer(req, { stopped: true });
  assert.deepEqual(await stop, { stopped: true });
  gw.notify('arp.emergencyStop', { reason: 'driver e-stop' });
  assert.deepEqual(stops, ['driver e-stop']);
});

test('a session ended by the server rejects what waits with session_ended, then closes', async () => {
  const { s, gw } = await session();
  const closes = [];
  s.on('close', (c) => closes.push(c));
  const call = s.callTool('drive', { linear: 0.2, angular: 0, durationSecs: 5 });
  const req = await gw.next('arp.callTool');
  gw.fail(req, -32603, 'the session ended before the robot answered', { reason: 'session_ended', cause: 'grant_revoked' });
  gw.end(1000, 'session ended: grant_revoked');
  await assert.rejects(call, (e) => e instanceof ArpError && e.code === -32603 && e.reason === 'session_ended' && e.data.cause === 'grant_revoked');
  assert.equal(s.state, 'closed');
  assert.deepEqual(closes, [{ code: 1000, reason: 'session ended: grant_revoked' }]);
  await assert.rejects(s.listTools(), (e) => e.reason === 'closed');
});

test('close rejects everything pending with closed', async () => {
  const { s, gw } = await session();
  const call = s.callTool('drive', { linear: 0.2, angular: 0, durationSecs: 5 });
  const tools = s.listTools();
  await gw.next('arp.listTools');
  s.close();
  assert.equal(gw.closedWith, 1000);
  for (const p of [call, tools]) {
    await assert.rejects(p, (e) => e instanceof ArpError && e.reason === 'closed' && e.data.code === 1000);
  }
  // An answer after the close changes nothing.
  gw.frame({ jsonrpc: '2.0', id: 2, result: { callId: 'late', state: 'completed' } });
});

test('the pending map is bounded, but an e-stop always goes out', async () => {
  const { s, gw } = await session({ maxPending: 2 });
  const a = s.listTools();
  const b = s.listContext();
  await assert.rejects(s.listConstraints(), (e) => e.code === -40001 && e.reason === 'rate_limited' && e.data.limit === 2);
  const stop = s.emergencyStop('now');
  gw.answer(await gw.next('arp.emergencyStop'), { stopped: true });
  await stop;
  gw.answer(await gw.next('arp.listTools'), { tools: [] });
  gw.answer(await gw.next('arp.listContext'), { sources: [] });
  await Promise.all([a, b]);
});

test('requests time out, and a frame over 64 KiB is refused before sending', async () => {
  const { s, gw } = await session({ timeoutMs: 20 });
  await assert.rejects(s.getConstraint('velocity_limit'), (e) => e.reason === 'timeout');
  const sent = gw.sent.length;
  await assert.rejects(s.callTool('save_location', { name: 'x'.repeat(70 * 1024) }), (e) => e.reason === 'too_large' && e.code === -32600);
  assert.equal(gw.sent.length, sent);
});
