// People in the loop, in real Chromium against the real signalling-server and a real
// robot-agent (sim driver, `drive` configured to need a person's yes):
//
//   a program (the browser SDK's ArpSession, in a page of its own, with an operator's token
//   and no `capabilities.confirmation`) calls `drive`; the robot asks for confirmation; the
//   gateway puts the request before people; the console of the robot's OWNER (another
//   subject, signed in with a client token) shows it; Approve runs the call, Deny fails it
//   with -40006 at the program, an answer after someone else's is a 409 the console explains;
//   the owner's per-robot e-stop fails a running call with -40007; the audit page lists the
//   calls with who approved them, pages with `next` and exports JSON lines; the admin's
//   fleet-wide e-stop (with its confirmation step) latches the robot's e-stop again.
// Any page error, console error, failed request or HTTP error on the console pages fails
// the test (except the ones a check provokes on purpose). Screenshots go to docs/console/
// unless CONSOLE_SCREENSHOTS=0.
//
// Runs inside a loopback-only network namespace (arp_console.sh). No sleeps as
// synchronisation: every wait is playwright's waiting or a bounded poll of a condition.

import { join } from 'node:path';
import { writeFileSync, readFileSync } from 'node:fs';
import { createServer } from 'node:net';
import { ROOT, SERVER_BIN, AGENT_BIN, Harness, waitFor, assert, log, run } from './lib.mjs';

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
const ADMIN = 'arp-console-e2e-admin-token-0123456789';
const ROBOT = 'arp-robot';
const IDLE = 'idle-robot';
const PROGRAM = 'planner'; // the program's subject: operator
const OWNER = 'olivia'; // the person who approves: owner
const OTHER_OWNER = 'bob'; // answers once through the API, before olivia's console does
const SHOTS = join(ROOT, 'docs', 'console');
const shoot = process.env.CONSOLE_SCREENSHOTS !== '0';
const WAIT = 15000;

const h = new Harness({ prefix: 'arp-console-e2e-', http: HTTP, admin: ADMIN });
const { work, check, start } = h;
const problems = [];
const started = Date.now();

async function screenshot(page, name) {
  if (shoot) await page.screenshot({ path: join(SHOTS, `${name}.png`), fullPage: false, type: 'png' });
}

/** A console page that records every JavaScript error, console error and failed request. */
async function watchedPage(browser, name) {
  const page = await browser.newPage();
  await page.setViewportSize({ width: 1100, height: 900 });
  page.on('pageerror', (e) => problems.push(`${name}: page error: ${e.message}`));
  page.on('console', (m) => {
    if (m.type() === 'error') problems.push(`${name}: console error: ${m.text()}`);
  });
  page.on('requestfailed', (r) => problems.push(`${name}: request failed: ${r.method()} ${r.url()} ${r.failure()?.errorText}`));
  page.on('response', (r) => {
    if (r.status() >= 400) problems.push(`${name}: HTTP ${r.status()}: ${r.request().method()} ${r.url()}`);
  });
  return page;
}

/** The 409 a check provoked on purpose (Chromium logs the failed load too), and nothing else. */
function expected409() {
  assert(problems.length > 0 && problems.every((p) => p.includes('409')), problems.join('; '));
  problems.length = 0;
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

/** The program: the SDK's ArpSession in a page of its own; calls run in the background. */
async function programPage(browser, token) {
  const page = await browser.newPage();
  page.on('pageerror', (e) => log(`program page error: ${e.message}`));
  await page.goto(`${HTTP}/healthz`);
  const server = await page.evaluate(async ({ http, robot, token: t }) => {
    const { ArpSession, arpUrl } = await import('/sdk/signalling-client.js');
    // No onConfirmation: the session declares confirmation: false, so people answer.
    const arp = await ArpSession.connect({ url: arpUrl(http, robot), token: t });
    window.arp = arp;
    window.calls = {};
    window.estops = [];
    arp.on('emergencyStop', (p) => window.estops.push(p));
    window.call = (name, tool, args) => {
      const c = { state: 'running', progress: [] };
      window.calls[name] = c;
      arp.callTool(tool, args, { onProgress: (p) => c.progress.push(p) }).then(
        (result) => { c.state = 'done'; c.result = result; },
        (e) => { c.state = 'error'; c.code = e.code; c.data = e.data; c.message = e.message; },
      );
    };
    return arp.server;
  }, { http: HTTP, robot: ROBOT, token });
  log(`program initialized: ${JSON.stringify(server.capabilities)}`);
  return {
    page,
    call: (name, tool, args) => page.evaluate(([n, t, a]) => window.call(n, t, a), [name, tool, args]),
    /** The call once it has ended (done or error). */
    ended: async (name, timeout = WAIT) => {
      await page.waitForFunction((n) => window.calls[n] && window.calls[n].state !== 'running', name, { timeout });
      return page.evaluate((n) => window.calls[n], name);
    },
    running: (name) => page.waitForFunction((n) => window.calls[n]?.progress.length > 0, name, { timeout: WAIT }),
    estops: () => page.evaluate(() => window.estops.length),
    now: (fn, arg) => page.evaluate(fn, arg),
  };
}

/** The card of the newest request for approval not yet answered. */
const waitingCard = (page) => page.locator('[data-testid="confirmation"][data-state="pending"]').last();

async function main() {
  const dbUrl = `sqlite://${join(work, 'server.db')}`;
  start('server', SERVER_BIN, ['--listen', `127.0.0.1:${PORT}`, '--admin-token', ADMIN, '--database-url', dbUrl]);
  await waitFor('server health', async () => (await fetch(`${HTTP}/healthz`)).ok);

  const tokens = {};
  let agentLog;
  /** How often robot-agent has latched its e-stop so far (its log says so each time). */
  const latches = () => (readFileSync(agentLog, 'utf8').match(/emergency stop requested; latched/g) ?? []).length;
  await check('setup: a robot-agent (sim) whose drive needs a person, online and serving ARP; grants and tokens', async () => {
    const created = await h.api('POST', '/v1/robots', { robotId: ROBOT, name: 'Rover with a person in the loop' });
    assert(created.status === 201 || created.status === 200, JSON.stringify(created));
    await h.api('POST', '/v1/robots', { robotId: IDLE });
    const configDir = join(work, 'agent');
    await run(AGENT_BIN, ['--config-dir', configDir, 'enroll', '--server', HTTP, '--robot-id', ROBOT, '--token', created.body.enrollmentToken]);
    writeFileSync(join(configDir, 'agent.toml'), [
      `server = "${WS}"`,
      `robot_id = "${ROBOT}"`,
      'driver = "sim"',
      '[reconnect]',
      'initial_delay_ms = 200',
      'max_delay_ms = 1000',
      '[arp]',
      'confirmation_timeout_secs = 60',
      '[arp.confirm]',
      'drive = true',
      '',
    ].join('\n'));
    agentLog = start('agent', AGENT_BIN, ['--config-dir', configDir, 'run']).logFile;
    await waitFor('robot online', async () => (await h.api('GET', `/v1/robots/${ROBOT}`)).body?.online === true, 20000);
    for (const [subject, role] of [[PROGRAM, 'operator'], [OWNER, 'owner'], [OTHER_OWNER, 'owner']]) {
      const g = await h.api('PUT', `/v1/robots/${ROBOT}/grants/${subject}`, { role });
      assert(g.status < 300, JSON.stringify(g));
      const t = await h.api('POST', '/v1/tokens', { subject, ttlSeconds: 3600 });
      assert(t.body?.token?.startsWith('sct_'), JSON.stringify(t));
      tokens[subject] = t.body.token;
    }
  });

  const browser = await h.browser();
  try {
    const owner = await watchedPage(browser, 'owner');
    // Every poll of the owner's console, and whether one was still out when the next left.
    const polls = { sent: 0, open: 0, overlapped: 0, hold: null };
    owner.on('request', (r) => {
      if (r.method() === 'GET' && r.url().endsWith('/v1/confirmations')) {
        polls.sent += 1;
        if (polls.open > 0) polls.overlapped += 1;
        polls.open += 1;
      }
    });
    const pollDone = (r) => {
      if (r.method() === 'GET' && r.url().endsWith('/v1/confirmations')) polls.open -= 1;
    };
    owner.on('requestfinished', pollDone);
    owner.on('requestfailed', pollDone);

    await check('the owner signs in with a client token: the robot with E-stop and Audit log, nothing to approve', async () => {
      await signIn(owner, tokens[OWNER], '#my-robots-table');
      const row = owner.locator(`#my-robots-table tr[data-robot="${ROBOT}"]`);
      await row.locator('.badge.on').waitFor();
      await row.locator('[data-testid="robot-estop"]').waitFor();
      await row.getByRole('link', { name: 'Audit log' }).waitFor();
      await waitFor('a few polls', () => polls.sent >= 2);
      assert(await owner.locator('#confirmations').isHidden(), 'no approval panel while nothing waits');
      noProblems('signing in');
    });

    let program;
    await check('a program (SDK ArpSession, operator, no confirmation capability) initializes and calls tools that need nobody', async () => {
      program = await programPage(browser, tokens[PROGRAM]);
      // A handful of quick calls: records enough for the audit page to page through.
      for (let i = 0; i < 10; i++) {
        await program.call(`list-${i}`, 'list_locations', {});
        const c = await program.ended(`list-${i}`);
        assert(c.state === 'done' && c.result.state === 'completed', JSON.stringify(c));
      }
    });

    const driveArgs = { linear: 0.2, angular: 0, durationSecs: 0.5 };
    await check('the robot asks before it drives: the owner\'s console shows robot, action, tool, parameters, level, who asked, a countdown', async () => {
      await program.call('approved', 'drive', driveArgs);
      const card = waitingCard(owner);
      await card.waitFor({ timeout: WAIT });
      await owner.getByRole('heading', { name: /Waiting for your approval/ }).waitFor();
      assert((await card.getByTestId('confirm-robot').textContent()) === ROBOT, 'robot');
      assert((await card.getByTestId('confirm-tool').textContent()) === 'drive', 'tool');
      assert((await card.getByTestId('confirm-requested-by').textContent()) === PROGRAM, 'requested by');
      assert((await card.getByTestId('confirm-level').textContent()) === 'elevated', await card.getByTestId('confirm-level').textContent());
      assert((await card.getByTestId('confirm-action').textContent()).length > 0, 'an action');
      const shown = JSON.parse(await card.getByTestId('confirm-arguments').textContent());
      const sorted = (o) => JSON.stringify(Object.fromEntries(Object.entries(o).sort()));
      assert(sorted(shown) === sorted(driveArgs), JSON.stringify(shown));
      assert(await card.getByTestId('confirm-arguments').evaluate((el) => el.children.length === 0), 'parameters are text only');
      // The countdown runs: it shows seconds and goes down.
      const countdown = card.getByTestId('confirm-countdown');
      const first = Number(await countdown.getAttribute('data-seconds'));
      assert(first > 40 && first <= 60, `countdown ${first}`);
      assert(/^(1 min )?\d+ s$/.test(await countdown.textContent()), await countdown.textContent());
      await owner.waitForFunction((n) => Number(document.querySelector('[data-testid="confirmation"][data-state="pending"] [data-testid="confirm-countdown"]').dataset.seconds) < n, first, { timeout: 3000 });
      await owner.waitForFunction(() => document.title.startsWith('(1)'));
      const approve = card.getByRole('button', { name: 'Approve' });
      assert(await approve.isEnabled(), 'approve enabled');
      await screenshot(owner, 'approval');
      const c = await program.now(() => window.calls.approved.state);
      assert(c === 'running', `the call waits for the person: ${c}`);
      noProblems('the prompt');
    });

    await check('Approve: the call runs and completes; the console says who approved it', async () => {
      const card = waitingCard(owner);
      const id = await card.getAttribute('data-confirmation');
      await card.getByTestId('confirm-approve').click();
      const answered = owner.locator(`[data-confirmation="${id}"]`);
      await answered.locator('[data-testid="confirm-result"]:has-text("Approved by olivia")').waitFor();
      assert((await answered.getAttribute('data-answer')) === 'approved', 'answered approved');
      // Focus stays on what happened, not lost with the buttons.
      assert(await answered.getByTestId('confirm-result').evaluate((el) => el === document.activeElement), 'focus on the result');
      const c = await program.ended('approved');
      assert(c.state === 'done' && c.result.state === 'completed', JSON.stringify(c));
      await owner.waitForFunction(() => !document.title.startsWith('('));
      noProblems('approving');
    });

    await check('Deny: the program\'s call fails with -40006', async () => {
      await program.call('denied', 'drive', { ...driveArgs, linear: 0.1 });
      const card = waitingCard(owner);
      await card.waitFor({ timeout: WAIT });
      const id = await card.getAttribute('data-confirmation');
      await card.getByTestId('confirm-deny').click();
      await owner.locator(`[data-confirmation="${id}"] [data-testid="confirm-result"]:has-text("Denied by olivia")`).waitFor();
      const c = await program.ended('denied');
      assert(c.state === 'error' && c.code === -40006, JSON.stringify(c));
      noProblems('denying');
    });

    await check('an answer after someone else\'s: 409, "already answered or expired"; one poll at a time', async () => {
      await program.call('by-bob', 'drive', driveArgs);
      const card = waitingCard(owner);
      await card.waitFor({ timeout: WAIT });
      const id = await card.getAttribute('data-confirmation');
      // Hold the console's next poll, so the card is still shown when bob's answer lands.
      const held = [];
      await owner.route('**/v1/confirmations', (route) => { held.push(route); });
      await waitFor('a poll held', () => held.length === 1);
      const bob = await fetch(`${HTTP}/v1/confirmations/${id}`, {
        method: 'POST',
        headers: { authorization: `Bearer ${tokens[OTHER_OWNER]}`, 'content-type': 'application/json' },
        body: JSON.stringify({ confirmed: true }),
      });
      assert(bob.status === 200, `bob answered ${bob.status}`);
      await card.getByTestId('confirm-approve').click();
      const answered = owner.locator(`[data-confirmation="${id}"]`);
      await answered.locator('[data-testid="confirm-result"]:has-text("Already answered or expired")').waitFor();
      expected409();
      // A window for a negative check: two of the console's one-second polls pass while one
      // is held; it must not send another.
      const t0 = await owner.evaluate(() => performance.now());
      await owner.waitForFunction((t) => performance.now() > t + 2500, t0);
      assert(held.length === 1, `${held.length} polls while one was out`);
      for (const route of held) await route.continue();
      await owner.unroute('**/v1/confirmations');
      const c = await program.ended('by-bob');
      assert(c.state === 'done' && c.result.state === 'completed', `bob's yes ran the call: ${JSON.stringify(c)}`);
      await answered.getByRole('button', { name: 'Dismiss' }).click();
      await answered.waitFor({ state: 'detached' });
      assert(polls.overlapped === 0, `${polls.overlapped} polls overlapped`);
      noProblems('the 409');
    });

    let exported;
    await check('the audit page: the approved calls with confirmedBy (olivia, bob), the denied one -40006; pages with next; JSON lines export', async () => {
      await owner.locator(`#my-robots-table tr[data-robot="${ROBOT}"]`).getByRole('link', { name: 'Audit log' }).click();
      await owner.getByRole('heading', { name: `Audit log: ${ROBOT}` }).waitFor();
      // Records are written in batches a moment after the calls end: ask again until the
      // last call is there.
      await waitFor('the three drives on record', async () => {
        await owner.locator('#audit-refresh').click();
        await owner.locator('#audit-summary:has-text("shown")').waitFor({ timeout: 2000 });
        return (await owner.locator('#audit-table tr[data-tool="drive"]').count()) === 3;
      }, WAIT, 250);
      const rows = await owner.locator('#audit-table tbody tr').evaluateAll((trs) => trs.map((tr) => ({
        action: tr.dataset.action, tool: tr.dataset.tool, outcome: tr.dataset.outcome,
        error: tr.querySelector('[data-col="error"]').textContent,
        by: tr.querySelector('[data-col="confirmed-by"]').textContent,
        subject: tr.children[1].textContent,
      })));
      log(`audit rows: ${JSON.stringify(rows.map((r) => `${r.action}/${r.tool}/${r.outcome}/${r.error}/${r.by}`))}`);
      const drives = rows.filter((r) => r.tool === 'drive');
      assert(drives.length === 3, JSON.stringify(drives));
      const [approved, denied, byBob] = drives;
      assert(approved.outcome === 'completed' && approved.by === OWNER && approved.subject === PROGRAM, JSON.stringify(approved));
      assert(denied.outcome === 'failed' && denied.error === '-40006', JSON.stringify(denied));
      assert(byBob.outcome === 'completed' && byBob.by === OTHER_OWNER, JSON.stringify(byBob));
      assert(!denied.by, `a denial names no approver: ${JSON.stringify(denied)}`);
      const total = rows.length;
      assert(total === 13, `${total} records`);
      await owner.locator('#audit-table').scrollIntoViewIfNeeded();
      await screenshot(owner, 'audit');

      // Paging: ten per page, then "Load more" follows `next` to the rest.
      await owner.locator('#audit-per-page').selectOption('10');
      await owner.locator('#audit-summary:has-text("10 records shown, oldest first; more below")').waitFor();
      assert((await owner.locator('#audit-table tbody tr').count()) === 10, 'first page');
      await owner.getByRole('button', { name: 'Load more' }).click();
      await waitFor('the second page', async () => (await owner.locator('#audit-table tbody tr').count()) === total);
      assert(await owner.getByRole('button', { name: 'Load more' }).isHidden(), 'no third page');
      const paged = await owner.locator('#audit-table tbody tr').evaluateAll((trs) => trs.map((tr) => tr.dataset.audit));
      assert(new Set(paged).size === paged.length, 'no record twice');

      // Export: every record as JSON lines, downloaded with the bearer token.
      const [download] = await Promise.all([
        owner.waitForEvent('download', { timeout: WAIT }),
        owner.getByRole('button', { name: 'Export (JSON lines)' }).click(),
      ]);
      assert(download.suggestedFilename() === `audit-${ROBOT}.jsonl`, download.suggestedFilename());
      const lines = readFileSync(await download.path(), 'utf8').split('\n').filter(Boolean).map((l) => JSON.parse(l));
      exported = lines.length;
      assert(lines.length >= total, `${lines.length} exported, ${total} shown`);
      assert(lines.some((l) => l.tool === 'drive' && l.confirmedBy === OWNER && l.outcome === 'completed'), 'the approved call exported');
      noProblems('the audit page');
    });

    // The e-stops come last: whatever they find, every check above has spoken. Each
    // reports on its own (a failure is counted, the next still runs).
    const alsoOnFailure = () => {};
    await owner.getByRole('link', { name: '← My robots' }).click();
    await owner.locator(`#my-robots-table tr[data-robot="${ROBOT}"] [data-testid="robot-estop"]`).waitFor();
    await check('the owner\'s per-robot e-stop fails a running call with -40007; the robot says it latched', async () => {
      await program.call('stopped', 'drive', { linear: 0.2, angular: 0, durationSecs: 20 });
      const card = waitingCard(owner);
      await card.waitFor({ timeout: WAIT });
      await card.getByTestId('confirm-approve').click();
      await program.running('stopped');
      const before = await program.estops();
      const latched = latches();
      await owner.locator(`#my-robots-table tr[data-robot="${ROBOT}"] [data-testid="robot-estop"]`).click();
      await owner.locator('#estop-result[data-result="sent"]').waitFor();
      noProblems('the API took the stop');
      // The API answered 202: the robot must now latch, and the running call fail.
      await waitFor('robot-agent latches its e-stop', () => latches() > latched, 5000).catch(() => {
        throw new Error(`POST /v1/robots/${ROBOT}/emergency-stop answered 202 (stop sent), but robot-agent never latched its e-stop and the drive runs on`);
      });
      const c = await program.ended('stopped', 5000);
      assert(c.state === 'error' && c.code === -40007, JSON.stringify(c));
      await waitFor('the arp.emergencyStop notification', async () => (await program.estops()) > before);
      // An operator resets it (the program, here), so the admin's stop below latches anew.
      await program.call('reset', 'reset_emergency_stop', {});
      const r = await program.ended('reset');
      assert(r.state === 'done' && r.result.result?.reset === true, JSON.stringify(r));
      noProblems('per-robot e-stop');
    }).catch(alsoOnFailure);

    const admin = await watchedPage(browser, 'admin');
    await check('the admin\'s fleet e-stop: a confirmation step, then a line per robot; the robot latches its e-stop', async () => {
      await signIn(admin, ADMIN, '#robots-table');
      await admin.locator(`tr[data-robot="${ROBOT}"] .badge.on`).waitFor();
      problems.length = 0; // what a failed check before left behind is its own failure
      const before = await program.estops();
      const latched = latches();
      await admin.getByTestId('fleet-estop').click();
      await admin.locator('#fleet-estop-question:has-text("Stop 1 online robot")').waitFor();
      assert((await program.estops()) === before, 'nothing stopped before the confirmation');
      await admin.getByTestId('fleet-estop-cancel').click();
      assert(await admin.getByTestId('fleet-estop-confirm').isHidden(), 'cancelled');
      await admin.getByTestId('fleet-estop').click();
      await admin.getByTestId('fleet-estop-confirm').click();
      await admin.getByTestId('fleet-estop-summary').waitFor();
      assert((await admin.getByTestId('fleet-estop-summary').textContent()) === 'Stop sent to 1 of 1 online robot.', await admin.getByTestId('fleet-estop-summary').textContent());
      await admin.locator(`#fleet-estop-results li[data-robot="${ROBOT}"][data-result="sent"]`).waitFor();
      await admin.locator(`#fleet-estop-results li[data-robot="${IDLE}"][data-result="skipped"]`).waitFor();
      await screenshot(admin, 'fleet-estop');
      noProblems('the API took the stop');
      await waitFor('robot-agent latches its e-stop', () => latches() > latched, 5000).catch(() => {
        throw new Error(`the fleet stop sent POST /v1/robots/${ROBOT}/emergency-stop (202), but robot-agent never latched its e-stop`);
      });
      await waitFor('the arp.emergencyStop notification', async () => (await program.estops()) > before);
      // Latched: the reset finds it so (`reset: wasLatched`).
      await program.call('after-fleet-stop', 'reset_emergency_stop', {});
      const r = await program.ended('after-fleet-stop');
      assert(r.state === 'done' && r.result.result?.reset === true, `the e-stop was latched: ${JSON.stringify(r)}`);
      noProblems('fleet e-stop');
    }).catch(alsoOnFailure);

    await check('the admin\'s robot page: its own e-stop (409 for an offline robot) and the audit log', async () => {
      await admin.getByRole('link', { name: IDLE, exact: true }).click();
      await admin.getByRole('button', { name: `Emergency stop ${IDLE}` }).click();
      await admin.locator('#estop-result[data-result="refused"]:has-text("offline")').waitFor();
      expected409();
      await admin.getByRole('link', { name: '← All robots' }).click();
      await admin.getByRole('link', { name: ROBOT, exact: true }).click();
      await admin.getByRole('link', { name: 'Audit log' }).click();
      await waitFor('the admin\'s stop on record', async () => {
        await admin.locator('#audit-refresh').click();
        await admin.locator('#audit-summary:has-text("shown")').waitFor({ timeout: 2000 });
        return (await admin.locator('#audit-table tr[data-action="emergency_stop"]:has-text("admin")').count()) === 1;
      }, WAIT, 250);
      noProblems('admin robot page');
    });

    await check('the owner signs out: the polling stops', async () => {
      await owner.getByRole('button', { name: 'Sign out' }).click();
      await owner.getByRole('heading', { name: 'Sign in' }).waitFor();
      await waitFor('the last poll answered', () => polls.open === 0);
      const sent = polls.sent;
      // A window for a negative check: three poll periods.
      const t0 = await owner.evaluate(() => performance.now());
      await owner.waitForFunction((t) => performance.now() > t + 3000, t0);
      assert(polls.sent === sent, `${polls.sent - sent} polls after signing out`);
      assert(await owner.locator('#confirmations').isHidden(), 'panel hidden');
      noProblems('sign out');
    });
    await program.page.evaluate(() => window.arp.close());
    log(`exported ${exported} records`);
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

console.log(`arp console e2e: ${h.passed} passed, ${h.failed} failed in ${((Date.now() - started) / 1000).toFixed(1)} s`);
process.exit(h.failed === 0 ? 0 : 1);
