/**
 * The public API on top of one client: `init`, `log.*`, `flush`, `setContext`.
 * Every entry point swallows its own failures: the SDK never throws into the page,
 * and a log written while the SDK is at work (a console call inside `beforeSend`,
 * a `toString` that logs) is not captured again.
 */

import { CONSOLE_METHODS, captureConsole, captureErrors, captureNetwork } from './capture';
import { type Client, createClient } from './client';
import { boxId, debugIds, sampled, sessionId } from './context';
import { cut, errorInfo, toAttrs, toText } from './serialize';
import { transport } from './transport';
import type { Attrs, Level, LogEvent, Options } from './types';

declare const __VERSION__: string;

type Log = (message: unknown, attrs?: Record<string, unknown>) => void;

export interface Sdk {
  init(options: Options): void;
  log: { debug: Log; info: Log; warn: Log; error: Log };
  /** Send what is queued now; resolves true once everything queued is delivered, false at
   * the first failed send (and always, once the server has refused the page: 401, 403). */
  flush(): Promise<boolean>;
  /** `release`, `boxId`, `sessionId` change the context of later events; other keys are
   * attributes added to every later event (`null` or `undefined` removes one). */
  setContext(values: Record<string, unknown>): void;
}

/** Every numeric option with its default (the `data-` attribute parser reads the types here). */
export const DEFAULTS = {
  sampleRate: 1,
  batchSize: 50,
  batchBytes: 16384,
  flushInterval: 1000,
  maxQueue: 2000,
  maxEventsPerMinute: 3000,
  maxMessageLength: 8192,
};

const CONTEXT_KEYS = ['release', 'boxId', 'sessionId'];

export function createSdk(random: () => number = Math.random): Sdk {
  let client: Client | undefined;
  let busy = false;
  let max = 8192;
  let url = '';
  const globals: Attrs = {};
  const context: Record<string, unknown> = {};
  /** A copy of `context` that events take as they are captured, replaced when it changes.
   * The debug ids are read when a body is written (a getter): scripts loaded since then only
   * add ids, and reading them on every call would cost more than the rest of it. */
  let snapshot: object = {};
  const snap = () => { snapshot = { ...context, get debugIds() { return debugIds(); } }; };

  function record(level: Level, parts: unknown[], attrs?: Record<string, unknown>,
                  error?: unknown): void {
    if (!client || busy) return;
    busy = true;
    try {
      let message = '';
      for (let i = 0; i < parts.length; i++) {
        const p = parts[i];
        if (p instanceof Error) error ??= p;
        message += (i ? ' ' : '') + toText(p, max);
      }
      const event: LogEvent = { ts: Date.now(), level, message: cut(message, max), url: href() };
      const a: Attrs = { ...globals };
      const found = attrs && toAttrs(attrs, a);
      error ??= found;
      for (const _ in a) { event.attrs = a; break; }
      const e = errorInfo(error, max);
      if (e) event.error = e;
      client.add_(event);
    } catch {
      // never into the page
    } finally {
      busy = false;
    }
  }

  /** `location.href` costs ~1.4 µs in Chromium, more than the rest of a call: read it once
   * per task. (A pushState between two logs of one task leaves the second with the old URL.) */
  function href(): string {
    if (!url) {
      url = location.href;
      queueMicrotask(() => { url = ''; });
    }
    return url;
  }

  function hide(): void {
    try {
      client!.hide_();
    } catch {
      // never into the page
    }
  }

  const log = {} as Sdk['log'];
  for (const level of ['debug', 'info', 'warn', 'error'] as const)
    log[level] = (message, attrs) => record(level, [message], attrs);

  return {
    init(options) {
      try {
        if (client || !options?.ingestKey || !options.endpoint) return;
        const o = { ...DEFAULTS } as Options & typeof DEFAULTS;
        for (const k in options) if ((options as any)[k] != null) (o as any)[k] = (options as any)[k];
        const sid = sessionId(random);
        if (!sampled(sid, o.sampleRate)) return;
        max = o.maxMessageLength;
        // Dropping the oldest of a longer array costs O(n) per event in V8 (measured: 1 µs at
        // 20,000, 200 µs at 50,000).
        o.maxQueue = Math.min(o.maxQueue, 20000);
        Object.assign(context, {
          sessionId: sid,
          release: o.release,
          userAgent: navigator.userAgent,
          boxId: boxId(o.boxId, location.hostname),
          sdk: { name: 'boxtrail', version: __VERSION__ },
        });
        const url = o.endpoint.replace(/\/+$/, '') + '/v1/ingest?key=' + encodeURIComponent(o.ingestKey);
        snap();
        client = createClient(o, transport(url, o.gzip !== false), () => snapshot, random);
        addEventListener('pagehide', hide);
        addEventListener('visibilitychange', () => document.visibilityState == 'hidden' && hide());
        const methods = o.captureConsole ?? true;
        if (methods) captureConsole(methods === true ? CONSOLE_METHODS : methods, record);
        if (o.captureErrors !== false) captureErrors(record);
        if (o.captureNetwork) captureNetwork(record);
      } catch {
        // never into the page
      }
    },
    log,
    async flush() {
      try {
        return client ? await client.flush_() : true;
      } catch {
        return false;
      }
    },
    setContext(values) {
      try {
        for (const k of Object.keys(values)) {
          const v = values[k];
          if (CONTEXT_KEYS.includes(k)) {
            context[k] = k == 'boxId' ? boxId(v as string, '') : v == null ? undefined : String(v);
            snap();
          } else if (v == null) delete globals[k];
          else toAttrs({ [k]: v }, globals);
        }
      } catch {
        // never into the page
      }
    },
  };
}
