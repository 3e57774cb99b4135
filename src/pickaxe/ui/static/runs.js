// Runs page: the table of /api/runs; selecting runs overlays their curves from /api/runs/compare.
"use strict";

const state = {runs: [], selected: new Set(PX_initialSelection()), metric: PX.query("metric"), seq: 0};

function PX_initialSelection() {
  return new URLSearchParams(window.location.search).getAll("run");
}

function syncUrl() {
  const params = new URLSearchParams();
  for (const id of state.selected) params.append("run", id);
  if (state.metric) params.set("metric", state.metric);
  const q = params.toString();
  history.replaceState(null, "", q ? `/runs?${q}` : "/runs");
}

function evalText(run, value) {
  if (value === null || value === undefined) return "-";
  return run.metric === "eval/accuracy" ? value.toFixed(3) : value.toFixed(1);
}

// "running (warm start)": what a running run is doing now (status.json's phase)
function stateText(run) {
  if (run.state === "running" && ["loading", "warm_start"].includes(run.phase)) {
    return `warming up (${run.phase.replace("_", " ")})`;
  }
  return run.phase ? `${run.state} (${run.phase.replace("_", " ")})` : run.state;
}

function renderTable() {
  const filter = document.getElementById("filter").value.trim().toLowerCase();
  const shown = state.runs.filter((r) =>
    !filter || [r.id, r.recipe, stateText(r)].some((t) => t.toLowerCase().includes(filter)));
  const columns = [
    {label: "", value: (r) => PX.el("input", {type: "checkbox", checked: state.selected.has(r.id),
      "aria-label": `select ${r.id}`, dataset: {run: r.id},
      onchange: (ev) => {
        if (ev.target.checked) state.selected.add(r.id); else state.selected.delete(r.id);
        update();
      }})},
    {label: "run", value: (r) => PX.el("a", {href: `/run?run=${encodeURIComponent(r.id)}`, className: "run-link",
      title: "every metric, live; events, config and live changes", text: r.id})},
    {label: "recipe", value: (r) => r.recipe},
    {label: "state", value: stateText, className: (r) => (stateText(r).startsWith("warming") ? "state-warmup" : `state-${r.state}`)},
    {label: "env steps", num: true, value: (r) => `${PX.fmt(r.step)}/${PX.fmt(r.total_steps)}`},
    {label: "final eval", num: true, value: (r) => evalText(r, r.final_eval)},
    {label: "best eval", num: true, value: (r) => evalText(r, r.best_eval)},
    {label: "metric", value: (r) => r.metric},
    {label: "wall", num: true, value: (r) => PX.duration(r.wall_s)},
    {label: "", value: (r) => PX.el("a", {href: `/checkpoints?run=${encodeURIComponent(r.id)}`,
      className: "ckpt-link", title: "checkpoints, alarms and the selected best", text: "checkpoints"})},
  ];
  const host = document.getElementById("runs");
  host.textContent = "";
  if (!state.runs.length) {
    host.appendChild(PX.el("div", {className: "px-empty",
      text: "No runs here yet (a run folder holds config.json); `pickaxe train RECIPE --run-dir DIR` makes one."}));
  } else {
    host.appendChild(PX.table(columns, shown, {className: "runs-table", rowData: (r) => ({run: r.id})}));
  }
  document.getElementById("count").textContent =
    `${state.runs.length} runs` + (filter ? `, ${shown.length} shown` : "") + `, ${state.selected.size} selected`;
}

let shownRuns = "";

async function loadRuns(quiet) {
  try {
    const data = await PX.getJSON("/api/runs");
    const text = JSON.stringify(data.runs);
    if (quiet && text === shownRuns) return; // nothing moved: keep the page as it is
    shownRuns = text;
    document.getElementById("root").textContent = data.root;
    state.runs = data.runs;
    const known = new Set(data.runs.map((r) => r.id));
    for (const id of Array.from(state.selected)) if (!known.has(id)) state.selected.delete(id);
    renderTable();
    await loadCompare();
  } catch (err) {
    PX.showError(err);
  }
}

const LONG_LABEL = 100;

/** A group's name on the page: compare's label, or "group N" when that label is too long to read (the config keys
 * table below shows what differs). */
function namer(data) {
  const names = new Map(data.groups.map((g, i) => [g.label, g.label.length <= LONG_LABEL ? g.label : `group ${i + 1}`]));
  return (label) => (label === null || label === undefined ? "-" : names.get(label) || label);
}

function groupsTable(data) {
  const name = namer(data);
  const conf = `${Math.round(data.confidence * 100)}% CI`;
  const est = (e) => PX.ci(e.value, e.low, e.high);
  return PX.table([
    {label: "group", value: (g) => PX.el("span", {title: g.label, text: name(g.label) + (g.label === data.best ? " *" : "")})},
    {label: "runs", num: true, value: (g) => g.n_runs},
    {label: `final IQM [${conf}]`, num: true, value: (g) => est(g.final.iqm)},
    {label: "final mean", num: true, value: (g) => est(g.final.mean)},
    {label: "best IQM", num: true, value: (g) => est(g.best.iqm)},
    {label: "best mean", num: true, value: (g) => est(g.best.mean)},
  ], data.groups, {className: "groups-table", rowClass: (g) => (g.label === data.best ? "best" : "")});
}

function renderCompare(data) {
  state.metric = data.metric;
  syncUrl();
  const select = document.getElementById("metric");
  select.textContent = "";
  for (const m of data.metrics.length ? data.metrics : [data.metric]) {
    select.appendChild(PX.el("option", {value: m, text: m, selected: m === data.metric}));
  }
  const series = [];
  let i = 0;
  const name = namer(data);
  const colorOf = new Map(data.groups.map((g, j) => [g.label, PX.color(j)]));
  for (const r of data.runs) {
    const grouped = data.groups.find((g) => g.label === r.group && g.curve);
    series.push({label: r.id + (r.seed !== null && r.seed !== undefined ? ` (seed ${r.seed})` : ""),
      x: r.step, y: r.value, color: grouped ? colorOf.get(r.group) : PX.color(data.groups.length + i++),
      width: grouped ? 1 : 2, dash: grouped ? [4, 3] : undefined, points: true});
  }
  for (const g of data.groups) {
    if (!g.curve) continue;
    series.push({label: `${name(g.label)}: IQM of ${g.n_runs} seeds`, x: g.curve.step, y: g.curve.iqm,
      low: g.curve.low, high: g.curve.high, color: colorOf.get(g.label), width: 3, points: true});
  }
  const width = Math.max(480, Math.min(1100, document.querySelector("main").clientWidth - 40));
  PX.chart(document.getElementById("chart"), {title: data.metric, series, width, height: 360});
  const groups = document.getElementById("groups");
  groups.textContent = "";
  groups.appendChild(groupsTable(data));
  const pairs = document.getElementById("pairs");
  pairs.textContent = "";
  if (data.comparisons.length) {
    pairs.appendChild(PX.el("div", {className: "px-note", text: "P(a run of A ends above a run of B)"}));
    pairs.appendChild(PX.table([
      {label: "A", value: (p) => name(p.a)},
      {label: "B", value: (p) => name(p.b)},
      {label: "P(A > B)", num: true, value: (p) => PX.ci(p.probability_a_better.value,
        p.probability_a_better.low, p.probability_a_better.high, 3)},
      {label: "better", value: (p) => (p.better ? name(p.better) : "can't tell")},
    ], data.comparisons));
  }
  // compare's sentences name the groups by label: use the page's names for labels too long to read
  const shorten = (t) => data.groups.reduce((acc, g) => acc.split(g.label).join(name(g.label)), t);
  document.getElementById("verdict").textContent = shorten(data.verdict);
  const notes = document.getElementById("notes");
  notes.textContent = "";
  for (const n of data.notes) notes.appendChild(PX.el("div", {className: "px-note", text: `note: ${shorten(n)}`}));
  // one row per config key that differs between the groups, one column per selected run (keys can be many)
  const varying = document.getElementById("varying");
  varying.textContent = "";
  const groupOf = new Map(data.groups.map((g) => [g.label, g]));
  const text = (v) => (v === undefined ? "-" : typeof v === "string" ? v : JSON.stringify(v));
  const keyRows = [{key: "group", cell: (r) => name(r.group)}, {key: "seed", cell: (r) => JSON.stringify(r.seed)}].concat(data.varying.map((k) => ({key: k,
    cell: (r) => {
      const g = groupOf.get(r.group);
      return text(g ? g.varying[k] : undefined);
    }})));
  const columns = [{label: "key", value: (row) => row.key}].concat(data.runs.map((r) => ({label: r.id,
    value: (row) => row.cell(r)})));
  varying.appendChild(PX.table(columns, keyRows, {className: "varying-table"}));
  if (!data.varying.length) {
    varying.appendChild(PX.el("div", {className: "px-note",
      text: "no other key differs: the selected runs share one config (they differ by seed only)"}));
  }
}

async function loadCompare() {
  const section = document.getElementById("compare");
  if (!state.selected.size) {
    section.hidden = true;
    syncUrl();
    return;
  }
  const params = new URLSearchParams();
  for (const id of state.selected) params.append("run", id);
  if (state.metric) params.set("metric", state.metric);
  const seq = ++state.seq;
  try {
    const data = await PX.getJSON(`/api/runs/compare?${params}`);
    if (seq !== state.seq) return; // a newer selection is on its way
    PX.clearError();
    section.hidden = false;
    renderCompare(data);
  } catch (err) {
    if (seq === state.seq) PX.showError(err);
  }
}

let pending = null;

function update() {
  // the boxes already show the selection: only the count changes (re-drawing 200 rows per tick is slow)
  document.getElementById("count").textContent = document.getElementById("count").textContent
    .replace(/\d+ selected$/, `${state.selected.size} selected`);
  // ticking several boxes in a row asks the server once, for the last selection
  clearTimeout(pending);
  pending = setTimeout(loadCompare, 150);
}

// while a run trains, its state, steps and evals move: refresh the table (the compare too) every 10 s
setInterval(() => {
  if (state.runs.some((r) => r.state === "running")) loadRuns(true);
}, 10000);
document.getElementById("filter").addEventListener("input", renderTable);
document.getElementById("clear").addEventListener("click", () => {
  state.selected.clear();
  renderTable();
  update();
});
document.getElementById("metric").addEventListener("change", (ev) => {
  state.metric = ev.target.value;
  loadCompare();
});
loadRuns();
