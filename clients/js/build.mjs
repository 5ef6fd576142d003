// Builds dist/: the minified ES module (esbuild) and its type declarations (tsc, which
// also type-checks). `--check` fails when the committed dist/ differs: the server embeds
// dist/signalling-client.js, so it must match src/. Both build into a scratch folder; a
// build copies only what changed into dist/, so an unchanged file keeps its time and cargo
// does not rebuild the server (which embeds it) after every `npm test`.
import { execFileSync } from 'node:child_process';
import { copyFileSync, existsSync, mkdirSync, mkdtempSync, readFileSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join, dirname } from 'node:path';
import { fileURLToPath } from 'node:url';
import { gzipSync } from 'node:zlib';
import { build } from 'esbuild';

const here = dirname(fileURLToPath(import.meta.url));
const check = process.argv.includes('--check');
const out = mkdtempSync(join(tmpdir(), 'sdk-dist-'));
const files = ['signalling-client.js', 'signalling-client.d.ts'];

execFileSync(join(here, 'node_modules', '.bin', 'tsc'), ['-p', join(here, 'tsconfig.json'), '--outDir', out], { stdio: 'inherit' });
await build({
  entryPoints: [join(here, 'src', 'signalling-client.ts')],
  outfile: join(out, 'signalling-client.js'),
  bundle: true,
  format: 'esm',
  target: 'es2020',
  minify: true,
  legalComments: 'none',
  banner: { js: '// @signalling/client (MIT): browser SDK of the robot signalling server' },
});

const js = readFileSync(join(out, 'signalling-client.js'));
console.log(`signalling-client.js: ${js.length} bytes minified, ${gzipSync(js).length} bytes gzipped`);

const dist = join(here, 'dist');
const differs = (f) =>
  !existsSync(join(dist, f)) || !readFileSync(join(dist, f)).equals(readFileSync(join(out, f)));
if (check) {
  let stale = false;
  for (const f of files.filter(differs)) {
    console.error(`clients/js/dist/${f} is out of date: run \`npm run build\` in clients/js and commit it`);
    stale = true;
  }
  rmSync(out, { recursive: true, force: true });
  if (stale) process.exit(1);
  console.log('dist/ matches src/');
} else {
  mkdirSync(dist, { recursive: true });
  for (const f of files.filter(differs)) copyFileSync(join(out, f), join(dist, f));
  rmSync(out, { recursive: true, force: true });
}
