// The cluster map: every node with its services and state (failed over, recovering), the
// partitions it holds active and as replica per keyspace, the rebalance and its progress,
// and the operators' actions (rebalance, fail over, recover).

import * as api from "./api.js";
import { badge, bar, clear, errorBox, fmt, h, poll } from "./dom.js";

export function mount(el) {
  const status = h("div", { id: "rebalance" });
  const nodes = h("div", { id: "nodes", class: "cards" });
  const note = h("div", { id: "cluster-note" });
  el.append(
    h("h2", {}, "Cluster"),
    h("div", { class: "toolbar" },
      h("button", { id: "rebalance-start", type: "button", onclick: () => act(note, () => api.post("/api/rebalance", {})) }, "Rebalance")),
    note, status, nodes);
  return poll(() => refresh(nodes, status, note), 2000);
}

async function act(note, f) {
  clear(note);
  try {
    await f();
  } catch (e) {
    note.append(errorBox(e));
  }
}

async function refresh(nodesEl, statusEl, note) {
  const [members, ks, rb] = await Promise.all([
    api.get("/api/nodes"),
    api.get("/api/keyspaces"),
    api.get("/api/rebalance"),
  ]);
  const maps = await Promise.all(
    ks.keyspaces.map((k) => api.get(`/api/keyspaces/${encodeURIComponent(k.name)}`)));
  // node -> keyspace -> {active: [...], replica: [...]}
  const held = {};
  for (const m of maps) {
    for (const [p, where] of Object.entries(m.partitions)) {
      const slot = (n) => ((held[n] ??= {})[m.name] ??= { active: [], replica: [] });
      slot(where.active).active.push(Number(p));
      for (const r of where.replicas) slot(r).replica.push(Number(p));
    }
  }
  clear(nodesEl);
  for (const n of members.nodes) nodesEl.append(card(n, held[n.name] || {}, maps, note));
  clear(statusEl);
  const r = rb.rebalance;
  if (r) {
    statusEl.append(h("div", { class: "rebalance" },
      h("strong", {}, `${r.kind} ${r.id.slice(0, 8)}: `), badge(r.state),
      ` ${r.moves.length} moves `, bar(r.progress)));
  }
}

function card(n, held, maps, note) {
  const state = n.failed_over ? "failed over" : n.recovering ? `recovering (${n.recovering})` : n.state;
  const rows = maps.map((m) => {
    const mine = held[m.name] || { active: [], replica: [] };
    const cells = [];
    for (let p = 0; p < m.num_partitions; p++) {
      const kind = mine.active.includes(p) ? "active" : mine.replica.includes(p) ? "replica" : "none";
      cells.push(h("span", { class: `cell ${kind}`, title: `partition ${p}: ${kind}` }));
    }
    return h("div", { class: "held" },
      h("div", { class: "held-label" },
        `${m.name}: `, h("span", { class: "n-active" }, fmt(mine.active.length)), " active, ",
        h("span", { class: "n-replica" }, fmt(mine.replica.length)), " replica"),
      h("div", { class: "strip" }, cells));
  });
  const data = n.services.includes("data");
  const actions = h("div", { class: "actions" });
  if (data && !n.failed_over) {
    actions.append(h("button", {
      type: "button", class: "danger",
      onclick: () => confirm(`Fail ${n.name} over? Its active partitions move to their replicas.`) &&
        act(note, () => api.post(`/api/nodes/${encodeURIComponent(n.name)}/failover`, {})),
    }, "Fail over"));
  }
  if (n.failed_over) {
    actions.append(h("button", {
      type: "button",
      onclick: () => act(note, () => api.post(`/api/nodes/${encodeURIComponent(n.name)}/recover`, { kind: "delta" })),
    }, "Recover (delta)"));
  }
  return h("div", { class: `card node ${n.failed_over ? "failed" : n.state}`, id: `node-${n.name}`, dataset: { node: n.name } },
    h("div", { class: "card-head" }, h("strong", { class: "node-name" }, n.name), " ", badge(state, n.failed_over ? "failed" : n.state)),
    h("div", { class: "muted" }, `${n.address} · group ${n.server_group || "–"}`),
    h("div", { class: "services" }, n.services.map((s) => badge(s, "service"))),
    rows, actions);
}
