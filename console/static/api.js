// The public API, as the console calls it: the session cookie authenticates (HttpOnly,
// never seen here); the CSRF token, kept in memory only, goes with every unsafe request.

let csrfToken = null;
let onSignedOut = () => {};

export class ApiError extends Error {
  constructor(status, body) {
    const error = (body && body.error) || {};
    super(error.message || `HTTP ${status}`);
    this.status = status;
    this.code = error.code || "http_error";
    this.detail = error.detail || {};
  }
}

export function whenSignedOut(callback) {
  onSignedOut = callback;
}

export async function request(method, path, { query, body, form, signal } = {}) {
  const url = new URL(path, location.origin);
  for (const [key, value] of Object.entries(query || {})) {
    if (value !== undefined && value !== null && value !== "") url.searchParams.set(key, value);
  }
  const headers = { Accept: "application/json" };
  let payload;
  if (form) {
    payload = form;
  } else if (body !== undefined) {
    headers["Content-Type"] = "application/json";
    payload = JSON.stringify(body);
  }
  if (method !== "GET" && csrfToken) headers["X-Boxtrail-CSRF"] = csrfToken;
  let response;
  try {
    response = await fetch(url, { method, headers, body: payload, signal,
                                  credentials: "same-origin", cache: "no-store" });
  } catch (err) {
    if (err.name === "AbortError") throw err;
    throw new ApiError(0, { error: { code: "network", message: "boxtrail is not reachable" } });
  }
  const text = await response.text();
  let data = null;
  try { data = text ? JSON.parse(text) : null; } catch { data = null; }
  if (!response.ok) {
    if (response.status === 401 && path !== "/v1/session") onSignedOut();
    throw new ApiError(response.status, data);
  }
  return { data, headers: response.headers };
}

export const get = async (path, query, signal) => (await request("GET", path, { query, signal })).data;

export async function signIn(apiKey) {
  const { data } = await request("POST", "/v1/session", { body: { apiKey } });
  csrfToken = data.csrfToken;
  return data;
}

/** The current session, or null: a reload keeps the cookie, and gets the CSRF token back. */
export async function currentSession() {
  try {
    const { data } = await request("GET", "/v1/session");
    csrfToken = data.csrfToken;
    return data;
  } catch (err) {
    if (err.status === 401) return null;
    throw err;
  }
}

export async function signOut() {
  try {
    await request("DELETE", "/v1/session");
  } finally {
    csrfToken = null;
  }
}

export const projectPath = (project, rest = "") =>
  `/v1/projects/${encodeURIComponent(project)}${rest}`;
