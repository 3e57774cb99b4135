// pickaxe ui playground: pick an LLM run and checkpoints, type a prompt, see the answers (text only, never HTML).
"use strict";

(() => {
  const $ = (id) => document.getElementById(id);
  let runs = [];

  const label = (c) => (typeof c === "number" ? `step ${c}` : String(c));

  function fillCheckpoints() {
    const run = runs.find((r) => r.run === $("run").value);
    const a = $("ckpt-a");
    const b = $("ckpt-b");
    a.textContent = "";
    b.textContent = "";
    b.appendChild(PX.el("option", {value: "", text: "(none)"}));
    if (!run) return;
    for (const c of run.checkpoints) {
      a.appendChild(PX.el("option", {value: String(c), text: label(c)}));
      b.appendChild(PX.el("option", {value: String(c), text: label(c)}));
    }
    a.value = String(run.checkpoints[run.checkpoints.length - 1]);
    if (run.max_new_tokens) $("max-new").value = run.max_new_tokens;
  }

  function show(side, result) {
    const box = $(side);
    box.hidden = false;
    box.querySelector(".pg-title").textContent = result.label;
    box.querySelector(".pg-text").textContent = result.text;
    box.querySelector(".pg-meta").textContent =
      `${result.finished ? "ended with EOS" : "stopped at max new tokens"} · ` +
      `${result.cached ? "model cached" : `model loaded in ${PX.fmt(result.load_ms)} ms`} · ` +
      `generated in ${PX.fmt(result.generate_ms)} ms`;
    const tokens = box.querySelector(".pg-tokens");
    tokens.textContent = "";
    if (result.tokens) {
      tokens.appendChild(PX.table([
        {label: "#", value: (t) => t.i, num: true},
        {label: "token", value: (t) => PX.el("code", {text: JSON.stringify(t.token)})},
        {label: "log-prob", value: (t) => PX.fmt(t.logprob, 4), num: true},
        {label: "prob", value: (t) => PX.fmt(Math.exp(t.logprob), 3), num: true},
      ], result.tokens.map((t, i) => ({...t, i})), {className: "pg-logprobs"}));
    }
  }

  async function ask(checkpoint) {
    const body = {
      run: $("run").value,
      checkpoint: /^\d+$/.test(checkpoint) ? Number(checkpoint) : checkpoint,
      prompt: $("prompt").value,
      temperature: Number($("temperature").value || 0),
      logprobs: $("logprobs").checked,
    };
    const maxNew = $("max-new").value;
    if (maxNew) body.max_new_tokens = Number(maxNew);
    return PX.postJSON("/api/playground/generate", body);
  }

  async function go() {
    PX.clearError();
    $("go").disabled = true;
    // the first answer of a checkpoint loads its model first (seconds to minutes on a CPU); later ones reuse it
    $("status").textContent = "loading the model and generating… (the first answer of a checkpoint loads its " +
      "model, which takes a while; the next ones are quick)";
    $("status").dataset.busy = "1";
    $("side-a").hidden = true;
    $("side-b").hidden = true;
    try {
      const a = $("ckpt-a").value;
      const b = $("ckpt-b").value;
      const results = await Promise.all([ask(a), b ? ask(b) : Promise.resolve(null)]);
      show("side-a", results[0]);
      if (results[1]) show("side-b", results[1]);
      $("status").textContent = "";
    } catch (e) {
      PX.showError(e);
      $("status").textContent = "";
    } finally {
      delete $("status").dataset.busy;
      $("go").disabled = false;
    }
  }

  function loading(on) {
    for (const id of ["run", "ckpt-a", "ckpt-b", "go"]) $(id).disabled = on;
    if (on) {
      for (const id of ["run", "ckpt-a"]) {
        $(id).textContent = "";
        $(id).appendChild(PX.el("option", {value: "", text: "loading…"}));
      }
    }
    $("status").textContent = on ? "loading the list of runs and checkpoints…" : "";
    if (on) $("status").dataset.busy = "1";
    else delete $("status").dataset.busy;
  }

  async function start() {
    $("go").addEventListener("click", go);
    $("prompt").addEventListener("keydown", (e) => {
      if (e.key === "Enter" && (e.ctrlKey || e.metaKey)) go();
    });
    $("run").addEventListener("change", fillCheckpoints);
    loading(true);
    try {
      runs = (await PX.getJSON("/api/playground/runs")).runs;
      loading(false);
      $("run").textContent = "";
      for (const r of runs) {
        $("run").appendChild(PX.el("option", {value: r.run, text: `${r.run} (${r.recipe || r.algo || "llm"})`}));
      }
      const wanted = PX.query("run");
      if (wanted && runs.some((r) => r.run === wanted)) $("run").value = wanted;
      fillCheckpoints();
      if (!runs.length) {
        $("empty").hidden = false;
        $("go").disabled = true;
      }
    } catch (e) {
      loading(false);
      $("go").disabled = true;
      PX.showError(e);
    }
  }

  start();
})();
