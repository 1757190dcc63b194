// Prometheus' text format, read into samples: [{name, labels: {k: v}, value}]. Only what
// the node writes (no timestamps, no exemplars); comment lines are skipped.

const LINE = /^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{(.*)\})?\s+(\S+)/;
const LABEL = /([a-zA-Z_][a-zA-Z0-9_]*)="((?:[^"\\]|\\.)*)"/g;

export function parse(text) {
  const out = [];
  for (const line of text.split("\n")) {
    if (!line || line.startsWith("#")) continue;
    const m = LINE.exec(line);
    if (!m) continue;
    const labels = {};
    if (m[3]) for (const l of m[3].matchAll(LABEL)) labels[l[1]] = l[2].replace(/\\(.)/g, "$1");
    out.push({ name: m[1], labels, value: Number(m[4]) });
  }
  return out;
}

// The sum of a metric's samples whose labels match `where` (all of its pairs).
export function sum(samples, name, where = {}) {
  let total = 0;
  for (const s of samples) {
    if (s.name !== name) continue;
    if (Object.entries(where).every(([k, v]) => s.labels[k] === v)) total += s.value;
  }
  return total;
}

// label value -> summed value, for one label of a metric.
export function by(samples, name, label) {
  const out = {};
  for (const s of samples) {
    if (s.name === name) out[s.labels[label] ?? ""] = (out[s.labels[label] ?? ""] || 0) + s.value;
  }
  return out;
}
