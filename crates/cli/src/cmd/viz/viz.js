// minfer viz: draws a minfer-graph export as a layered DAG (laid out by dagre) and shows
// the per-node trace of each step, from a recorded minfer-trace file or live over SSE.
"use strict";

const SVGNS = "http://www.w3.org/2000/svg";
const $ = (id) => document.getElementById(id);

// Everything the page knows; `window.viz` exposes it to tests and to the console.
const viz = {
  info: null,
  graph: null, // the minfer-graph export drawn now
  trace: { phases: [] }, // minfer-trace schema, filled from the file or from events
  cur: { phase: -1, step: -1 }, // the step shown; phase -1: the initial graph, no data
  follow: true, // jump to each new step of a live run
  collapsed: new Set(), // collapsed layer numbers
  selected: null,
  layoutMs: 0,
  drawn: 0, // node boxes drawn (collapsed layers count once)
  events: 0, // events received
  ready: false,
};
window.viz = viz;

// Sources read by more nodes than this are drawn without their edges.
const FANOUT_EDGES = 8;
// mul_mat_id_swiglu: the experts' gate and up products with their SwiGLU in one node.
const FUSED_OPS = new Set(["swiglu", "geglu", "fused_qkv", "fused_ffn", "fused_qkv_norm", "qkv_bias_rope_store", "mul_mat_id_swiglu"]);

function layerOf(node) {
  const m = /-(\d+)$/.exec(node.name);
  return m ? Number(m[1]) : null;
}

function layers(graph) {
  const s = new Set();
  for (const n of graph.nodes) {
    const l = layerOf(n);
    if (l !== null) s.add(l);
  }
  return [...s].sort((a, b) => a - b);
}

function el(tag, attrs, parent) {
  const e = document.createElementNS(SVGNS, tag);
  for (const k in attrs) e.setAttribute(k, attrs[k]);
  if (parent) parent.appendChild(e);
  return e;
}

function fmt(x) {
  if (x === null || x === undefined) return "—";
  if (typeof x !== "number") return String(x);
  if (x !== 0 && (Math.abs(x) >= 1e5 || Math.abs(x) < 1e-3)) return x.toExponential(4);
  return x.toFixed(5).replace(/\.?0+$/, "") || "0";
}

// ---- layout and drawing ----------------------------------------------------------

function visibleKey(node) {
  const l = layerOf(node);
  return l !== null && viz.collapsed.has(l) ? "L" + l : "n" + node.id;
}

function render() {
  const graph = viz.graph;
  if (!graph) return;
  const t0 = performance.now();
  const g = new dagre.graphlib.Graph({ multigraph: false });
  g.setGraph({ rankdir: "TB", nodesep: 12, ranksep: 22, edgesep: 4, marginx: 10, marginy: 10 });
  g.setDefaultEdgeLabel(() => ({}));
  const groups = new Map();
  for (const n of graph.nodes) {
    const key = visibleKey(n);
    if (key[0] === "L") {
      if (!groups.has(key)) groups.set(key, { layer: layerOf(n), members: [] });
      groups.get(key).members.push(n.id);
      continue;
    }
    const chars = Math.max(n.name.length, n.op.length + 12);
    g.setNode(key, { width: Math.max(70, chars * 6.5 + 12), height: 30, node: n });
  }
  for (const [key, grp] of groups) {
    g.setNode(key, { width: 150, height: 34, group: grp });
  }
  // A value read by many nodes (the positions feed every RoPE and attention) would draw
  // long edges across the whole graph, which cost the layout most of its time and help
  // nobody read it: such sources are marked instead, and listed in each reader's details.
  const fanout = new Map();
  for (const n of graph.nodes) for (const s of n.src) fanout.set(s, (fanout.get(s) || 0) + 1);
  for (const n of graph.nodes) {
    const to = visibleKey(n);
    for (const s of n.src) {
      if (fanout.get(s) > FANOUT_EDGES) continue;
      const from = visibleKey(graph.nodes[s]);
      if (from !== to) g.setEdge(from, to);
    }
  }
  dagre.layout(g);
  const vp = $("viewport");
  vp.replaceChildren();
  const edges = el("g", {}, vp);
  for (const e of g.edges()) {
    const pts = g.edge(e).points.map((p) => p.x + "," + p.y).join(" ");
    el("polyline", { class: "edge", points: pts }, edges);
  }
  let drawn = 0;
  for (const key of g.nodes()) {
    const d = g.node(key);
    const box = el("g", { class: "node", transform: `translate(${d.x - d.width / 2},${d.y - d.height / 2})` }, vp);
    el("rect", { width: d.width, height: d.height }, box);
    const t1 = el("text", { x: 6, y: 13 }, box);
    const t2 = el("text", { x: 6, y: 25 }, box);
    if (d.group) {
      box.classList.add("group");
      box.dataset.layer = d.group.layer;
      t1.textContent = `layer ${d.group.layer}`;
      t2.textContent = `${d.group.members.length} nodes (click to expand)`;
      box.addEventListener("click", (ev) => {
        ev.stopPropagation();
        viz.collapsed.delete(d.group.layer);
        render();
      });
    } else {
      const n = d.node;
      box.dataset.id = n.id;
      box.classList.add(n.backend || "unassigned");
      if (FUSED_OPS.has(n.op)) box.classList.add("fused");
      if (n.dead) box.classList.add("dead");
      t1.textContent = n.name;
      t2.textContent = n.op + (FUSED_OPS.has(n.op) ? " (fused)" : "") + " " + n.shape.filter((x) => x > 1).join("×");
      if (fanout.get(n.id) > FANOUT_EDGES) {
        box.classList.add("fanout");
        t2.textContent += ` → ${fanout.get(n.id)} nodes`;
      }
      box.addEventListener("click", (ev) => {
        ev.stopPropagation();
        select(n.id);
      });
    }
    drawn++;
  }
  viz.drawn = drawn;
  viz.size = g.graph();
  viz.layoutMs = performance.now() - t0;
  fit();
  paintData();
  updateCounts();
}

function updateCounts() {
  const graph = viz.graph;
  if (!graph) return;
  const live = graph.nodes.filter((n) => !n.dead).length;
  $("counts").textContent =
    `${graph.nodes.length} nodes (${live} live, ${layers(graph).length} layers, ${viz.drawn} boxes) · layout ${Math.round(viz.layoutMs)} ms`;
  $("counts").dataset.nodes = graph.nodes.length;
}

// ---- pan and zoom ------------------------------------------------------------------

const view = { x: 0, y: 0, k: 1 };
function applyView() {
  $("viewport").setAttribute("transform", `translate(${view.x},${view.y}) scale(${view.k})`);
}
function fit() {
  const box = $("canvas").getBoundingClientRect();
  const w = viz.size.width || 1;
  view.k = Math.min(1.2, Math.max(0.05, (box.width - 20) / w));
  view.x = (box.width - w * view.k) / 2;
  view.y = 10;
  applyView();
}
(function panZoom() {
  const c = $("canvas");
  let drag = null;
  c.addEventListener("wheel", (e) => {
    e.preventDefault();
    const r = c.getBoundingClientRect();
    const mx = e.clientX - r.left, my = e.clientY - r.top;
    const f = Math.exp(-e.deltaY * 0.0015);
    view.x = mx - (mx - view.x) * f;
    view.y = my - (my - view.y) * f;
    view.k *= f;
    applyView();
  }, { passive: false });
  c.addEventListener("mousedown", (e) => { drag = { x: e.clientX - view.x, y: e.clientY - view.y }; });
  window.addEventListener("mousemove", (e) => {
    if (!drag) return;
    view.x = e.clientX - drag.x;
    view.y = e.clientY - drag.y;
    applyView();
  });
  window.addEventListener("mouseup", () => { drag = null; });
})();

// ---- steps and data ----------------------------------------------------------------

// Every (phase, step) in order, for the slider and the arrows.
function flatSteps() {
  const out = [];
  viz.trace.phases.forEach((p, pi) => p.steps.forEach((_, si) => out.push([pi, si])));
  return out;
}

function stepData() {
  const p = viz.trace.phases[viz.cur.phase];
  const s = p && p.steps[viz.cur.step];
  if (!s) return null;
  if (!s.byId || s.byIdLen !== s.nodes.length) {
    s.byId = new Map(s.nodes.map((n) => [n.id, n]));
    s.byIdLen = s.nodes.length;
  }
  return s;
}

function goto(phase, step) {
  const changedGraph = phase !== viz.cur.phase && viz.trace.phases[phase];
  viz.cur = { phase, step };
  if (changedGraph) {
    const g = viz.trace.phases[phase].graph;
    if (g && g !== viz.graph) {
      // Node ids differ between a prefill and a decode graph: keep the selection by name.
      const name = viz.selected !== null && viz.graph.nodes[viz.selected] ? viz.graph.nodes[viz.selected].name : null;
      viz.graph = g;
      const same = name === null ? undefined : g.nodes.find((n) => n.name === name);
      viz.selected = same ? same.id : null;
      render();
      if (viz.selected !== null) select(viz.selected);
      else $("details").replaceChildren();
    }
  }
  $("phase").value = String(phase);
  const flat = flatSteps();
  const idx = flat.findIndex(([p, s]) => p === phase && s === step);
  $("stepSlider").max = String(Math.max(0, flat.length - 1));
  $("stepSlider").value = String(Math.max(0, idx));
  const s = stepData();
  const kind = viz.trace.phases[phase] ? viz.trace.phases[phase].kind : "";
  $("stepLabel").textContent = s
    ? `${kind} step ${step + 1}/${viz.trace.phases[phase].steps.length}: ` +
      (s.token === null || s.token === undefined ? "(no token)" : `token ${s.token} ${JSON.stringify(s.text)}`)
    : "no data";
  $("stepLabel").dataset.phase = phase;
  $("stepLabel").dataset.step = step;
  paintData();
  if (viz.selected !== null) showDetails(viz.selected);
}

function move(delta) {
  const flat = flatSteps();
  let idx = flat.findIndex(([p, s]) => p === viz.cur.phase && s === viz.cur.step);
  idx = Math.min(flat.length - 1, Math.max(0, idx + delta));
  if (flat[idx]) {
    viz.follow = idx === flat.length - 1;
    goto(flat[idx][0], flat[idx][1]);
  }
}

function refreshPhases() {
  const sel = $("phase");
  const want = viz.trace.phases.length;
  if (sel.options.length !== want) {
    sel.replaceChildren();
    viz.trace.phases.forEach((p, i) => {
      const o = document.createElement("option");
      o.value = String(i);
      o.textContent = `${i}: ${p.kind} (${p.graph ? p.graph.nodes.length : "?"} nodes)`;
      sel.appendChild(o);
    });
  }
  sel.value = String(viz.cur.phase);
  $("stepSlider").max = String(Math.max(0, flatSteps().length - 1));
}

// Marks boxes without data in this step, and those whose values hold NaN or Inf.
function paintData() {
  const s = stepData();
  for (const box of $("viewport").querySelectorAll("g.node")) {
    let nodata = true, bad = false;
    if (s) {
      const ids = box.dataset.id !== undefined ? [Number(box.dataset.id)] : groupMembers(Number(box.dataset.layer));
      for (const id of ids) {
        const e = s.byId.get(id);
        if (e) {
          nodata = false;
          if (e.stats.nan > 0 || e.stats.inf > 0) bad = true;
        }
      }
    }
    box.classList.toggle("nodata", nodata);
    box.classList.toggle("nan", bad);
  }
}

function groupMembers(layer) {
  return viz.graph.nodes.filter((n) => layerOf(n) === layer).map((n) => n.id);
}

// ---- details -----------------------------------------------------------------------

function select(id) {
  viz.selected = id;
  for (const b of $("viewport").querySelectorAll("g.node.selected")) b.classList.remove("selected");
  const box = $("viewport").querySelector(`g.node[data-id="${id}"]`);
  if (box) box.classList.add("selected");
  showDetails(id);
}
viz.select = select;

function showDetails(id) {
  const n = viz.graph && viz.graph.nodes[id];
  const d = $("details");
  d.replaceChildren();
  if (!n) return;
  const h = document.createElement("h3");
  h.textContent = `#${n.id} ${n.name}`;
  d.appendChild(h);
  const info = document.createElement("table");
  info.id = "nodeInfo";
  const rows = [
    ["op", n.op + (n.detail ? ` (${n.detail})` : "")],
    ["shape", "[" + n.shape.join(", ") + "]"],
    ["dtype", n.dtype],
    ["backend", n.backend || "unassigned"],
    ["fused", FUSED_OPS.has(n.op) ? "yes" : "no"],
    ["status", n.dead ? "dead (rewritten by fusion, not executed)" : "live"],
  ];
  if (n.meta && n.meta.weight_name) rows.push(["weight", n.meta.weight_name]);
  for (const [k, v] of rows) {
    const tr = info.insertRow();
    tr.insertCell().textContent = k;
    tr.insertCell().textContent = v;
  }
  d.appendChild(info);
  const srcs = document.createElement("p");
  srcs.id = "nodeSources";
  srcs.textContent = "sources: ";
  if (n.src.length === 0) srcs.append("none");
  for (const s of n.src) {
    const a = document.createElement("span");
    a.className = "src";
    a.textContent = `#${s} ${viz.graph.nodes[s].name}`;
    a.addEventListener("click", () => {
      const l = layerOf(viz.graph.nodes[s]);
      if (l !== null && viz.collapsed.has(l)) { viz.collapsed.delete(l); render(); }
      select(s);
    });
    srcs.appendChild(a);
  }
  d.appendChild(srcs);
  const l = layerOf(n);
  if (l !== null) {
    const b = document.createElement("button");
    b.textContent = `collapse layer ${l}`;
    b.addEventListener("click", () => { viz.collapsed.add(l); render(); });
    d.appendChild(b);
  }
  const s = stepData();
  const e = s && s.byId.get(id);
  const title = document.createElement("h4");
  title.textContent = s ? `values in ${viz.trace.phases[viz.cur.phase].kind} step ${viz.cur.step + 1}` : "values";
  d.appendChild(title);
  if (!e) {
    const p = document.createElement("p");
    p.id = "noData";
    p.className = "hint";
    p.textContent = s ? "no data for this node in this step (KV regions and views are not recorded)" : "no step selected: run a prompt or open a trace";
    d.appendChild(p);
    return;
  }
  const st = document.createElement("table");
  st.id = "nodeStats";
  st.className = "stats";
  for (const k of ["min", "max", "mean", "rms", "nan", "inf"]) {
    const tr = st.insertRow();
    tr.insertCell().textContent = k;
    const c = tr.insertCell();
    c.textContent = fmt(e.stats[k]);
    c.dataset.stat = k;
  }
  const tr = st.insertRow();
  tr.insertCell().textContent = "elements";
  tr.insertCell().textContent = `${e.n} (${e.values.length} sampled, stride ${e.stride})`;
  d.appendChild(st);
  d.appendChild(histogram(e.values));
}

function histogram(values) {
  const W = 330, H = 120, B = 32;
  const svg = el("svg", { id: "histogram", width: W, height: H + 18 });
  const xs = values.filter((v) => v !== null && Number.isFinite(v));
  if (xs.length === 0) return svg;
  let lo = Math.min(...xs), hi = Math.max(...xs);
  if (hi === lo) { hi = lo + 1; }
  const bins = new Array(B).fill(0);
  for (const v of xs) bins[Math.min(B - 1, Math.floor(((v - lo) / (hi - lo)) * B))]++;
  const top = Math.max(...bins);
  bins.forEach((c, i) => {
    const h = (c / top) * H;
    el("rect", { x: i * (W / B), y: H - h, width: W / B - 1, height: h, fill: "#5c6bc0", "data-count": c }, svg);
  });
  const lab = el("text", { x: 0, y: H + 14, "font-size": 10 }, svg);
  lab.textContent = `${fmt(lo)} … ${fmt(hi)} (${xs.length} sampled values)`;
  return svg;
}

// ---- live runs ---------------------------------------------------------------------

function ensureStep(p, s) {
  const ph = viz.trace.phases[p];
  while (ph.steps.length <= s) ph.steps.push({ token: null, text: "", logits_top: [], nodes: [] });
  return ph.steps[s];
}

function listen() {
  const es = new EventSource("/viz/events");
  es.addEventListener("run", (m) => {
    viz.events++;
    const d = JSON.parse(m.data);
    viz.trace = { model: d.model, prompt: d.prompt, phases: [] };
    viz.follow = true;
    $("runStatus").textContent = `running ${JSON.stringify(d.prompt)}…`;
  });
  es.addEventListener("phase", (m) => {
    viz.events++;
    const d = JSON.parse(m.data);
    viz.trace.phases[d.phase] = { kind: d.kind, graph: d.graph, steps: [] };
    refreshPhases();
  });
  es.addEventListener("node", (m) => {
    viz.events++;
    const d = JSON.parse(m.data);
    if (!viz.trace.phases[d.phase]) return;
    ensureStep(d.phase, d.step).nodes.push(d);
  });
  es.addEventListener("step", (m) => {
    viz.events++;
    const d = JSON.parse(m.data);
    if (!viz.trace.phases[d.phase]) return;
    const s = ensureStep(d.phase, d.step);
    s.token = d.token;
    s.text = d.text;
    s.logits_top = d.logits_top;
    refreshPhases();
    if (viz.follow) goto(d.phase, d.step);
  });
  es.addEventListener("done", (m) => {
    viz.events++;
    const d = JSON.parse(m.data);
    $("runStatus").textContent = d.error ? `error: ${d.error}` : `done: ${d.tokens} tokens ${JSON.stringify(d.text)}`;
    $("runStatus").dataset.done = "1";
    $("run").disabled = false;
  });
  es.addEventListener("lagged", (m) => {
    $("runStatus").textContent = `the page fell behind and missed ${JSON.parse(m.data).missed} events`;
  });
}

async function startRun() {
  $("run").disabled = true;
  $("runStatus").dataset.done = "";
  const r = await fetch("/viz/run", {
    method: "POST",
    headers: { "content-type": "application/json" },
    body: JSON.stringify({ prompt: $("prompt").value, n: Number($("ntok").value) }),
  });
  if (!r.ok) {
    const e = await r.json().catch(() => ({ error: r.statusText }));
    $("runStatus").textContent = `refused: ${e.error}`;
    $("run").disabled = false;
  }
}

// ---- start -------------------------------------------------------------------------

function legend() {
  const lg = $("legend");
  for (const [cls, label] of [["cpu", "cpu"], ["wgpu", "wgpu"], ["cuda", "cuda"], ["metal", "metal"]]) {
    const s = document.createElement("span");
    s.className = "legend-item";
    s.style.background = { cpu: "#fff6bf", wgpu: "#cfe6ff", cuda: "#d7f5d0", metal: "#d6ecff" }[cls];
    s.textContent = label;
    lg.appendChild(s);
  }
  const f = document.createElement("span");
  f.className = "legend-item";
  f.style.border = "3px solid #c2185b";
  f.textContent = "fused";
  lg.appendChild(f);
}

async function main() {
  legend();
  $("prev").addEventListener("click", () => move(-1));
  $("next").addEventListener("click", () => move(1));
  $("stepSlider").addEventListener("input", () => {
    const flat = flatSteps();
    const idx = Number($("stepSlider").value);
    if (flat[idx]) { viz.follow = idx === flat.length - 1; goto(flat[idx][0], flat[idx][1]); }
  });
  $("phase").addEventListener("change", () => { viz.follow = false; goto(Number($("phase").value), 0); });
  $("expandAll").addEventListener("click", () => { viz.collapsed.clear(); render(); });
  $("collapseAll").addEventListener("click", () => { viz.collapsed = new Set(layers(viz.graph)); render(); });
  $("run").addEventListener("click", startRun);
  document.addEventListener("keydown", (e) => {
    if (e.target.tagName === "INPUT") return;
    if (e.key === "ArrowRight") move(1);
    if (e.key === "ArrowLeft") move(-1);
  });
  viz.info = await (await fetch("/viz/info")).json();
  $("model").textContent = viz.info.model;
  $("mode").textContent = viz.info.mode === "live" ? "live" : "recorded trace";
  $("ntok").max = String(viz.info.max_tokens);
  viz.graph = await (await fetch("/viz/graph")).json();
  // A 24-layer model is read layer by layer: large graphs start collapsed.
  if (viz.graph.nodes.length > 200) viz.collapsed = new Set(layers(viz.graph));
  if (viz.info.mode === "live") {
    listen();
  } else {
    $("runBar").querySelectorAll("input,button").forEach((x) => { x.disabled = true; });
    viz.trace = await (await fetch("/viz/trace")).json();
    if (viz.trace.phases[0] && viz.trace.phases[0].graph) viz.graph = viz.trace.phases[0].graph;
    if (viz.graph.nodes.length > 200) viz.collapsed = new Set(layers(viz.graph));
    refreshPhases();
  }
  render();
  if (viz.trace.phases.length > 0) goto(0, 0);
  viz.ready = true;
}

main().catch((e) => {
  $("runStatus").textContent = "error: " + e;
});
