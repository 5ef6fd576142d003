// A robot's audit log (owners and the admin): what programs did through the ARP gateway,
// who approved it, every emergency stop and takeover. The API gives it oldest first in
// pages; "Load more" follows `next`. The export downloads the same records as JSON lines
// (`?format=jsonl`, every page), fetched with the bearer token and saved from a Blob.
import { h, api, auth, show, act, when } from '/console/ui.js';

const PAGE_SIZES = [10, 50, 200];
const EXPORT_PAGE = 10000;

/** `datetime-local` text → Unix ms (the reader's time zone), or undefined. */
const ms = (input) => (input.value ? new Date(input.value).getTime() : undefined);

export function auditPage(view, robotId, backHref, backLabel) {
  const path = `/v1/robots/${encodeURIComponent(robotId)}/audit`;
  const from = h('input', { id: 'audit-from', type: 'datetime-local' });
  const to = h('input', { id: 'audit-to', type: 'datetime-local' });
  const perPage = h('select', { id: 'audit-per-page' }, ...PAGE_SIZES.map((n) => h('option', { value: n, selected: n === 50 }, n)));
  const body = h('tbody');
  const summary = h('p', { class: 'muted', id: 'audit-summary', role: 'status' }, 'Loading…');
  const more = h('button', { type: 'button', class: 'secondary', id: 'audit-more', hidden: true }, 'Load more');
  let next = null;
  let shown = 0;

  const query = (extra) => {
    const q = new URLSearchParams(extra);
    if (ms(from) !== undefined) q.set('from', String(ms(from)));
    if (ms(to) !== undefined) q.set('to', String(ms(to)));
    return q;
  };

  const row = (r) => h('tr', { 'data-audit': r.id, 'data-action': r.action, 'data-tool': r.tool ?? '', 'data-outcome': r.outcome },
    h('td', {}, h('time', { datetime: new Date(r.at).toISOString() }, when(r.at))),
    h('td', {}, r.subject),
    h('td', { class: 'wide' }, r.role),
    h('td', {}, r.action),
    h('td', {}, r.tool ? h('code', {}, r.tool) : '—'),
    h('td', { 'data-col': 'outcome' }, h('span', { class: `outcome outcome-${r.outcome.replace(/[^a-z_]/g, '')}` }, r.outcome)),
    h('td', { 'data-col': 'error' }, r.errorCode ?? ''),
    h('td', { class: 'num' }, r.durationMs === undefined ? '' : `${r.durationMs} ms`),
    h('td', { 'data-col': 'confirmed-by' }, r.confirmedBy ?? ''),
    h('td', { class: 'wide' }, r.params ? h('details', {}, h('summary', {}, 'parameters'), h('pre', { class: 'params' }, r.params)) : ''));

  /**
   * The first page again (`reset`, which drops any load still under way) or the page after
   * the last one shown.
   */
  let seq = 0;
  let busy = false;
  const load = async (reset) => {
    if (!reset && (busy || !next)) return;
    const mine = ++seq;
    busy = true;
    more.disabled = true;
    try {
      const q = query({ limit: perPage.value });
      if (!reset) q.set('after', next);
      const page = await api('GET', `${path}?${q}`);
      if (mine !== seq) return;
      if (reset) {
        body.replaceChildren();
        shown = 0;
      }
      body.append(...page.records.map(row));
      shown += page.records.length;
      next = page.next ?? null;
      more.hidden = !next;
      if (!shown) body.replaceChildren(h('tr', {}, h('td', { colspan: 10, class: 'muted' }, 'Nothing on record.')));
      summary.textContent = `${shown} record${shown === 1 ? '' : 's'} shown, oldest first${next ? '; more below' : ''}.`;
    } catch (err) {
      if (mine !== seq) return;
      summary.textContent = '';
      show(err.status === 403 ? 'Only the robot\'s owners and the admin see its audit log.' : `Audit log: ${err.message}`);
    } finally {
      if (mine === seq) {
        busy = false;
        more.disabled = false;
      }
    }
  };
  more.addEventListener('click', () => load(false));
  perPage.addEventListener('change', () => load(true));

  const exportButton = h('button', { type: 'button', id: 'audit-export', onclick: act(async () => {
    exportButton.disabled = true;
    try {
      const lines = [];
      let after = null;
      // Every page of the same selection, following the cursor the server puts in a header.
      for (;;) {
        const q = query({ format: 'jsonl', limit: String(EXPORT_PAGE) });
        if (after) q.set('after', after);
        const response = await fetch(`${path}?${q}`, { headers: { authorization: `Bearer ${auth.token}` } });
        if (!response.ok) throw new Error(`export refused (HTTP ${response.status})`);
        lines.push(await response.text());
        after = response.headers.get('x-next-cursor');
        if (!after) break;
      }
      const blob = new Blob(lines, { type: 'application/x-ndjson' });
      const url = URL.createObjectURL(blob);
      const a = h('a', { href: url, download: `audit-${robotId.replace(/[^A-Za-z0-9._-]/g, '_')}.jsonl`, hidden: true });
      document.body.append(a);
      a.click();
      a.remove();
      setTimeout(() => URL.revokeObjectURL(url), 60000);
      show(`Exported the audit log of ${robotId}.`, 'info');
    } finally {
      exportButton.disabled = false;
    }
  }) }, 'Export (JSON lines)');

  view.append(
    h('p', {}, h('a', { href: backHref }, backLabel)),
    h('h2', {}, `Audit log: ${robotId}`),
    h('p', { class: 'muted' }, 'What programs did through the ARP gateway, who approved it, and every emergency stop and takeover.'),
    h('form', { class: 'row', onsubmit: (e) => { e.preventDefault(); load(true); } },
      h('label', { for: 'audit-from' }, 'From', from),
      h('label', { for: 'audit-to' }, 'To', to),
      h('label', { for: 'audit-per-page' }, 'Per page', perPage),
      h('button', { type: 'submit', id: 'audit-refresh' }, 'Show'),
      exportButton),
    summary,
    h('div', { class: 'table-wrap' }, h('table', { id: 'audit-table' },
      h('thead', {}, h('tr', {}, ...[['Time'], ['Subject'], ['Role', 'wide'], ['Action'], ['Tool'], ['Outcome'], ['Error'], ['Duration'], ['Confirmed by'], ['Parameters', 'wide']]
        .map(([c, cls]) => h('th', { scope: 'col', class: cls }, c)))),
      body)),
    h('p', {}, more),
  );
  load(true);
}
