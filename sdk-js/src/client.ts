/**
 * The delivery pipeline: rate cap -> beforeSend -> JSON -> bounded queue -> batches ->
 * transport, with retries and backoff, and a count of every event it had to drop.
 *
 * Events are serialized once, when queued, each beside the context in force then; a batch
 * is a join of those strings under one context, so it ends where the context changed.
 * One request is in flight at a time. A failed batch (network error, 408, 429, 5xx) goes
 * back to the head of the queue and waits for `Retry-After` or the backoff; other refusals
 * (4xx) are dropped as `rejected`. Dropped events are reported by a synthetic `warn` event at
 * the head of the next batch (a body of that report alone is not sent again if refused).
 *
 * 401 (unknown key) and 403 (origin not allowed) refuse the page, not a batch: the client
 * says so once in the console, empties its queue and sends nothing more, so a refused page
 * makes one request. The first body goes uncompressed for that: a gzipped body needs a CORS
 * preflight, and a refused preflight reads as a network error (as does the retry after one).
 *
 * When the page hides, the queue goes by `sendBeacon`. The batch then in flight stays with
 * its request, which `keepalive` carries past the page: it is never sent again, even if its
 * fetch then fails. (Chromium rejects that fetch as the page goes, just before the pagehide
 * listeners run, while the request goes on; a network error is handled a task later, after
 * them.) At most once for that batch, rather than every line twice.
 */

import type { LogEvent } from './types';

// Members whose names end in `_` are the SDK's own, never the page's: the <script> build
// shortens them (esbuild's mangleProps, scripts/build.mjs). Options and the wire format keep
// their names.

export interface Transport {
  /** POST a body; resolves `[status, Retry-After, body of a refusal]`, rejects on a network
   * error. */
  post_(data: string | Blob, gzipped: boolean): Promise<[number, string | null, string?]>;
  /** Fire and forget while the page goes away; false when the browser refused it. */
  beacon_(body: string): boolean;
  gzip_?: (body: string) => Promise<Blob>;
}

export interface Settings {
  batchSize: number;
  batchBytes: number;
  flushInterval: number;
  maxQueue: number;
  maxEventsPerMinute: number;
  beforeSend?: (event: LogEvent) => LogEvent | null | undefined | false;
}

export interface Client {
  add_(event: LogEvent): void;
  /** Send everything now; true once the queue is empty, false if a send failed or the
   * server refused the page. */
  flush_(): Promise<boolean>;
  /** The page is going away: hand the queue to `beacon_`. */
  hide_(): void;
}

/** Largest request body (characters of JSON) and events per request. */
export const MAX_BODY = 60000;
export const MAX_EVENTS = 500;
/** Beacons and `keepalive` fetches share the browser's 64 KiB quota: uncompressed bodies
 * (beacons, and fetches that are not gzipped) are kept to this many characters. */
export const SMALL_BODY = 30000;
/** gzip only pays for itself (and a CORS preflight) on bodies larger than this. */
export const GZIP_MIN = 1024;
/** Characters of JSON kept queued at most, whatever maxQueue says. */
export const MAX_QUEUED = 4e6;
const MAX_BACKOFF = 30000;
const MAX_RETRY_AFTER = 600000;

/** Backoff before retry number `attempt` (0-based): 0.5 s doubling to 30 s, ±25% jitter. */
export function backoff(attempt: number, random: () => number): number {
  return Math.min(MAX_BACKOFF, 500 * 2 ** attempt) * (0.75 + random() / 2);
}

/** `Retry-After` (seconds or an HTTP date) in ms, at most 10 minutes; undefined if absent. */
export function retryAfter(header: string | null, now: number): number | undefined {
  if (!header) return;
  const s = +header;
  const ms = s >= 0 ? s * 1000 : Date.parse(header) - now;
  return ms >= 0 ? Math.min(ms, MAX_RETRY_AFTER) : undefined;
}

/** A queued event: its JSON, and the context in force when it was added. */
type Queued = [string, object];

/** `context()` is read when each event is added and written out with the body; it is the same
 * object until the context changes. */
export function createClient(
  s: Settings,
  transport: Transport,
  context: () => object,
  random: () => number = Math.random,
): Client {
  let queue: Queued[] = [];
  let chars = 0;
  let inflight: Queued[] | null = null;
  /** Of the batch in flight: 0 being compressed, 1 posted, 2 posted before the page hid. */
  let stage = 0;
  /** Whether the last request had an answer: only then is a gzipped body (and the CORS
   * preflight it needs, which hides a refusal's status) worth it. */
  let answered = false;
  let refused = false;
  let generation = 0;
  let attempt = 0;
  let dropped: Record<string, number> = {};
  let droppedTotal = 0;
  let reporting: Record<string, number> | null = null;
  let timer: ReturnType<typeof setTimeout> | undefined;
  let timerAt = 0;
  let blockedUntil = 0;
  let windowStart = -Infinity;
  let windowCounts = [0, 0];
  let waiters: Array<(ok: boolean) => void> = [];

  function drop(reason: string, n = 1): void {
    dropped[reason] = (dropped[reason] || 0) + n;
    droppedTotal += n;
  }

  function restore(counts: Record<string, number> | null): void {
    for (const k in counts) drop(k, counts[k]);
  }

  function sum(list: Queued[]): number {
    let n = 0;
    for (const e of list) n += e[0].length + 1;
    return n;
  }

  /** The first `n` queued events, out of the queue. */
  function take(n: number): Queued[] {
    const events = queue.splice(0, n);
    chars -= sum(events);
    return events;
  }

  /** `events` back at the head of the queue. */
  function putBack(events: Queued[]): void {
    queue = events.concat(queue);
    chars += sum(events);
  }

  /** Drop the oldest queued events until the queue (with what is in flight) fits, in count
   * and in size (huge events: 2000 stacks of 16 K characters would be half a gigabyte). */
  function trim(): void {
    while (queue.length &&
           (queue.length + (inflight ? inflight.length : 0) > s.maxQueue || chars > MAX_QUEUED)) {
      // shift, not splice(0, 1): V8 moves the front of the array instead of copying it all
      chars -= queue.shift()![0].length + 1;
      drop('queue_full');
    }
  }

  function schedule(ms: number): void {
    if (inflight) return; // settle() schedules what comes next
    const now = Date.now();
    const at = Math.max(now + ms, blockedUntil);
    if (timer !== undefined) {
      if (timerAt <= at) return;
      clearTimeout(timer);
    }
    timerAt = at;
    timer = setTimeout(run, at - now);
  }

  function next(): void {
    if (queue.length >= s.batchSize || chars >= s.batchBytes || (waiters.length && queue.length))
      schedule(0);
    else if (queue.length || droppedTotal) schedule(s.flushInterval);
  }

  function resolve(ok: boolean): void {
    const w = waiters;
    waiters = [];
    for (const f of w) f(ok);
  }

  /** How many events from the head of the queue, of one context, fit in a body of `max`
   * characters. */
  function fit(max: number): number {
    let n = 0;
    let size = 0;
    while (n < queue.length && n < MAX_EVENTS && queue[n][1] == queue[0][1] &&
           (!n || size + queue[n][0].length < max))
      size += queue[n++][0].length + 1;
    return n;
  }

  /** The drop counts so far, handed to the next body (and put back if it fails). */
  function takeReport(): Record<string, number> | null {
    const r = droppedTotal ? dropped : null;
    dropped = {};
    droppedTotal = 0;
    return r;
  }

  /** A body of `list` (of one context) with the drop report (if any) ahead. */
  function body(list: Queued[], report: Record<string, number> | null): string {
    const events = list.map((e) => e[0]);
    if (report) {
      let total = 0;
      for (const k in report) total += report[k];
      events.unshift(JSON.stringify({
        ts: Date.now(),
        level: 'warn',
        message: 'boxtrail: dropped ' + total + ' events ' + JSON.stringify(report),
        attrs: { dropped: total, ...report },
      }));
    }
    // JSON.stringify writes a lone surrogate (half an emoji cut by page code) as a \udXXX
    // escape, which the server refuses along with the whole body: make each one U+FFFD.
    // (Text that spells a backslash and "udXXX" literally is changed too; the JSON stays valid.)
    return ('{"context":' + JSON.stringify(list[0] ? list[0][1] : context()) + ',"events":['
            + events + ']}')
      .replace(/\\ud[89a-f]\w\w/g, '\\ufffd');
  }

  function run(): void {
    timer = undefined;
    if (inflight || !(queue.length || droppedTotal)) return;
    const gzip = answered && transport.gzip_;
    const events = inflight = take(fit(gzip ? MAX_BODY : SMALL_BODY));
    stage = 0;
    reporting = takeReport();
    const data = body(events, reporting);
    const mine = ++generation;
    const gz = gzip && data.length > GZIP_MIN ? gzip(data).catch(() => data) : 0;
    Promise.resolve(gz || data)
      .then((payload) => {
        if (mine != generation) return; // hide() took these events
        stage = 1;
        return transport.post_(payload, payload !== data);
      })
      .then(
        (res) => mine == generation && settle(res![0], res![1], res![2]),
        // A task later: Chromium rejects the fetch of a page being left just before its
        // pagehide listeners run, in the task that ends with the page (see `hide_`).
        () => setTimeout(() => mine == generation && settle(0, null)),
      )
      .catch(() => {});
  }

  function settle(status: number, after: string | null, text = ''): void {
    const sent = inflight!;
    const report = reporting;
    inflight = reporting = null;
    answered = status > 0;
    if (status == 401 || status == 403) {
      // The server refuses the page (its key or its origin), not a batch: say why, once, and stop.
      refused = true; // (no timer is set while a request is out)
      queue = [];
      droppedTotal = 0;
      resolve(false);
      try {
        text = JSON.parse(text).error.message;
      } catch {
        // not our error shape (a proxy's page): quoted as it is
      }
      console.warn('boxtrail: HTTP ' + status + ' ' + text + ' (this page sends no more logs)');
      return;
    }
    // A fetch that failed after the page hid: its request may well go on (see above), so it
    // counts as sent.
    if (status ? status == 408 || status == 429 || status > 499 : stage < 2) {
      putBack(sent);
      restore(report);
      trim();
      const now = Date.now();
      const wait = retryAfter(after, now) ?? backoff(attempt, random);
      attempt++;
      blockedUntil = now + wait;
      resolve(false);
      schedule(wait);
      return;
    }
    attempt = 0;
    if (status > 299) {
      // A body of the report alone, refused: its count goes with it (or it would go forever).
      if (sent.length) {
        restore(report);
        drop('rejected', sent.length);
      }
      resolve(false);
    }
    if (!queue.length && !droppedTotal) resolve(true);
    next();
  }

  return {
    add_(event) {
      if (refused) return;
      if (event.ts - windowStart >= 60000) {
        windowStart = event.ts;
        windowCounts = [0, 0];
      }
      if (++windowCounts[+(event.level == 'error')] > s.maxEventsPerMinute) drop('rate_limit');
      else {
        let json: string | undefined;
        try {
          const e = s.beforeSend ? s.beforeSend(event) : event;
          if (!e) return;
          json = JSON.stringify(e);
        } catch {
          drop('before_send');
        }
        if (json) {
          queue.push([json, context()]);
          chars += json.length + 1;
          trim();
        }
      }
      next();
    },

    flush_() {
      return new Promise<boolean>((done) => {
        if (refused) return done(false);
        if (!queue.length && !inflight && !droppedTotal) return done(true);
        waiters.push(done);
        if (!inflight) schedule(0);
      });
    },

    hide_() {
      if (inflight && stage) stage = 2;
      else if (inflight) {
        // Still being compressed: it would never leave. Send it with the rest.
        putBack(inflight);
        inflight = null;
        restore(reporting);
        reporting = null;
        generation++;
      }
      while (queue.length || droppedTotal) {
        const n = fit(SMALL_BODY);
        const report = takeReport();
        if (!transport.beacon_(body(queue.slice(0, n), report))) {
          restore(report);
          break;
        }
        take(n);
      }
      next();
    },
  };
}
