// The node's HTTP API as the console calls it: every request carries the user's HTTP basic
// credentials (kept in sessionStorage: gone when the tab closes) and says it is the
// console's (X-Requested-With), so a refused login answers 401 without a challenge and the
// browser shows no dialog of its own.

const KEY = "shardex.console.auth";
const USER = "shardex.console.user";
const listeners = [];

export class ApiError extends Error {
  constructor(status, body) {
    const first = body && Array.isArray(body.errors) && body.errors[0];
    super(first ? (first.msg || first.message || JSON.stringify(first)) : `HTTP ${status}`);
    this.status = status;
    this.body = body;
  }
}

function basic(user, password) {
  const bytes = new TextEncoder().encode(`${user}:${password}`);
  let text = "";
  for (const b of bytes) text += String.fromCharCode(b);
  return btoa(text);
}

export function loggedIn() {
  return sessionStorage.getItem(KEY) !== null;
}

export function user() {
  return sessionStorage.getItem(USER) || "";
}

// Checks the credentials against the node (GET /api/nodes: every user may read it) and
// keeps them when they work; throws ApiError otherwise.
export async function login(name, password) {
  const token = basic(name, password);
  const resp = await fetch("/api/nodes", { headers: headers(token) });
  if (!resp.ok) throw new ApiError(resp.status, await body(resp));
  sessionStorage.setItem(KEY, token);
  sessionStorage.setItem(USER, name);
}

export function logout() {
  sessionStorage.removeItem(KEY);
  sessionStorage.removeItem(USER);
  for (const f of listeners) f();
}

export function onLogout(f) {
  listeners.push(f);
}

function headers(token) {
  return { "Authorization": `Basic ${token}`, "X-Requested-With": "shardex-console" };
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
  const h = headers(sessionStorage.getItem(KEY) || "");
  const init = { method, headers: h };
  if (payload !== undefined) {
    h["Content-Type"] = "application/json";
    init.body = JSON.stringify(payload);
  }
  const resp = await fetch(path, init);
  if (resp.status === 401) {
    logout();
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
