// Bundle sizes of the browser SDK and its peers, each bundled the same way in this run:
// esbuild, bundle + minify, one IIFE for a <script> tag, target es2020, no source map.
// Each entry does what a page needs from its SDK: start it, log, capture console and
// errors. Prints JSON: {name: {version, minified, gzip, brotli}} (bytes; gzip level 9).
//
//   node benchmarks/bench_sdk.mjs        (run from the repository root; needs sdk-js/node_modules)

import { readFileSync } from 'node:fs';
import { createRequire } from 'node:module';
import { dirname, join } from 'node:path';
import { fileURLToPath } from 'node:url';
import zlib from 'node:zlib';

const sdkDir = join(dirname(fileURLToPath(import.meta.url)), '..', 'sdk-js');
const require = createRequire(join(sdkDir, 'package.json'));
const esbuild = require('esbuild');

const version = (name) => JSON.parse(readFileSync(join(sdkDir, 'node_modules', name, 'package.json'), 'utf8')).version;
const own = JSON.parse(readFileSync(join(sdkDir, 'package.json'), 'utf8')).version;

const entries = {
  boxtrail: {
    version: own,
    // The <script> entry bundled as the peers are (esbuild alone): a like-for-like row. The
    // shipped file (esbuild, then terser: sdk-js/scripts/build.mjs) is what bench_sdk.py reports.
    entryPoints: [join(sdkDir, 'src/browser.ts')],
    define: { __VERSION__: JSON.stringify(own) },
    tsconfigRaw: { compilerOptions: { alwaysStrict: false } },
  },
  '@datadog/browser-logs': {
    version: version('@datadog/browser-logs'),
    // datadogLogs.init({clientToken, site, forwardErrorsToLogs, forwardConsoleLogs}), logger.info(...)
    stdin: `import { datadogLogs } from '@datadog/browser-logs'; window.DD_LOGS = datadogLogs;`,
  },
  '@sentry/browser': {
    version: version('@sentry/browser'),
    // Sentry.init({dsn, enableLogs, integrations: [consoleLoggingIntegration()]}), logger.info(...)
    stdin: `import { init, logger, flush, setContext, consoleLoggingIntegration } from '@sentry/browser';
            window.Sentry = { init, logger, flush, setContext, consoleLoggingIntegration };`,
  },
};

const out = {};
for (const [name, { version: v, stdin, ...options }] of Object.entries(entries)) {
  const result = await esbuild.build({
    ...options,
    ...(stdin ? { stdin: { contents: stdin, resolveDir: sdkDir, loader: 'js' } } : {}),
    absWorkingDir: sdkDir,
    bundle: true,
    minify: true,
    format: 'iife',
    target: 'es2021',
    platform: 'browser',
    write: false,
    logLevel: 'error',
  });
  const code = result.outputFiles[0].contents;
  out[name] = {
    version: v,
    minified: code.length,
    gzip: zlib.gzipSync(code, { level: 9 }).length,
    brotli: zlib.brotliCompressSync(code).length,
  };
}
process.stdout.write(JSON.stringify(out) + '\n');
