// Run page: every metric a run logs (metrics.jsonl), grouped by prefix and searchable, updated while the run trains
// (/api/run/poll returns the records after the last byte read); its status, events, config and live changes.
"use strict";

const ORDER = ["eval", "rollout", "loss", "kl", "train", "algo", "llm", "agent", "override", "alarm", "time", "sys"];
const WARMUP = new Set(["loading", "warm_start"]);
const POLL_MS = 1500;
const IDLE_POLL_MS = 5000;

const S = {
  run: null, offset: 0, file: null, events: 0, seq: 0, timer: null, status: null, info: null,
  series: new Map(), // metric -> {x: [], y: []}
  bands: new Map(), // metric -> {low: Map(step -> value), high: Map(step -> value)} from its _ci_low/_ci_high
  boxes: new Map(), // metric -> {box, drawn: number of points drawn}
  groups: new Map(), // group -> {details, grid, count}
};

const $ = (id) => document.getElementById(id);

function groupOf(name) {
  const i = name.indexOf("/");
  return i > 0 ? name.slice(0, i) : "other";
}

function groupRank(g) {
  const i = ORDER.indexOf(g);
  if (i < 0) return [g === "other" ? 1 : 0, ORDER.indexOf("time"), g];
  return [i >= ORDER.indexOf("time") ? 2 : 0, i, g];
}

function compareGroups(a, b) {
  const ra = groupRank(a);
  const rb = groupRank(b);
  return ra[0] - rb[0] || ra[1] - rb[1] || ra[2].localeCompare(rb[2]);
}

function terms() {
  return $("search").value.trim().toLowerCase().split(/\s+/).filter(Boolean);
}

function matches(name, ts) {
  const n = name.toLowerCase();
  return ts.every((t) => n.includes(t));
}

function resetMetrics() {
  S.series.clear();
  S.bands.clear();
  S.boxes.clear();
  S.groups.clear();
  $("metrics").textContent = "";
}

function add(records) {
  const touched = new Set();
  for (const r of records) {
    const step = r.step;
    if (typeof step !== "number") continue;
    for (const [k, v] of Object.entries(r)) {
      if (k === "step" || (typeof v !== "number" && v !== null)) continue;
      const bound = /_ci_(low|high)$/.exec(k);
      if (bound) { // a CI bound is the band of its metric's chart, not a chart of its own
        const base = k.slice(0, -bound[0].length);
        if (!S.bands.has(base)) S.bands.set(base, {low: new Map(), high: new Map()});
        S.bands.get(base)[bound[1]].set(step, v);
        touched.add(base);
        continue;
      }
      let s = S.series.get(k);
      if (!s) {
        s = {x: [], y: []};
        S.series.set(k, s);
      }
      const last = s.x.length ? s.x[s.x.length - 1] : -Infinity;
      if (step > last) {
        s.x.push(step);
        s.y.push(v);
      } else { // a step logged again (or out of order): keep the steps sorted and the latest value
        const i = s.x.findIndex((x) => x >= step);
        if (s.x[i] === step) s.y[i] = v;
        else {
          s.x.splice(i, 0, step);
          s.y.splice(i, 0, v);
        }
      }
      touched.add(k);
    }
  }
  for (const name of Array.from(touched)) if (!S.series.has(name)) touched.delete(name); // bounds without a mean
  return touched;
}

function ensureGroup(g) {
  let entry = S.groups.get(g);
  if (entry) return entry;
  const grid = PX.el("div", {className: "px-grid"});
  const summary = PX.el("summary", {}, [PX.el("span", {className: "group-name", text: g}), " ",
    PX.el("span", {className: "px-note group-count"})]);
  const details = PX.el("details", {className: "metric-group", dataset: {group: g}}, [summary, grid]);
  details.open = S.groups.size < 4 || ["eval", "loss", "rollout", "kl"].includes(g);
  details.addEventListener("toggle", () => drawVisible());
  entry = {details, grid, summary};
  S.groups.set(g, entry);
  const host = $("metrics");
  const after = Array.from(S.groups.keys()).filter((k) => k !== g).sort(compareGroups).find((k) =>
    compareGroups(k, g) > 0);
  host.insertBefore(details, after ? S.groups.get(after).details : null);
  return entry;
}

function ensureBox(name) {
  let entry = S.boxes.get(name);
  if (entry) return entry;
  const group = ensureGroup(groupOf(name));
  const box = PX.el("div", {className: "chart metric-chart", dataset: {metric: name}});
  entry = {box, drawn: -1};
  S.boxes.set(name, entry);
  const names = Array.from(S.boxes.keys()).filter((n) => groupOf(n) === groupOf(name) && n !== name).sort();
  const next = names.find((n) => n > name);
  group.grid.insertBefore(box, next ? S.boxes.get(next).box : null);
  return entry;
}

function visible(name) {
  const g = S.groups.get(groupOf(name));
  return g && g.details.open && matches(name, terms());
}

function draw(name) {
  const entry = S.boxes.get(name);
  const s = S.series.get(name);
  if (!entry || !s || entry.drawn === s.x.length) return;
  const u = entry.box._uplot;
  const band = S.bands.get(name);
  const pts = s.x.length < 60;
  if (u && entry.drawn >= 0 && !band && (entry.drawn < 60) === pts) {
    u.setData([s.x.slice(), s.y.slice()]);
  } else {
    PX.chart(entry.box, spec(name, s));
  }
  entry.drawn = s.x.length;
  entry.box.dataset.points = String(s.x.length);
}

function spec(name, s) {
  const line = {label: name, x: s.x.slice(), y: s.y.slice(), color: "#2f6fdb"};
  const band = S.bands.get(name);
  if (band) {
    line.low = s.x.map((x) => (band.low.has(x) ? band.low.get(x) : null));
    line.high = s.x.map((x) => (band.high.has(x) ? band.high.get(x) : null));
    line.label = `${name} (band: 95% CI)`;
  }
  return {title: name, fit: true, height: 190, series: [line]};
}

function drawVisible() {
  for (const name of S.boxes.keys()) if (visible(name)) draw(name);
}

function applySearch() {
  const ts = terms();
  let shown = 0;
  const perGroup = new Map();
  for (const [name, entry] of S.boxes) {
    const ok = matches(name, ts);
    entry.box.hidden = !ok;
    if (ok) shown += 1;
    perGroup.set(groupOf(name), (perGroup.get(groupOf(name)) || 0) + (ok ? 1 : 0));
  }
  for (const [g, entry] of S.groups) {
    const n = perGroup.get(g) || 0;
    const total = Array.from(S.boxes.keys()).filter((k) => groupOf(k) === g).length;
    entry.details.hidden = n === 0;
    entry.summary.querySelector(".group-count").textContent = ts.length ? `${n} of ${total}` : String(total);
    if (ts.length && n) entry.details.open = true;
  }
  $("metric-count").textContent = S.series.size ?
    `${S.series.size} metrics in ${S.groups.size} groups` + (ts.length ? `, ${shown} match` : "") : "";
  if (!S.series.size) {
    $("metrics").dataset.empty = "1";
  } else delete $("metrics").dataset.empty;
  drawVisible();
}

function showEmpty() {
  if (S.series.size || $("metrics").querySelector(".px-empty")) return;
  $("metrics").appendChild(PX.el("div", {className: "px-empty", text: "No metrics logged yet: they appear " +
    "here as the run writes metrics.jsonl (the first log point comes after the first training iteration)."}));
}

function showStatus(st) {
  S.status = st;
  const warm = st.state === "running" && WARMUP.has(st.phase);
  const phase = st.phase ? st.phase.replace("_", " ") : null;
  const text = warm ? `warming up (${phase})` : phase ? `${st.state} (${phase})` : st.state;
  const badge = $("state");
  badge.textContent = text;
  badge.className = `run-state state-${warm ? "warmup" : st.state}`;
  badge.dataset.state = st.state;
  badge.dataset.phase = st.phase || "";
  const parts = [];
  if (st.step !== null && st.step !== undefined) {
    parts.push(`env step ${PX.fmt(st.step)}${st.total_steps ? ` of ${PX.fmt(st.total_steps)}` : ""}`);
  }
  if (st.wall_s !== null && st.wall_s !== undefined) parts.push(`wall ${PX.duration(st.wall_s)}`);
  if (st.reason) parts.push(st.reason);
  $("progress").textContent = parts.join(" · ");
  const note = $("phase-note");
  note.hidden = !warm;
  note.textContent = warm ? (st.phase === "loading" ?
    "The run is loading its config, model and data; it is starting, not stuck. Training metrics appear here " +
    "once its first iteration is logged." :
    "The run is in its warm start (supervised fine-tuning before RL); its RL metrics follow it.") : "";
  const running = st.state === "running";
  $("set-apply").disabled = st.state === "finished" || !S.info || !S.info.mutable.length;
  return running;
}

function addEvents(events, reset) {
  const host = $("events");
  let table = host.querySelector("table");
  if (reset || !table) {
    host.textContent = "";
    table = null;
  }
  if (!events.length && !table) {
    if (!host.querySelector(".px-empty")) host.appendChild(PX.el("div", {className: "px-note", text: "no events yet"}));
    return;
  }
  if (!table) {
    host.textContent = "";
    table = PX.table([{label: "time", value: () => ""}, {label: "step", num: true, value: () => ""},
      {label: "event", value: () => ""}, {label: "details", value: () => ""}], [], {className: "events-table"});
    host.appendChild(table);
  }
  const body = table.querySelector("tbody");
  for (const e of events) {
    const extra = Object.entries(e).filter(([k]) => !["time", "step", "message"].includes(k))
      .map(([k, v]) => `${k}=${typeof v === "string" ? v : JSON.stringify(v)}`).join(" ");
    const when = typeof e.time === "number" ? new Date(e.time * 1000).toLocaleString() : "";
    const cls = e.alarm ? "event-alarm" : /resum|restart/.test(e.message || "") ? "event-resume" : "";
    body.appendChild(PX.el("tr", {className: cls}, [PX.el("td", {text: when}),
      PX.el("td", {className: "num", text: e.step === undefined ? "" : PX.fmt(e.step)}),
      PX.el("td", {text: e.message || ""}), PX.el("td", {className: "mono", text: extra})]));
  }
  host.scrollTop = host.scrollHeight;
}

function showInfo(info) {
  S.info = info;
  $("config").textContent = JSON.stringify(info.config, null, 2);
  $("checkpoints-link").href = `/checkpoints?run=${encodeURIComponent(info.run)}`;
  const key = $("set-key");
  const chosen = key.value;
  key.textContent = "";
  for (const m of info.mutable) key.appendChild(PX.el("option", {value: m.key, text: m.key}));
  if (chosen && info.mutable.some((m) => m.key === chosen)) key.value = chosen;
  fillValue();
  const host = $("overrides");
  host.textContent = "";
  if (info.mutable_error) host.appendChild(PX.el("div", {className: "px-note", text: info.mutable_error}));
  if (info.pending) {
    host.appendChild(PX.el("div", {className: "px-note pending", text: `${info.pending} change request` +
      `${info.pending === 1 ? "" : "s"} waiting for the run's next update boundary`}));
  }
  if (info.overrides.length) {
    host.appendChild(PX.table([
      {label: "env step", num: true, value: (o) => PX.fmt(o.step)},
      {label: "key", value: (o) => o.key},
      {label: "value", value: (o) => JSON.stringify(o.value)},
    ], info.overrides, {className: "overrides-table"}));
  } else {
    host.appendChild(PX.el("div", {className: "px-note", text: "no live change applied yet"}));
  }
  showStatus(info.status);
}

function fillValue() {
  const m = (S.info ? S.info.mutable : []).find((x) => x.key === $("set-key").value);
  $("set-value").value = m && m.value !== null && m.value !== undefined ? String(m.value) : "";
  $("set-range").textContent = m ? `${m.type}${m.range ? `, ${m.range}` : ""}` : "";
}

async function apply(ev) {
  ev.preventDefault();
  const key = $("set-key").value;
  const value = $("set-value").value.trim();
  $("set-message").textContent = "";
  if (!key || !value) return;
  $("set-apply").disabled = true;
  try {
    const out = await PX.postJSON("/api/run/set", {run: S.run, changes: {[key]: value}});
    PX.clearError();
    $("set-message").textContent = out.message;
    showInfo(await PX.getJSON(`/api/run?run=${encodeURIComponent(S.run)}`));
  } catch (err) {
    PX.showError(err);
  } finally {
    $("set-apply").disabled = S.status && S.status.state === "finished";
  }
}

async function poll(seq) {
  if (seq !== S.seq) return;
  let again = IDLE_POLL_MS;
  try {
    const q = new URLSearchParams({run: S.run, offset: String(S.offset), events: String(S.events)});
    if (S.file) q.set("file", S.file);
    const data = await PX.getJSON(`/api/run/poll?${q}`);
    if (seq !== S.seq) return;
    if (data.reset) resetMetrics();
    S.offset = data.offset;
    S.file = data.file;
    const touched = add(data.records);
    for (const name of touched) ensureBox(name);
    if (touched.size) {
      for (const c of $("metrics").querySelectorAll(".px-empty")) c.remove();
      applySearch();
    }
    showEmpty();
    addEvents(data.events, data.events_reset || (data.reset && S.events > 0));
    S.events = data.events_count;
    const running = showStatus(data.status);
    if (S.info && data.pending !== S.info.pending) {
      showInfo(await PX.getJSON(`/api/run?run=${encodeURIComponent(S.run)}`));
    }
    $("live").textContent = `updated ${new Date().toLocaleTimeString()}` + (running ? "" : " (not running)");
    $("live").dataset.offset = String(S.offset);
    again = data.more ? 0 : running ? POLL_MS : IDLE_POLL_MS;
  } catch (err) {
    $("live").textContent = err.unreachable ? "server unreachable; retrying" : "";
    if (!err.unreachable) PX.showError(err);
  }
  if (seq === S.seq && $("follow").checked) S.timer = setTimeout(() => poll(seq), again);
}

async function open(run) {
  S.run = run;
  S.seq += 1;
  clearTimeout(S.timer);
  S.offset = 0;
  S.file = null;
  S.events = 0;
  resetMetrics();
  $("events").textContent = "";
  const url = new URL(window.location.href);
  url.searchParams.set("run", run);
  history.replaceState(null, "", url.pathname + url.search);
  try {
    showInfo(await PX.getJSON(`/api/run?run=${encodeURIComponent(run)}`));
    PX.clearError();
  } catch (err) {
    PX.showError(err);
    return;
  }
  poll(S.seq);
}

async function init() {
  $("search").addEventListener("input", applySearch);
  $("expand").addEventListener("click", () => { for (const g of S.groups.values()) g.details.open = true; });
  $("collapse").addEventListener("click", () => { for (const g of S.groups.values()) g.details.open = false; });
  $("set-key").addEventListener("change", fillValue);
  $("set-form").addEventListener("submit", apply);
  $("follow").addEventListener("change", () => {
    clearTimeout(S.timer);
    if ($("follow").checked) poll(S.seq);
  });
  $("run").addEventListener("change", () => open($("run").value));
  let runs = [];
  try {
    runs = (await PX.getJSON("/api/runs")).runs;
  } catch (err) {
    PX.showError(err);
  }
  const wanted = PX.query("run") || (runs.find((r) => r.state === "running") || runs[0] || {}).id;
  const select = $("run");
  for (const r of runs) select.appendChild(PX.el("option", {value: r.id, text: r.id, selected: r.id === wanted}));
  if (wanted && !runs.some((r) => r.id === wanted)) {
    select.appendChild(PX.el("option", {value: wanted, text: wanted, selected: true}));
  }
  if (wanted) open(wanted);
  else $("metrics").appendChild(PX.el("div", {className: "px-empty", text: "No runs here yet."}));
}

init();
