// pickaxe ui arena: fetch a match, vote, show the leaderboard. Model output is only ever set with textContent.
"use strict";

(() => {
  const $ = (id) => document.getElementById(id);
  const KEY = "pickaxe.arena.voter";
  let current = null; // {arena, match}

  function voterId() {
    let v = localStorage.getItem(KEY);
    if (!v) {
      const bytes = new Uint8Array(8);
      crypto.getRandomValues(bytes);
      v = "voter-" + Array.from(bytes, (b) => b.toString(16).padStart(2, "0")).join("");
      localStorage.setItem(KEY, v);
    }
    return v;
  }

  function setVoting(enabled) {
    for (const b of document.querySelectorAll(".arena-votes button")) b.disabled = !enabled;
  }

  async function loadArenas() {
    const data = await PX.getJSON("/api/arena/arenas");
    const sel = $("arena");
    sel.textContent = "";
    const chosen = sel.value;
    for (const a of data.arenas) {
      sel.appendChild(PX.el("option", {value: a.id, dataset: {votes: String(a.votes)},
        text: `${a.name} (${a.folder}: ${a.checkpoints} checkpoints, ${a.prompts} prompts, ${a.votes} votes)`}));
    }
    if (chosen && data.arenas.some((a) => a.id === chosen)) sel.value = chosen;
    const skipped = data.unreadable || [];
    $("unreadable").hidden = !skipped.length;
    $("unreadable").textContent = skipped.length
      ? "skipped: " + skipped.map((u) => u.reason).join("; ")
      : "";
    const wanted = PX.query("arena");
    if (wanted && data.arenas.some((a) => a.id === wanted)) sel.value = wanted;
    if (!data.arenas.length) {
      $("status").textContent = "no arenas yet: run `pickaxe arena RUN_DIR` for a run under this folder";
      $("next").disabled = true;
    }
    return data.arenas.length > 0;
  }

  async function nextMatch() {
    PX.clearError();
    setVoting(false);
    try {
      const m = await PX.postJSON("/api/arena/match", {arena: $("arena").value, voter: $("voter").value});
      current = {arena: $("arena").value, match: m.match};
      $("prompt").textContent = m.prompt;
      $("left").textContent = m.left;
      $("right").textContent = m.right;
      $("match").hidden = false;
      $("match").dataset.match = m.match;
      setVoting(true);
    } catch (e) {
      PX.showError(e);
    }
  }

  const RETRIES = [500, 1500, 3000]; // ms before each new try of a vote that got no answer (a repeat is harmless)

  async function sendVote(body) {
    for (let i = 0; ; i++) {
      try {
        return await PX.postJSON("/api/arena/vote", body);
      } catch (e) {
        if (!e.unreachable || i >= RETRIES.length) throw e;
        $("status").textContent = `vote not sent yet (server unreachable); trying again (${i + 1}/${RETRIES.length})`;
        await new Promise((resolve) => setTimeout(resolve, RETRIES[i]));
      }
    }
  }

  async function castVote(choice) {
    if (!current) return;
    PX.clearError();
    setVoting(false);
    let r;
    try {
      r = await sendVote({arena: current.arena, match: current.match, voter: $("voter").value, choice});
    } catch (e) {
      // the match stays on screen: voting again sends the same vote (the server stores it once)
      $("status").textContent = "";
      $("match").dataset.unsent = choice;
      PX.showError(new Error(`your vote (${choice}) was NOT stored: ${e.message}. Vote again to retry.`));
      setVoting(true);
      return;
    }
    delete $("match").dataset.unsent;
    $("status").textContent = `vote stored (${r.votes} vote${r.votes === 1 ? "" : "s"} in this arena)`;
    $("status").dataset.votes = String(r.votes);
    current = null;
    try {
      await loadArenas();
      await loadBoard();
      await nextMatch();
    } catch (e) {
      PX.showError(e);
    }
  }

  async function loadBoard() {
    const arena = $("arena").value;
    if (!arena) return;
    const b = await PX.getJSON("/api/arena/leaderboard?arena=" + encodeURIComponent(arena));
    $("scale").textContent = b.scale;
    const rows = b.ratings.map((r, i) => ({...r, rank: i + 1}));
    const board = $("board");
    board.textContent = "";
    board.dataset.votes = String(b.votes);
    board.appendChild(PX.table([
      {label: "#", value: (r) => r.rank, num: true},
      {label: "checkpoint", value: (r) => r.name},
      {label: "score", value: (r) => PX.fmt(Math.round(r.score)), num: true},
      {label: "95% CI", value: (r) => `[${Math.round(r.low)}, ${Math.round(r.high)}]`, num: true},
      {label: "votes", value: (r) => r.votes, num: true},
      {label: "wins", value: (r) => r.wins, num: true},
      {label: "losses", value: (r) => r.losses, num: true},
      {label: "ties", value: (r) => r.ties, num: true},
    ], rows, {className: "arena-board", rowData: (r) => ({name: r.name})}));
    const s = b.separate;
    let text = "";
    if (!b.votes) text = "No votes yet.";
    else if (!s) text = "";
    else if (s.more_votes === null) text = `${s.a} and ${s.b} are level so far; more votes will tell.`;
    else if (s.more_votes === 0) text = `${s.a} is ahead of ${s.b} beyond the 95% CI of their difference.`;
    else text = `About ${s.more_votes} more votes between ${s.a} and ${s.b} would separate the top two ` +
      `(P(${s.a} beats ${s.b}) = ${PX.fmt(s.p, 3)} from ${s.votes} head-to-head votes).`;
    $("separate").textContent = text;
    const same = b.identical_pairs || 0;
    $("identical").textContent = same ? `${same} of ${b.pairs} prompt-and-pair combinations have two identical ` +
      "answers; they are never shown as a match (nothing to choose between)." : "";
    $("identical").dataset.count = String(same);
  }

  async function start() {
    const voter = $("voter");
    voter.value = voterId();
    voter.addEventListener("change", () => {
      const v = voter.value.trim();
      if (v) localStorage.setItem(KEY, v);
      else voter.value = voterId();
    });
    for (const b of document.querySelectorAll(".arena-votes button")) {
      b.addEventListener("click", () => castVote(b.dataset.choice));
    }
    $("next").addEventListener("click", nextMatch);
    $("arena").addEventListener("change", async () => {
      current = null;
      $("match").hidden = true;
      try { await loadBoard(); await nextMatch(); } catch (e) { PX.showError(e); }
    });
    try {
      if (await loadArenas()) {
        await loadBoard();
        await nextMatch();
      }
    } catch (e) {
      PX.showError(e);
    }
  }

  start();
})();
