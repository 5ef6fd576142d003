// Requests for approval: when a robot asks a person before it runs a tool and the program
// that called did not say it answers these itself, the ARP gateway puts the request before
// the robot's owners (GET /v1/confirmations). While a client is signed in this
// panel asks every second — one request at a time, slower after failures — and shows each
// request with what it would do, who asked, a countdown, and Approve / Deny.
import { $, h, api, request, auth, prettyJson } from '/console/ui.js';

const POLL_MS = 1000;
const MAX_BACKOFF_MS = 30000;
/** An answered or vanished request stays on screen this long (or until dismissed). */
const KEEP_DONE_MS = 30000;

const panel = $('#confirmations');
const list = $('#confirmations-list');
const status = $('#confirmations-status');
const announcer = $('#announcer');
const baseTitle = document.title;

/** Bumped on every start and stop: the answer to a poll of an earlier sign-in is dropped. */
let generation = 0;
let timer = null;
let ticker = null;
let failures = 0;
/** Server clock minus ours (ms), from the `Date` header; zero unless clearly off. */
let skew = 0;
/** id → card: {request, state: pending|answering|answered|gone|expired, el, parts, doneAt}. */
const cards = new Map();

export function startConfirmations() {
  stopConfirmations();
  const gen = generation;
  poll(gen);
  ticker = setInterval(tick, 250);
}

export function stopConfirmations() {
  generation += 1;
  clearTimeout(timer);
  clearInterval(ticker);
  timer = null;
  ticker = null;
  failures = 0;
  cards.clear();
  list.replaceChildren();
  status.textContent = '';
  panel.hidden = true;
  document.title = baseTitle;
}

/** One poll; the next is scheduled only when this one has finished (never two at once). */
async function poll(gen) {
  let delay = POLL_MS;
  try {
    const { data, response } = await request('GET', '/v1/confirmations');
    if (gen !== generation) return;
    const serverNow = Date.parse(response.headers.get('date') ?? '');
    if (Number.isFinite(serverNow)) {
      // The header has one-second resolution: only a clear difference is worth correcting.
      const diff = serverNow - Date.now();
      skew = Math.abs(diff) > 2000 ? diff : 0;
    }
    failures = 0;
    status.textContent = '';
    update(Array.isArray(data) ? data : []);
  } catch (err) {
    if (gen !== generation) return;
    failures += 1;
    delay = Math.min(MAX_BACKOFF_MS, POLL_MS * 2 ** failures);
    status.textContent = `Cannot check for requests (${err.message}); trying again in ${Math.round(delay / 1000)} s.`;
    redraw();
  }
  if (gen === generation) timer = setTimeout(() => poll(gen), delay);
}

function update(pending) {
  const seen = new Set();
  for (const req of pending) {
    if (typeof req?.id !== 'string') continue;
    seen.add(req.id);
    if (!cards.has(req.id)) {
      const card = makeCard(req);
      cards.set(req.id, card);
      list.append(card.el);
      announcer.textContent = `Approval needed: ${req.robotId} asks to run ${req.tool || req.action || 'an action'} for ${req.requestedBy}.`;
    }
  }
  for (const card of cards.values()) {
    if (card.state === 'pending' && !seen.has(card.request.id)) {
      finish(card, 'gone', 'No longer waiting: someone else answered it, or it expired.');
    }
  }
  redraw();
}

/** Shows the panel while it has something to say; the title counts open requests. */
function redraw() {
  const open = [...cards.values()].filter((c) => c.state === 'pending' || c.state === 'answering').length;
  $('#confirmations-count').textContent = open ? `(${open} waiting)` : '';
  panel.hidden = cards.size === 0 && failures < 2;
  document.title = open ? `(${open}) ${baseTitle}` : baseTitle;
}

function makeCard(req) {
  const id = req.id;
  const slug = `confirmation-${id.replace(/[^A-Za-z0-9_-]/g, '')}`;
  const own = req.requestedBy === auth.subject;
  const countdown = h('span', { class: 'countdown', 'data-testid': 'confirm-countdown' }, '');
  const result = h('p', { class: 'confirm-result', role: 'status', tabindex: -1, 'data-testid': 'confirm-result' },
    own ? 'Your own program asked: another operator or owner of this robot must answer.' : '');
  const approve = h('button', { type: 'button', 'data-testid': 'confirm-approve', 'aria-describedby': `${slug}-title` }, 'Approve');
  const deny = h('button', { type: 'button', class: 'danger', 'data-testid': 'confirm-deny', 'aria-describedby': `${slug}-title` }, 'Deny');
  const dismiss = h('button', { type: 'button', class: 'secondary', 'data-testid': 'confirm-dismiss', hidden: true }, 'Dismiss');
  const args = prettyJson(req.arguments);
  const level = req.safetyLevel || 'unspecified';
  const el = h('article', {
    class: 'card confirm-card', id: slug, 'aria-labelledby': `${slug}-title`,
    'data-confirmation': id, 'data-robot': req.robotId, 'data-testid': 'confirmation', 'data-state': 'pending',
  },
  h('h3', { id: `${slug}-title` }, req.tool ? `${req.robotId} asks to run ${req.tool}` : `${req.robotId}: ${req.action || 'an action'}`),
  h('dl', { class: 'facts' },
    h('dt', {}, 'Robot'), h('dd', { 'data-testid': 'confirm-robot' }, req.robotId),
    h('dt', {}, 'Action'), h('dd', { 'data-testid': 'confirm-action' }, req.action || '—'),
    h('dt', {}, 'Tool'), h('dd', {}, h('code', { 'data-testid': 'confirm-tool' }, req.tool || '—')),
    h('dt', {}, 'Safety level'), h('dd', {}, h('span', { class: `level level-${level.replace(/[^a-z]/g, '')}`, 'data-testid': 'confirm-level' }, level)),
    h('dt', {}, 'Asked by'), h('dd', { 'data-testid': 'confirm-requested-by' }, req.requestedBy),
    h('dt', {}, 'Asked at'), h('dd', {}, new Date(req.createdAt).toLocaleTimeString()),
    h('dt', {}, 'Time left'), h('dd', {}, countdown)),
  h('p', { class: 'muted params-label', id: `${slug}-params` }, 'Parameters'),
  h('pre', { class: 'params', 'aria-labelledby': `${slug}-params`, 'data-testid': 'confirm-arguments', tabindex: 0 }, args || '(none)'),
  own ? null : h('div', { class: 'row' }, approve, deny),
  result,
  dismiss);
  const card = { request: req, state: 'pending', el, parts: { countdown, result, approve, deny, dismiss }, doneAt: null, own };
  approve.addEventListener('click', () => answer(card, true));
  deny.addEventListener('click', () => answer(card, false));
  dismiss.addEventListener('click', () => remove(card));
  showCountdown(card);
  return card;
}

async function answer(card, confirmed) {
  if (card.state !== 'pending') return;
  const gen = generation;
  setState(card, 'answering');
  card.parts.result.textContent = confirmed ? 'Approving…' : 'Denying…';
  try {
    const res = await api('POST', `/v1/confirmations/${encodeURIComponent(card.request.id)}`, { confirmed });
    if (gen !== generation) return;
    finish(card, 'answered', res.confirmed
      ? `Approved by ${res.confirmedBy}: the robot goes ahead.`
      : `Denied by ${res.confirmedBy}: the robot refuses the call.`);
    card.el.dataset.answer = res.confirmed ? 'approved' : 'denied';
  } catch (err) {
    if (gen !== generation) return;
    if (err.status === 409) {
      finish(card, 'gone', 'Already answered or expired: your answer was not needed.');
    } else if (err.status === 403 || err.status === 404) {
      finish(card, 'gone', `Not answered: ${err.message}`);
    } else {
      setState(card, 'pending');
      card.parts.result.textContent = `Your answer was not sent (${err.message}). Try again.`;
    }
  }
  // The buttons are gone or disabled: keep keyboard focus on what happened.
  card.parts.result.focus({ preventScroll: true });
  redraw();
}

function setState(card, state) {
  card.state = state;
  card.el.dataset.state = state;
  const open = state === 'pending';
  card.parts.approve.disabled = !open;
  card.parts.deny.disabled = !open;
}

function finish(card, state, text) {
  setState(card, state);
  card.doneAt = Date.now();
  card.parts.result.textContent = text;
  card.parts.countdown.textContent = '—';
  card.parts.approve.hidden = true;
  card.parts.deny.hidden = true;
  card.parts.dismiss.hidden = false;
}

function remove(card) {
  cards.delete(card.request.id);
  card.el.remove();
  redraw();
}

function showCountdown(card) {
  const left = card.request.expiresAt - (Date.now() + skew);
  if (left <= 0) {
    finish(card, 'expired', 'Expired: nobody answered in time, so the robot refuses the call.');
    return;
  }
  const s = Math.ceil(left / 1000);
  card.parts.countdown.textContent = s >= 60 ? `${Math.floor(s / 60)} min ${s % 60} s` : `${s} s`;
  card.parts.countdown.dataset.seconds = String(s);
  card.parts.countdown.classList.toggle('soon', s <= 10);
}

function tick() {
  const now = Date.now();
  let changed = false;
  for (const card of [...cards.values()]) {
    if (card.state === 'pending' || card.state === 'answering') {
      const before = card.state;
      showCountdown(card);
      changed ||= card.state !== before;
    } else if (card.doneAt && now - card.doneAt > KEEP_DONE_MS && !card.el.contains(document.activeElement)) {
      remove(card);
    }
  }
  if (changed) redraw();
}
