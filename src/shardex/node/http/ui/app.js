// The console's shell: the login form, the navigation, and one page at a time (the hash
// names it: #/cluster, #/keyspaces, #/indexes, #/query, #/charts). A page module exports
// mount(element) and returns a function that stops its polling.

import * as api from "./api.js";
import { clear } from "./dom.js";
import * as cluster from "./page-cluster.js";
import * as keyspaces from "./page-keyspaces.js";
import * as indexes from "./page-indexes.js";
import * as query from "./page-query.js";
import * as charts from "./page-charts.js";

const PAGES = { cluster, keyspaces, indexes, query, charts };
const $ = (id) => document.getElementById(id);
let stopPage = null;

function showLogin(message = "") {
  if (stopPage) stopPage();
  stopPage = null;
  clear($("page"));
  $("top").hidden = true;
  $("login").hidden = false;
  $("login-error").textContent = message;
  $("login-user").focus();
}

function route() {
  if (!api.loggedIn()) {
    showLogin();
    return;
  }
  const name = location.hash.replace(/^#\/?/, "") || "cluster";
  const page = PAGES[name] ? name : "cluster";
  $("login").hidden = true;
  $("top").hidden = false;
  $("who").textContent = api.user();
  for (const a of document.querySelectorAll("nav a")) {
    a.classList.toggle("active", a.dataset.page === page);
  }
  if (stopPage) stopPage();
  const el = clear($("page"));
  el.dataset.page = page;
  stopPage = PAGES[page].mount(el) || null;
  charts.startSampling();
}

$("login-form").addEventListener("submit", async (ev) => {
  ev.preventDefault();
  $("login-error").textContent = "";
  try {
    await api.login($("login-user").value, $("login-password").value);
    $("login-password").value = "";
    route();
  } catch (e) {
    $("login-error").textContent = e.status === 401
      ? "Unknown user or wrong password."
      : `Login failed: ${e.message}`;
  }
});

$("logout").addEventListener("click", () => api.logout());
api.onLogout((why) => showLogin(why));
window.addEventListener("hashchange", route);
api.resume().catch(() => {}).finally(route); // a reload keeps the node's session
