// Keyspaces: the list, create and drop, and one keyspace's partition map.

import * as api from "./api.js";
import { clear, errorBox, fmt, h, poll } from "./dom.js";

export function mount(el) {
  const note = h("div");
  const table = h("div", { id: "keyspaces" });
  const detail = h("div", { id: "keyspace-detail" });
  let open = null;
  const form = h("form", { id: "keyspace-create", class: "inline" },
    h("input", { name: "name", placeholder: "name", required: true }),
    h("label", {}, "partitions ", h("input", { name: "partitions", type: "number", min: 1, value: 64 })),
    h("label", {}, "replicas ", h("input", { name: "replicas", type: "number", min: 0, max: 3, value: 1 })),
    h("button", { type: "submit" }, "Create keyspace"));
  form.addEventListener("submit", async (ev) => {
    ev.preventDefault();
    clear(note);
    const f = new FormData(form);
    try {
      await api.post("/api/keyspaces", {
        name: f.get("name"), partitions: Number(f.get("partitions")), replicas: Number(f.get("replicas")),
      });
      form.reset();
      await refresh();
    } catch (e) {
      note.append(errorBox(e));
    }
  });

  async function show(name) {
    open = name;
    const m = await api.get(`/api/keyspaces/${encodeURIComponent(name)}`);
    clear(detail).append(
      h("h3", {}, `Partition map of ${name}`),
      h("table", { class: "grid" },
        h("thead", {}, h("tr", {}, h("th", {}, "partition"), h("th", {}, "active"), h("th", {}, "replicas"))),
        h("tbody", {}, Object.entries(m.partitions).map(([p, w]) =>
          h("tr", {}, h("td", {}, p), h("td", {}, w.active), h("td", {}, w.replicas.join(", ") || "–"))))));
  }

  async function refresh() {
    const ks = (await api.get("/api/keyspaces")).keyspaces;
    clear(table).append(h("table", { class: "grid" },
      h("thead", {}, h("tr", {}, ["name", "partitions", "replicas", "nodes", ""].map((t) => h("th", {}, t)))),
      h("tbody", {}, ks.map((k) => h("tr", { dataset: { keyspace: k.name } },
        h("td", {}, h("a", { href: "#/keyspaces", onclick: (ev) => { ev.preventDefault(); show(k.name); } }, k.name)),
        h("td", {}, fmt(k.num_partitions)), h("td", {}, fmt(k.num_replicas)), h("td", {}, k.nodes.join(", ")),
        h("td", {}, h("button", {
          type: "button", class: "danger",
          onclick: async () => {
            if (!confirm(`Drop keyspace ${k.name} and all its documents?`)) return;
            try {
              await api.del(`/api/keyspaces/${encodeURIComponent(k.name)}`);
              if (open === k.name) clear(detail);
              await refresh();
            } catch (e) {
              note.append(errorBox(e));
            }
          },
        }, "Drop")))))));
  }

  el.append(h("h2", {}, "Keyspaces"), form, note, table, detail);
  return poll(refresh, 5000);
}
