/**
 * Any value a page logs, turned into text or a JSON-safe scalar without throwing:
 * circular references, Errors, DOM nodes, BigInt, Symbols, functions, throwing
 * getters and huge objects all have a bounded, readable form.
 */

import type { Attrs, ErrorInfo, Scalar } from './types';

const MAX_DEPTH = 4;
const MAX_KEYS = 50;
/** Values visited for one text: a wide object stops here instead of at 50^4. */
const MAX_NODES = 200;
let budget = 0;
/** Strings inside objects and attribute values are cut to this many characters. */
export const MAX_VALUE = 1000;

/** `s` cut to `max` characters, marked with `…`. (A pair cut in half is mended when the
 * body is written: see `body` in client.ts.) */
export function cut(s: string, max: number): string {
  return s.length > max ? s.slice(0, max) + '…' : s;
}

function node(v: any): string | undefined {
  if (typeof v.nodeType != 'number' || typeof v.nodeName != 'string') return;
  if (v.nodeType != 1) return v.nodeName;
  const cls = typeof v.className == 'string' && v.className.trim();
  return '<' + v.nodeName.toLowerCase() + (v.id ? '#' + v.id : '') +
    (cls ? '.' + cls.split(/\s+/).join('.') : '') + '>';
}

function walk(v: any, depth: number, seen: object[]): unknown {
  const t = typeof v;
  if (t == 'string') return cut(v, MAX_VALUE);
  if (t == 'number') return isFinite(v) ? v : String(v);
  if (t == 'bigint') return v + 'n';
  if (t == 'symbol') return v.toString();
  if (t == 'function') return '[Function ' + v.name + ']';
  if (t != 'object' || v == null) return v;
  if (v instanceof Error) return v.name + ': ' + v.message;
  const n = node(v);
  if (n) return n;
  if (seen.includes(v)) return '[Circular]';
  if (depth >= MAX_DEPTH || --budget < 0) return '…';
  if (typeof v.toJSON == 'function') return walk(v.toJSON(), depth + 1, seen);
  if (v instanceof Map || v instanceof Set) v = Array.from(v as Iterable<unknown>);
  seen.push(v);
  let out: any;
  // Arrays and typed arrays by index: Object.keys of a million elements is a million strings.
  const list = Array.isArray(v) || ArrayBuffer.isView(v);
  const keys = list ? [] : Object.keys(v);
  const size = list ? v.length : keys.length;
  if (list) out = Array.prototype.slice.call(v, 0, MAX_KEYS).map((x) => walk(x, depth + 1, seen));
  else {
    out = {};
    for (const k of keys.slice(0, MAX_KEYS)) {
      try {
        out[k] = walk(v[k], depth + 1, seen);
      } catch {
        out[k] = '[Throws]';
      }
    }
  }
  if (size > MAX_KEYS) out[list ? MAX_KEYS : '…'] = '+' + (size - MAX_KEYS);
  seen.pop();
  return out;
}

/** Text for any value: strings as they are, the rest as bounded JSON. Never throws. */
export function toText(v: unknown, max: number): string {
  try {
    budget = MAX_NODES;
    const w = typeof v == 'string' ? v : walk(v, 0, []);
    return cut(typeof w == 'string' ? w : String(JSON.stringify(w)), max);
  } catch {
    return '[unserializable]';
  }
}

/** The `error` field for an Error or an object shaped like one, else undefined. */
export function errorInfo(v: any, max: number): ErrorInfo | undefined {
  try {
    if (!v || typeof v != 'object' || !('message' in v)) return; // Errors have one too
    return {
      type: String(v.name || 'Error'),
      message: toText(v.message, max),
      stack: typeof v.stack == 'string' ? cut(v.stack, 2 * max) : undefined,
    };
  } catch {
    return;
  }
}

/**
 * Attribute values as the contract wants them (scalars; long strings cut; the rest as text),
 * added to `into`. Returns the first Error among the values, for the event's `error`.
 */
export function toAttrs(a: Record<string, unknown>, into: Attrs): unknown {
  let error: unknown;
  try {
    for (const k of Object.keys(a).slice(0, 64)) {
      const v = a[k];
      const t = typeof v;
      if (v === undefined) continue;
      if (v instanceof Error) error ??= v;
      into[k] = v === null || t == 'boolean' || (t == 'number' && isFinite(v as number))
        ? (v as Scalar)
        : toText(v, MAX_VALUE);
    }
  } catch {
    // an exotic object (a throwing Proxy): keep what was read
  }
  return error;
}
