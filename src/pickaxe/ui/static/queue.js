// Queue page: the jobs of /api/queue; Cancel and Retry call the same JobQueue methods as `pickaxe queue`.
"use strict";

let busy = false;

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
  document.getElementById("db").textContent = data.db;
  const host = document.getElementById("jobs");
  host.textContent = "";
  if (!data.exists) {
    host.appendChild(PX.el("div", {className: "px-empty", text: data.message}));
    return;
  }
  if (!data.jobs.length) {
    host.appendChild(PX.el("div", {className: "px-empty",
      text: "The queue is empty; `pickaxe queue add -- COMMAND` adds a job."}));
    return;
  }
  host.appendChild(PX.table([
    {label: "id", num: true, value: (j) => j.id},
    {label: "name", value: (j) => (j.run_id ? PX.el("a", {href: `/runs?run=${encodeURIComponent(j.run_id)}`,
      title: `run ${j.run_id}`, text: j.name}) : j.name)},
    {label: "state", value: (j) => j.state, className: (j) => `state-${j.state} job-state`},
    {label: "prio", num: true, value: (j) => j.priority},
    {label: "after", value: (j) => j.depends_on.join(",")},
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

async function load() {
  if (busy) return;
  busy = true;
  try {
    render(await PX.getJSON("/api/queue"));
    PX.clearError();
  } catch (err) {
    PX.showError(err);
  } finally {
    busy = false;
  }
}

async function act(id, action) {
  document.getElementById("message").textContent = "";
  try {
    const out = await PX.postJSON(`/api/queue/${id}/${action}`);
    PX.clearError();
    document.getElementById("message").textContent = out.message;
  } catch (err) {
    PX.showError(err);
  }
  await load();
}

document.getElementById("refresh").addEventListener("click", load);
setInterval(() => {
  if (document.getElementById("auto").checked) load();
}, 5000);
load();
