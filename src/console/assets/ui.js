// What every part of the console shares: building DOM (text nodes only, never innerHTML),
// the notice line, who is signed in, the HTTP API with the bearer token, and formatting.

export const $ = (sel, root = document) => root.querySelector(sel);
const notice = $('#notice');

/** `h('tag', {attrs}, children...)`: builds DOM with text nodes only, never innerHTML. */
export function h(tag, attrs = {}, ...children) {
  const el = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs)) {
    if (v === undefined || v === null || v === false) continue;
    if (k.startsWith('on')) el.addEventListener(k.slice(2), v);
    else if (k === 'class') el.className = v;
    else if (v === true) el.setAttribute(k, '');
    else el.setAttribute(k, String(v));
  }
  for (const c of children.flat()) {
    if (c === null || c === undefined || c === false) continue;
    el.append(c instanceof Node ? c : document.createTextNode(String(c)));
  }
  return el;
}

export function show(message, kind = 'error') {
  notice.textContent = message;
  notice.className = kind === 'error' ? 'notice' : 'notice info';
  notice.hidden = !message;
}

export const TOKEN_KEY = 'console.token';

export const auth = {
  token: sessionStorage.getItem(TOKEN_KEY),
  kind: null, // 'admin' | 'client'
  subject: null,
};

export class HttpError extends Error {
  constructor(status, body) {
    super(body?.message || `HTTP ${status}`);
    this.status = status;
    this.code = body?.error;
  }
}

/** One API call with the bearer token: the parsed body and the response (for headers). */
export async function request(method, path, body) {
  const response = await fetch(path, {
    method,
    headers: {
      authorization: `Bearer ${auth.token}`,
      ...(body === undefined ? {} : { 'content-type': 'application/json' }),
    },
    body: body === undefined ? undefined : JSON.stringify(body),
  });
  const text = await response.text();
  let data = null;
  try {
    data = text ? JSON.parse(text) : null;
  } catch {
    if (response.ok) throw new HttpError(response.status, { message: 'the server answered something that is not JSON' });
  }
  if (!response.ok) throw new HttpError(response.status, data);
  return { data, response };
}

export async function api(method, path, body) {
  return (await request(method, path, body)).data;
}

/** Wraps an action: shows its failure, never leaves an unhandled rejection. */
export const act = (fn) => async (e) => {
  e?.preventDefault?.();
  try {
    show('');
    await fn(e);
  } catch (err) {
    show(err.message || String(err));
  }
};

/** ISO text or Unix milliseconds, in the reader's locale. */
export const when = (t) => (t || t === 0 ? new Date(t).toLocaleString() : '—');
export const ago = (iso) => {
  if (!iso) return 'never';
  const s = Math.max(0, Math.round((Date.now() - new Date(iso).getTime()) / 1000));
  if (s < 60) return `${s} s ago`;
  if (s < 3600) return `${Math.round(s / 60)} min ago`;
  if (s < 86400) return `${Math.round(s / 3600)} h ago`;
  return when(iso);
};
export const badge = (online) => h('span', { class: `badge ${online ? 'on' : 'off'}` }, online ? 'online' : 'offline');

/** JSON text pretty-printed; what does not parse is shown as it came. */
export function prettyJson(text) {
  if (text === undefined || text === null || text === '') return '';
  try {
    return JSON.stringify(JSON.parse(text), null, 2);
  } catch {
    return String(text);
  }
}
