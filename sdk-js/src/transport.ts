/** How bodies leave the page: fetch (gzipped when it pays), and sendBeacon on the way out. */

import type { Transport } from './client';

/** fetch bodies up to this size use `keepalive`, so they survive the page; beacons take the rest of the browser's 64 KiB quota. */
const KEEPALIVE_MAX = 30000;

export function transport(url: string, gzip: boolean): Transport {
  const send = fetch; // saved before captureNetwork wraps it: the SDK's own requests are not captured
  return {
    gzip_: gzip && typeof CompressionStream == 'function'
      ? (body) => new Response(new Blob([body]).stream().pipeThrough(new CompressionStream('gzip'))).blob()
      : undefined,
    post_(data, gzipped) {
      // text/plain and no other header: no CORS preflight, except for gzip's Content-Encoding.
      const blob = new Blob([data], { type: 'text/plain' });
      return send(url, {
        // No credentials: the default mode sends cookies only to the page's own origin.
        method: 'POST', body: blob, headers: gzipped ? { 'Content-Encoding': 'gzip' } : {},
        keepalive: blob.size < KEEPALIVE_MAX,
      }).then((r) => r.text().catch(() => '')
        .then((text) => [r.status, r.headers.get('Retry-After'), text]));
    },
    beacon_(body) {
      try {
        // A string goes as text/plain: no CORS preflight.
        return navigator.sendBeacon(url, body);
      } catch {
        return false;
      }
    },
  };
}
