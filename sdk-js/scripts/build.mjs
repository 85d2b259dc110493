// Builds dist/ (ESM, one-file IIFE, .d.ts); with --tests, also the unit tests into build/test.
// --no-types skips the declarations (the browser tests only need the bundles).
import { execFileSync } from 'node:child_process';
import { readdirSync, readFileSync, rmSync } from 'node:fs';
import { dirname, join } from 'node:path';
import { fileURLToPath } from 'node:url';
import * as esbuild from 'esbuild';

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

await Promise.all([
  esbuild.build({ ...common, entryPoints: ['src/index.ts'], format: 'esm', sourcemap: true,
                  outfile: 'dist/boxtrail.mjs' }),
  // The <script> build: every byte counts (budget: 4 KB min+gzip, tests/test_sdk_size.py).
  // Its map is written beside it without a sourceMappingURL comment in the file, and a
  // closure needs no "use strict" prologue.
  esbuild.build({ ...common, entryPoints: ['src/browser.ts'], format: 'iife',
                  minify: true, sourcemap: 'external', outfile: 'dist/boxtrail.js',
                  tsconfigRaw: { compilerOptions: { alwaysStrict: false } } }),
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
