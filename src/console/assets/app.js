// The web console: plain ES module, no framework. It uses only the public HTTP API and the
// browser SDK the server ships (/sdk/signalling-client.js). Hash routes:
//   #/robots, #/robots/ID, #/tokens, #/sessions   (admin token)
//   #/my-robots                                   (client token or JWT)
//   #/teleop/ID                                   (client token or JWT)
//   #/audit/ID                                    (admin, or an owner of ID)
// Beside the views: requests for approval (people.js) while a client is signed in.
import { SignallingClient } from '/sdk/signalling-client.js';
import { $, h, show, auth, api, act, when, ago, badge, TOKEN_KEY } from '/console/ui.js';
import { startConfirmations, stopConfirmations } from '/console/people.js';
import { auditPage } from '/console/audit.js';
import { fleetStopCard, robotStopButton } from '/console/estop.js';

const view = $('#view');
const REFRESH_MS = 2000;

const wsUrl = () => `${location.protocol === 'https:' ? 'wss' : 'ws'}://${location.host}/ws`;

async function copy(text, button) {
  try {
    await navigator.clipboard.writeText(text);
    button.textContent = 'Copied';
  } catch {
    // Clipboard access needs a secure context: select the text for a manual copy instead.
    const range = document.createRange();
    range.selectNodeContents(button.previousElementSibling);
    getSelection().removeAllRanges();
    getSelection().addRange(range);
    button.textContent = 'Selected: press Ctrl+C';
  }
}

// ---------- sign in ----------

/** Client tokens start with sct_, JWTs have three dot-separated parts; anything else is admin. */
const looksLikeClientToken = (t) => t.startsWith('sct_') || t.split('.').length === 3;

async function signIn(token) {
  auth.token = token;
  if (looksLikeClientToken(token)) {
    const me = await api('GET', '/v1/me');
    auth.kind = 'client';
    auth.subject = me.subject;
    startConfirmations();
  } else {
    await api('GET', '/v1/robots');
    auth.kind = 'admin';
    auth.subject = 'admin';
  }
  sessionStorage.setItem(TOKEN_KEY, token);
}

function signOut() {
  stopConfirmations();
  sessionStorage.removeItem(TOKEN_KEY);
  auth.token = null;
  auth.kind = null;
  leaveView();
  location.hash = '';
  render();
}

$('#sign-in-form').addEventListener('submit', async (e) => {
  e.preventDefault();
  const token = $('#token').value.trim();
  try {
    await signIn(token);
    $('#token').value = '';
    show('');
    location.hash = auth.kind === 'admin' ? '#/robots' : '#/my-robots';
    render();
  } catch (err) {
    auth.token = null;
    show(err.status === 401 ? 'That token was refused.' : `Sign-in failed: ${err.message}`);
  }
});
$('#sign-out').addEventListener('click', signOut);

// ---------- routing ----------

let cleanup = [];
function leaveView() {
  for (const fn of cleanup.splice(0)) {
    try { fn(); } catch { /* best effort */ }
  }
}
/** Runs `fn` now and every REFRESH_MS while the view is shown. */
function every(fn, ms = REFRESH_MS) {
  fn();
  const timer = setInterval(fn, ms);
  cleanup.push(() => clearInterval(timer));
}

const ADMIN_NAV = [['#/robots', 'Robots'], ['#/tokens', 'Tokens'], ['#/sessions', 'Sessions']];
const CLIENT_NAV = [['#/my-robots', 'My robots']];

function renderChrome() {
  const signedIn = Boolean(auth.kind);
  $('#sign-in').hidden = signedIn;
  $('#nav').hidden = !signedIn;
  $('#who').hidden = !signedIn;
  if (!signedIn) return;
  $('#who-name').textContent = auth.kind === 'admin' ? 'admin' : `signed in as ${auth.subject}`;
  const links = $('#nav-links');
  links.replaceChildren(...(auth.kind === 'admin' ? ADMIN_NAV : CLIENT_NAV).map(([href, label]) => {
    const current = location.hash.startsWith(href);
    return h('li', {}, h('a', { href, 'aria-current': current ? 'page' : null }, label));
  }));
}

function render() {
  leaveView();
  view.replaceChildren();
  renderChrome();
  if (!auth.kind) return;
  const [, route, arg] = location.hash.split('/');
  const id = arg ? decodeURIComponent(arg) : null;
  const routes = auth.kind === 'admin'
    ? {
      robots: id ? () => robotPage(id) : robotsPage,
      tokens: tokensPage,
      sessions: sessionsPage,
      audit: () => auditPage(view, id, `#/robots/${encodeURIComponent(id)}`, `← Robot ${id}`),
    }
    : {
      'my-robots': myRobotsPage,
      teleop: () => teleopPage(id),
      audit: () => auditPage(view, id, '#/my-robots', '← My robots'),
    };
  const page = routes[route];
  if (!page || (route === 'audit' && !id)) {
    location.hash = auth.kind === 'admin' ? '#/robots' : '#/my-robots';
    return;
  }
  page();
  $('#main').focus({ preventScroll: true });
}
window.addEventListener('hashchange', render);

// ---------- admin: robots ----------

function robotsPage() {
  const search = h('input', { id: 'robot-search', type: 'search', placeholder: 'id or name', 'aria-controls': 'robots-table' });
  const body = h('tbody');
  const created = h('div', { 'aria-live': 'polite' });
  let robots = [];
  const draw = () => {
    const q = search.value.trim().toLowerCase();
    const rows = robots.filter((r) => !q || r.robotId.toLowerCase().includes(q) || (r.name ?? '').toLowerCase().includes(q));
    body.replaceChildren(...rows.map((r) => h('tr', { 'data-robot': r.robotId },
      h('td', {}, h('a', { href: `#/robots/${encodeURIComponent(r.robotId)}` }, r.robotId)),
      h('td', { class: 'wide' }, r.name ?? ''),
      h('td', {}, badge(r.online)),
      h('td', {}, h('span', { title: when(r.lastSeenAt) }, r.online ? 'now' : ago(r.lastSeenAt))),
      h('td', { class: 'wide' }, r.credential ?? 'not enrolled', r.credentialRevoked ? ' (revoked)' : ''),
    )));
    if (!rows.length) body.append(h('tr', {}, h('td', { colspan: 5, class: 'muted' }, robots.length ? 'No robot matches.' : 'No robots yet.')));
  };
  search.addEventListener('input', draw);
  const idInput = h('input', { id: 'new-robot-id', name: 'robotId', required: true, pattern: '[A-Za-z0-9._:\\-]{1,128}', autocomplete: 'off' });
  const nameInput = h('input', { id: 'new-robot-name', name: 'name', autocomplete: 'off' });
  const form = h('form', { class: 'row', onsubmit: act(async () => {
    const robotId = idInput.value.trim();
    const res = await api('POST', '/v1/robots', { robotId, ...(nameInput.value.trim() ? { name: nameInput.value.trim() } : {}) });
    created.replaceChildren(enrollmentBox(robotId, res.enrollmentToken, res.enrollmentTokenExpiresAt));
    idInput.value = '';
    nameInput.value = '';
    await refresh();
  }) },
  h('label', { for: 'new-robot-id' }, 'Robot id', idInput),
  h('label', { for: 'new-robot-name' }, 'Name (optional)', nameInput),
  h('button', { type: 'submit' }, 'Create robot'));
  const refresh = async () => {
    try {
      robots = await api('GET', '/v1/robots');
      draw();
    } catch (err) {
      show(`Robots: ${err.message}`);
    }
  };
  view.append(
    h('h2', {}, 'Robots'),
    fleetStopCard(),
    h('section', { class: 'card', 'aria-labelledby': 'create-title' }, h('h3', { id: 'create-title' }, 'Create a robot'), form, created),
    h('div', { class: 'row' }, h('label', { for: 'robot-search' }, 'Search', search)),
    h('div', { class: 'table-wrap' }, h('table', { id: 'robots-table' },
      h('caption', { class: 'muted' }, 'Online state refreshes every 2 s'),
      h('thead', {}, h('tr', {}, h('th', { scope: 'col' }, 'Robot'), h('th', { scope: 'col', class: 'wide' }, 'Name'),
        h('th', { scope: 'col' }, 'State'), h('th', { scope: 'col' }, 'Last seen'), h('th', { scope: 'col', class: 'wide' }, 'Credential'))),
      body)),
  );
  every(refresh);
}

/** The one-time enrollment token and the exact command that uses it. */
function enrollmentBox(robotId, token, expiresAt) {
  const command = `robot-agent enroll --server ${location.origin} --robot-id ${robotId} --token ${token}`;
  const pre = h('pre', { class: 'command', id: 'enroll-command' }, command);
  const button = h('button', { type: 'button', class: 'secondary' }, 'Copy command');
  button.addEventListener('click', () => copy(command, button));
  return h('div', { class: 'card secret', role: 'status' },
    h('p', {}, h('strong', {}, `Enrollment token for ${robotId}`), ` (single use, expires ${when(expiresAt)}). It is shown only now. On the robot, run:`),
    pre, button);
}

function robotPage(id) {
  const facts = h('dl', { class: 'facts' });
  const grantsBody = h('tbody');
  const enrollment = h('div', { 'aria-live': 'polite' });
  const estopResult = h('p', { id: 'estop-result', role: 'status' });
  const path = `/v1/robots/${encodeURIComponent(id)}`;
  const refresh = async () => {
    try {
      const r = await api('GET', path);
      facts.replaceChildren(
        h('dt', {}, 'State'), h('dd', { id: 'robot-state' }, badge(r.online)),
        h('dt', {}, 'Name'), h('dd', {}, r.name ?? '—'),
        h('dt', {}, 'Last seen'), h('dd', {}, when(r.lastSeenAt)),
        h('dt', {}, 'Credential'), h('dd', {}, r.credential ?? 'not enrolled', r.credentialRevoked ? ' (revoked)' : ''),
        h('dt', {}, 'Node'), h('dd', {}, r.node ?? '—'),
        h('dt', {}, 'Created'), h('dd', {}, when(r.createdAt)),
      );
    } catch (err) {
      if (err.status === 404) {
        location.hash = '#/robots';
        return;
      }
      show(err.message);
    }
  };
  const refreshGrants = async () => {
    const grants = await api('GET', `${path}/grants`);
    grantsBody.replaceChildren(...grants.map((g) => {
      const select = roleSelect(g.role, `role-${g.subject}`);
      select.setAttribute('aria-label', `Role of ${g.subject}`);
      select.addEventListener('change', act(async () => {
        await api('PUT', `${path}/grants/${encodeURIComponent(g.subject)}`, { role: select.value });
        show(`${g.subject} is now ${select.value}.`, 'info');
      }));
      return h('tr', { 'data-subject': g.subject },
        h('td', {}, g.subject),
        h('td', {}, select),
        h('td', { class: 'wide' }, when(g.createdAt)),
        h('td', {}, h('button', { type: 'button', class: 'secondary', 'aria-label': `Remove grant of ${g.subject}`, onclick: act(async () => {
          await api('DELETE', `${path}/grants/${encodeURIComponent(g.subject)}`);
          await refreshGrants();
        }) }, 'Remove')));
    }));
    if (!grants.length) grantsBody.append(h('tr', {}, h('td', { colspan: 4, class: 'muted' }, 'No grants: nobody may open a session.')));
  };
  const subject = h('input', { id: 'grant-subject', required: true, maxlength: 256, autocomplete: 'off' });
  const role = roleSelect('operator', 'grant-role');
  view.append(
    h('p', {}, h('a', { href: '#/robots' }, '← All robots')),
    h('h2', {}, `Robot ${id}`),
    h('section', { class: 'card' }, facts),
    h('section', { class: 'card', 'aria-labelledby': 'arp-title' },
      h('h3', { id: 'arp-title' }, 'Programs and safety'),
      h('div', { class: 'row' },
        robotStopButton(id, estopResult),
        h('a', { href: `#/audit/${encodeURIComponent(id)}`, class: 'audit-link' }, 'Audit log')),
      estopResult),
    h('section', { class: 'card', 'aria-labelledby': 'grants-title' },
      h('h3', { id: 'grants-title' }, 'Grants'),
      h('div', { class: 'table-wrap' }, h('table', { id: 'grants-table' },
        h('thead', {}, h('tr', {}, h('th', { scope: 'col' }, 'Subject'), h('th', { scope: 'col' }, 'Role'), h('th', { scope: 'col', class: 'wide' }, 'Since'), h('th', { scope: 'col' }, ''))),
        grantsBody)),
      h('h3', {}, 'Add a grant'),
      h('form', { class: 'row', onsubmit: act(async () => {
        await api('PUT', `${path}/grants/${encodeURIComponent(subject.value.trim())}`, { role: role.value });
        subject.value = '';
        await refreshGrants();
      }) },
      h('label', { for: 'grant-subject' }, 'Subject', subject),
      h('label', { for: 'grant-role' }, 'Role', role),
      h('button', { type: 'submit' }, 'Grant'))),
    h('section', { class: 'card', 'aria-labelledby': 'cred-title' },
      h('h3', { id: 'cred-title' }, 'Credentials'),
      h('div', { class: 'row' },
        h('button', { type: 'button', id: 'new-enrollment', onclick: act(async () => {
          const t = await api('POST', `${path}/enrollment-token`);
          enrollment.replaceChildren(enrollmentBox(id, t.enrollmentToken, t.expiresAt));
        }) }, 'New enrollment token'),
        h('button', { type: 'button', class: 'danger', onclick: act(async () => {
          if (!confirm(`Revoke ${id}'s key for good? Its connection and sessions end now.`)) return;
          await api('POST', `${path}/revoke`);
          show(`${id}: credential revoked.`, 'info');
          await refresh();
        }) }, 'Revoke credential'),
        h('button', { type: 'button', class: 'danger', onclick: act(async () => {
          if (!confirm(`Delete ${id} and its grants?`)) return;
          await api('DELETE', path);
          location.hash = '#/robots';
        }) }, 'Delete robot')),
      enrollment),
  );
  every(refresh);
  refreshGrants().catch((err) => show(err.message));
}

function roleSelect(value, id) {
  const s = h('select', { id }, ...['viewer', 'operator', 'owner'].map((r) => h('option', { value: r, selected: r === value }, r)));
  return s;
}

// ---------- admin: tokens ----------

function tokensPage() {
  const subject = h('input', { id: 'token-subject', required: true, maxlength: 256, autocomplete: 'off' });
  const hours = h('input', { id: 'token-hours', type: 'number', min: 1, max: 8784, value: 24 });
  const created = h('div', { 'aria-live': 'polite' });
  const body = h('tbody');
  const refresh = async () => {
    const tokens = await api('GET', '/v1/tokens');
    body.replaceChildren(...tokens.map((t) => h('tr', { 'data-token': t.tokenId },
      h('td', {}, h('code', {}, t.tokenId)),
      h('td', {}, t.subject),
      h('td', { class: 'wide' }, when(t.expiresAt)),
      h('td', {}, t.revokedAt ? `revoked ${when(t.revokedAt)}` : new Date(t.expiresAt) < new Date() ? 'expired' : 'valid'),
      h('td', {}, t.revokedAt ? '' : h('button', { type: 'button', class: 'secondary', 'aria-label': `Revoke token ${t.tokenId}`, onclick: act(async () => {
        await api('DELETE', `/v1/tokens/${encodeURIComponent(t.tokenId)}`);
        await refresh();
      }) }, 'Revoke')))));
    if (!tokens.length) body.append(h('tr', {}, h('td', { colspan: 5, class: 'muted' }, 'No client tokens yet.')));
  };
  view.append(
    h('h2', {}, 'Client tokens'),
    h('section', { class: 'card', 'aria-labelledby': 'new-token-title' },
      h('h3', { id: 'new-token-title' }, 'Create a client token'),
      h('form', { class: 'row', onsubmit: act(async () => {
        const t = await api('POST', '/v1/tokens', { subject: subject.value.trim(), ttlSeconds: Math.round(Number(hours.value) * 3600) });
        const code = h('code', { id: 'new-token' }, t.token);
        const button = h('button', { type: 'button', class: 'secondary' }, 'Copy token');
        button.addEventListener('click', () => copy(t.token, button));
        created.replaceChildren(h('div', { class: 'card secret', role: 'status' },
          h('p', {}, h('strong', { id: 'new-token-for' }, `Token for ${t.subject}`), ` (expires ${when(t.expiresAt)}). It is shown only now.`),
          h('p', {}, code, ' ', button)));
        subject.value = '';
        await refresh();
      }) },
      h('label', { for: 'token-subject' }, 'Subject', subject),
      h('label', { for: 'token-hours' }, 'Valid for (hours)', hours),
      h('button', { type: 'submit' }, 'Create token')),
      created),
    h('div', { class: 'table-wrap' }, h('table', { id: 'tokens-table' },
      h('thead', {}, h('tr', {}, h('th', { scope: 'col' }, 'Token id'), h('th', { scope: 'col' }, 'Subject'), h('th', { scope: 'col', class: 'wide' }, 'Expires'), h('th', { scope: 'col' }, 'State'), h('th', { scope: 'col' }, ''))),
      body)),
  );
  refresh().catch((err) => show(err.message));
}

// ---------- admin: sessions ----------

function sessionsPage() {
  const filter = h('select', { id: 'session-filter' },
    h('option', { value: '' }, 'all'), h('option', { value: 'true' }, 'live'), h('option', { value: 'false' }, 'ended'));
  const robot = h('input', { id: 'session-robot', type: 'search', autocomplete: 'off' });
  const subject = h('input', { id: 'session-subject', type: 'search', autocomplete: 'off' });
  const body = h('tbody');
  const refresh = async () => {
    const q = new URLSearchParams({ limit: '200' });
    if (filter.value) q.set('active', filter.value);
    if (robot.value.trim()) q.set('robotId', robot.value.trim());
    if (subject.value.trim()) q.set('subject', subject.value.trim());
    try {
      const sessions = await api('GET', `/v1/sessions?${q}`);
      body.replaceChildren(...sessions.map((s) => h('tr', { 'data-session': s.connectionId },
        h('td', {}, s.robotId),
        h('td', {}, s.subject),
        h('td', {}, s.role),
        h('td', {}, when(s.startedAt)),
        h('td', { class: 'wide' }, when(s.connectedAt)),
        h('td', {}, s.endedAt ? when(s.endedAt) : h('span', { class: 'badge on' }, 'live')),
        h('td', {}, s.endReason ?? ''),
        h('td', { class: 'wide' }, h('code', { title: s.connectionId }, s.connectionId.slice(0, 8))))));
      if (!sessions.length) body.append(h('tr', {}, h('td', { colspan: 8, class: 'muted' }, 'No sessions.')));
    } catch (err) {
      show(`Sessions: ${err.message}`);
    }
  };
  for (const input of [filter, robot, subject]) input.addEventListener('input', refresh);
  view.append(
    h('h2', {}, 'Sessions'),
    h('div', { class: 'row' },
      h('label', { for: 'session-filter' }, 'Show', filter),
      h('label', { for: 'session-robot' }, 'Robot', robot),
      h('label', { for: 'session-subject' }, 'Subject', subject)),
    h('div', { class: 'table-wrap' }, h('table', { id: 'sessions-table' },
      h('caption', { class: 'muted' }, 'Newest first; refreshes every 2 s'),
      h('thead', {}, h('tr', {}, ...['Robot', 'Subject', 'Role', 'Started', 'Connected', 'Ended', 'End reason', 'Session'].map((c, i) =>
        h('th', { scope: 'col', class: i === 4 || i === 7 ? 'wide' : null }, c)))),
      body)),
  );
  every(refresh);
}

// ---------- client: my robots ----------

function myRobotsPage() {
  const body = h('tbody');
  const estopResult = h('p', { id: 'estop-result', role: 'status' });
  let shown = null;
  const refresh = async () => {
    try {
      const robots = await api('GET', '/v1/me/robots');
      // Redrawn only when what it shows changes, so a focused button stays focused.
      const seen = JSON.stringify(robots.map((r) => [r.robotId, r.name, r.online, r.role, r.online || ago(r.lastSeenAt)]));
      if (seen === shown) return;
      shown = seen;
      body.replaceChildren(...robots.map((r) => h('tr', { 'data-robot': r.robotId },
        h('td', {}, r.robotId, r.name ? h('span', { class: 'muted' }, ` ${r.name}`) : ''),
        h('td', {}, badge(r.online)),
        h('td', {}, r.online ? 'now' : ago(r.lastSeenAt)),
        h('td', {}, r.role),
        h('td', { class: 'actions' },
          h('a', { href: `#/teleop/${encodeURIComponent(r.robotId)}`, class: 'teleop-link' }, r.role === 'viewer' ? 'Watch' : 'Drive'),
          // Owners see what programs did on their robot, and stop it through the API.
          r.role === 'owner' ? [
            h('a', { href: `#/audit/${encodeURIComponent(r.robotId)}`, class: 'audit-link' }, 'Audit log'),
            r.online ? robotStopButton(r.robotId, estopResult) : null,
          ] : null))));
      if (!robots.length) body.append(h('tr', {}, h('td', { colspan: 5, class: 'muted' }, 'You hold no grants yet.')));
    } catch (err) {
      show(err.message);
    }
  };
  view.append(
    h('h2', {}, 'My robots'),
    estopResult,
    h('div', { class: 'table-wrap' }, h('table', { id: 'my-robots-table' },
      h('thead', {}, h('tr', {}, ...['Robot', 'State', 'Last seen', 'Your role', ''].map((c) => h('th', { scope: 'col' }, c)))),
      body)),
  );
  every(refresh);
}

// ---------- client: teleop ----------

const KEYS = {
  KeyW: [1, 0], ArrowUp: [1, 0], KeyS: [-1, 0], ArrowDown: [-1, 0],
  KeyA: [0, 1], ArrowLeft: [0, 1], KeyD: [0, -1], ArrowRight: [0, -1],
};

function teleopPage(robotId) {
  const status = h('p', { id: 'teleop-status', role: 'status' }, 'Connecting…');
  const video = h('video', { id: 'teleop-video', autoplay: true, playsinline: true, muted: true, 'aria-label': `Video of ${robotId}` });
  video.muted = true;
  const placeholder = h('div', { class: 'placeholder' }, 'No video from this robot');
  const stats = h('dl', { class: 'facts stats', id: 'teleop-stats' });
  const caps = h('dd', { id: 'teleop-caps' }, '—');
  const controls = h('section', { class: 'card', id: 'drive', 'aria-labelledby': 'drive-title', hidden: true });
  const knob = h('div', { class: 'knob' });
  const stick = h('div', { class: 'joystick', role: 'application', 'aria-label': 'Joystick: drag to drive' }, knob);
  const keyCells = Object.fromEntries(['KeyW', 'KeyA', 'KeyS', 'KeyD'].map((k) => [k, h('span', {}, k.slice(3))]));
  const speed = h('input', { id: 'speed', type: 'range', min: 0.1, max: 1, step: 0.1, value: 0.5 });
  const estop = h('button', { type: 'button', class: 'estop', id: 'estop', 'aria-pressed': 'false', 'aria-keyshortcuts': 'Space' }, 'EMERGENCY STOP');
  const release = h('button', { type: 'button', class: 'secondary', id: 'estop-release', hidden: true }, 'Release emergency stop');
  const sent = h('span', { id: 'moves-sent' }, '0');

  controls.append(
    h('h3', { id: 'drive-title' }, 'Drive'),
    h('p', { class: 'muted' }, 'W A S D or the arrow keys, the joystick, or a gamepad. Space: emergency stop.'),
    estop, release,
    h('div', { class: 'keys', 'aria-hidden': 'true' }, h('i'), keyCells.KeyW, h('i'), keyCells.KeyA, keyCells.KeyS, keyCells.KeyD),
    stick,
    h('label', { for: 'speed' }, 'Speed ', speed),
    h('p', { class: 'muted' }, 'Commands sent: ', sent),
  );
  view.append(
    h('p', {}, h('a', { href: '#/my-robots' }, '← My robots')),
    h('h2', {}, `Teleop: ${robotId}`),
    status,
    h('div', { class: 'teleop' },
      h('div', {},
        h('div', { class: 'video-box' }, video, placeholder),
        h('section', { class: 'card', 'aria-labelledby': 'stats-title' },
          h('h3', { id: 'stats-title' }, 'Link'), stats,
          h('dl', { class: 'facts' }, h('dt', {}, 'Capabilities'), caps))),
      controls),
  );

  let client = null;
  let session = null;
  let drives = false; // operators and owners; a viewer's page sends no commands at all
  let closed = false;
  const input = { keys: new Set(), stick: [0, 0], pad: [0, 0] };
  let moving = false;
  let count = 0;

  const setStatus = (text) => { status.textContent = text; };

  // Keyboard: held keys drive; Space is the emergency stop wherever focus is.
  const onKey = (e) => {
    if (!session || !drives || (e.target instanceof HTMLInputElement && e.target.type !== 'range')) return;
    if (e.code === 'Space' && e.type === 'keydown') {
      e.preventDefault();
      engage();
      return;
    }
    if (!KEYS[e.code]) return;
    e.preventDefault();
    if (e.type === 'keydown') input.keys.add(e.code);
    else input.keys.delete(e.code);
    const cell = keyCells[e.code];
    if (cell) cell.classList.toggle('down', e.type === 'keydown');
  };
  const onBlur = () => input.keys.clear();
  document.addEventListener('keydown', onKey);
  document.addEventListener('keyup', onKey);
  window.addEventListener('blur', onBlur);
  cleanup.push(() => {
    document.removeEventListener('keydown', onKey);
    document.removeEventListener('keyup', onKey);
    window.removeEventListener('blur', onBlur);
  });

  // On-screen joystick (pointer events: mouse, touch, pen).
  const stickMove = (e) => {
    const r = stick.getBoundingClientRect();
    const radius = r.width / 2;
    let x = (e.clientX - r.left - radius) / radius;
    let y = (e.clientY - r.top - radius) / radius;
    const len = Math.hypot(x, y);
    if (len > 1) { x /= len; y /= len; }
    input.stick = [-y, -x];
    knob.style.transform = `translate(${x * radius * 0.7}px, ${y * radius * 0.7}px)`;
  };
  const stickEnd = () => {
    input.stick = [0, 0];
    knob.style.transform = '';
  };
  stick.addEventListener('pointerdown', (e) => { stick.setPointerCapture(e.pointerId); stickMove(e); });
  stick.addEventListener('pointermove', (e) => { if (stick.hasPointerCapture(e.pointerId)) stickMove(e); });
  stick.addEventListener('pointerup', stickEnd);
  stick.addEventListener('pointercancel', stickEnd);

  function engage() {
    if (!session || !drives) return;
    try {
      session.emergencyStop();
    } catch (err) {
      show(`Emergency stop could not be sent: ${err.message}`);
    }
    estop.setAttribute('aria-pressed', 'true');
    release.hidden = false;
    setStatus('Emergency stop engaged: driving is blocked until you release it.');
  }
  estop.addEventListener('click', engage);
  release.addEventListener('click', act(async () => {
    await session.resetEmergencyStop();
    estop.setAttribute('aria-pressed', 'false');
    release.hidden = true;
    setStatus('Connected. You may drive.');
  }));

  // 10 Hz: one command per tick while any input is active, one zero command on release.
  const tick = () => {
    if (!session || !drives || session.state !== 'open' || session.emergencyStopped) return;
    const pads = navigator.getGamepads ? [...navigator.getGamepads()].filter(Boolean) : [];
    const pad = pads[0];
    const dead = (v) => (Math.abs(v) < 0.15 ? 0 : v);
    input.pad = pad ? [dead(-pad.axes[1] || 0), dead(-pad.axes[0] || 0)] : [0, 0];
    if (pad && pad.buttons[1]?.pressed) { engage(); return; }
    let forward = input.stick[0] + input.pad[0];
    let turn = input.stick[1] + input.pad[1];
    for (const k of input.keys) {
      forward += KEYS[k][0];
      turn += KEYS[k][1];
    }
    const scale = Number(speed.value);
    forward = Math.max(-1, Math.min(1, forward)) * scale;
    turn = Math.max(-1, Math.min(1, turn)) * scale;
    const active = forward !== 0 || turn !== 0;
    if (!active && !moving) return;
    try {
      if (active) session.move({ forward, turn });
      else session.stop();
      count += 1;
      sent.textContent = String(count);
    } catch { /* the channel closed: the state handler reports it */ }
    moving = active;
  };

  const fmt = (v, unit, digits = 0) => (typeof v === 'number' && Number.isFinite(v) ? `${v.toFixed(digits)} ${unit}` : '—');
  const showStats = async () => {
    if (!session || session.state === 'closed') return;
    try {
      const s = await session.stats();
      stats.replaceChildren(
        h('dt', {}, 'RTT'), h('dd', { id: 'stat-rtt' }, fmt(s.rttMs, 'ms', 1)),
        h('dt', {}, 'Bitrate in'), h('dd', {}, fmt(s.bitrateIn !== undefined ? s.bitrateIn / 1000 : undefined, 'kbit/s')),
        h('dt', {}, 'Frames/s'), h('dd', { id: 'stat-fps' }, fmt(s.framesPerSecond, 'fps')),
        h('dt', {}, 'Resolution'), h('dd', {}, s.frameWidth ? `${s.frameWidth}×${s.frameHeight}` : '—'),
        h('dt', {}, 'Candidates'), h('dd', { id: 'stat-candidate' }, s.localCandidateType ? `${s.localCandidateType} → ${s.remoteCandidateType}` : '—'),
      );
    } catch { /* closed meanwhile */ }
  };

  (async () => {
    let role = 'viewer';
    try {
      const mine = await api('GET', '/v1/me/robots');
      const grant = mine.find((r) => r.robotId === robotId);
      if (!grant) throw new Error(`You hold no grant on ${robotId}.`);
      role = grant.role;
      client = await SignallingClient.connect({ url: wsUrl(), token: auth.token });
      if (closed) { client.close(); return; }
      client.on('state', (s) => {
        if (s === 'reconnecting') setStatus('Signalling connection lost; reconnecting (the session continues)…');
        if (s === 'open' && session?.state === 'open') setStatus('Connected.');
      });
      setStatus('Opening a session…');
      session = await client.openSession(robotId, { video: true });
      if (closed) { session.close(); return; }
      window.consoleSession = session; // for tests and the curious
      drives = role === 'operator' || role === 'owner';
      controls.hidden = !drives;
      setStatus(drives ? `Connected as ${role}. You may drive.` : 'Connected as viewer: you can watch, not drive.');
      session.on('video', (stream) => {
        video.srcObject = stream;
        placeholder.hidden = true;
      });
      if (session.video) {
        video.srcObject = session.video;
        placeholder.hidden = true;
      }
      const showCaps = () => {
        if (session.capabilities) caps.textContent = JSON.stringify(session.capabilities);
      };
      showCaps();
      session.on('message', (m) => {
        if (m.type === 'agent.capabilities') showCaps();
        if (m.type === 'agent.error' && m.payload?.details?.reason === 'emergency_stop') {
          setStatus('The robot reports an emergency stop (latched on the robot).');
        }
      });
      session.on('error', (e) => show(`${e.code}${e.reason ? ` (${e.reason})` : ''}: ${e.message}`));
      session.on('state', (s, reason) => {
        if (s === 'reconnecting') setStatus('Link interrupted; restarting ICE…');
        if (s === 'open') setStatus('Connected.');
        if (s === 'closed') {
          controls.hidden = true;
          setStatus(`Session ended (${reason}).`);
        }
      });
      every(tick, 100);
      every(showStats, 1000);
    } catch (err) {
      const why = err.code === 'FORBIDDEN' && err.reason === 'robot_busy' ? 'Another operator is driving this robot.'
        : err.reason === 'robot_offline' ? 'The robot is offline.'
          : err.message;
      setStatus(`Could not open a session: ${why}`);
      show(`${err.code ? `${err.code}${err.reason ? ` (${err.reason})` : ''}: ` : ''}${err.message}`);
    }
  })();

  cleanup.push(() => {
    closed = true;
    input.keys.clear();
    try { session?.state === 'open' && session.stop(); } catch { /* closed */ }
    session?.close();
    client?.close();
    window.consoleSession = undefined;
  });
}

// ---------- start ----------

(async () => {
  if (auth.token) {
    try {
      await signIn(auth.token);
    } catch {
      sessionStorage.removeItem(TOKEN_KEY);
      auth.token = null;
      auth.kind = null;
    }
  }
  render();
})();
