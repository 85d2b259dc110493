// Small pure helpers: times, levels, and the URL hash that holds each view's state.

export const LEVELS = ["debug", "info", "warn", "error"];

export function levelClass(level) {
  return LEVELS.includes(level) ? `level-${level}` : "level-other";
}

/** "2026-12-01T10:00:00.123Z" -> "10:00:00.123" (today) or "12-01 10:00:00.123". */
export function shortTime(iso) {
  if (!iso) return "";
  const today = new Date().toISOString().slice(0, 10);
  const time = iso.slice(11, 23);
  return iso.slice(0, 10) === today ? time : `${iso.slice(5, 10)} ${time}`;
}

export function ago(iso) {
  const seconds = Math.max(0, (Date.now() - Date.parse(iso)) / 1000);
  if (seconds < 60) return `${Math.round(seconds)}s ago`;
  if (seconds < 3600) return `${Math.round(seconds / 60)}m ago`;
  if (seconds < 86400) return `${Math.round(seconds / 3600)}h ago`;
  return `${Math.round(seconds / 86400)}d ago`;
}

export function bytes(n) {
  if (n < 1024) return `${n} B`;
  if (n < 1 << 20) return `${(n / 1024).toFixed(1)} KB`;
  return `${(n / (1 << 20)).toFixed(1)} MB`;
}

/** The hash route: "#/p/shop/search?q=x" -> {path: ["p", "shop", "search"], params}. */
export function parseHash(hash) {
  const [path, query] = hash.replace(/^#\/?/, "").split("?", 2);
  let parts = [];
  try {
    parts = path ? path.split("/").map(decodeURIComponent) : [];
  } catch {
    parts = ["not-found"];  // a malformed %-escape: no such view
  }
  return { path: parts, params: new URLSearchParams(query || "") };
}

export function hashFor(path, params) {
  const clean = new URLSearchParams();
  for (const [key, value] of Object.entries(params || {})) {
    if (value !== undefined && value !== null && value !== "") clean.set(key, value);
  }
  const query = clean.toString();
  return "#/" + path.map(encodeURIComponent).join("/") + (query ? "?" + query : "");
}

/** The message of a row, for one line: whitespace runs shown as one space. */
export function oneLine(text, max = 400) {
  const line = String(text ?? "").replace(/\s+/g, " ");
  if (line.length <= max) return line;
  return Array.from(line).slice(0, max).join("") + "…";  // by code point: no pair cut in two
}

/** A row's details (attributes, error, ...) as indented JSON text. */
export function details(row) {
  const shown = {};
  for (const key of ["id", "ts", "level", "message", "boxId", "sessionId", "release", "url", "attrs",
                     "error", "truncated", "problem", "rawAttrs"]) {
    if (row[key] !== undefined && row[key] !== null) shown[key] = row[key];
  }
  return JSON.stringify(shown, null, 2);
}
