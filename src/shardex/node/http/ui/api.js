// The node's HTTP API as the console calls it. Logging in (POST /api/session) sets the
// node's session cookie (HttpOnly: this script never sees it; SameSite=Strict), which the
// browser sends with every request to this node; the page keeps only the user's name.
// Every request says it is the console's (X-Requested-With): the node takes the cookie
// only on such requests (no other site can add the header), and a refused one is answered
// 401 without a challenge, so the browser shows no login dialog of its own.

const listeners = [];
let current = null; // the logged-in user's name, null when logged out

export class ApiError extends Error {
  constructor(status, body) {
    const first = body && Array.isArray(body.errors) && body.errors[0];
    super(first ? (first.msg || first.message || JSON.stringify(first)) : `HTTP ${status}`);
    this.status = status;
    this.body = body;
  }
}

export function loggedIn() {
  return current !== null;
}

export function user() {
  return current || "";
}

// Whether this browser still has a session on the node (a reload keeps the cookie).
export async function resume() {
  const resp = await fetch("/api/session", { headers: headers() });
  const data = await body(resp);
  current = resp.ok && data && data.user ? data.user : null;
}

// Logs in on the node (the cookie comes with the answer); throws ApiError when refused.
export async function login(name, password) {
  const resp = await fetch("/api/session", {
    method: "POST",
    headers: { ...headers(), "Content-Type": "application/json" },
    body: JSON.stringify({ user: name, password }),
  });
  const data = await body(resp);
  if (!resp.ok) throw new ApiError(resp.status, data);
  current = data.user;
}

// Ends the session on the node (it forgets it, the browser drops the cookie), then here.
export async function logout() {
  try {
    await fetch("/api/session", { method: "DELETE", headers: headers() });
  } finally {
    ended("Logged out.");
  }
}

function ended(why) {
  current = null;
  for (const f of listeners) f(why);
}

// f(why): the console is logged out, `why` says how.
export function onLogout(f) {
  listeners.push(f);
}

function headers() {
  return { "X-Requested-With": "shardex-console" };
}

async function body(resp) {
  const text = await resp.text();
  try {
    return JSON.parse(text);
  } catch {
    return text;
  }
}

// One request; JSON in and out. `raw`: the Response itself (the caller reads the body).
export async function request(method, path, payload, { raw = false, text = false } = {}) {
  const h = headers();
  const init = { method, headers: h };
  if (payload !== undefined) {
    h["Content-Type"] = "application/json";
    init.body = JSON.stringify(payload);
  }
  const resp = await fetch(path, init);
  if (resp.status === 401) {
    // the session ended on the node (expired, the password changed, the user dropped)
    ended("The session ended: log in again.");
    throw new ApiError(401, await body(resp));
  }
  if (raw) return resp;
  if (text) {
    if (!resp.ok) throw new ApiError(resp.status, await body(resp));
    return resp.text();
  }
  const data = await body(resp);
  if (!resp.ok) throw new ApiError(resp.status, data);
  return data;
}

export const get = (path) => request("GET", path);
export const post = (path, payload) => request("POST", path, payload ?? {});
export const del = (path) => request("DELETE", path);
