// Charts of the whole cluster over the last minutes: KV ops/s, SQL statements/s, index
// freshness and scan latency, one line per node and one for the cluster's total. The node
// serving the console gathers every node's numbers (GET /api/charts, cluster.manage) and
// keeps their history; the page asks every 2 s while the console is open and draws what
// it answers (per-node values and totals are computed on the node: cluster_charts.py).

import * as api from "./api.js";
import { lineChart } from "./chart.js";
import { clear, h, poll } from "./dom.js";

const EVERY = 2000; // ms between asks
let latest = null; // the node's last answer, its times moved onto this browser's clock
let problem = "";
let stopSampling = null;

async function sample() {
  let data;
  try {
    data = await api.get("/api/charts");
  } catch (e) {
    problem = e.status === 403 ? "Charts need a user with cluster.manage (GET /api/charts)." : e.message;
    if (e.status === 403 && stopSampling) {
      stopSampling(); // not this user's to read: opening the charts page asks again
      stopSampling = null;
    }
    return;
  }
  problem = "";
  const shift = Date.now() - data.now; // the node's clock to the browser's
  for (const lines of Object.values(data.charts)) {
    for (const points of Object.values(lines)) for (const p of points) p[0] += shift;
  }
  latest = data;
}

// From login on: the node keeps the history, asking keeps it going.
export function startSampling() {
  if (!stopSampling) stopSampling = poll(sample, EVERY);
}

api.onLogout(() => {
  if (stopSampling) stopSampling();
  stopSampling = null;
  latest = null;
});

export function mount(el) {
  startSampling();
  const body = h("div", { id: "charts" });
  const nodes = h("p", { class: "muted", id: "charts-nodes" });
  el.append(h("h2", {}, "Charts"), nodes, body);
  const draw = () => {
    clear(body);
    if (problem) body.append(h("p", { class: "error" }, problem));
    const span = (latest ? latest.span_seconds : 300) * 1000;
    const lines = (key) => (latest ? latest.charts[key] : {});
    nodes.textContent = latest
      ? `Every node's metrics, sampled every ${latest.every_seconds} s by the node serving the console: ${latest.nodes.join(", ")}` +
        (latest.unreachable.length ? ` (not answering: ${latest.unreachable.join(", ")})` : "")
      : "Every node's metrics, sampled every 2 s.";
    const chart = (title, key, unit, note) => h("figure", { class: "chart-box", id: `chart-${key}` },
      h("figcaption", {}, title, note ? h("span", { class: "muted" }, ` ${note}`) : null),
      lineChart(lines(key), { span, unit }));
    body.append(
      chart("KV operations per second", "kv_ops", "", "(requests each node's data service answered)"),
      chart("SQL statements per second", "sql_statements", "", "(statements each node initiated)"),
      chart("Index freshness", "freshness", "", "(seqnos the most lagging index's stability TS is behind)"),
      chart("Scan latency", "scan_latency_ms", " ms", "(mean time to the first reply of the scans each node coordinated)"));
  };
  return poll(async () => draw(), EVERY);
}
