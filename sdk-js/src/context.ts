/** Who is sending: session id, sampling, box id and the debug ids of loaded scripts. */

const SESSION_KEY = 'boxtrail.sid';
const BOX_ID = /^[a-z0-9][\w.-]{0,63}$/i; // a letter or digit, then up to 63 of those, `_`, `.`, `-`
/** The script URL in a stack (`at fn (URL:1:2)`, `fn@URL:1:2`), or a key that is a URL. */
const SCRIPT_URL = /(\w[\w+.-]*:\/\/[^\s()@]+?)(?::\d+:\d+|$)/;

function hex(random: () => number): string {
  return ((random() * 2 ** 32) >>> 0).toString(16).padStart(8, '0');
}

/** A 16-hex-digit id kept in sessionStorage, so it lasts across the tab's navigations. */
export function sessionId(random: () => number): string {
  let id = hex(random) + hex(random);
  try {
    const kept = sessionStorage.getItem(SESSION_KEY);
    if (kept) return kept;
    sessionStorage.setItem(SESSION_KEY, id);
  } catch {
    // no storage (sandboxed iframe, privacy mode): one id per page
  }
  return id;
}

/** Whether a session is sent at `rate`: decided by its id, so a kept session has no holes. */
export function sampled(id: string, rate: number): boolean {
  return !(parseInt(id.slice(0, 8), 16) / 2 ** 32 >= rate);
}

/** The box id a valid option gives, else the one in a host `{box}.box.<domain>`. */
export function boxId(option: string | undefined, hostname: string): string | undefined {
  if (option && BOX_ID.test(option)) return option;
  const m = /^([a-z0-9][a-z0-9-]{0,62})\.box\./i.exec(hostname);
  return m ? m[1] : undefined;
}

let seenKeys = -1;
let cached: Record<string, string> | undefined;

/**
 * `{scriptUrl: debugId}` from `_sentryDebugIds` and `_debugIds`: both map the stack of the
 * snippet a bundler put into each script to that script's debug id.
 */
export function debugIds(): Record<string, string> | undefined {
  const g = globalThis as any;
  const maps = [g._sentryDebugIds, g._debugIds];
  let n = 0;
  for (const m of maps) for (const _ in m) n++;
  if (n != seenKeys) {
    seenKeys = n;
    cached = undefined;
    for (const m of maps) {
      for (const k in m) {
        const url = SCRIPT_URL.exec(k);
        if (url && typeof m[k] == 'string') (cached ||= {})[url[1]] = m[k];
      }
    }
  }
  return cached;
}
