// Builds dist/: the minified ES module (esbuild) and its type declarations (tsc, which
// also type-checks). `--check` builds into a scratch folder and fails when the committed
// dist/ differs: the server embeds dist/signalling-client.js, so it must match src/.
import { execFileSync } from 'node:child_process';
import { mkdtempSync, readFileSync, rmSync, existsSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join, dirname } from 'node:path';
import { fileURLToPath } from 'node:url';
import { gzipSync } from 'node:zlib';
import { build } from 'esbuild';

const here = dirname(fileURLToPath(import.meta.url));
const check = process.argv.includes('--check');
const out = check ? mkdtempSync(join(tmpdir(), 'sdk-dist-')) : join(here, 'dist');
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

if (check) {
  let stale = false;
  for (const f of files) {
    const committed = join(here, 'dist', f);
    if (!existsSync(committed) || !readFileSync(committed).equals(readFileSync(join(out, f)))) {
      console.error(`clients/js/dist/${f} is out of date: run \`npm run build\` in clients/js and commit it`);
      stale = true;
    }
  }
  rmSync(out, { recursive: true, force: true });
  if (stale) process.exit(1);
  console.log('dist/ matches src/');
}
