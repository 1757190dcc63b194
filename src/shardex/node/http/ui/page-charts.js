// Charts of this node's ops/s, index freshness and scan latency over the last minutes,
// sampled from its Prometheus metrics (GET /metrics, cluster.manage) every few seconds
// while the console is open: counters become rates between two samples, the scan latency
// histogram's sum and count the mean latency of the scans in between.

import * as api from "./api.js";
import { lineChart } from "./chart.js";
import { clear, h, poll } from "./dom.js";
import { by, parse, sum } from "./prom.js";

const EVERY = 2000; // ms between samples
const SPAN = 5 * 60 * 1000; // ms shown
const history = { ops: {}, freshness: {}, latency: {} }; // chart -> series -> [[t, v]]
let previous = null; // {t, samples}
let problem = "";
let stopSampling = null;

function push(chart, name, t, v) {
  const s = (history[chart][name] ??= []);
  s.push([t, v]);
  while (s.length && s[0][0] < t - SPAN) s.shift();
}

async function sample() {
  let text;
  try {
    text = await api.request("GET", "/metrics", undefined, { text: true });
  } catch (e) {
    problem = e.status === 403 ? "Charts need a user with cluster.manage (GET /metrics)." : e.message;
    if (e.status === 403 && stopSampling) {
      stopSampling(); // not this user's to read: opening the charts page asks again
      stopSampling = null;
    }
    return;
  }
  problem = "";
  const t = Date.now();
  const samples = parse(text);
  if (previous) {
    const dt = (t - previous.t) / 1000;
    const rate = (name) => Math.max(0, sum(samples, name) - sum(previous.samples, name)) / dt;
    push("ops", "kv ops/s", t, rate("shardex_kv_ops_total"));
    push("ops", "sql statements/s", t, rate("shardex_sql_statements_total"));
    const sums = by(samples, "shardex_scan_open_duration_seconds_sum", "consistency");
    const counts = by(samples, "shardex_scan_open_duration_seconds_count", "consistency");
    const sums0 = by(previous.samples, "shardex_scan_open_duration_seconds_sum", "consistency");
    const counts0 = by(previous.samples, "shardex_scan_open_duration_seconds_count", "consistency");
    for (const c of Object.keys(counts)) {
      const n = counts[c] - (counts0[c] || 0);
      if (n > 0) push("latency", c, t, ((sums[c] - (sums0[c] || 0)) / n) * 1000);
    }
  }
  for (const s of samples) {
    if (s.name === "shardex_index_stability_lag_seqnos") {
      push("freshness", `${s.labels.keyspace}.${s.labels.index}`, t, s.value);
    }
  }
  previous = { t, samples };
}

// From login on: the charts have a history when their page opens.
export function startSampling() {
  if (!stopSampling) stopSampling = poll(sample, EVERY);
}

api.onLogout(() => {
  if (stopSampling) stopSampling();
  stopSampling = null;
  previous = null;
});

export function mount(el) {
  startSampling();
  const body = h("div", { id: "charts" });
  el.append(h("h2", {}, "Charts"),
    h("p", { class: "muted" }, "This node's metrics (the node serving the console), sampled every 2 s."), body);
  const draw = () => {
    clear(body);
    if (problem) body.append(h("p", { class: "error" }, problem));
    const chart = (title, key, unit, note) => h("figure", { class: "chart-box", id: `chart-${key}` },
      h("figcaption", {}, title, note ? h("span", { class: "muted" }, ` ${note}`) : null),
      lineChart(history[key], { span: SPAN, unit }));
    body.append(
      chart("Operations per second", "ops", "", "(KV requests this node served, SQL statements it ran)"),
      chart("Index freshness", "freshness", "", "(seqnos each index's stability TS is behind this node's partitions)"),
      chart("Scan latency", "latency", " ms", "(mean time to the first reply, by consistency)"));
  };
  return poll(async () => draw(), EVERY);
}
