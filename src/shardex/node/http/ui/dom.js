// Small DOM helpers shared by the pages.

// h("div", {class: "x", onclick: f}, child, ...): an element; strings become text nodes.
export function h(tag, attrs = {}, ...children) {
  const el = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs || {})) {
    if (v === undefined || v === null || v === false) continue;
    if (k.startsWith("on")) el.addEventListener(k.slice(2), v);
    else if (k === "dataset") Object.assign(el.dataset, v);
    else el.setAttribute(k, v === true ? "" : String(v));
  }
  for (const c of children.flat()) {
    if (c === undefined || c === null || c === false) continue;
    el.append(c instanceof Node ? c : document.createTextNode(String(c)));
  }
  return el;
}

export function clear(el) {
  while (el.firstChild) el.removeChild(el.firstChild);
  return el;
}

// A progress bar: share 0..1.
export function bar(share, cls = "") {
  const pct = Math.max(0, Math.min(1, Number(share) || 0)) * 100;
  return h("div", { class: `bar ${cls}`, title: `${pct.toFixed(0)}%` },
    h("div", { class: "fill", style: `width:${pct.toFixed(1)}%` }),
    h("span", { class: "label" }, `${pct.toFixed(0)}%`));
}

export function badge(text, cls = "") {
  return h("span", { class: `badge ${cls || String(text).toLowerCase()}` }, text);
}

export function fmt(n) {
  if (n === null || n === undefined) return "–";
  return Number(n).toLocaleString("en-US");
}

// Runs f now and every `ms` until stop(); a run never overlaps the previous one.
export function poll(f, ms) {
  let timer = null;
  let stopped = false;
  const tick = async () => {
    try {
      await f();
    } catch (e) {
      if (!stopped) console.warn(e);
    }
    if (!stopped) timer = setTimeout(tick, ms);
  };
  tick();
  return () => {
    stopped = true;
    clearTimeout(timer);
  };
}

export function errorBox(e) {
  return h("p", { class: "error", role: "alert" }, e instanceof Error ? e.message : String(e));
}
