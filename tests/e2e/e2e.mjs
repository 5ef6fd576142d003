// End-to-end test: the real signalling-server, the real robot-agent with a
// recording exec driver, and headless Chromium as the teleop client.
// Runs inside a loopback-only network namespace (see run.sh). Every message
// the agent sends to the browser is validated against the spec's schemas.
//
// No sleeps are used as synchronisation: every wait polls for a condition
// with a bounded deadline.

import { join } from 'node:path';
import { readFileSync, statSync, writeFileSync } from 'node:fs';
import {
  HERE, SERVER_BIN, AGENT_BIN, Harness, driverMessages as readDriverLog, loadSchemas, waitFor, assert,
  log, run, stop,
} from './lib.mjs';

const PORT = 18080;
const HTTP = `http://127.0.0.1:${PORT}`;
const WS = `ws://127.0.0.1:${PORT}/ws`;
const ADMIN = 'e2e-admin-token-0123456789';
const ROBOT = 'e2e-robot';

const h = new Harness({ prefix: 'robot-agent-e2e-', http: HTTP, admin: ADMIN });
const { work, check, start, api } = h;
const driverLog = join(work, 'driver.jsonl');
const driverMessages = () => readDriverLog(driverLog);
const figures = {};

// ---------- the test ----------

async function main() {
  const validate = loadSchemas();
  const dbUrl = `sqlite://${join(work, 'server.db')}`;
  // A development CA, so the server can sign a robot's CSR.
  const caDir = join(work, 'ca');
  await run(SERVER_BIN, ['pki', 'init-ca', '--out', caDir]);
  const serverArgs = ['--listen', `127.0.0.1:${PORT}`, '--admin-token', ADMIN, '--database-url', dbUrl,
    '--ca-cert', join(caDir, 'ca.pem'), '--ca-key', join(caDir, 'ca.key')];
  let server = start('server', SERVER_BIN, serverArgs);
  await waitFor('server health', async () => (await fetch(`${HTTP}/healthz`)).ok);

  const configDir = join(work, 'agent');
  await check('robot enrolls with an Ed25519 key', async () => {
    const created = await api('POST', '/v1/robots', { robotId: ROBOT });
    assert(created.status === 201, JSON.stringify(created));
    await run(AGENT_BIN, ['--config-dir', configDir, 'enroll', '--server', HTTP,
      '--robot-id', ROBOT, '--token', created.body.enrollmentToken]);
    const mode = statSync(join(configDir, 'agent.key')).mode & 0o777;
    assert(mode === 0o600, `key mode ${mode.toString(8)}`);
  });

  writeFileSync(join(configDir, 'agent.toml'), [
    `server = "${WS}"`,
    `robot_id = "${ROBOT}"`,
    `driver = "exec:python3 ${join(HERE, 'driver.py')} ${driverLog}"`,
    'include_loopback_candidates = true',
    '[safety]',
    'max_linear_speed = 0.5',
    'max_angular_speed = 1.0',
    'watchdog_ms = 300',
    '[reconnect]',
    'initial_delay_ms = 200',
    'max_delay_ms = 1000',
    '',
  ].join('\n'));
  const agent = start('agent', AGENT_BIN, ['--config-dir', configDir, 'run']);

  await check('agent registers, proves its key and comes online', async () => {
    await waitFor('robot online', async () => (await api('GET', `/v1/robots/${ROBOT}`)).body?.online === true);
    await waitFor('driver ready', () => driverMessages().some((m) => m.method === 'stop' && m.params.reason === 'driver_started'));
  });

  await check('a second robot enrolls a P-256 key by CSR and logs in with its certificate', async () => {
    const robot = 'e2e-robot-x509';
    const created = await api('POST', '/v1/robots', { robotId: robot });
    assert(created.status === 201, JSON.stringify(created));
    const dir = join(work, 'agent-x509');
    await run(AGENT_BIN, ['--config-dir', dir, 'enroll', '--server', HTTP, '--robot-id', robot,
      '--token', created.body.enrollmentToken, '--key-type', 'p256', '--csr']);
    const mode = statSync(join(dir, 'agent.crt')).mode & 0o777;
    assert(mode === 0o600, `certificate mode ${mode.toString(8)}`);
    start('agent-x509', AGENT_BIN, ['--config-dir', dir, 'run', '--driver', 'sim']);
    const info = await waitFor('x509 robot online', async () => {
      const r = (await api('GET', `/v1/robots/${robot}`)).body;
      return r?.online === true ? r : undefined;
    });
    assert(info.credential === 'x509', `credential ${info.credential}`);
  });

  for (const [subject, role] of [['alice', 'operator'], ['bob', 'viewer']]) {
    const granted = await api('PUT', `/v1/robots/${ROBOT}/grants/${subject}`, { role });
    assert(granted.status === 200, JSON.stringify(granted));
  }
  const tokenFor = async (subject) => (await api('POST', '/v1/tokens', { subject })).body.token;

  const browser = await h.browser();
  const newClient = (name) => h.newClient(browser, name, validate, { ws: WS, robot: ROBOT });

  try {
    const alice = await newClient('alice');
    await check('operator session: offer with control channel + recvonly video, data channel opens', async () => {
      const { setupMs, answerSdp } = await alice.connect(await tokenFor('alice'), 'e2e-session-alice');
      figures.setupMs = setupMs;
      const video = answerSdp.split('m=').find((m) => m.startsWith('video'));
      assert(video && /a=inactive/.test(video), 'video m-line answered inactive');
      const caps = await alice.expect('agent.capabilities', (m) => m.type === 'agent.capabilities');
      assert(caps.payload.versions.includes('0.5'), 'capabilities list 0.5');
    });

    await check('ping/pong over the data channel', async () => {
      const id = await alice.send('agent.ping');
      await alice.expect('pong', (m) => m.type === 'agent.pong' && m.correlationId === id);
    });

    await check('movement reaches the driver scaled, then the watchdog stops it', async () => {
      const before = driverMessages().length;
      for (let i = 0; i < 5; i++) {
        await alice.send('agent.movement', { forward: 0.5, turn: -0.5 });
      }
      const moves = await waitFor('move at the driver', () => {
        const fresh = driverMessages().slice(before).filter((m) => m.method === 'move');
        return fresh.length ? fresh : undefined;
      });
      assert(moves[0].params.linear === 0.25, `linear ${moves[0].params.linear} = 0.5 * 0.5 m/s`);
      assert(moves[0].params.angular === -0.5, `angular ${moves[0].params.angular} = -0.5 * 1.0 rad/s`);
      const stopMsg = await waitFor('watchdog stop', () => driverMessages().slice(before)
        .find((m) => m.method === 'stop' && m.params.reason === 'watchdog'));
      const lastMove = driverMessages().slice(before).filter((m) => m.method === 'move').pop();
      figures.watchdogMs = Math.round((stopMsg.t - lastMove.t) * 1000);
      assert(figures.watchdogMs >= 250 && figures.watchdogMs < 1000, `watchdog after ${figures.watchdogMs} ms`);
    });

    await check('location create and list', async () => {
      const location = { name: 'dock', position: { x: 0.5, y: 0.0 }, orientation: { yaw: 0.0 } };
      const id = await alice.send('agent.location.create', location);
      const created = await alice.expect('create response', (m) => m.correlationId === id);
      assert(created.type === 'agent.location.response' && created.payload.operation === 'create', JSON.stringify(created));
      const listId = await alice.send('agent.location.list', {});
      const list = await alice.expect('list response', (m) => m.correlationId === listId);
      assert(list.payload.locations.some((l) => l.name === 'dock' && l.position.x === 0.5), JSON.stringify(list));
    });

    await check('navigation reports started then completed', async () => {
      const id = await alice.send('agent.navigation.start', { name: 'dock' });
      const started = await alice.expect('started', (m) => m.correlationId === id && m.payload?.status === 'started');
      assert(started.type === 'agent.navigation.response' && started.payload.name === 'dock', JSON.stringify(started));
      await alice.expect('completed', (m) => m.correlationId === id && m.payload?.status === 'completed');
      const goal = driverMessages().find((m) => m.method === 'navigate');
      assert(goal && goal.params.position.x === 0.5, `driver got the goal: ${JSON.stringify(goal)}`);
    });

    const bob = await newClient('bob');
    await check('a viewer session runs alongside and its movement is refused', async () => {
      await bob.connect(await tokenFor('bob'), 'e2e-session-bob');
      await bob.expect('capabilities', (m) => m.type === 'agent.capabilities');
      const before = driverMessages().filter((m) => m.method === 'move').length;
      const id = await bob.send('agent.movement', { forward: 1.0, turn: 0.0 });
      const refused = await bob.expect('refusal', (m) => m.correlationId === id);
      assert(refused.type === 'agent.error' && refused.payload.code === 'MOVEMENT_FAILED', JSON.stringify(refused));
      assert(refused.payload.details.reason === 'forbidden', JSON.stringify(refused));
      // The operator's session still works at the same time.
      const ping = await alice.send('agent.ping');
      await alice.expect('pong', (m) => m.type === 'agent.pong' && m.correlationId === ping);
      const after = driverMessages().filter((m) => m.method === 'move').length;
      assert(after === before, 'no movement reached the driver');
    });

    await check('agent reconnects and re-registers after a server restart', async () => {
      const logBefore = driverMessages().length;
      await stop(server);
      await waitFor('robot stopped on signalling loss', () => driverMessages().slice(logBefore)
        .some((m) => m.method === 'stop' && m.params.reason === 'signalling_lost'));
      alice.page.evaluate(() => window.robotClient.close());
      bob.page.evaluate(() => window.robotClient.close());
      const agentLogBefore = readFileSync(agent.logFile, 'utf8').split('registered and verified').length;
      server = start('server2', SERVER_BIN, serverArgs);
      await waitFor('server health', async () => (await fetch(`${HTTP}/healthz`)).ok);
      await waitFor('robot online again', async () => (await api('GET', `/v1/robots/${ROBOT}`)).body?.online === true);
      // The server marks the robot online before the agent has read
      // pki_verified, so wait for the agent's side too.
      await waitFor('the agent logs its new verified login', () =>
        readFileSync(agent.logFile, 'utf8').split('registered and verified').length > agentLogBefore);
      // A fresh session works end to end after the reconnect.
      const carol = await newClient('alice-again');
      const { setupMs } = await carol.connect(await tokenFor('alice'), 'e2e-session-after-restart');
      figures.setupAfterRestartMs = setupMs;
      const id = await carol.send('agent.ping');
      await carol.expect('pong', (m) => m.type === 'agent.pong' && m.correlationId === id);
    });
  } finally {
    await browser.close();
  }
}

try {
  await main();
} catch (e) {
  if (h.failed === 0) {
    h.failed += 1;
    log(`FAIL setup: ${e.stack || e}`);
  }
  h.dumpLogs();
} finally {
  await h.cleanup();
}

if (figures.setupMs !== undefined) {
  console.log(`\nsession setup time (offer sent -> data channel open): ${figures.setupMs.toFixed(1)} ms`);
}
if (figures.setupAfterRestartMs !== undefined) {
  console.log(`session setup time after agent reconnect: ${figures.setupAfterRestartMs.toFixed(1)} ms`);
}
if (figures.watchdogMs !== undefined) {
  console.log(`watchdog stop after last movement command: ${figures.watchdogMs} ms (configured 300 ms)`);
}
console.log(`e2e: ${h.passed} passed, ${h.failed} failed`);
process.exit(h.failed === 0 ? 0 : 1);
