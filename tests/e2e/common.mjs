// The helpers the stand-alone browser tests (sdpmid.mjs, legacy.mjs) use, from the one
// shared module (lib.mjs): the spec's schema validator, a bounded polling wait, and the
// flags headless Chromium runs with.
export { loadSchemas, waitFor, CHROMIUM_ARGS } from './lib.mjs';
