// Pieces shared by the browser tests in this directory (e2e.mjs, sdpmid.mjs):
// the spec's JSON Schema validator, a bounded polling wait, and the flags
// headless Chromium runs with.

import { readFileSync, readdirSync, statSync } from 'node:fs';
import { join, dirname, resolve } from 'node:path';
import { fileURLToPath } from 'node:url';
import Ajv2020 from 'ajv/dist/2020.js';
import addFormats from 'ajv-formats';

const ROOT = resolve(dirname(fileURLToPath(import.meta.url)), '../..');

/** Polls `fn` until it returns a truthy value (returned) or the deadline passes (throws). */
export async function waitFor(what, fn, timeoutMs = 15000, everyMs = 25) {
  const deadline = Date.now() + timeoutMs;
  for (;;) {
    let value;
    try { value = await fn(); } catch { value = undefined; }
    if (value) return value;
    if (Date.now() > deadline) throw new Error(`timed out waiting for ${what}`);
    await new Promise((r) => setTimeout(r, everyMs));
  }
}

/**
 * A validator for every message type of the bundled spec: `validate(message)`
 * throws unless the message matches the schema of its `type`.
 */
export function loadSchemas() {
  const ajv = new Ajv2020({ strict: false, allErrors: true });
  addFormats(ajv);
  const base = join(ROOT, 'crates', 'protocol', 'spec', 'schemas');
  const byType = {};
  const walk = (dir) => {
    for (const entry of readdirSync(dir)) {
      const path = join(dir, entry);
      if (statSync(path).isDirectory()) { walk(path); continue; }
      if (!entry.endsWith('.json') || entry === 'index.json' || entry.includes('supported.keys')) continue;
      const schema = JSON.parse(readFileSync(path, 'utf8'));
      ajv.addSchema(schema);
      const rel = path.slice(base.length + 1).replace(/\.json$/, '').split('/');
      // agent/v0/location/create -> agent.location.create
      const type = [rel[0], ...rel.slice(2)].join('.');
      byType[type] = schema.$id;
    }
  };
  walk(base);
  return (message) => {
    const id = byType[message.type];
    if (!id) throw new Error(`no schema for ${message.type}`);
    const validate = ajv.getSchema(id);
    if (!validate(message)) {
      throw new Error(`${message.type} breaks the spec: ${JSON.stringify(validate.errors)}\n${JSON.stringify(message)}`);
    }
  };
}

/** Headless Chromium for WebRTC over loopback alone, nothing fetched in the background. */
export const CHROMIUM_ARGS = ['--headless', '--no-sandbox', '--disable-gpu', '--disable-quic', '--no-first-run',
  '--disable-background-networking', '--disable-component-update', '--disable-sync',
  '--allow-loopback-in-peer-connection', '--disable-features=WebRtcHideLocalIpsWithMdns'];
