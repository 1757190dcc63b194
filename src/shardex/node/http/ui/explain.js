// EXPLAIN drawn as a tree: the distributed plan's root fragment on the initiator, the
// exchanges as edges, the leaf fragments on their nodes below it, each with what it does;
// then the statement's operators in order.

import { h } from "./dom.js";

function fragment(f, exchange) {
  return h("div", { class: `fragment ${f.kind === "root" || f.fragment === 0 ? "root" : "leaf"}` },
    exchange ? h("div", { class: "exchange" }, `▲ ${exchange.kind} exchange ${exchange.from} → ${exchange.to}`) : null,
    h("div", { class: "fragment-box" },
      h("div", { class: "fragment-title" }, `fragment ${f.fragment} · ${f.kind} · on ${f.on}`),
      f.partitions ? h("div", { class: "muted" }, `partitions ${f.partitions.join(", ")}`) : null,
      h("ol", { class: "does" }, (f.does || []).map((d) => h("li", {}, typeof d === "string" ? d : JSON.stringify(d))))));
}

export function drawPlan(plan) {
  const out = h("div", { class: "plan" });
  const dist = plan && plan.distributed;
  if (dist && Array.isArray(dist.fragments)) {
    const root = dist.fragments.find((f) => f.fragment === 0) || dist.fragments[0];
    const edges = Object.fromEntries((dist.exchanges || []).map((e) => [e.edge, e]));
    const leaves = dist.fragments.filter((f) => f !== root);
    out.append(
      h("div", { class: "plan-meta muted" },
        `mode ${dist.mode} · source ${dist.source}`,
        dist.index ? ` · index ${dist.index.name}${dist.index.covering ? " (covering)" : ""}` : ""),
      h("div", { class: "tree" },
        fragment(root),
        leaves.length ? h("div", { class: "children" }, leaves.map((f) => fragment(f, edges[f.output]))) : null),
      dist.fast_path ? h("div", { class: "muted" }, `fast path: ${dist.fast_path.kind} (${dist.fast_path.does.join(" → ")})`) : null);
  }
  const ops = plan && (plan.operators || plan.plan || plan["~children"]);
  if (Array.isArray(ops)) {
    out.append(h("h4", {}, "Operators"), h("ol", { class: "operators" },
      ops.map((o) => h("li", {}, h("strong", {}, o.operator || o["#operator"] || "?"), " ",
        h("code", {}, JSON.stringify(Object.fromEntries(Object.entries(o).filter(([k]) => k !== "operator"))))))));
  }
  out.append(h("details", {}, h("summary", {}, "plan as JSON"), h("pre", {}, JSON.stringify(plan, null, 2))));
  return out;
}
