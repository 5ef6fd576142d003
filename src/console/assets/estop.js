// Emergency stops through the API (POST /v1/robots/{id}/emergency-stop, owners and the
// admin): the robot's ARP server latches its e-stop, running calls fail -40007, and the
// stop is on record. One robot at once, or every online robot (the admin, after a
// confirmation step). The API answers 409 for a robot that is offline or does not serve ARP.
import { h, api } from '/console/ui.js';

const path = (robotId) => `/v1/robots/${encodeURIComponent(robotId)}/emergency-stop`;

/** What one stop came to: {robotId, ok, text}. */
async function stopOne(robotId) {
  try {
    await api('POST', path(robotId));
    return { robotId, ok: true, text: 'stop sent' };
  } catch (err) {
    const text = err.status === 409 ? `not stopped: ${err.message} (offline, or it does not serve ARP)` : `not stopped: ${err.message}`;
    return { robotId, ok: false, text };
  }
}

/** A per-robot e-stop button; its result goes to `out` (a status element) when given. */
export function robotStopButton(robotId, out) {
  const button = h('button', {
    type: 'button', class: 'danger estop-one', 'data-testid': 'robot-estop', 'data-robot': robotId,
    'aria-label': `Emergency stop ${robotId}`,
  }, 'E-stop');
  // No second question: stopping is always the safe side, and it must be quick.
  button.addEventListener('click', async () => {
    button.disabled = true;
    const result = await stopOne(robotId);
    button.disabled = false;
    if (out) {
      out.textContent = `${robotId}: ${result.text}.`;
      out.dataset.result = result.ok ? 'sent' : 'refused';
    }
  });
  return button;
}

/**
 * The admin's stop for the whole fleet: a button, a confirmation step naming how many
 * robots it stops, then one stop per online robot (all at once) and a line per robot.
 * The list is fetched afresh when asked and again when confirmed, so a robot that came
 * online in between is stopped too.
 */
export function fleetStopCard() {
  const results = h('ul', { id: 'fleet-estop-results', class: 'results', 'aria-live': 'polite' });
  const question = h('p', { id: 'fleet-estop-question' });
  const yes = h('button', { type: 'button', class: 'danger', 'data-testid': 'fleet-estop-confirm' }, 'Yes, stop them');
  const no = h('button', { type: 'button', class: 'secondary', 'data-testid': 'fleet-estop-cancel' }, 'Cancel');
  const confirmStep = h('div', { class: 'confirm-step', role: 'group', 'aria-labelledby': 'fleet-estop-question', hidden: true },
    question, h('div', { class: 'row' }, yes, no));
  const start = h('button', { type: 'button', class: 'estop estop-fleet', 'data-testid': 'fleet-estop', 'aria-controls': 'fleet-estop-results' },
    'EMERGENCY STOP ALL ROBOTS');

  let asked = [];
  start.addEventListener('click', async () => {
    try {
      asked = await api('GET', '/v1/robots');
    } catch (err) {
      results.replaceChildren(h('li', { class: 'bad' }, `Cannot list the robots: ${err.message}`));
      return;
    }
    const online = asked.filter((r) => r.online);
    results.replaceChildren();
    question.textContent = online.length
      ? `Stop ${online.length} online robot${online.length === 1 ? '' : 's'} now (${online.map((r) => r.robotId).join(', ')})? Each stays stopped until someone resets it.`
      : 'No robot is online: there is nothing to stop.';
    yes.hidden = !online.length;
    confirmStep.hidden = false;
    (online.length ? yes : no).focus();
  });
  no.addEventListener('click', () => {
    confirmStep.hidden = true;
    start.focus();
  });
  yes.addEventListener('click', async () => {
    confirmStep.hidden = true;
    start.disabled = true;
    let all = asked;
    try {
      all = await api('GET', '/v1/robots');
    } catch { /* the list shown in the question will do */ }
    const online = all.filter((r) => r.online);
    results.replaceChildren(h('li', {}, `Stopping ${online.length} robot${online.length === 1 ? '' : 's'}…`));
    const done = await Promise.all(online.map((r) => stopOne(r.robotId)));
    start.disabled = false;
    const skipped = all.filter((r) => !r.online).map((r) => ({ robotId: r.robotId, ok: false, skipped: true, text: 'offline: skipped' }));
    results.replaceChildren(...[...done, ...skipped].map((r) => h('li', {
      'data-robot': r.robotId, 'data-result': r.ok ? 'sent' : r.skipped ? 'skipped' : 'refused',
      class: r.ok ? 'ok' : r.skipped ? 'muted' : 'bad',
    }, h('strong', {}, r.robotId), `: ${r.text}`)));
    const sent = done.filter((r) => r.ok).length;
    results.prepend(h('li', { 'data-testid': 'fleet-estop-summary' },
      `Stop sent to ${sent} of ${online.length} online robot${online.length === 1 ? '' : 's'}.`));
  });

  return h('section', { class: 'card', 'aria-labelledby': 'fleet-estop-title' },
    h('h3', { id: 'fleet-estop-title' }, 'Emergency stop: the whole fleet'),
    h('p', { class: 'muted' }, 'Latches the e-stop of every online robot that serves ARP; running calls fail. Operators reset each robot afterwards.'),
    start, confirmStep, results);
}
