// Checkpoints page: "which checkpoint?" first: the selected best, the alarms and the gold / proxy / KL charts at the
// top; then the checkpoint evaluation (eval/checkpoints.json) as a table that scrolls in its box and one chart per
// other metric with its CI band, in a grid that fits the window; the run's training-time evaluations below.
"use strict";

const ALARM_COLOR = "#c4312b";
const BEST_COLOR = "#1b873f";

function alarmMarkers(alarms) {
  return alarms.map((a) => ({x: a.step, label: `alarm ${a.name}`, color: ALARM_COLOR}));
}

function chartBox(host) {
  const box = PX.el("div", {className: "chart"});
  host.appendChild(box);
  return box;
}

// the curves that tell reward over-optimisation apart: held-out gold, the proxy reward, the KL to the reference
const KEY = /gold|proxy|(^|[/_])kl([/_]|$)/i;

function renderEvaluation(data) {
  const ev = data.evaluation;
  const section = document.getElementById("evaluation");
  section.hidden = !ev;
  document.getElementById("best").textContent = "";
  if (!ev) return;
  const rows = ev.rows;
  const metrics = ev.metrics && ev.metrics.length ? ev.metrics :
    Array.from(new Set(rows.flatMap((r) => Object.keys(r.metrics || {}))));
  const best = ev.best || null;
  const bestBox = document.getElementById("best");
  bestBox.textContent = "";
  if (best) {
    bestBox.appendChild(PX.el("p", {className: "best-summary"}, [
      PX.el("strong", {text: `Best: step ${PX.fmt(best.step)}`}),
      ` by rule ${best.rule} on ${best.metric}: ${PX.ci(best.mean, best.low, best.high)}`,
      best.reason ? ` (${best.reason})` : "",
    ]));
  }
  const settings = ev.settings ? Object.entries(ev.settings).map(([k, v]) =>
    `${k}=${typeof v === "string" ? v : JSON.stringify(v)}`).join(", ") : "";
  document.getElementById("settings").textContent = settings ? `settings: ${settings}` : "";
  const columns = [
    {label: "step", num: true, value: (r) => PX.fmt(r.step)},
    {label: "source", value: (r) => r.source || ""},
    ...metrics.map((m) => ({label: m, num: true, value: (r) => {
      const v = (r.metrics || {})[m];
      return v ? PX.ci(v.mean, v.low, v.high) : "-";
    }})),
    {label: "sha256", value: (r) => (r.sha256 ? r.sha256.slice(0, 12) : ""), className: () => "mono"},
    {label: "", value: (r) => (best && r.step === best.step ? "best" : "")},
  ];
  const table = document.getElementById("table");
  table.textContent = "";
  table.appendChild(PX.table(columns, rows, {className: "checkpoints-table",
    rowClass: (r) => (best && r.step === best.step ? "best" : ""), rowData: (r) => ({step: String(r.step)})}));
  const pairs = document.getElementById("pairs");
  pairs.textContent = "";
  const agree = ev.agreement;
  if (agree && agree.metrics) {  // pickaxe eval --fqe: how the off-policy estimate ranks against the online return
    pairs.appendChild(PX.el("p", {className: "px-note agreement", text: `rank agreement of ${agree.metrics[1]} with ` +
      `${agree.metrics[0]} over ${PX.fmt(agree.n)} checkpoints: Spearman ` +
      (agree.spearman === null || agree.spearman === undefined ? "undefined" : PX.fmt(agree.spearman))}));
  }
  if (ev.pairs && ev.pairs.length) {
    pairs.appendChild(PX.el("div", {className: "px-note", text: "pairs of checkpoints: the difference of the means " +
      "and how many more samples each would need for its 95% CI to exclude 0"}));
    pairs.appendChild(PX.table([
      {label: "A", num: true, value: (p) => PX.fmt(p.a)},
      {label: "B", num: true, value: (p) => PX.fmt(p.b)},
      {label: "metric", value: (p) => p.metric},
      {label: "difference", num: true, value: (p) => PX.fmt(p.difference)},
      {label: "P(A > B)", num: true, value: (p) => PX.fmt(p.probability_of_improvement)},
      {label: "more samples", num: true, value: (p) => (p.more_samples === null || p.more_samples === undefined ?
        "never (equal means)" : p.more_samples === 0 ? "0 (separated)" : PX.fmt(p.more_samples))},
    ], ev.pairs));
  }
  const charts = document.getElementById("eval-charts");
  charts.textContent = "";
  const markers = alarmMarkers(data.alarms);
  if (best) markers.push({x: best.step, label: "best", color: BEST_COLOR});
  const key = document.getElementById("key-charts");
  for (const m of order(metrics, best ? best.metric : null)) {
    const pick = (k) => rows.map((r) => ((r.metrics || {})[m] ? r.metrics[m][k] : null));
    const top = KEY.test(m) || (best && m === best.metric);
    PX.chart(chartBox(top ? key : charts), {title: `${m} (checkpoints)`, fit: true, height: 240, markers,
      series: [{label: m, x: rows.map((r) => r.step), y: pick("mean"), low: pick("low"), high: pick("high"),
        points: true}]});
  }
}

function renderAlarms(alarms) {
  document.getElementById("alarms-section").hidden = !alarms.length;
  const host = document.getElementById("alarms");
  host.textContent = "";
  if (!alarms.length) return;
  host.appendChild(PX.table([
    {label: "step", num: true, value: (a) => PX.fmt(a.step)},
    {label: "alarm", value: (a) => a.name},
    {label: "message", value: (a) => a.message || ""},
    {label: "seen in", value: (a) => a.sources.join(", ")},
  ], alarms, {className: "alarms-table"}));
}

// the selected metric first, then the gold / proxy / KL curves that tell over-optimisation apart, then the rest
function order(names, first) {
  const rank = (n) => (n === first ? 0 : /gold/.test(n) ? 1 : /proxy/.test(n) ? 2 : /kl/.test(n) ? 3 : 4);
  return names.slice().sort((a, b) => rank(a) - rank(b) || a.localeCompare(b));
}

function renderTraining(data) {
  const names = order(Object.keys(data.training), data.selection ? data.selection.metric : null);
  document.getElementById("training").hidden = !names.length;
  const sel = data.selection;
  document.getElementById("selection").textContent = sel && sel.step !== undefined ?
    `selected during training: step ${PX.fmt(sel.step)} by rule ${sel.rule} on ${sel.metric}: ` +
    `${PX.ci(sel.mean, sel.low, sel.high)}${sel.reason ? ` (${sel.reason})` : ""}` : "";
  const charts = document.getElementById("training-charts");
  charts.textContent = "";
  const markers = alarmMarkers(data.alarms);
  if (sel && typeof sel.step === "number") markers.push({x: sel.step, label: "selected", color: BEST_COLOR});
  const key = document.getElementById("key-charts");
  const evaluated = new Set(data.evaluation ? data.evaluation.metrics || [] : []);
  for (const m of names) {
    const c = data.training[m];
    // without a checkpoint evaluation of it, a gold / proxy / KL curve from training goes to the top
    const top = (KEY.test(m) || (sel && m === sel.metric)) && !evaluated.has(m);
    PX.chart(chartBox(top ? key : charts), {title: m, fit: true, height: 220, markers,
      series: [{label: m, x: c.step, y: c.mean, low: c.low, high: c.high}]});
  }
}

async function show(run) {
  const url = new URL(window.location.href);
  url.searchParams.set("run", run);
  history.replaceState(null, "", url.pathname + url.search);
  try {
    const data = await PX.getJSON(`/api/checkpoints?run=${encodeURIComponent(run)}`);
    PX.clearError();
    if (data.errors.length) PX.showError(data.errors.join("; "));
    document.getElementById("path").textContent = data.path;
    const missing = document.getElementById("missing");
    missing.textContent = "";
    if (!data.evaluation) {
      missing.appendChild(PX.el("div", {className: "px-empty"}, [
        "No checkpoint evaluation for this run yet; this command makes it: ",
        PX.el("code", {text: data.command}),
      ]));
    }
    document.getElementById("key-charts").textContent = "";
    document.getElementById("run-link").href = `/run?run=${encodeURIComponent(data.run)}`;
    renderEvaluation(data);
    renderAlarms(data.alarms);
    renderTraining(data);
  } catch (err) {
    PX.showError(err);
  }
}

async function init() {
  let runs = [];
  try {
    runs = (await PX.getJSON("/api/runs")).runs;
  } catch (err) {
    PX.showError(err);
  }
  const select = document.getElementById("run");
  const wanted = PX.query("run") || (runs.find((r) => r.checkpoints) || runs[0] || {}).id;
  for (const r of runs) {
    select.appendChild(PX.el("option", {value: r.id, selected: r.id === wanted,
      text: r.id + (r.checkpoints ? "  (evaluated)" : "")}));
  }
  select.addEventListener("change", () => show(select.value));
  if (wanted) show(wanted);
  else document.getElementById("missing").appendChild(PX.el("div", {className: "px-empty", text: "No runs here yet."}));
}

init();
