const D = JSON.parse(document.getElementById("cw-data").textContent);
const K = D.tokens.length;
const shown = t => t.replace(/\r/g, "").replace(/\n/g, "\u21b5").replace(/\t/g, "\u21e5");
const short = t => t.length > 11 ? t.slice(0, 10) + "\u2026" : t;  // column labels: 11 characters at most
const sinkKeys = new Set(D.sinks);
let excludedKeys = new Set();  // the selected position's excluded keys (any position's for "sum")
const excludedAt = sel => new Set(sel === "sum" ? D.excluded.flat() : (D.excluded[+sel] || []));
function colour(v, lim) {
  if (!(lim > 0)) return "#fff";
  const t = Math.max(-1, Math.min(1, v / lim)), end = t >= 0 ? [178, 24, 43] : [33, 102, 172];
  return "rgb(" + end.map(e => Math.round(255 + (e - 255) * Math.abs(t))).join(",") + ")";
}
function pick(rowsByKey, sel) {  // rowsByKey: [row][key] -> [key], summed over rows for "sum"
  if (sel !== "sum") return rowsByKey[+sel];
  return rowsByKey[0].map((_, j) => rowsByKey.reduce((s, row) => s + row[j], 0));
}
function meanRows(rowsByKey, sel) {
  if (sel !== "sum") return rowsByKey[+sel];
  return pick(rowsByKey, "sum").map(v => v / rowsByKey.length);
}
function cellWidth() {  // fit the window (labels thinned out below 12 px), or 12 px per token and scroll
  const avail = Math.max(300, Math.min(window.innerWidth, 1600) - 140);
  const least = document.getElementById("width").value === "fit" ? 3 : 12;
  return Math.max(least, Math.min(40, Math.floor(avail / K)));
}
function grid(title, rowLabels, matrix, sinkMask, scale, onRow, selected) {
  const w = cellWidth(), every = Math.ceil(13 / w), wrap = document.createElement("div");
  wrap.className = "panel";
  const clip = scale !== "all";  // leave the sink keys out of the scale: they saturate instead
  const peak = m => {
    const kept = Math.max(0, ...m.map((v, j) => (clip && sinkKeys.has(j)) || excludedKeys.has(j) ? 0 : Math.abs(v)));
    return kept > 0 ? kept : Math.max(0, ...m.map((v, j) => excludedKeys.has(j) ? 0 : Math.abs(v)));
  };
  const gridLimit = Math.max(0, ...matrix.map(peak));
  const perRow = scale === "row";
  const head = document.createElement("div");
  head.className = "hm-title"; head.textContent = title; wrap.appendChild(head);
  const legend = document.createElement("div"); legend.className = "legend";
  legend.innerHTML = perRow ? '<span class="bar"></span> each row scaled to its own largest |score|'
    + (clip ? " (sinks left out)" : "")
    : '<span>' + (-gridLimit).toPrecision(3) + '</span><span class="bar"></span><span>+' + gridLimit.toPrecision(3)
      + '</span>' + (clip && sinkKeys.size ? " (sinks left out of the scale)" : "");
  wrap.appendChild(legend);
  const box = document.createElement("div"); box.className = "hm-wrap";
  const g = document.createElement("div"); g.className = "hm";
  g.style.gridTemplateColumns = "64px repeat(" + K + ", " + w + "px)";
  g.appendChild(document.createElement("div"));
  D.tokens.forEach((t, j) => {
    const c = document.createElement("div");
    c.className = (sinkKeys.has(j) ? "col sink" : "col") + (excludedKeys.has(j) ? " excluded" : "");
    c.textContent = sinkKeys.has(j) ? "\u25bc" + short(shown(t)) : ((K - 1 - j) % every === 0 ? short(shown(t)) : "");
    c.title = j + ": " + JSON.stringify(t) + (sinkKeys.has(j) ? " (sink)" : "") + (excludedKeys.has(j) ? " (excluded)" : "");
    g.appendChild(c);
  });
  matrix.forEach((values, r) => {
    const label = document.createElement("div");
    label.className = "rl" + (selected === r ? " sel" : ""); label.textContent = rowLabels[r];
    label.style.height = Math.max(12, Math.min(w, 18)) + "px";
    if (onRow) { label.onclick = () => onRow(r); label.title = "show this layer's heads"; }
    g.appendChild(label);
    const lim = perRow ? peak(values) : gridLimit;
    values.forEach((v, j) => {
      const c = document.createElement("div");
      c.className = (sinkMask && sinkMask[r][j] > D.threshold ? "c s" : "c") + (excludedKeys.has(j) ? " x" : "");
      if (!excludedKeys.has(j)) c.style.background = colour(v, lim);
      c.title = rowLabels[r] + " \u00b7 " + JSON.stringify(D.tokens[j]) + " (" + j + ") \u00b7 " + title
        + " = " + v.toPrecision(6) + (sinkMask ? " \u00b7 attention " + sinkMask[r][j].toPrecision(3) : "");
      g.appendChild(c);
    });
  });
  box.appendChild(g); wrap.appendChild(box);
  return wrap;
}
const state = {row: document.getElementById("row").value, layer: D.layers.length - 1};
function render() {
  const sel = state.row, scale = document.getElementById("scale").value;
  excludedKeys = excludedAt(sel);
  document.querySelectorAll(".strips").forEach(s => { s.hidden = s.dataset.row !== sel; });
  const layers = document.getElementById("layers"); layers.innerHTML = "";
  const attention = D.per_layer.attention.map(l => meanRows(l, sel));
  D.metrics.forEach(m => {
    const matrix = D.per_layer[m].map(l => pick(l, sel));
    layers.appendChild(grid(D.labels[m], D.layers.map(l => "layer " + l), matrix, attention, scale,
      r => { state.layer = r; render(); }, state.layer));
  });
  const heads = document.getElementById("heads"); heads.innerHTML = "";
  document.getElementById("head-layer").textContent = D.layers[state.layer];
  const headAttention = D.per_head.attention[state.layer].map(h => meanRows(h, sel));
  D.metrics.forEach(m => {
    const matrix = D.per_head[m][state.layer].map(h => pick(h, sel));
    heads.appendChild(grid(D.labels[m] + ", layer " + D.layers[state.layer], D.heads.map(h => "head " + h),
      matrix, headAttention, scale, null, -1));
  });
}
document.getElementById("row").onchange = e => { state.row = e.target.value; render(); };
document.getElementById("scale").onchange = render;
document.getElementById("width").onchange = render;
render();
