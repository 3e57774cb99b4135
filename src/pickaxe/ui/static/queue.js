// Queue page: every queue under the runs folder (the default one, each sweep's and pipeline's), the jobs of the one
// chosen, Cancel and Retry (the same JobQueue methods as `pickaxe queue`) and a form that queues a recipe run.
"use strict";

let busy = false;

const $ = (id) => document.getElementById(id);

function current() {
  return $("queue").value || "default";
}

function withQueue(url) {
  const q = current();
  return q === "default" ? url : `${url}${url.includes("?") ? "&" : "?"}queue=${encodeURIComponent(q)}`;
}

function actions(job) {
  const cell = PX.el("span");
  const canCancel = ["queued", "blocked", "running"].includes(job.state) && !job.cancel_requested;
  const canRetry = ["failed", "cancelled", "blocked"].includes(job.state);
  if (canCancel) {
    cell.appendChild(PX.el("button", {type: "button", className: "cancel", text: "Cancel",
      dataset: {job: String(job.id)}, onclick: () => act(job.id, "cancel")}));
  }
  if (canRetry) {
    cell.appendChild(PX.el("button", {type: "button", className: "retry", text: "Retry",
      dataset: {job: String(job.id)}, onclick: () => act(job.id, "retry")}));
  }
  return cell;
}

function note(job) {
  if (job.state === "running" && job.cancel_requested) return "cancelling";
  return job.reason || "";
}

function render(data) {
  $("db").textContent = data.db;
  const host = $("jobs");
  host.textContent = "";
  if (!data.exists) {
    host.appendChild(PX.el("div", {className: "px-empty", text: data.message}));
    return;
  }
  if (!data.jobs.length) {
    host.appendChild(PX.el("div", {className: "px-empty",
      text: "The queue is empty; `pickaxe queue add -- COMMAND` or the form below adds a job."}));
    return;
  }
  host.appendChild(PX.table([
    {label: "id", num: true, value: (j) => j.id},
    {label: "name", value: (j) => (j.run_id ? PX.el("a", {href: `/run?run=${encodeURIComponent(j.run_id)}`,
      title: `run ${j.run_id}`, text: j.name}) : j.name)},
    {label: "state", value: (j) => j.state, className: (j) => `state-${j.state} job-state`},
    {label: "prio", num: true, value: (j) => j.priority},
    {label: "after", value: (j) => j.depends_on.join(","), className: () => "job-after"},
    {label: "cpu", num: true, value: (j) => j.cpus},
    {label: "gpu", num: true, value: (j) => j.gpus},
    {label: "tries", num: true, value: (j) => j.attempts},
    {label: "exit", num: true, value: (j) => (j.exit_status === null ? "" : j.exit_status)},
    {label: "time", num: true, value: (j) => PX.duration(j.wall_s)},
    {label: "log", value: (j) => (j.log_url ? PX.el("a", {href: j.log_url, target: "_blank", text: "log"}) : "")},
    {label: "note", value: note},
    {label: "", value: actions},
  ], data.jobs, {className: "jobs-table", rowData: (j) => ({job: String(j.id)})}));
}

function counts(q) {
  const parts = Object.entries(q.counts).map(([s, n]) => `${n} ${s}`);
  return parts.length ? parts.join(", ") : q.exists ? "empty" : "not created yet";
}

async function loadQueues() {
  const data = await PX.getJSON("/api/queues");
  const select = $("queue");
  const chosen = select.value || PX.query("queue") || "default";
  select.textContent = "";
  for (const q of data.queues) {
    const label = q.id === "default" ? "default queue" : `${q.kind} ${q.id}`;
    select.appendChild(PX.el("option", {value: q.id, text: `${label} (${counts(q)})`, selected: q.id === chosen}));
  }
  if (!data.queues.some((q) => q.id === chosen)) select.value = "default";
  $("queues").textContent = `${data.queues.length} queue${data.queues.length === 1 ? "" : "s"}: the default one` +
    (data.queues.length > 1 ? " and those of the sweeps and pipelines under the runs folder" : "");
  const list = $("recipes");
  if (!list.children.length) for (const r of data.recipes) list.appendChild(PX.el("option", {value: r}));
}

async function load() {
  if (busy) return;
  busy = true;
  try {
    await loadQueues();
    render(await PX.getJSON(withQueue("/api/queue")));
    const url = new URL(window.location.href);
    if (current() === "default") url.searchParams.delete("queue");
    else url.searchParams.set("queue", current());
    history.replaceState(null, "", url.pathname + url.search);
    PX.clearError();
  } catch (err) {
    PX.showError(err);
  } finally {
    busy = false;
  }
}

async function act(id, action) {
  $("message").textContent = "";
  try {
    const out = await PX.postJSON(withQueue(`/api/queue/${id}/${action}`));
    PX.clearError();
    $("message").textContent = out.message;
  } catch (err) {
    PX.showError(err);
  }
  await load();
}

async function add(ev) {
  ev.preventDefault();
  $("message").textContent = "";
  $("add").disabled = true;
  try {
    const out = await PX.postJSON("/api/queue/add", {queue: current(), recipe: $("add-recipe").value.trim(),
      flags: $("add-flags").value, priority: Number($("add-priority").value || 0), after: $("add-after").value});
    PX.clearError();
    $("message").textContent = out.message;
  } catch (err) {
    PX.showError(err);
  } finally {
    $("add").disabled = false;
  }
  await load();
}

$("refresh").addEventListener("click", load);
$("queue").addEventListener("change", load);
$("add-form").addEventListener("submit", add);
setInterval(() => {
  if ($("auto").checked) load();
}, 5000);
load();
