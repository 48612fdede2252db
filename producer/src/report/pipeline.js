// batchfleet profile of a pipeline: inlined into profile.html by
// producer/src/report/pipeline_page.rs. Draws the page from the JSON in
// <script id="profile-data"> (its shape: pipeline_page.rs, `page_data`). No network.
// Its address's fragment may say `view=<critical|flatten|compact|hierarchical>`, `open=<step>`
// and `compact=<seconds>`. For headless tests it sets on <body>: data-bars-drawn, data-critical-path, data-view,
// data-ready="1", and with #selftest data-selftest (data-errors: the window.onerror handler).
(function () {
  "use strict";
  const D = JSON.parse(document.getElementById("profile-data").textContent);
  const S = D.steps;
  const STATUS_COLORS = ["#d0d7de", "#a77bca", "#edc948", "#4e79a7", "#59a14f"];
  const STATUS_HELP = ["waiting for the steps it reads from", "staging inputs (a parallel step: planning until its first mini-batch is published)",
    "queued (a parallel step's first mini-batch waiting for a slot; a command step: none)",
    "running (a command; a parallel step's first attempt to its last)", "uploading outputs (a parallel step: aggregating, writing its result)"];
  const body = document.body;
  const hash = new URLSearchParams(location.hash.slice(1));

  const { el, dur, tick, tickStep, section, csvCell } = BF;
  const wall = Math.max(1, D.wall);
  function pct(t) { return (Math.max(0, Math.min(wall, t)) * 100 / wall) + "%"; }

  const main = el("main");
  body.appendChild(main);

  // ---- header --------------------------------------------------------------------------------
  const chain = D.critical.map((i) => S[i].name).join(" → ");
  const facts = [["wall time", dur(D.wall)], ["steps", String(S.length)],
    ["critical path", chain || "none"], ["result", D.pipeline.result || "not finished"]];
  main.appendChild(el("header", {}, [
    el("h1", {}, ["Profile of pipeline ", el("span", { class: "job", text: D.pipeline.id })]),
    el("p", { class: "summary", id: "summary", text: D.summary }),
    el("div", { class: "facts" }, facts.map((f) => el("span", {}, [f[0] + ": ", el("b", { text: f[1] })]))),
  ]));

  // ---- Gantt ---------------------------------------------------------------------------------
  const state = { view: "critical", threshold: 30000, selected: -1, open: new Set() };
  const thresholdHash = parseFloat(hash.get("compact"));
  if (!isNaN(thresholdHash) && thresholdHash >= 0) state.threshold = thresholdHash * 1000;
  const VIEWS = [["critical", "Critical path"], ["flatten", "Flatten"], ["compact", "Compact"], ["hierarchical", "Hierarchical"]];
  const viewButtons = VIEWS.map((v) => el("button", { class: "view", "data-view": v[0], text: v[1],
    title: viewHelp(v[0]), onclick: () => setView(v[0]) }));
  const thresholdInput = el("input", { type: "number", min: "0", step: "1", id: "compact-threshold",
    value: String(state.threshold / 1000), title: "compact view: seconds" });
  thresholdInput.addEventListener("change", () => {
    const s = parseFloat(thresholdInput.value);
    if (!isNaN(s) && s >= 0) { state.threshold = s * 1000; if (state.view === "compact") draw(); }
  });
  const legend = el("span", { class: "legend" }, D.statuses.map((n, i) => el("span", { title: STATUS_HELP[i] },
    [el("i", { class: "swatch" + (i === 0 ? " waiting" : ""), style: "background:" + STATUS_COLORS[i] }), n])).concat([
    el("span", {}, [el("i", { class: "swatch", style: "background:#fff;outline:2px solid var(--critical)" }), "critical path"]),
    el("span", {}, [el("i", { class: "swatch", style: "background:#fff;outline:2px dashed var(--failed)" }), "failed"]),
  ]));
  const toolbar = el("div", { class: "toolbar" }, [el("span", { class: "views" }, viewButtons),
    el("label", { for: "compact-threshold", text: "compact: steps over" }), thresholdInput, el("span", { text: "s" }), legend]);
  const chart = el("div", { class: "pchart", id: "pipeline-gantt" });
  const viewNote = el("p", { class: "hint", id: "view-note" });
  main.appendChild(section("timeline", "Timeline — one bar per step, coloured by the time in each status",
    [toolbar, chart, viewNote]));

  function viewHelp(view) {
    return { critical: "only the steps of the critical path: the chain of dependent steps that decided when the pipeline ended",
      flatten: "every step", compact: "only the steps whose own time (dependencies met → end) is over the threshold",
      hierarchical: "every step; a parallel step opens into its own mini-batch timeline" }[view];
  }
  function shown(i) {
    if (state.view === "critical") return S[i].critical;
    if (state.view === "compact") return S[i].span != null && S[i].total > state.threshold;
    return true;
  }
  function setView(view) { state.view = view; draw(); }

  function axis() {
    const row = el("div", { class: "prow axis" }, [el("div", { class: "plabel" })]);
    const track = el("div", { class: "ptrack" });
    const step = tickStep(wall, 8);
    for (let t = 0; t <= wall; t += step) {
      track.appendChild(el("span", { class: "ptick", style: "left:" + pct(t), text: tick(t, step) }));
    }
    row.appendChild(track);
    return row;
  }
  function describe(s) {
    const lines = [s.name + " (" + s.kind + ") · " + s.state + (s.critical ? " · on the critical path" : "")];
    if (s.span) lines.push("from +" + dur(s.span[0]) + " to +" + dur(s.span[1]) + "; its own time " + dur(s.total));
    D.statuses.forEach((n, k) => { if (s.durations[k] > 0) lines.push(n + ": " + dur(s.durations[k])); });
    if (s.after.length) lines.push("reads from: " + s.after.map((j) => S[j].name).join(", "));
    if (s.location) lines.push(s.location);
    return lines.join("\n");
  }
  function bar(i) {
    const s = S[i];
    const cls = "pbar" + (s.critical ? " critical" : "") + (s.state === "failed" ? " failed" : "") +
      (i === state.selected ? " selected" : "");
    const node = el("div", { class: cls, "data-step": String(i), "data-name": s.name, title: describe(s),
      "data-durations": s.durations.join(","), onclick: (e) => { e.stopPropagation(); select(i, "bar"); } });
    if (!s.span) return node;
    node.style.left = pct(s.span[0]);
    node.style.width = "calc(" + pct(s.span[1] - s.span[0]) + " + 2px)";
    const span = Math.max(1, s.span[1] - s.span[0]);
    s.durations.forEach((d, k) => {
      if (d <= 0) return;
      node.appendChild(el("span", { class: "seg" + (k === 0 ? " waiting" : ""), "data-status": D.statuses[k],
        style: "width:" + (d * 100 / span) + "%;background:" + STATUS_COLORS[k] }));
    });
    return node;
  }
  function draw() {
    chart.replaceChildren(axis());
    let drawn = 0;
    S.forEach((s, i) => {
      if (!shown(i)) return;
      drawn++;
      const canOpen = state.view === "hierarchical" && s.kind === "parallel";
      const open = canOpen && state.open.has(i);
      const toggle = canOpen ? el("button", { class: "toggle", "data-step": String(i), text: open ? "▾" : "▸",
        title: open ? "close its mini-batch timeline" : "open its mini-batch timeline",
        onclick: (e) => { e.stopPropagation(); if (open) state.open.delete(i); else state.open.add(i); draw(); } }) :
        el("span", { class: "toggle-space" });
      const label = el("div", { class: "plabel" + (s.critical ? " crit-mark" : ""), title: s.name }, [toggle,
        (s.critical ? "★ " : "") + s.name, el("span", { class: "kind", text: s.kind }),
        el("span", { class: "ptotal", text: s.span ? dur(s.total) : s.state })]);
      const track = el("div", { class: "ptrack" }, [bar(i)]);
      if (!s.span) track.appendChild(el("span", { class: "muted nobar", text: s.state === "not run" ? "not run" : "no times recorded" }));
      chart.appendChild(el("div", { class: "prow" + (i === state.selected ? " selected" : ""), "data-step": String(i) }, [label, track]));
      if (open) chart.appendChild(nested(i));
    });
    if (!drawn) chart.appendChild(el("p", { class: "muted empty", text: state.view === "compact" ?
      "No step took over " + dur(state.threshold) + ": lower the threshold." : "No step has recorded times." }));
    viewButtons.forEach((b) => b.classList.toggle("on", b.dataset.view === state.view));
    viewNote.textContent = viewHelp(state.view) + ". Click a bar to find its row in the table; hover it for its statuses.";
    body.dataset.view = state.view;
    body.dataset.barsDrawn = String(drawn);
    return drawn;
  }
  function nested(i) {
    const s = S[i];
    const box = el("div", { class: "nested", "data-step": String(i) });
    if (s.page) {
      const frame = el("iframe", { class: "nested-page", title: "mini-batch timeline of " + s.name });
      frame.srcdoc = s.page;
      box.appendChild(frame);
    } else {
      box.appendChild(el("p", { class: "muted", text: "No mini-batch timeline for " + s.name + ": " + (s.page_note || "it did not run") }));
    }
    return box;
  }

  // ---- steps table and CSV -------------------------------------------------------------------
  // [header, value, numeric, shown as]
  const COLUMNS = [["step", (s) => s.name, false], ["type", (s) => s.kind, false], ["state", (s) => s.state, false],
    ["started", (s) => s.times[1], true, (v) => v == null ? "" : "+" + dur(v)],
    ["total", (s) => s.total, true, dur]].concat(D.statuses.map((n, k) => [n, (s) => s.durations[k], true, dur]))
    .concat([["critical path", (s) => s.critical ? "yes" : "", false], ["reads from", (s) => s.after.map((j) => S[j].name).join(" "), false],
      ["location", (s) => s.location, false]]);
  const table = { sort: 4, desc: true, rows: [] };
  const tbody = el("tbody");
  const headRow = el("tr", {}, COLUMNS.map((c, k) => el("th", { class: "sortable" + (c[2] ? " num" : ""), text: c[0],
    "data-column": c[0], title: "sort by " + c[0],
    onclick: () => { table.desc = table.sort === k ? !table.desc : c[2]; table.sort = k; fillTable(); } })));
  const exportLink = el("a", { class: "button", id: "export-csv", text: "Export CSV", download: "steps-" + D.pipeline.id + ".csv",
    title: "the table below, in its order, times in milliseconds" });
  function fillTable() {
    const get = COLUMNS[table.sort][1], dir = table.desc ? -1 : 1;
    table.rows = S.map((s, i) => i);
    table.rows.sort((x, y) => {
      let a = get(S[x]), b = get(S[y]);
      if (a == null) a = -1; if (b == null) b = -1;
      return a < b ? -dir : a > b ? dir : x - y;
    });
    tbody.replaceChildren(...table.rows.map((i) => {
      const s = S[i];
      return el("tr", { class: "clickable" + (s.state === "failed" ? " failed" : "") + (i === state.selected ? " selected" : ""),
        "data-step": String(i), title: "click: highlight its bar", onclick: () => select(i, "row") },
      COLUMNS.map((c) => { const v = c[1](s); return el("td", { class: c[2] ? "num" : c[0] === "location" ? "mono loc" : "",
        text: c[3] ? c[3](v) : (c[0] === "step" && s.critical ? "★ " : "") + String(v) }); }));
    }));
    Array.from(headRow.children).forEach((th, k) => {
      th.classList.toggle("sorted", k === table.sort); th.classList.toggle("asc", k === table.sort && !table.desc);
    });
    exportLink.href = "data:text/csv;base64," + btoa(unescape(encodeURIComponent(csvText())));
  }
  // The table's rows, in its order, times in milliseconds (its start relative to the pipeline's).
  function csvText() {
    const lines = [COLUMNS.map((c) => c[0] + (c[3] ? " ms" : "")).join(",")];
    table.rows.forEach((i) => lines.push(COLUMNS.map((c) => csvCell(c[1](S[i]))).join(",")));
    return lines.join("\n") + "\n";
  }
  main.appendChild(section("steps-section", "Steps", [
    el("div", { class: "toolbar" }, [exportLink, el("span", { text: "click a header to sort, a row to highlight its bar" })]),
    el("div", { class: "table-wrap" }, [el("table", { id: "steps" }, [el("thead", {}, [headRow]), tbody])]),
  ]));

  // ---- linking -------------------------------------------------------------------------------
  function select(i, from) {
    state.selected = i;
    if (!shown(i)) state.view = "flatten";
    draw(); fillTable();
    const target = from === "bar" ? tbody.querySelector('tr[data-step="' + i + '"]') : chart.querySelector('.pbar[data-step="' + i + '"]');
    if (target && target.scrollIntoView) target.scrollIntoView({ block: "nearest" });
  }

  // ---- first render --------------------------------------------------------------------------
  // `#view=hierarchical&open=<step>`: a view, and a parallel step opened in it.
  if (VIEWS.some((v) => v[0] === hash.get("view"))) state.view = hash.get("view");
  const opened = S.findIndex((s) => s.name === hash.get("open"));
  if (opened >= 0) state.open.add(opened);
  fillTable();
  draw();
  body.dataset.criticalPath = String(D.critical.length);
  if (!location.hash.startsWith("#selftest")) { body.dataset.ready = "1"; return; }

  // `profile.html#selftest`: go through the views, sorting, the links and a nested page once.
  const names = () => Array.from(chart.querySelectorAll(".pbar")).map((b) => b.dataset.name);
  const report = { views: {} };
  VIEWS.forEach((v) => { setView(v[0]); report.views[v[0]] = names(); });
  const sortedBy = (column, value) => {
    headRow.querySelector('th[data-column="' + column + '"]').click();
    if (!table.desc) headRow.querySelector('th[data-column="' + column + '"]').click();
    return table.rows.every((row, k) => k === 0 || value(S[table.rows[k - 1]]) >= value(S[row]));
  };
  report.sortedByTotal = sortedBy("total", (s) => s.total);
  report.sortedByRunning = sortedBy("running", (s) => s.durations[3]);
  setView("flatten");
  const last = S.length - 1;
  tbody.querySelector('tr[data-step="' + last + '"]').click();
  report.rowToBar = chart.querySelector(".pbar.selected") ? chart.querySelector(".pbar.selected").dataset.name : null;
  chart.querySelector('.pbar[data-step="0"]').click();
  report.barToRow = tbody.querySelector("tr.selected") ? tbody.querySelector("tr.selected").dataset.step : null;
  report.csv = csvText();
  const parallel = S.findIndex((s) => s.kind === "parallel" && s.page);
  const finish = () => {
    setView("critical");
    body.dataset.selftest = JSON.stringify(report);
    body.dataset.ready = "1";
  };
  if (parallel < 0) { finish(); return; }
  setView("hierarchical");
  chart.querySelector('.toggle[data-step="' + parallel + '"]').click();
  const frame = chart.querySelector("iframe.nested-page");
  let done = false;
  const look = () => {
    if (done) return;
    const inner = frame.contentDocument && frame.contentDocument.body;
    if (!inner || inner.dataset.ready !== "1") return;
    done = true;
    report.nested = { step: S[parallel].name, bars: inner.dataset.barsDrawn, errors: inner.dataset.errors };
    state.open.delete(parallel);
    finish();
  };
  frame.addEventListener("load", look);
  const poll = setInterval(() => { look(); if (done) clearInterval(poll); }, 50);
  setTimeout(() => { if (!done) { done = true; clearInterval(poll); report.nested = { step: S[parallel].name, error: "did not render" }; finish(); } }, 8000);
})();
