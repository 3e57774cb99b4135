// pickaxe ui: helpers shared by every page. Text from the server (run names, model output, messages) is only ever
// inserted with textContent / createTextNode, never as HTML.
"use strict";

const PX = (() => {
  const NAV = [
    ["runs", "Runs", "/runs"],
    ["run", "Run", "/run"],
    ["queue", "Queue", "/queue"],
    ["checkpoints", "Checkpoints", "/checkpoints"],
    ["playground", "Playground", "/playground"],
    ["arena", "Arena", "/arena"],
  ];
  const COLORS = ["#2f6fdb", "#d9480f", "#2b8a3e", "#9c36b5", "#e8590c", "#0b7285", "#c2255c", "#5c940d",
    "#364fc7", "#a61e4d"];

  /** el("td", {className: "num", title: "..."}, "text" | Node | [children]) -> Element (strings become text). */
  function el(tag, props, children) {
    const node = document.createElement(tag);
    for (const [k, v] of Object.entries(props || {})) {
      if (v === undefined || v === null) continue;
      if (k === "className") node.className = v;
      else if (k === "text") node.textContent = String(v);
      else if (k === "dataset") Object.assign(node.dataset, v);
      else if (k.startsWith("on") && typeof v === "function") node.addEventListener(k.slice(2), v);
      else if (k in node && typeof v !== "string") node[k] = v;
      else node.setAttribute(k, String(v));
    }
    const kids = children === undefined || children === null ? [] : Array.isArray(children) ? children : [children];
    for (const c of kids) {
      if (c === undefined || c === null) continue;
      node.appendChild(c instanceof Node ? c : document.createTextNode(String(c)));
    }
    return node;
  }

  function nav() {
    if (document.querySelector("nav.px-nav")) return;
    const page = document.body.dataset.page || "";
    const bar = el("nav", {className: "px-nav"}, [el("span", {className: "px-brand", text: "pickaxe"})]);
    for (const [key, label, href] of NAV) {
      bar.appendChild(el("a", {href, className: key === page ? "active" : "", text: label}));
    }
    document.body.insertBefore(bar, document.body.firstChild);
  }

  /** The one-line message of a failed response: the API's {"detail": "..."} or the status line. */
  async function failure(resp) {
    let detail = `${resp.status} ${resp.statusText}`;
    try {
      const body = await resp.json();
      if (body && typeof body.detail === "string") detail = body.detail;
    } catch (e) { /* not JSON */ }
    const err = new Error(detail);
    err.status = resp.status;
    return err;
  }

  /** fetch() that says "the server is unreachable" instead of the browser's "Failed to fetch" when the request
   * never got an answer (the server stopped, the network is down); such errors have `unreachable` set. */
  async function send(url, init) {
    try {
      return await fetch(url, init);
    } catch (e) {
      if (e && e.name === "AbortError") throw e;
      const err = new Error(`cannot reach the pickaxe ui server at ${window.location.host}: is \`pickaxe ui\` ` +
        "still running? (start it again, then reload this page)");
      err.unreachable = true;
      throw err;
    }
  }

  async function getJSON(url) {
    const resp = await send(url, {headers: {Accept: "application/json"}});
    if (!resp.ok) throw await failure(resp);
    return resp.json();
  }

  async function postJSON(url, body) {
    const resp = await send(url, {
      method: "POST",
      headers: {"Content-Type": "application/json", Accept: "application/json"},
      body: JSON.stringify(body === undefined ? {} : body),
    });
    if (!resp.ok) throw await failure(resp);
    return resp.json();
  }

  function errorBox() {
    let box = document.getElementById("error");
    if (!box) {
      box = el("div", {id: "error", className: "px-error", role: "alert"});
      const main = document.querySelector("main") || document.body;
      main.insertBefore(box, main.firstChild);
    }
    return box;
  }

  /** Show one error line (an Error's message or a string) in the page's #error box. */
  function showError(err) {
    errorBox().textContent = err instanceof Error ? err.message : String(err);
  }

  function clearError() {
    errorBox().textContent = "";
  }

  /** Number formatting: significant digits, "-" for null. */
  function fmt(x, digits) {
    if (x === null || x === undefined || Number.isNaN(x)) return "-";
    if (typeof x !== "number") return String(x);
    if (Number.isInteger(x) && Math.abs(x) < 1e15) return x.toLocaleString("en-US");
    return Number(x.toPrecision(digits || 4)).toString();
  }

  /** "0.512 [0.401, 0.620]" from a mean and optional CI bounds. */
  function ci(mean, low, high, digits) {
    if (mean === null || mean === undefined) return "-";
    if (low === null || low === undefined || high === null || high === undefined) return fmt(mean, digits);
    return `${fmt(mean, digits)} [${fmt(low, digits)}, ${fmt(high, digits)}]`;
  }

  function duration(s) {
    if (s === null || s === undefined) return "-";
    if (s < 60) return `${s.toFixed(1)}s`;
    const m = Math.floor(s / 60);
    if (m < 60) return `${m}m${String(Math.round(s % 60)).padStart(2, "0")}s`;
    return `${Math.floor(m / 60)}h${String(m % 60).padStart(2, "0")}m`;
  }

  /**
   * table(columns, rows, {rowClass}) -> <table>. columns: [{label, value: row => string|number|Node, num: bool}];
   * cells are text (or Nodes built by the caller with el()).
   */
  function table(columns, rows, opts) {
    const o = opts || {};
    const head = el("tr", {}, columns.map((c) => el("th", {className: c.num ? "num" : "", text: c.label})));
    const body = rows.map((row) => {
      const tr = el("tr", {className: o.rowClass ? o.rowClass(row) || "" : ""},
        columns.map((c) => {
          const v = c.value(row);
          return el("td", {className: (c.num ? "num " : "") + (c.className ? c.className(row) || "" : "")},
            v instanceof Node ? v : v === null || v === undefined ? "" : String(v));
        }));
      if (o.rowData) Object.assign(tr.dataset, o.rowData(row));
      return tr;
    });
    return el("table", {className: "px-table" + (o.className ? " " + o.className : "")},
      [el("thead", {}, head), el("tbody", {}, body)]);
  }

  function color(i) {
    return COLORS[i % COLORS.length];
  }

  function fade(hex, alpha) {
    const n = parseInt(hex.slice(1), 16);
    return `rgba(${(n >> 16) & 255}, ${(n >> 8) & 255}, ${n & 255}, ${alpha})`;
  }

  /**
   * A uPlot line chart in `container` (emptied first).
   * spec: {title, xLabel, yLabel, width, height, fit?,
   *        series: [{label, x: [...], y: [...], low?: [...], high?: [...], color?, width?, dash?, points?}],
   *        markers: [{x, label, color?}]}   // vertical lines (alarms, the selected best)
   * Each series may have its own x; they are joined on the union of x values (gaps spanned).
   * A series with low/high gets a shaded CI band. Every point gets a marker when the series has few points or
   * `points: true` (a series of one point has no line: its marker is what shows it). `fit: true` sizes the chart
   * to its container's width and follows it when the window is resized. Returns the uPlot instance (also
   * container._uplot);
   * container.dataset.series holds the number of lines drawn (bands not counted).
   */
  function chart(container, spec) {
    container.textContent = "";
    const xs = Array.from(new Set(spec.series.flatMap((s) => s.x))).sort((a, b) => a - b);
    const index = new Map(xs.map((x, i) => [x, i]));
    const col = (s, key) => {
      const out = new Array(xs.length).fill(null);
      s.x.forEach((x, i) => {
        const v = s[key][i];
        out[index.get(x)] = v === undefined ? null : v;
      });
      return out;
    };
    const data = [xs];
    const series = [{label: spec.xLabel || "step"}];
    const bands = [];
    const legend = [];
    spec.series.forEach((s, i) => {
      const c = s.color || color(i);
      data.push(col(s, "y"));
      const showPoints = s.points === true || (s.points !== false && s.x.length < 60);
      series.push({label: s.label, stroke: c, width: s.width || 2, spanGaps: true, dash: s.dash,
        points: {show: showPoints, size: s.x.length === 1 ? 9 : 6, fill: c}});
      legend.push([s.label, c, s.width || 2]);
      const hasBand = s.low && s.high && s.low.some((v) => v !== null) && s.high.some((v) => v !== null);
      if (hasBand) {
        const hi = data.length;
        data.push(col(s, "high"));
        series.push({label: `${s.label} CI high`, stroke: fade(c, 0.35), width: 1, spanGaps: true,
          points: {show: false}});
        data.push(col(s, "low"));
        series.push({label: `${s.label} CI low`, stroke: fade(c, 0.35), width: 1, spanGaps: true,
          points: {show: false}});
        bands.push({series: [hi, hi + 1], fill: fade(c, 0.15)});
      }
    });
    const markers = spec.markers || [];
    const drawMarkers = (u) => {
      const ctx = u.ctx;
      const top = u.bbox.top;
      const bottom = u.bbox.top + u.bbox.height;
      ctx.save();
      for (const m of markers) {
        const px = u.valToPos(m.x, "x", true);
        if (!Number.isFinite(px) || px < u.bbox.left - 1 || px > u.bbox.left + u.bbox.width + 1) continue;
        ctx.strokeStyle = m.color || "#c4312b";
        ctx.lineWidth = 1.5 * devicePixelRatio;
        ctx.setLineDash([5 * devicePixelRatio, 4 * devicePixelRatio]);
        ctx.beginPath();
        ctx.moveTo(px, top);
        ctx.lineTo(px, bottom);
        ctx.stroke();
      }
      ctx.restore();
    };
    const box = el("div", {className: "px-chart"});
    if (spec.title) box.appendChild(el("div", {className: "px-chart-title", text: spec.title}));
    const plotHost = el("div");
    box.appendChild(plotHost);
    const legendBox = el("div", {className: "px-legend"}, legend.map(([label, c, w]) =>
      el("span", {}, [el("span", {className: "swatch", style: `background:${c};height:${w + 1}px`}), label])));
    box.appendChild(legendBox);
    if (markers.length) {
      box.appendChild(el("div", {className: "px-marker-key"},
        markers.map((m) => `${m.label} @ ${fmt(m.x)}`).join(" · ")));
    }
    container.appendChild(box);
    const fitWidth = () => Math.max(240, container.clientWidth - 18);
    const opts = {
      width: spec.fit ? fitWidth() : spec.width || 640,
      height: spec.height || 300,
      series,
      bands,
      legend: {show: false},
      scales: {x: {time: false}},
      axes: [{label: spec.xLabel || "step"}, {label: spec.yLabel || ""}],
      hooks: {draw: [drawMarkers]},
    };
    const u = new uPlot(opts, data, plotHost);
    if (spec.fit && window.ResizeObserver) {
      let last = container.clientWidth;
      const watch = new ResizeObserver(() => {
        if (!container.isConnected) { watch.disconnect(); return; }
        if (container.clientWidth !== last) {
          last = container.clientWidth;
          u.setSize({width: fitWidth(), height: opts.height});
        }
      });
      watch.observe(container);
    }
    container._uplot = u;
    container.dataset.series = String(spec.series.length);
    return u;
  }

  function query(name) {
    return new URLSearchParams(window.location.search).get(name);
  }

  if (document.readyState === "loading") document.addEventListener("DOMContentLoaded", nav);
  else nav();

  return {el, getJSON, postJSON, showError, clearError, fmt, ci, duration, table, chart, color, query};
})();
