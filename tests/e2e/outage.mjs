// Issue 16 end to end: no stale command moves the robot after an outage.
//
// Runs in the browser's network namespace (see outage.sh); the server and
// the robot-agent (with the recording exec driver) run in the robot's
// namespace, reached over a veth pair. Chromium holds "forward" at 10 Hz on
// the reliable, ordered `control` channel, the browser's link goes down for
// 5 s and comes back. From the driver's log: the watchdog stops the robot
// within its window, no command sent before the link returned is executed
// after it, and fresh commands drive again. Then the same with the legacy
// `MovementCommand` form. Every message the agent sends is schema-checked.

import { join } from 'node:path';
import { writeFileSync } from 'node:fs';
import {
  HERE, SERVER_BIN, AGENT_BIN, Harness, driverMessages, loadSchemas, waitFor, assert, log, run,
} from './lib.mjs';

const NS = process.env.E2E_ROBOT_NS;
const LINK = process.env.E2E_BROWSER_IF;
const ADDR = process.env.E2E_SERVER_ADDR;
if (!NS || !LINK || !ADDR) throw new Error('run through outage.sh');
const PORT = 18081;
const HTTP = `http://${ADDR}:${PORT}`;
const WS = `ws://${ADDR}:${PORT}/ws`;
const ADMIN = 'e2e-outage-admin';
const ROBOT = 'e2e-outage-robot';
const WATCHDOG_MS = 300;
const OUTAGE_MS = 5000;
// Slack for the agent's 25 ms watchdog tick and the exec driver's pipe.
const STOP_SLACK_MS = 150;

const h = new Harness({ prefix: 'robot-agent-outage-', http: HTTP, admin: ADMIN });
const driverLog = join(h.work, 'driver.jsonl');
const figures = [];

/** Runs a command inside the robot's namespace. */
const inRobotNs = (bin, args) => ['ip', ['netns', 'exec', NS, bin, ...args]];
const pause = (ms) => new Promise((r) => setTimeout(r, ms));

/** Executed moves since `from` (index into the driver log), each with its command's seq. */
function moves(from) {
  return driverMessages(driverLog).slice(from)
    .filter((m) => m.method === 'move')
    .map((m) => ({ t: m.t * 1000, seq: Math.round(m.params.angular * 10000), linear: m.params.linear }));
}

async function scenario(browser, validate, token, form) {
  const name = `${form} form`;
  const client = await h.newClient(browser, `operator-${form}`, validate, { ws: WS, robot: ROBOT });
  await client.connect(token, `e2e-outage-${form}`);
  await client.expect('capabilities', (m) => m.type === 'agent.capabilities');
  const logStart = driverMessages(driverLog).length;
  await client.page.evaluate((f) => window.robotClient.startHolding(f, 0.5), form);
  await waitFor(`${name}: driving at 10 Hz`, () => moves(logStart).length >= 10);

  // Only what the agent says from here on counts below.
  await client.pull();
  client.received = [];
  // The outage: the browser's link goes down for 5 s.
  const down = Date.now();
  await run('ip', ['link', 'set', LINK, 'down']);
  await pause(OUTAGE_MS);
  const up = Date.now();
  await run('ip', ['link', 'set', LINK, 'up']);
  log(`${name}: link down ${down}, up ${up}`);

  const sentAt = async () => (await client.page.evaluate(() => window.robotClient.held())).sentAt;
  // Fresh motion after the link returns: a command sent after `up` runs.
  const fresh = await waitFor(`${name}: motion on a fresh command`, async () => {
    const sent = await sentAt();
    return moves(logStart).find((m) => m.t > up && sent[m.seq] >= up);
  }, 20000);
  // The backlog is delivered whenever SCTP retransmits (seconds after the
  // link returns): wait until the agent has refused (nearly) all of it.
  const queuedCount = async () => Object.values(await sentAt()).filter((at) => at >= down && at < up).length;
  const staleErrors = () => client.received.filter((m) => m.type === 'agent.error' && m.payload.details?.reason === 'stale');
  const queuedTotal = await queuedCount();
  // Delivered means refused as stale, or (the failure this test exists
  // for) executed after the link returned.
  await waitFor(`${name}: the queued backlog reaches the agent`, async () => {
    await client.pull();
    const sent = await sentAt();
    const ranLate = moves(logStart).filter((m) => m.t >= up && !(sent[m.seq] >= up)).length;
    return staleErrors().length + ranLate >= queuedTotal - 1;
  }, 20000);
  // A further second of holding: nothing late may still turn up.
  await pause(1000);
  const sent = await client.page.evaluate(() => window.robotClient.stopHolding());
  await client.pull();

  const log_ = driverMessages(driverLog).slice(logStart).map((m) => ({ ...m, t: m.t * 1000 }));
  const all = moves(logStart);
  await h.check(`${name}: the watchdog stops the robot within its window of the outage`, async () => {
    const stop = log_.find((m) => m.method === 'stop' && m.t > down);
    assert(stop, 'a stop after the link went down');
    assert(stop.params.reason === 'watchdog', `stopped by ${stop.params.reason}`);
    const lastBefore = all.filter((m) => m.t < stop.t).pop();
    const sinceLast = stop.t - lastBefore.t;
    const sinceDown = stop.t - down;
    assert(sinceLast <= WATCHDOG_MS + STOP_SLACK_MS, `stop ${sinceLast} ms after the last move`);
    assert(sinceDown <= WATCHDOG_MS + 100 + STOP_SLACK_MS, `stop ${sinceDown} ms after the link went down`);
    const movedDuring = all.filter((m) => m.t > stop.t && m.t < up);
    assert(movedDuring.length === 0, `moved during the outage: ${JSON.stringify(movedDuring)}`);
    figures.push(`${name}: watchdog stop ${Math.round(sinceLast)} ms after the last move, ${Math.round(sinceDown)} ms after link down`);
  });
  await h.check(`${name}: no command sent before the link returned runs after it`, async () => {
    const queued = Object.entries(sent).filter(([, at]) => at >= down && at < up).length;
    assert(queued >= 40, `only ${queued} commands were sent during the outage`);
    const late = all.filter((m) => m.t >= up && !(sent[m.seq] >= up));
    assert(late.length === 0, `stale commands executed: ${JSON.stringify(late.map((m) => ({ ...m, sentAt: sent[m.seq] })))}`);
    const stale = staleErrors();
    assert(stale.length >= queued - 1, `only ${stale.length} of ${queued} queued commands refused as stale`);
    figures.push(`${name}: ${queued} commands queued during the outage; ${stale.length} refused as stale`);
  });
  await h.check(`${name}: fresh commands after the link returns drive again`, async () => {
    const after = all.filter((m) => m.t > up && sent[m.seq] >= up);
    assert(after.length >= 10, `${after.length} fresh moves`);
    figures.push(`${name}: motion again ${Math.round(fresh.t - up)} ms after link up (command sent ${Math.round(sent[fresh.seq] - up)} ms after)`);
  });
  await client.page.evaluate(() => window.robotClient.close());
  await client.page.close();
}

async function main() {
  const validate = loadSchemas();
  const server = inRobotNs(SERVER_BIN, ['--listen', `${ADDR}:${PORT}`, '--admin-token', ADMIN,
    '--database-url', `sqlite://${join(h.work, 'server.db')}`]);
  h.start('server', ...server);
  await waitFor('server health', async () => (await fetch(`${HTTP}/healthz`)).ok);

  const configDir = join(h.work, 'agent');
  const created = await h.api('POST', '/v1/robots', { robotId: ROBOT });
  assert(created.status === 201, JSON.stringify(created));
  await run(...inRobotNs(AGENT_BIN, ['--config-dir', configDir, 'enroll', '--server', HTTP,
    '--robot-id', ROBOT, '--token', created.body.enrollmentToken]));
  writeFileSync(join(configDir, 'agent.toml'), [
    `server = "${WS}"`,
    `robot_id = "${ROBOT}"`,
    `driver = "exec:python3 ${join(HERE, 'driver.py')} ${driverLog}"`,
    '[safety]',
    `watchdog_ms = ${WATCHDOG_MS}`,
    '',
  ].join('\n'));
  h.start('agent', ...inRobotNs(AGENT_BIN, ['--config-dir', configDir, 'run']));
  await waitFor('robot online', async () => (await h.api('GET', `/v1/robots/${ROBOT}`)).body?.online === true);
  await waitFor('driver ready', () => driverMessages(driverLog)
    .some((m) => m.method === 'stop' && m.params.reason === 'driver_started'));

  const granted = await h.api('PUT', `/v1/robots/${ROBOT}/grants/alice`, { role: 'operator' });
  assert(granted.status === 200, JSON.stringify(granted));
  const browser = await h.browser();
  try {
    for (const form of ['spec', 'legacy']) {
      const token = (await h.api('POST', '/v1/tokens', { subject: 'alice' })).body.token;
      await scenario(browser, validate, token, form);
      // The next session may only start once the server has ended this one.
      await waitFor('session ended', async () => {
        const sessions = (await h.api('GET', `/v1/sessions?robotId=${ROBOT}&active=true`)).body;
        return Array.isArray(sessions) && sessions.length === 0;
      });
    }
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
for (const line of figures) console.log(line);
console.log(`outage e2e: ${h.passed} passed, ${h.failed} failed`);
process.exit(h.failed === 0 ? 0 : 1);
