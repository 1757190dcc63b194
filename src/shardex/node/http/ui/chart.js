// A small line chart in plain SVG: series of [time ms, value] over the last `span` ms,
// one line each, a y axis from 0 to the largest value, and a legend.

const NS = "http://www.w3.org/2000/svg";
const COLOURS = ["#2563eb", "#dc2626", "#16a34a", "#9333ea", "#ea580c", "#0891b2"];

function el(tag, attrs) {
  const e = document.createElementNS(NS, tag);
  for (const [k, v] of Object.entries(attrs)) e.setAttribute(k, v);
  return e;
}

// series: {name: [[t, v], ...]}; returns the <svg>.
export function lineChart(series, { span = 300000, width = 560, height = 180, unit = "" } = {}) {
  const svg = el("svg", { viewBox: `0 0 ${width} ${height}`, class: "chart", role: "img" });
  const pad = { l: 56, r: 8, t: 8, b: 22 };
  const now = Date.now();
  const names = Object.keys(series);
  let max = 0;
  for (const n of names) for (const [, v] of series[n]) max = Math.max(max, v);
  svg.dataset.max = String(max); // the largest value shown (the browser tests read it)
  max = max > 0 ? max * 1.1 : 1;
  const x = (t) => pad.l + ((t - (now - span)) / span) * (width - pad.l - pad.r);
  const y = (v) => height - pad.b - (v / max) * (height - pad.t - pad.b);
  svg.append(el("line", { x1: pad.l, y1: y(0), x2: width - pad.r, y2: y(0), class: "axis" }));
  svg.append(el("line", { x1: pad.l, y1: pad.t, x2: pad.l, y2: y(0), class: "axis" }));
  for (const v of [0, max / 2, max]) {
    const t = el("text", { x: pad.l - 4, y: y(v) + 4, "text-anchor": "end", class: "tick" });
    t.textContent = `${v >= 100 ? v.toFixed(0) : v.toPrecision(2)}${unit}`;
    svg.append(t);
  }
  const minutes = el("text", { x: pad.l, y: height - 4, class: "tick" });
  minutes.textContent = `last ${Math.round(span / 60000)} min`;
  svg.append(minutes);
  names.forEach((n, i) => {
    const pts = series[n].filter(([t]) => t >= now - span);
    const colour = COLOURS[i % COLOURS.length];
    if (pts.length > 1) {
      svg.append(el("polyline", {
        points: pts.map(([t, v]) => `${x(t).toFixed(1)},${y(v).toFixed(1)}`).join(" "),
        fill: "none", stroke: colour, "stroke-width": 1.5,
      }));
    }
    const label = el("text", { x: width - pad.r - 4, y: pad.t + 12 + i * 13, "text-anchor": "end", fill: colour, class: "legend" });
    const last = pts.length ? pts[pts.length - 1][1] : null;
    label.dataset.series = n; // the series' name and largest value shown (the browser tests read them)
    label.dataset.max = String(pts.reduce((m, [, v]) => Math.max(m, v), 0));
    label.textContent = `${n}${last === null ? "" : `: ${last >= 100 ? last.toFixed(0) : last.toPrecision(3)}${unit}`}`;
    svg.append(label);
  });
  return svg;
}
