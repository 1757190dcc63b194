// The query workbench: a statement runs through the node's N1QL query service
// (POST /query/service) with a client context ID of the console's; its rows show as a
// table and as JSON, EXPLAIN as a tree of fragments and exchanges, the envelope's metrics
// below. Cancel finds the running request by that context ID in /admin/active_requests
// and DELETEs it: the query stops on every node and its answer ends "stopped".

import * as api from "./api.js";
import { clear, h } from "./dom.js";
import { drawPlan } from "./explain.js";

const SHOWN = 1000; // rows drawn in the table (the JSON tab has them all)
let lastStatement = "SELECT 1 + 1 AS two";

function cellText(v) {
  if (v === null) return "null";
  if (v === undefined) return "";
  return typeof v === "object" ? JSON.stringify(v) : String(v);
}

function table(rows) {
  if (!rows.length) return h("p", { class: "muted" }, "no rows");
  const objects = rows.every((r) => r !== null && typeof r === "object" && !Array.isArray(r));
  const cols = objects ? [...new Set(rows.slice(0, SHOWN).flatMap((r) => Object.keys(r)))] : ["value"];
  return h("table", { class: "grid results", id: "query-table" },
    h("thead", {}, h("tr", {}, cols.map((c) => h("th", {}, c)))),
    h("tbody", {}, rows.slice(0, SHOWN).map((r) =>
      h("tr", {}, cols.map((c) => h("td", {}, cellText(objects ? r[c] : r)))))),
    rows.length > SHOWN ? h("caption", {}, `first ${SHOWN} of ${rows.length} rows`) : null);
}

export function mount(el) {
  const editor = h("textarea", { id: "query-editor", rows: 6, spellcheck: "false" }, lastStatement);
  const consistency = h("select", { id: "query-consistency" },
    ["not_bounded", "request_plus"].map((c) => h("option", { value: c }, c)));
  const timeout = h("input", { id: "query-timeout", value: "75s", size: 6 });
  const run = h("button", { id: "query-run", type: "button" }, "Run");
  const explain = h("button", { id: "query-explain", type: "button" }, "Explain");
  const cancel = h("button", { id: "query-cancel", type: "button", class: "danger", disabled: true }, "Cancel");
  const status = h("span", { id: "query-status", class: "muted" });
  const metrics = h("div", { id: "query-metrics", class: "muted" });
  const errors = h("div", { id: "query-errors" });
  const views = { table: h("div", { id: "view-table" }), json: h("pre", { id: "view-json", hidden: true }), plan: h("div", { id: "view-plan", hidden: true }) };
  const tabs = h("div", { class: "tabs" }, Object.keys(views).map((k) =>
    h("button", { type: "button", class: "tab", dataset: { view: k }, onclick: () => showView(k) }, k === "plan" ? "Plan" : k === "json" ? "JSON" : "Table")));
  let running = null; // {context}

  function showView(k) {
    for (const [name, v] of Object.entries(views)) v.hidden = name !== k;
    for (const b of tabs.querySelectorAll("button")) b.classList.toggle("active", b.dataset.view === k);
  }

  async function execute(statement, asPlan) {
    if (running) return;
    lastStatement = editor.value;
    const context = `console-${Date.now().toString(36)}-${Math.random().toString(36).slice(2)}`;
    running = { context };
    run.disabled = explain.disabled = true;
    cancel.disabled = false;
    status.textContent = "running…";
    clear(errors);
    clear(metrics);
    const payload = { statement, client_context_id: context, scan_consistency: consistency.value };
    if (timeout.value.trim()) payload.timeout = timeout.value.trim();
    try {
      const resp = await api.request("POST", "/query/service", payload, { raw: true });
      const text = await resp.text();
      let body;
      try {
        body = JSON.parse(text);
      } catch {
        throw new Error(`the answer is not JSON (HTTP ${resp.status}): ${text.slice(0, 200)}`);
      }
      status.textContent = `${body.status} (HTTP ${resp.status})`;
      status.dataset.status = body.status;
      for (const e of body.errors || []) errors.append(h("p", { class: "error" }, `${e.code}: ${e.msg}`));
      const m = body.metrics || {};
      metrics.textContent = Object.entries(m).map(([k, v]) => `${k} ${v}`).join(" · ");
      const rows = body.results || [];
      views.json.textContent = JSON.stringify(rows, null, 2);
      clear(views.table).append(table(rows));
      clear(views.plan);
      if (asPlan && rows.length) {
        views.plan.append(drawPlan(rows[0]));
        showView("plan");
      } else {
        views.plan.append(h("p", { class: "muted" }, "Explain draws the statement's plan here."));
        showView("table");
      }
    } catch (e) {
      status.textContent = "failed";
      errors.append(h("p", { class: "error" }, e.message));
    } finally {
      running = null;
      run.disabled = explain.disabled = false;
      cancel.disabled = true;
    }
  }

  async function stop() {
    if (!running) return;
    const { context } = running;
    status.textContent = "cancelling…";
    // The request may not be listed yet: look again for a moment.
    for (let i = 0; i < 20 && running && running.context === context; i++) {
      const active = await api.get("/admin/active_requests");
      const mine = active.find((r) => r.clientContextID === context);
      if (mine) {
        await api.del(`/admin/active_requests/${encodeURIComponent(mine.requestID)}`);
        return;
      }
      await new Promise((r) => setTimeout(r, 100));
    }
  }

  run.addEventListener("click", () => execute(editor.value, false));
  explain.addEventListener("click", () => execute(`EXPLAIN ${editor.value.replace(/^\s*explain\s+/i, "")}`, true));
  cancel.addEventListener("click", () => stop().catch((e) => errors.append(h("p", { class: "error" }, e.message))));
  editor.addEventListener("keydown", (ev) => {
    if (ev.key === "Enter" && (ev.ctrlKey || ev.metaKey)) execute(editor.value, false);
  });
  el.append(
    h("h2", {}, "Query workbench"), editor,
    h("div", { class: "toolbar" }, run, explain, cancel,
      h("label", {}, " consistency ", consistency), h("label", {}, " timeout ", timeout), " ", status),
    errors, metrics, tabs, views.table, views.json, views.plan);
  showView("table");
  return () => {};
}
