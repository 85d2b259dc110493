// Builds dist/ (ESM, one-file IIFE, .d.ts); with --tests, also the unit tests into build/test.
// --no-types skips the declarations (the browser tests only need the bundles).
import { execFileSync } from 'node:child_process';
import { mkdirSync, readdirSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import { dirname, join } from 'node:path';
import { fileURLToPath } from 'node:url';
import * as esbuild from 'esbuild';
import { minify } from 'terser';

const root = join(dirname(fileURLToPath(import.meta.url)), '..');
const { version } = JSON.parse(readFileSync(join(root, 'package.json'), 'utf8'));
const args = new Set(process.argv.slice(2));
const common = {
  absWorkingDir: root,
  bundle: true,
  target: 'es2021',
  define: { __VERSION__: JSON.stringify(version) },
  logLevel: 'warning',
};

/** The <script> build: every byte counts (budget: tests/test_sdk_size.py). esbuild bundles and
 * minifies; terser then minifies its output again, which took the file from 4,191 to 4,020
 * bytes gzipped (as the test measures): 116 of them from names chosen to compress, most of
 * the rest from inlining functions called once. The map goes through both and is written
 * beside the file, with no sourceMappingURL comment in it; a closure needs no "use strict"
 * prologue. */
async function script() {
  const { outputFiles } = await esbuild.build({
    ...common, entryPoints: ['src/browser.ts'], format: 'iife', minify: true,
    sourcemap: 'external', outfile: 'dist/boxtrail.js', write: false,
    // Internal members (client, transport) end in `_` (src/client.ts): 13 bytes gzipped.
    mangleProps: /_$/,
    tsconfigRaw: { compilerOptions: { alwaysStrict: false } },
  });
  const [js, map] = ['.js', '.js.map'].map((end) => outputFiles.find((f) => f.path.endsWith(end)));
  const out = await minify(js.text, {
    ecma: 2021,
    sourceMap: { content: map.text, filename: 'boxtrail.js' },
    // \u escapes, as esbuild writes them: a page that serves the file without a charset
    // would read UTF-8 `…` as three other characters.
    format: { ascii_only: true },
  });
  mkdirSync(join(root, 'dist'), { recursive: true });
  writeFileSync(join(root, 'dist/boxtrail.js'), out.code);
  writeFileSync(join(root, 'dist/boxtrail.js.map'), out.map);
}

await Promise.all([
  // Left as written, names and all: the page's own bundler minifies it.
  esbuild.build({ ...common, entryPoints: ['src/index.ts'], format: 'esm', sourcemap: true,
                  outfile: 'dist/boxtrail.mjs' }),
  script(),
]);
if (!args.has('--no-types')) {
  rmSync(join(root, 'dist/types'), { recursive: true, force: true });
  execFileSync(join(root, 'node_modules/.bin/tsc'), ['-p', 'tsconfig.build.json'], { cwd: root, stdio: 'inherit' });
}
if (args.has('--tests')) {
  rmSync(join(root, 'build/test'), { recursive: true, force: true });
  const tests = readdirSync(join(root, 'test')).filter((f) => f.endsWith('.test.ts'));
  await esbuild.build({ ...common, entryPoints: tests.map((f) => `test/${f}`), format: 'esm',
                        platform: 'node', outdir: 'build/test', outExtension: { '.js': '.mjs' },
                        sourcemap: 'inline' });
}
