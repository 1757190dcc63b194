// Indexes: state, build progress, items and freshness (the seqnos the index's stability TS
// is behind its keyspace's writes), with create (a CREATE INDEX statement), build and drop.

import * as api from "./api.js";
import { badge, bar, clear, errorBox, fmt, h, poll } from "./dom.js";

const path = (i) => `/api/indexes/${encodeURIComponent(i.keyspace)}/${encodeURIComponent(i.name)}`;

export function mount(el) {
  const note = h("div", { id: "index-note" });
  const table = h("div", { id: "indexes" });
  const form = h("form", { id: "index-create", class: "inline" },
    h("input", {
      id: "index-statement", name: "statement", size: 70, required: true,
      placeholder: "CREATE INDEX by_city ON users(address.city) WITH {\"defer_build\": true}",
    }),
    h("button", { type: "submit" }, "Create index"));
  form.addEventListener("submit", async (ev) => {
    ev.preventDefault();
    clear(note);
    try {
      await api.post("/api/indexes", { statement: form.statement.value });
      form.reset();
      await refresh();
    } catch (e) {
      note.append(errorBox(e));
    }
  });

  const act = async (f) => {
    clear(note);
    try {
      await f();
      await refresh();
    } catch (e) {
      note.append(errorBox(e));
    }
  };

  async function refresh() {
    const list = (await api.get("/api/indexes")).indexes;
    const head = ["keyspace", "name", "state", "build", "items", "freshness (seqnos behind)", "keys", "nodes", ""];
    clear(table).append(h("table", { class: "grid" },
      h("thead", {}, h("tr", {}, head.map((t) => h("th", {}, t)))),
      h("tbody", {}, list.map((i) => h("tr", { class: "index-row", dataset: { index: `${i.keyspace}/${i.name}` } },
        h("td", {}, i.keyspace),
        h("td", { class: "index-name" }, i.name),
        h("td", { class: "index-state" }, badge(i.state), i.error ? h("div", { class: "error" }, i.error) : null),
        h("td", {}, bar(i.progress, i.state === "ACTIVE" ? "done" : "")),
        h("td", { class: "index-items" }, fmt(i.items_count)),
        h("td", { class: "index-lag" }, i.stability_lag === null ? "–" : fmt(i.stability_lag)),
        h("td", { class: "muted" }, i.is_primary ? "(primary)" : i.keys.join(", ")),
        h("td", { class: "muted" }, i.nodes.join(", ")),
        h("td", {},
          ["READY", "ERROR"].includes(i.state)
            ? h("button", { type: "button", class: "build", onclick: () => act(() => api.post(`${path(i)}/build`)) }, "Build")
            : null,
          h("button", {
            type: "button", class: "danger",
            onclick: () => confirm(`Drop index ${i.name} on ${i.keyspace}?`) && act(() => api.del(path(i))),
          }, "Drop")))))));
  }

  el.append(h("h2", {}, "Indexes"), form, note, table);
  return poll(refresh, 1000);
}
