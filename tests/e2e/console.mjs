// The web console in real Chromium against the real signalling-server and a real
// robot-agent (recording exec driver): sign in as admin, create a robot, enroll the agent
// with the command the console shows, grant, create a client token, sign in as that client,
// open the teleop page (data channel; video when the agent offers it), drive with the
// keyboard, press the emergency stop, and find the session on the sessions page.
// Any page error, console error or failed request fails the test. Screenshots of each page
// go to docs/console/ (CONSOLE_SCREENSHOTS=0 skips writing them).
//
// Runs inside a loopback-only network namespace (console.sh). No sleeps as
// synchronisation: every wait polls a condition with a bounded deadline.

import { join } from 'node:path';
import { writeFileSync } from 'node:fs';
import { createServer } from 'node:net';
import {
  ROOT, HERE, SERVER_BIN, AGENT_BIN, Harness, driverMessages as readDriverLog, waitFor, assert, log, run, stop,
} from './lib.mjs';

const freePort = () => new Promise((resolve, reject) => {
  const s = createServer();
  s.once('error', reject);
  s.listen(0, '127.0.0.1', () => {
    const { port } = s.address();
    s.close(() => resolve(port));
  });
});

const PORT = await freePort();
const HTTP = `http://127.0.0.1:${PORT}`;
const WS = `ws://127.0.0.1:${PORT}/ws`;
const ADMIN = 'console-e2e-admin-token-0123456789';
const ROBOT = 'console-robot';
const SHOTS = join(ROOT, 'docs', 'console');
const shoot = process.env.CONSOLE_SCREENSHOTS !== '0';

const h = new Harness({ prefix: 'console-e2e-', http: HTTP, admin: ADMIN });
const { work, check, start } = h;
const driverLog = join(work, 'driver.jsonl');
const driverMessages = () => readDriverLog(driverLog);
const figures = {};
const problems = [];

async function screenshot(page, name) {
  if (!shoot) return;
  await page.screenshot({ path: join(SHOTS, `${name}.png`), fullPage: false, type: 'png' });
}

/** A page that records every JavaScript error, console error and failed request. */
async function watchedPage(browser) {
  const page = await browser.newPage();
  await page.setViewportSize({ width: 1100, height: 760 });
  page.on('pageerror', (e) => problems.push(`page error: ${e.message}`));
  page.on('console', (m) => {
    if (m.type() === 'error') problems.push(`console error: ${m.text()}`);
  });
  page.on('requestfailed', (r) => problems.push(`request failed: ${r.method()} ${r.url()} ${r.failure()?.errorText}`));
  page.on('response', (r) => {
    if (r.status() >= 400) problems.push(`HTTP ${r.status()}: ${r.request().method()} ${r.url()}`);
  });
  return page;
}

function noProblems(what) {
  assert(problems.length === 0, `${what}: ${problems.join('; ')}`);
}

async function signIn(page, token, landing) {
  await page.goto(`${HTTP}/`);
  await page.getByLabel('Token').fill(token);
  await page.getByRole('button', { name: 'Sign in' }).click();
  await page.locator(landing).waitFor();
}

async function main() {
  const dbUrl = `sqlite://${join(work, 'server.db')}`;
  const serverArgs = ['--listen', `127.0.0.1:${PORT}`, '--admin-token', ADMIN, '--database-url', dbUrl];
  let server = start('server', SERVER_BIN, serverArgs);
  await waitFor('server health', async () => (await fetch(`${HTTP}/healthz`)).ok);

  const browser = await h.browser();
  try {
    const page = await watchedPage(browser);

    await check('the console loads without errors and offers sign-in', async () => {
      await page.goto(`${HTTP}/`);
      await page.getByRole('heading', { name: 'Sign in' }).waitFor();
      await screenshot(page, 'sign-in');
      noProblems('loading the console');
    });

    await check('a wrong token is refused with a message', async () => {
      await page.getByLabel('Token').fill('sct_not-a-real-token');
      await page.getByRole('button', { name: 'Sign in' }).click();
      await page.locator('#notice:has-text("refused")').waitFor();
      // That 401 was the point of this check.
      problems.length = 0;
    });

    let command;
    await check('admin signs in and creates a robot; the console shows the enroll command', async () => {
      await signIn(page, ADMIN, '#robots-table');
      await page.getByLabel('Robot id').fill(ROBOT);
      await page.getByLabel('Name (optional)').fill('Warehouse rover');
      await page.getByRole('button', { name: 'Create robot' }).click();
      command = (await page.locator('#enroll-command').textContent()).trim();
      assert(command.startsWith(`robot-agent enroll --server ${HTTP} --robot-id ${ROBOT} --token set_`), command);
      await page.locator(`tr[data-robot="${ROBOT}"]`).waitFor();
      await screenshot(page, 'robots');
      noProblems('creating a robot');
    });

    const configDir = join(work, 'agent');
    await check('the shown command enrolls the real agent, which comes online in the list', async () => {
      const args = command.split(/\s+/);
      assert(args[0] === 'robot-agent', command);
      await run(AGENT_BIN, ['--config-dir', configDir, ...args.slice(1)]);
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
      start('agent', AGENT_BIN, ['--config-dir', configDir, 'run']);
      await page.locator(`tr[data-robot="${ROBOT}"] .badge.on`).waitFor({ timeout: 15000 });
    });

    await check('grants: add, change role, remove', async () => {
      await page.getByRole('link', { name: ROBOT }).click();
      await page.locator('#robot-state .badge.on').waitFor();
      for (const [subject, role] of [['alice', 'operator'], ['bob', 'viewer'], ['carol', 'viewer']]) {
        await page.getByLabel('Subject').fill(subject);
        await page.locator('#grant-role').selectOption(role);
        await page.getByRole('button', { name: 'Grant', exact: true }).click();
        await page.locator(`#grants-table tr[data-subject="${subject}"]`).waitFor();
      }
      await page.getByLabel('Role of bob').selectOption('owner');
      await page.locator('#notice:has-text("bob is now owner")').waitFor();
      const grants = await h.api('GET', `/v1/robots/${ROBOT}/grants`);
      assert(grants.body.find((g) => g.subject === 'bob')?.role === 'owner', JSON.stringify(grants.body));
      await screenshot(page, 'robot');
      await page.getByRole('button', { name: 'Remove grant of bob' }).click();
      await page.locator('#grants-table tr[data-subject="bob"]').waitFor({ state: 'detached' });
      noProblems('grants');
    });

    const tokens = {};
    await check('tokens: create client tokens for alice and carol', async () => {
      await page.getByRole('link', { name: 'Tokens' }).click();
      for (const subject of ['dave', 'carol', 'alice']) {
        await page.getByLabel('Subject').fill(subject);
        await page.getByRole('button', { name: 'Create token' }).click();
        await page.locator(`#new-token-for:has-text("${subject}")`).waitFor();
        tokens[subject] = (await page.locator('#new-token').textContent()).trim();
        assert(tokens[subject].startsWith('sct_'), tokens[subject]);
        await page.locator(`#tokens-table tr:has-text("${subject}")`).first().waitFor();
      }
      await screenshot(page, 'tokens');
      // Revoke dave's from the list: the token stops working at once.
      const daveId = await page.locator('#tokens-table tr:has-text("dave")').getAttribute('data-token');
      await page.getByRole('button', { name: `Revoke token ${daveId}` }).click();
      await page.locator(`#tokens-table tr[data-token="${daveId}"]:has-text("revoked")`).waitFor();
      const refused = await fetch(`${HTTP}/v1/me`, { headers: { authorization: `Bearer ${tokens.dave}` } });
      assert(refused.status === 401, `revoked token answered ${refused.status}`);
      noProblems('tokens');
    });

    await check('alice signs in and sees only her robot', async () => {
      await page.getByRole('button', { name: 'Sign out' }).click();
      await signIn(page, tokens.alice, '#my-robots-table');
      await page.locator(`#my-robots-table tr[data-robot="${ROBOT}"] .badge.on`).waitFor();
      const rows = await page.locator('#my-robots-table tbody tr').count();
      assert(rows === 1, `${rows} rows`);
      await screenshot(page, 'my-robots');
    });

    await check('teleop: the session opens through the SDK (data channel), stats and capabilities show', async () => {
      const t0 = Date.now();
      await page.getByRole('link', { name: 'Drive' }).click();
      await page.locator('#teleop-status:has-text("You may drive")').waitFor({ timeout: 20000 });
      figures.openMs = Date.now() - t0;
      await page.locator('#drive').waitFor();
      await page.locator('#teleop-caps:has-text("versions")').waitFor();
      await waitFor('stats with a candidate pair', async () =>
        (await page.locator('#stat-candidate').textContent())?.includes('host'));
      const video = await page.evaluate(() => Boolean(window.consoleSession?.video));
      figures.video = video;
      if (video) {
        await waitFor('video frames', () => page.evaluate(() => {
          const v = document.querySelector('#teleop-video');
          return v.readyState >= 2 && v.videoWidth > 0;
        }), 20000);
      }
      await screenshot(page, 'teleop');
      noProblems('teleop');
    });

    await check('the SDK in Chromium: typed errors, request/reply, clean close', async () => {
      await h.api('POST', '/v1/robots', { robotId: 'offline-robot' });
      await h.api('PUT', '/v1/robots/offline-robot/grants/carol', { role: 'viewer' });
      const other = await browser.newPage();
      await other.goto(`${HTTP}/healthz`);
      const result = await other.evaluate(async ({ ws, robot, alice, carol }) => {
        const { SignallingClient } = await import('/sdk/signalling-client.js');
        const out = {};
        const code = async (p) => {
          try { await p; return 'resolved'; } catch (e) { return `${e.code}/${e.reason ?? ''}`; }
        };
        out.badToken = await code(SignallingClient.connect({ url: ws, token: 'sct_wrong', reconnect: false }));
        const asAlice = await SignallingClient.connect({ url: ws, token: alice });
        out.busy = await code(asAlice.openSession(robot));
        await asAlice.close();
        const asCarol = await SignallingClient.connect({ url: ['ws://127.0.0.1:9/ws', ws], token: carol });
        out.robots = (await asCarol.robots()).map((r) => `${r.robotId}:${r.role}:${r.online}`).sort().join(',');
        out.noGrant = await code(asCarol.openSession('no-such-robot'));
        out.offline = await code(asCarol.openSession('offline-robot'));
        const s = await asCarol.openSession(robot, { video: true });
        const pong = await s.request({ type: 'agent.ping' });
        out.pong = pong.type;
        out.moveRefused = await code(s.request({ type: 'agent.movement', payload: { forward: 0.5, turn: 0 } }));
        out.serverRtt = (await asCarol.ping()) >= 0;
        await s.close();
        out.closed = s.state;
        await asCarol.close();
        return out;
      }, { ws: WS, robot: ROBOT, alice: tokens.alice, carol: tokens.carol });
      await other.close();
      log(`SDK in Chromium: ${JSON.stringify(result)}`);
      assert(result.badToken === 'UNAUTHORIZED/token', result.badToken);
      assert(result.busy === 'FORBIDDEN/robot_busy', result.busy);
      assert(result.noGrant === 'FORBIDDEN/no_grant', result.noGrant);
      assert(result.robots === `${ROBOT}:viewer:true,offline-robot:viewer:false`, result.robots);
      assert(result.offline === 'CONNECTION_FAILED/robot_offline', result.offline);
      assert(result.pong === 'agent.pong', result.pong);
      assert(result.moveRefused === 'MOVEMENT_FAILED/forbidden', result.moveRefused);
      assert(result.serverRtt && result.closed === 'closed', JSON.stringify(result));
      noProblems('the console page while the SDK ran beside it');
    });

    await check('the keyboard drives the robot (the driver records the moves)', async () => {
      const before = driverMessages().length;
      await page.keyboard.down('w');
      const moves = await waitFor('moves at the driver', () => {
        const fresh = driverMessages().slice(before).filter((m) => m.method === 'move' && m.params.linear > 0);
        return fresh.length >= 3 ? fresh : undefined;
      });
      await page.keyboard.up('w');
      // Speed 0.5 × max 0.5 m/s.
      assert(moves[0].params.linear === 0.25, `linear ${moves[0].params.linear}`);
      const gaps = moves.slice(1).map((m, i) => (m.t - moves[i].t) * 1000);
      figures.commandGapMs = Math.round(gaps.reduce((a, b) => a + b, 0) / gaps.length);
      await waitFor('the release stops the robot', () => driverMessages().slice(before)
        .some((m) => (m.method === 'move' && m.params.linear === 0 && m.params.angular === 0) || m.method === 'stop'));
    });

    await check('the on-screen joystick and a gamepad drive too', async () => {
      const stopped = (from) => driverMessages().slice(from)
        .some((m) => (m.method === 'move' && m.params.linear === 0 && m.params.angular === 0) || m.method === 'stop');
      // Joystick: press in the middle, drag to the top edge (full forward).
      let before = driverMessages().length;
      const box = await page.locator('.joystick').boundingBox();
      await page.mouse.move(box.x + box.width / 2, box.y + box.height / 2);
      await page.mouse.down();
      await page.mouse.move(box.x + box.width / 2, box.y + 2, { steps: 4 });
      await waitFor('joystick moves at the driver', () => driverMessages().slice(before)
        .filter((m) => m.method === 'move' && m.params.linear > 0.2).length >= 2);
      await page.mouse.up();
      await waitFor('joystick release stops', () => stopped(before));
      // Gamepad: the browser's Gamepad API, its left stick pushed forward and turned left.
      before = driverMessages().length;
      await page.evaluate(() => {
        window.fakePad = { axes: [-1, -1, 0, 0], buttons: [{ pressed: false }, { pressed: false }] };
        Object.defineProperty(navigator, 'getGamepads', { configurable: true, value: () => [window.fakePad] });
      });
      const padMove = await waitFor('gamepad moves at the driver', () => driverMessages().slice(before)
        .find((m) => m.method === 'move' && m.params.linear > 0 && m.params.angular > 0));
      assert(padMove.params.linear === 0.25 && padMove.params.angular === 0.5, JSON.stringify(padMove));
      await page.evaluate(() => { window.fakePad.axes = [0, 0, 0, 0]; });
      await waitFor('gamepad release stops', () => stopped(before));
      noProblems('joystick and gamepad');
    });

    await check('Space is the emergency stop: the robot stops and driving is blocked', async () => {
      await page.keyboard.down('w');
      const before = driverMessages().length;
      await waitFor('moving', () => driverMessages().slice(before).some((m) => m.method === 'move' && m.params.linear > 0));
      await page.keyboard.press('Space');
      await page.locator('#estop[aria-pressed="true"]').waitFor();
      const pressedAt = driverMessages().length;
      const halt = await waitFor('the stop at the driver', () => driverMessages().slice(before)
        .find((m) => (m.method === 'move' && m.params.linear === 0 && m.params.angular === 0) || m.method === 'stop'));
      log(`driver after e-stop: ${JSON.stringify(halt)}`);
      // W is still held: the console sends nothing more; a move recorded after the stop
      // could only be one already in flight when Space was pressed.
      // A negative check needs a window: ten of the console's 100 ms ticks pass with W
      // held, and its command counter must not move.
      const sentBefore = await page.locator('#moves-sent').textContent();
      const t = await page.evaluate(() => performance.now());
      await page.waitForFunction((t0) => performance.now() > t0 + 1000, t);
      assert((await page.locator('#moves-sent').textContent()) === sentBefore, 'no command sent while stopped');
      await page.keyboard.up('w');
      await screenshot(page, 'teleop-estop');
      const after = driverMessages().slice(pressedAt).filter((m) => m.method === 'move' && m.params.linear > 0);
      assert(after.length <= 1, `moves after the e-stop: ${JSON.stringify(after)}`);
      noProblems('e-stop');
    });

    await check('a viewer sees the session and its figures but no drive controls', async () => {
      await page.getByRole('link', { name: '← My robots' }).click();
      await page.getByRole('button', { name: 'Sign out' }).click();
      await signIn(page, tokens.carol, '#my-robots-table');
      await page.locator(`#my-robots-table tr[data-robot="${ROBOT}"] a.teleop-link`).click();
      await page.locator('#teleop-status:has-text("viewer")').waitFor({ timeout: 20000 });
      assert(await page.locator('#drive').isHidden(), 'drive controls hidden');
      await waitFor('viewer stats', async () => (await page.locator('#stat-candidate').textContent())?.includes('host'));
      const before = driverMessages().filter((m) => m.method === 'move').length;
      // A window for a negative check: W held for ten of the page's 100 ms ticks.
      await page.keyboard.down('w');
      const t = await page.evaluate(() => performance.now());
      await page.waitForFunction((t0) => performance.now() > t0 + 1000, t);
      await page.keyboard.up('w');
      assert(driverMessages().filter((m) => m.method === 'move').length === before, 'a viewer moves nothing');
      assert(await page.locator('#notice').isHidden(), 'no refusal shown: nothing was sent');
      await screenshot(page, 'teleop-viewer');
      noProblems('viewer');
    });

    await check('the sessions show on the sessions page, ended', async () => {
      await page.getByRole('link', { name: '← My robots' }).click();
      await page.getByRole('button', { name: 'Sign out' }).click();
      await signIn(page, ADMIN, '#robots-table');
      await page.getByRole('link', { name: 'Sessions' }).click();
      const row = page.locator(`#sessions-table tr:has-text("alice")`).first();
      await row.waitFor();
      await waitFor('the session ended', async () => (await row.textContent()).includes('closed'));
      const text = await row.textContent();
      assert(text.includes(ROBOT) && text.includes('operator'), text);
      await screenshot(page, 'sessions');
      noProblems('sessions');
    });

    await check('the console works at phone width', async () => {
      await page.setViewportSize({ width: 390, height: 800 });
      await page.getByRole('link', { name: 'Robots' }).click();
      await page.locator(`tr[data-robot="${ROBOT}"]`).waitFor();
      const overflow = await page.evaluate(() => document.documentElement.scrollWidth - window.innerWidth);
      assert(overflow <= 0, `page wider than the screen by ${overflow}px`);
      await screenshot(page, 'phone');
      noProblems('phone width');
    });

    await check('the SDK reconnects by itself after a server restart, and opens a new session', async () => {
      // The console page polls the API: park it so the outage is no failed request of its.
      await page.goto(`${HTTP}/healthz`);
      const other = await browser.newPage();
      await other.goto(`${HTTP}/healthz`);
      await other.evaluate(async ({ ws, token }) => {
        const { SignallingClient } = await import('/sdk/signalling-client.js');
        window.sdk = await SignallingClient.connect({ url: ws, token, initialDelayMs: 100, maxDelayMs: 500 });
        window.sdkStates = [];
        window.sdk.on('state', (st) => window.sdkStates.push(st));
        window.firstId = window.sdk.connectionId;
      }, { ws: WS, token: tokens.alice });
      await stop(server);
      await waitFor('the SDK notices', () => other.evaluate(() => window.sdk.state === 'reconnecting'));
      server = start('server-restarted', SERVER_BIN, serverArgs);
      await waitFor('the SDK is back', () => other.evaluate(() => window.sdk.state === 'open'), 20000);
      await waitFor('robot online again', async () => (await h.api('GET', `/v1/robots/${ROBOT}`)).body?.online === true, 20000);
      const result = await other.evaluate(async (robot) => {
        let session;
        // The server marks the robot online a moment before the agent has read its
        // verification; an offer in that moment is refused, so retry within a bound.
        for (let i = 0; ; i++) {
          try {
            session = await window.sdk.openSession(robot, { timeoutMs: 5000 });
            break;
          } catch (e) {
            if (i >= 20) throw e;
            await new Promise((r) => setTimeout(r, 100 * (i + 1)));
          }
        }
        const pong = await session.request({ type: 'agent.ping' });
        await session.close();
        await window.sdk.close();
        return { states: window.sdkStates, newId: window.sdk.connectionId !== window.firstId, pong: pong.type };
      }, ROBOT);
      await other.close();
      log(`SDK across a server restart: ${JSON.stringify(result)}`);
      assert(result.states.join(',') === 'reconnecting,open,closed', result.states.join(','));
      assert(result.newId && result.pong === 'agent.pong', JSON.stringify(result));
    });

    await check('with --session-resume-secs a session survives a signalling drop: same session, same peer connection', async () => {
      await stop(server);
      server = start('server-resume', SERVER_BIN, [...serverArgs, '--session-resume-secs', '30']);
      await waitFor('server health', async () => (await fetch(`${HTTP}/healthz`)).ok, 20000);
      await waitFor('robot online again', async () => (await h.api('GET', `/v1/robots/${ROBOT}`)).body?.online === true, 20000);
      const other = await browser.newPage();
      await other.goto(`${HTTP}/healthz`);
      const result = await other.evaluate(async ({ ws, token, robot }) => {
        const { SignallingClient } = await import('/sdk/signalling-client.js');
        const sdk = await SignallingClient.connect({ url: ws, token, initialDelayMs: 100, maxDelayMs: 500 });
        let session;
        for (let i = 0; ; i++) {
          try {
            session = await sdk.openSession(robot, { timeoutMs: 5000 });
            break;
          } catch (e) {
            if (i >= 20) throw e;
            await new Promise((r) => setTimeout(r, 100 * (i + 1)));
          }
        }
        const firstSocket = sdk.connectionId;
        const states = [];
        sdk.on('state', (st) => states.push(st));
        // Drop the signalling socket only (what a flaky network does to a TCP connection).
        sdk.ws.close();
        const until = async (what, ok) => {
          for (let i = 0; i < 200 && !ok(); i++) await new Promise((r) => setTimeout(r, 50));
          if (!ok()) throw new Error(`timed out waiting for ${what}`);
        };
        await until('the socket back', () => sdk.state === 'open' && sdk.connectionId !== firstSocket);
        // The re-offer's answer: the robot answered the same session over the new socket.
        await until('the re-offer answered', () => session.state === 'open' && !session.restarting);
        const pong = await session.request({ type: 'agent.ping' });
        const result = { states, session: session.id, sessionState: session.state, pong: pong.type };
        await session.close();
        await sdk.close();
        return result;
      }, { ws: WS, token: tokens.alice, robot: ROBOT });
      await other.close();
      log(`SDK across a signalling drop: ${JSON.stringify(result)}`);
      assert(result.states.join(',').startsWith('reconnecting,open'), result.states.join(','));
      assert(result.sessionState === 'open' && result.pong === 'agent.pong', JSON.stringify(result));
      // One record for the session, ended only by the close at the end: it was never
      // ended by the drop, and the re-offer opened no second one.
      const records = (await h.api('GET', `/v1/sessions?robotId=${ROBOT}`)).body
        .filter((r) => r.connectionId === result.session);
      assert(records.length === 1, JSON.stringify(records));
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

if (figures.openMs !== undefined) console.log(`\nteleop page: click -> data channel open: ${figures.openMs} ms`);
if (figures.commandGapMs !== undefined) console.log(`keyboard drive: mean gap between commands at the driver ${figures.commandGapMs} ms (10 Hz = 100)`);
if (figures.video !== undefined) console.log(`video offered by the agent: ${figures.video}`);
console.log(`console e2e: ${h.passed} passed, ${h.failed} failed`);
process.exit(h.failed === 0 ? 0 : 1);
