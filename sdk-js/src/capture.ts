/**
 * What the SDK listens to: console methods (the original still prints), uncaught
 * errors, unhandled rejections, and optionally failed fetch / XHR requests.
 * Every hook hands its findings to `record`, which never throws.
 */

import type { ConsoleMethod, Level } from './types';

/** One event: `parts` joined like console arguments; `error` an Error or `{name, message, stack}`
 * (by default the first Error among the parts and attribute values). */
export type Recorder = (level: Level, parts: unknown[], attrs?: Record<string, unknown>,
                         error?: unknown) => void;

export const CONSOLE_METHODS: ConsoleMethod[] = ['debug', 'log', 'info', 'warn', 'error'];

export function captureConsole(methods: ConsoleMethod[], record: Recorder): void {
  for (const m of methods) {
    const original = console[m];
    if (typeof original != 'function') continue;
    console[m] = function (this: unknown, ...args: unknown[]) {
      original.apply(this, args);
      record(m == 'log' ? 'info' : m, args);
    };
  }
}

export function captureErrors(record: Recorder): void {
  addEventListener('error', (e: ErrorEvent) => {
    // Failed <img>/<script> loads are plain Events (and do not bubble here): not ours.
    if (!e.message && !e.error) return;
    const x = e.error ?? e.message;
    record('error', ['Uncaught', x], { mechanism: 'onerror' }, x instanceof Error ? x : {
      name: 'Error', message: x, stack: 'Error\n    at ' + e.filename + ':' + e.lineno + ':' + e.colno,
    });
  });
  addEventListener('unhandledrejection', (e: PromiseRejectionEvent) => {
    const r = e.reason;
    record('error', ['Unhandled rejection:', r], { mechanism: 'unhandledrejection' },
      r instanceof Error ? r : { name: 'UnhandledRejection', message: r });
  });
}

/** Network errors and 5xx of the page's own requests (the SDK's use the saved fetch). */
export function captureNetwork(record: Recorder): void {
  const check = (method: string, url: string, status: number) =>
    (!status || status > 499) && record('error',
      [method, url, status ? 'failed: HTTP ' + status : 'failed'],
      { mechanism: 'network', method, url, status });
  const f = fetch;
  globalThis.fetch = (input: RequestInfo | URL, init?: RequestInit) => {
    const method = String(init?.method || (input as Request).method || 'GET').toUpperCase();
    const url = String((input as Request).url || input);
    return f(input, init).then(
      (r) => (check(method, url, r.status), r),
      (e) => {
        check(method, url, 0);
        throw e;
      },
    );
  };
  const xhr = XMLHttpRequest.prototype;
  const open = xhr.open;
  xhr.open = function (this: XMLHttpRequest & { _bt?: [string, string] }, method: string,
                      url: string | URL) {
    if (!this._bt) {
      // `error` (no answer: status 0) or `load` (any answer); an abort is neither.
      const done = () => check(...this._bt!, this.status);
      this.addEventListener('error', done);
      this.addEventListener('load', done);
    }
    this._bt = [method.toUpperCase(), String(url)];
    return (open as any).apply(this, arguments);
  };
}
