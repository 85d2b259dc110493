/** A fake transport for the client, and a fake page (globals) for the whole SDK. */

import type { Transport } from '../src/client';

export interface Body {
  context: Record<string, any>;
  events: Array<Record<string, any>>;
}

/** What `post_` answers next: a status with an optional Retry-After (and response text), or a
 * network error. */
export type Answer = number | [number, string | null, string?] | 'network'
  | Promise<[number, string | null]>;

export function fakeTransport(answers: Answer[] = []) {
  const posts: Array<{ at: number; body: Body; gzipped: boolean }> = [];
  const beacons: Body[] = [];
  let beaconOk = true;
  const transport: Transport = {
    post_(data, gzipped) {
      // A gzipped body (from a fake `gzip_`) is recorded as sent, not read.
      posts.push({ at: Date.now(), body: gzipped ? { context: {}, events: [] } : JSON.parse(data as string),
                   gzipped });
      const a = answers.length ? answers.shift()! : 202;
      if (a === 'network') return Promise.reject(new TypeError('Failed to fetch'));
      if (a instanceof Promise) return a;
      return Promise.resolve(typeof a == 'number' ? [a, null] : a);
    },
    beacon_(body) {
      if (!beaconOk) return false;
      beacons.push(JSON.parse(body));
      return true;
    },
  };
  return {
    transport,
    posts,
    beacons,
    answers,
    refuseBeacons(refuse: boolean) {
      beaconOk = !refuse;
    },
    /** Every event message posted so far, in order. */
    messages(): string[] {
      return posts.flatMap((p) => p.body.events.map((e) => e.message));
    },
  };
}

/** Lets promise chains run (setImmediate is not faked by the mock timers used here). */
export function settle(): Promise<void> {
  return new Promise((r) => setImmediate(r));
}

/** What the page's own requests get: `down` fails, `fail` is a 503, the rest 200. */
async function pageRequest(url: string): Promise<Response> {
  if (url.includes('down')) throw new TypeError('Failed to fetch');
  return new Response('', { status: url.includes('fail') ? 503 : 200 });
}

class FakeXHR extends EventTarget {
  status = 0;
  url = '';
  open(_method: string, url: string) {
    this.url = url;
  }
  send() {
    pageRequest(this.url).then(
      (r) => { this.status = r.status; this.dispatchEvent(new Event('load')); },
      () => this.dispatchEvent(new Event('error')),
    );
  }
}

/** A page for the SDK in node: location, navigator, document, storage, fetch, events. */
export function fakePage(href = 'http://b1.box.test:8000/shop') {
  const g = globalThis as any;
  const target = new EventTarget();
  const storage = new Map<string, string>();
  const requests: Array<{ url: string; headers: Record<string, string>; body: Body }> = [];
  const beacons: Array<{ url: string; body: Body }> = [];
  const names = ['addEventListener', 'location', 'navigator', 'document', 'sessionStorage', 'fetch',
                 'XMLHttpRequest'];
  const saved = names.map((n) => Object.getOwnPropertyDescriptor(g, n));
  const consoleSaved = { ...console };
  const printed: Array<[string, unknown[]]> = [];
  for (const m of ['debug', 'log', 'info', 'warn', 'error'] as const) {
    console[m] = (...args: unknown[]) => { printed.push([m, args]); };
  }
  const define = (name: string, value: unknown) =>
    Object.defineProperty(g, name, { value, configurable: true, writable: true });
  define('addEventListener', target.addEventListener.bind(target));
  const url = new URL(href);
  define('location', { href, hostname: url.hostname });
  define('navigator', {
    userAgent: 'fake-agent/1.0',
    sendBeacon(to: string, body: string) {
      beacons.push({ url: to, body: JSON.parse(body) });
      return true;
    },
  });
  define('document', { visibilityState: 'visible' });
  define('sessionStorage', {
    getItem: (k: string) => storage.get(k) ?? null,
    setItem: (k: string, v: string) => void storage.set(k, v),
  });
  let answer = 202;
  let answerBody = '{}';
  define('fetch', async (to: string, init: RequestInit = {}) => {
    if (!to.includes('/v1/ingest')) return pageRequest(to);
    const headers: Record<string, string> = { ...init.headers as Record<string, string>,
                                              'Content-Type': (init.body as Blob).type };
    let stream = (init.body as Blob).stream();
    if (headers['Content-Encoding'] == 'gzip') stream = stream.pipeThrough(new DecompressionStream('gzip'));
    requests.push({ url: to, headers, body: JSON.parse(await new Response(stream).text()) });
    return new Response(answerBody, { status: answer });
  });
  define('XMLHttpRequest', FakeXHR);
  return {
    target,
    storage,
    requests,
    beacons,
    printed,
    answerWith(status: number, body = '{}') {
      answer = status;
      answerBody = body;
    },
    events(): Array<Record<string, any>> {
      return requests.flatMap((r) => r.body.events);
    },
    dispatch(type: string, props: Record<string, unknown> = {}) {
      target.dispatchEvent(Object.assign(new Event(type), props));
    },
    restore() {
      names.forEach((n, i) => {
        const d = saved[i];
        if (d) Object.defineProperty(g, n, d);
        else delete g[n];
      });
      Object.assign(console, consoleSaved);
      delete g._sentryDebugIds;
      delete g._debugIds;
    },
  };
}
