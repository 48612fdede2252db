// batchfleet profile: inlined into profile.html by producer/src/report/page.rs. Draws the page
// from the JSON in <script id="profile-data"> (its shape: page.rs, `page_data`). No network.
// For headless tests it sets on <body>: data-bars-drawn, data-critical-path, data-ready="1"
// (data-errors is counted by the window.onerror handler set before this script).
(function () {
  "use strict";
  const D = JSON.parse(document.getElementById("profile-data").textContent);
  const PHASE_COLORS = ["#a77bca", "#4e79a7", "#59a14f", "#f28e2b", "#9aa4ad"];
  const PHASE_NAMES = ["start runtime", "load", "run()", "write", "settle"];
  const FAILED = "#d1242f", CRITICAL = "#c2185b", IDLE = "#e6e9ed";
  const WORKER_COLORS = ["#4e79a7", "#e15759", "#59a14f", "#f28e2b", "#76b7b2", "#edc948",
    "#b07aa1", "#ff9da7", "#9c755f", "#bab0ac"];
  // Attempt fields (page.rs): lane, batch, attempt, outcome, t0..t5, published, items in,
  // items out, cpu, error kind, error, pid.
  const A = D.attempts;
  const LANE = 0, BATCH = 1, TRY = 2, OUT = 3, T = 4, PUB = 10, IN = 11, OUTN = 12, CPU = 13,
    EKIND = 14, ERR = 15, PID = 16;
  const body = document.body;

  // ---- helpers -------------------------------------------------------------------------------
  const { el, dur, tick, section, csvCell } = BF;
  function at(ms) { return "+" + dur(ms); }
  function pct(part, whole) {
    if (!whole) return "0 %";
    const p = part * 100 / whole;
    return (p > 0 && p < 0.5) ? "<1 %" : Math.round(p) + " %";
  }
  function phase(a, p) { return a[T + p + 1] - a[T + p]; }
  function elapsed(a) { return a[T + 5] - a[T]; }
  function queue(a) { return a[PUB] >= 0 ? a[T] - a[PUB] : -1; }
  function laneName(l) { const lane = D.lanes[l]; return lane ? lane.worker + " · slot " + lane.slot : "?"; }
  function outcome(a) { return D.outcomes[a[OUT]] || "?"; }

  const main = el("main");
  body.appendChild(main);
  const critical = D.critical;
  const criticalAttempts = new Set();
  if (critical) critical.steps.forEach((s) => {
    if (s.attempt != null && (s.kind === "attempt" || s.kind === "failed_attempt" ||
      s.kind === "runtime_start")) criticalAttempts.add(s.attempt);
  });

  // ---- header --------------------------------------------------------------------------------
  const facts = [
    ["wall time", dur(D.wall)], ["attempts", A.length.toLocaleString()],
    ["mini-batches", D.batches.toLocaleString() + (D.job.planned ? " of " +
      D.job.planned.batches.toLocaleString() + " planned" : "")],
    ["failed attempts", String(D.failed)], ["retried batches", String(D.retried)],
    ["workers", String(D.workers.length)], ["slots", String(D.lanes.length)],
    ["median attempt", dur(D.median)],
    ["result", D.job.result || "not finished"],
  ];
  main.appendChild(el("header", {}, [
    el("h1", {}, ["Profile of job ", el("span", { class: "job", text: D.job.id })]),
    el("p", { class: "summary", id: "summary", text: D.summary }),
    el("div", { class: "facts" }, facts.map((f) => el("span", {}, [f[0] + ": ", el("b", { text: f[1] })]))),
  ]));
  if (D.skipped_total > 0) {
    main.appendChild(el("section", { class: "warn", id: "skipped" }, [
      el("b", { text: D.skipped_total + " unreadable record line(s) skipped" +
        (D.skipped_total > D.skipped.length ? " (the first " + D.skipped.length + " below)" : "") }),
      el("ul", {}, D.skipped.map((s) => el("li", { class: "mono", text: s.file + ": " + s.why }))),
    ]));
  }

  // ---- Gantt ---------------------------------------------------------------------------------
  const view = { t0: 0, t1: Math.max(D.wall, 1) };
  // 3x the median, and never under 10 ms: with attempts of a millisecond or two (times are
  // whole milliseconds), 3x the median would keep nearly all of them.
  const compact = { on: false, threshold: Math.max(10, D.median * 3) };
  const GUTTER = 118, AXIS = 26;
  const laneH = Math.max(7, Math.min(24, Math.floor(520 / Math.max(1, D.lanes.length))));
  const legend = el("span", { class: "legend" }, PHASE_NAMES.map((n, i) => el("span", {},
    [el("i", { class: "swatch", style: "background:" + PHASE_COLORS[i] }), n])).concat([
    el("span", {}, [el("i", { class: "swatch", style: "background:" + FAILED }), "failed"]),
    el("span", {}, [el("i", { class: "swatch", style: "background:#fff;outline:2px solid " + CRITICAL }), "critical path"]),
  ]));
  const thresholdInput = el("input", { type: "number", min: "0", step: "0.1",
    value: (compact.threshold / 1000).toFixed(2), title: "seconds" });
  const compactBox = el("input", { type: "checkbox", id: "compact" });
  const toolbar = el("div", { class: "toolbar" }, [
    el("button", { text: "Whole job", onclick: () => { view.t0 = 0; view.t1 = Math.max(D.wall, 1); draw(); } }),
    el("button", { text: "Zoom to the longest critical step", onclick: () => zoomToStep(critical && critical.longest) }),
    el("label", {}, [compactBox, " compact: only attempts over "]), thresholdInput, el("span", { text: "s" }),
    legend,
  ]);
  const gantt = el("canvas", { id: "gantt" });
  const ganttWrap = el("div", { class: "chart", id: "gantt-wrap" }, [gantt]);
  const tooltip = el("div", { class: "tooltip" });
  document.body.appendChild(tooltip);
  main.appendChild(section("timeline", "Timeline — one lane per worker slot", [toolbar, ganttWrap,
    el("p", { class: "hint", text: "Wheel: zoom · drag: pan · double-click: whole job · hover a bar for its phases. " +
      "Bars narrower than a pixel are merged into one-pixel columns coloured by their main phase." })]));

  function X(t, width) { return GUTTER + (t - view.t0) * (width - GUTTER) / (view.t1 - view.t0); }
  function tickStep(span, px) { return BF.tickStep(span, px / 110); }
  function setupCanvas(canvas, cssHeight) {
    const ratio = window.devicePixelRatio || 1;
    const width = Math.max(300, canvas.parentNode.clientWidth || 1200);
    canvas.style.height = cssHeight + "px";
    canvas.width = Math.round(width * ratio);
    canvas.height = Math.round(cssHeight * ratio);
    const ctx = canvas.getContext("2d");
    ctx.setTransform(ratio, 0, 0, ratio, 0, 0);
    return { ctx: ctx, width: width };
  }
  function drawAxis(ctx, width, height, top) {
    const step = tickStep(view.t1 - view.t0, width - GUTTER);
    ctx.font = "11px system-ui, sans-serif";
    ctx.fillStyle = "#59636e";
    ctx.textBaseline = "middle";
    for (let t = Math.ceil(view.t0 / step) * step; t <= view.t1; t += step) {
      const x = Math.round(X(t, width)) + 0.5;
      ctx.strokeStyle = "#eef1f4";
      ctx.beginPath(); ctx.moveTo(x, top); ctx.lineTo(x, height); ctx.stroke();
      ctx.fillText(tick(t, step), x + 3, top / 2 || 10);
    }
  }
  // The first attempt of a lane that may end after t (attempts are sorted by start).
  function firstVisible(list, t) {
    let lo = 0, hi = list.length;
    while (lo < hi) { const mid = (lo + hi) >> 1; if (A[list[mid]][T] < t) lo = mid + 1; else hi = mid; }
    return Math.max(0, lo - 1);
  }
  function visible(a) { return !compact.on || elapsed(a) >= compact.threshold; }

  function draw() {
    const height = AXIS + D.lanes.length * laneH + 6;
    const { ctx, width } = setupCanvas(gantt, height);
    ctx.clearRect(0, 0, width, height);
    drawAxis(ctx, width, height, AXIS);
    let drawn = 0;
    const critLane = critical ? critical.lane : -1;
    D.lanes.forEach((lane, l) => {
      const y = AXIS + l * laneH, h = laneH - (laneH > 10 ? 3 : 1);
      if (l === critLane) { ctx.fillStyle = "#fdf0f5"; ctx.fillRect(0, y, width, laneH); }
      else if (l % 2) { ctx.fillStyle = "#fafbfc"; ctx.fillRect(0, y, width, laneH); }
      ctx.fillStyle = l === critLane ? CRITICAL : "#1f2328";
      ctx.font = (l === critLane ? "600 " : "") + Math.min(12, laneH - 2) + "px system-ui, sans-serif";
      ctx.textBaseline = "middle";
      if (laneH >= 9) ctx.fillText((l === critLane ? "★ " : "") + lane.worker + " · s" + lane.slot, 6, y + laneH / 2, GUTTER - 10);
      const list = lane.attempts;
      let px = -1, count = 0, sums = [0, 0, 0, 0, 0], failed = false;
      const flush = () => {
        if (count === 0) return;
        let best = 0; for (let p = 1; p < 5; p++) if (sums[p] > sums[best]) best = p;
        ctx.fillStyle = PHASE_COLORS[best]; ctx.fillRect(px, y + 1, 1, h);
        if (failed) { ctx.fillStyle = FAILED; ctx.fillRect(px, y + 1, 1, Math.max(2, h / 3)); }
        drawn += count; count = 0; sums = [0, 0, 0, 0, 0]; failed = false;
      };
      for (let k = firstVisible(list, view.t0); k < list.length; k++) {
        const i = list[k], a = A[i];
        if (a[T] > view.t1) break;
        if (a[T + 5] < view.t0 || !visible(a)) continue;
        const x0 = X(a[T], width), x1 = X(a[T + 5], width);
        if (x1 - x0 < 1) {
          const col = Math.floor(x0);
          if (col !== px) { flush(); px = col; }
          count++; for (let p = 0; p < 5; p++) sums[p] += phase(a, p);
          failed = failed || a[OUT] === 1;
          continue;
        }
        flush();
        for (let p = 0; p < 5; p++) {
          const s0 = X(a[T + p], width), s1 = X(a[T + p + 1], width);
          if (s1 - s0 < 0.25) continue;
          ctx.fillStyle = PHASE_COLORS[p];
          ctx.fillRect(s0, y + 1, Math.max(0.5, s1 - s0), h);
        }
        if (a[OUT] === 1) {
          ctx.strokeStyle = FAILED; ctx.lineWidth = 2;
          ctx.strokeRect(x0 + 1, y + 2, Math.max(1, x1 - x0 - 2), h - 2);
          ctx.fillStyle = FAILED; ctx.fillRect(x0, y + 1, Math.min(4, x1 - x0), h);
        }
        if (criticalAttempts.has(i) && x1 - x0 >= 8) {
          ctx.strokeStyle = CRITICAL; ctx.lineWidth = 1.5;
          ctx.strokeRect(x0 + 0.75, y + 0.75, x1 - x0 - 1.5, h + 0.5);
        }
        if (x1 - x0 > 64 && h >= 12) {
          ctx.fillStyle = "#fff"; ctx.font = "11px system-ui, sans-serif";
          ctx.fillText(a[BATCH] + (a[TRY] > 1 ? " #" + a[TRY] : ""), x0 + 5, y + 1 + h / 2, x1 - x0 - 8);
        }
        drawn++;
      }
      flush();
    });
    // The critical path: a line under the critical lane, dashed through its idle stretches.
    if (critical) {
      const y = AXIS + critLane * laneH + laneH - 1;
      ctx.save();
      ctx.strokeStyle = CRITICAL; ctx.lineWidth = 2;
      critical.steps.forEach((s) => {
        const x0 = Math.max(GUTTER, X(s.start, width)), x1 = Math.min(width, X(s.end, width));
        if (x1 < GUTTER || x0 > width) return;
        ctx.setLineDash(s.kind.startsWith("waiting") ? [4, 3] : []);
        ctx.beginPath(); ctx.moveTo(x0, y); ctx.lineTo(Math.max(x0 + 1, x1), y); ctx.stroke();
      });
      ctx.restore();
      const longest = critical.longest != null ? critical.steps[critical.longest] : null;
      if (longest) {
        const x0 = X(longest.start, width), x1 = X(longest.end, width);
        if (x1 > GUTTER && x0 < width) {
          ctx.strokeStyle = CRITICAL; ctx.lineWidth = 3;
          ctx.strokeRect(Math.max(GUTTER, x0) - 1, AXIS + critLane * laneH - 1,
            Math.max(3, Math.min(width, x1) - Math.max(GUTTER, x0) + 2), laneH + 1);
        }
      }
    }
    ctx.fillStyle = "#fff"; ctx.fillRect(0, AXIS - 1, 0, 0);
    ctx.strokeStyle = "#d1d9e0"; ctx.lineWidth = 1;
    ctx.beginPath(); ctx.moveTo(GUTTER - 0.5, 0); ctx.lineTo(GUTTER - 0.5, height); ctx.stroke();
    drawResources();
    return drawn;
  }
  let pending = false;
  function redraw() {
    if (pending) return; pending = true;
    requestAnimationFrame(() => { pending = false; draw(); });
  }
  function zoomTo(t0, t1) {
    const pad = Math.max(20, (t1 - t0) * 0.25);
    view.t0 = Math.max(-pad, t0 - pad); view.t1 = t1 + pad; draw();
    ganttWrap.scrollIntoView({ block: "nearest" });
  }
  function zoomToStep(index) {
    if (!critical || index == null || !critical.steps[index]) return;
    const s = critical.steps[index];
    zoomTo(s.start, s.end);
  }
  gantt.addEventListener("wheel", (e) => {
    e.preventDefault();
    const width = gantt.clientWidth, x = e.offsetX;
    if (x < GUTTER) return;
    const t = view.t0 + (x - GUTTER) * (view.t1 - view.t0) / (width - GUTTER);
    const factor = Math.pow(1.0015, e.deltaY);
    const span = Math.max(2, Math.min(D.wall * 4 + 1000, (view.t1 - view.t0) * factor));
    const f = (t - view.t0) / (view.t1 - view.t0);
    view.t0 = t - span * f; view.t1 = view.t0 + span; redraw();
  }, { passive: false });
  let drag = null;
  gantt.addEventListener("mousedown", (e) => { drag = { x: e.clientX, t0: view.t0, t1: view.t1 }; gantt.classList.add("dragging"); });
  window.addEventListener("mouseup", () => { drag = null; gantt.classList.remove("dragging"); });
  window.addEventListener("mousemove", (e) => {
    if (!drag) return;
    const dt = (e.clientX - drag.x) * (drag.t1 - drag.t0) / (gantt.clientWidth - GUTTER);
    view.t0 = drag.t0 - dt; view.t1 = drag.t1 - dt; redraw();
  });
  gantt.addEventListener("dblclick", () => { view.t0 = 0; view.t1 = Math.max(D.wall, 1); draw(); });
  gantt.addEventListener("mouseleave", () => { tooltip.style.display = "none"; });
  gantt.addEventListener("mousemove", (e) => {
    const l = Math.floor((e.offsetY - AXIS) / laneH), width = gantt.clientWidth;
    const lane = D.lanes[l];
    if (!lane || e.offsetX < GUTTER || drag) { tooltip.style.display = "none"; return; }
    const t = view.t0 + (e.offsetX - GUTTER) * (view.t1 - view.t0) / (width - GUTTER);
    const slack = 3 * (view.t1 - view.t0) / (width - GUTTER);
    let found = -1;
    for (let k = firstVisible(lane.attempts, t - slack); k < lane.attempts.length; k++) {
      const a = A[lane.attempts[k]];
      if (a[T] > t + slack) break;
      if (a[T + 5] >= t - slack && visible(a)) { found = lane.attempts[k]; break; }
    }
    if (found < 0) { tooltip.style.display = "none"; return; }
    tooltip.textContent = describe(found);
    tooltip.style.display = "block";
    tooltip.style.left = Math.min(window.innerWidth - 430, e.clientX + 14) + "px";
    tooltip.style.top = (e.clientY + 14) + "px";
  });
  function describe(i) {
    const a = A[i];
    const lines = ["batch " + a[BATCH] + " · attempt " + a[TRY] + " · " + outcome(a) +
      (criticalAttempts.has(i) ? " · on the critical path" : ""),
      laneName(a[LANE]) + (a[PID] >= 0 ? " · pid " + a[PID] : "") + " · " + a[IN] + " item(s) in, " + a[OUTN] + " out",
      "received " + at(a[T]) + ", settled " + at(a[T + 5]) + " (" + dur(elapsed(a)) + ")",
      "queue wait " + (queue(a) >= 0 ? dur(queue(a)) : "unknown")];
    for (let p = 0; p < 5; p++) if (phase(a, p) > 0) lines.push(PHASE_NAMES[p] + ": " + dur(phase(a, p)));
    if (a[CPU] >= 0) lines.push("CPU in run(): " + a[CPU].toFixed(2) + " s");
    if (a[EKIND] || a[ERR]) lines.push("error: " + (a[EKIND] || "") + " " + (a[ERR] || "").slice(0, 300));
    return lines.join("\n");
  }

  // ---- resource timeline ---------------------------------------------------------------------
  const resCanvas = el("canvas", { id: "resources" });
  const resNote = el("p", { class: "hint", id: "resources-note" });
  const resChildren = [];
  if (D.resources.length) {
    resChildren.push(el("div", { class: "toolbar" }, [el("span", { class: "legend" },
      D.resources.map((r, i) => el("span", {}, [el("i", { class: "swatch", style: "background:" + WORKER_COLORS[i % 10] }), r.worker]))
        .concat([el("span", { text: "solid: CPU % · dashed: memory used %" })]))]));
    resChildren.push(el("div", { class: "chart" }, [resCanvas]));
    const procs = [];
    D.resources.forEach((r) => r.processes.forEach((p) => {
      let peak = 0; p.rss.forEach((v) => { if (v != null && v > peak) peak = v; });
      procs.push({ worker: r.worker, pid: p.pid, peak: peak });
    }));
    procs.sort((x, y) => y.peak - x.peak);
    resNote.textContent = procs.length ? procs.length + " runtime process(es) sampled; largest RSS: " +
      procs.slice(0, 5).map((p) => p.worker + " pid " + p.pid + " " + p.peak.toFixed(0) + " MB").join(", ") :
      "No per-process samples (processes_resource_usage.csv).";
  } else {
    resNote.textContent = "No resource timeline: no worker wrote logs/sys/perf/<worker>/node_resource_usage.csv " +
      "for this job (sampling runs every --resource_monitor_interval seconds; 0 turns it off).";
  }
  if (D.resource_skipped_total > 0) resNote.textContent += " " + D.resource_skipped_total + " unreadable CSV row(s) skipped: " + D.resource_skipped.slice(0, 5).join("; ");
  resChildren.push(resNote);
  const resourcesSection = section("resources-section", "Resource usage", resChildren);
  main.appendChild(resourcesSection);
  function drawResources() {
    if (!D.resources.length) return;
    const height = 150;
    const { ctx, width } = setupCanvas(resCanvas, height);
    const top = 8, bottom = height - 18;
    const Y = (v) => bottom - (bottom - top) * Math.max(0, Math.min(100, v)) / 100;
    ctx.clearRect(0, 0, width, height);
    ctx.font = "11px system-ui, sans-serif"; ctx.fillStyle = "#59636e"; ctx.textBaseline = "middle";
    [0, 50, 100].forEach((v) => {
      ctx.strokeStyle = "#eef1f4"; ctx.beginPath(); ctx.moveTo(GUTTER, Y(v)); ctx.lineTo(width, Y(v)); ctx.stroke();
      ctx.fillText(v + " %", GUTTER - 40, Y(v));
    });
    ctx.save(); ctx.beginPath(); ctx.rect(GUTTER, 0, width - GUTTER, height); ctx.clip();
    D.resources.forEach((r, i) => {
      ctx.strokeStyle = WORKER_COLORS[i % 10]; ctx.lineWidth = 1.5;
      [["cpu", []], ["mem_pct", [5, 4]]].forEach(([key, dash]) => {
        ctx.setLineDash(dash); ctx.beginPath(); let started = false;
        r.t.forEach((t, k) => {
          const v = r[key][k]; if (v == null) { started = false; return; }
          const x = X(t, width), y = Y(v);
          if (started) ctx.lineTo(x, y); else { ctx.moveTo(x, y); started = true; }
        });
        ctx.stroke();
        if (r.t.length <= 80) {
          ctx.fillStyle = WORKER_COLORS[i % 10];
          r.t.forEach((t, k) => { const v = r[key][k]; if (v != null) ctx.fillRect(X(t, width) - 2, Y(v) - 2, 4, 4); });
        }
      });
    });
    ctx.restore();
    ctx.setLineDash([]);
    const step = tickStep(view.t1 - view.t0, width - GUTTER);
    for (let t = Math.ceil(view.t0 / step) * step; t <= view.t1; t += step) ctx.fillText(tick(t, step), X(t, width) + 3, height - 8);
  }

  // ---- critical path -------------------------------------------------------------------------
  const critChildren = [];
  if (critical) {
    critChildren.push(el("p", { class: "critical-text", id: "critical-text", text: critical.text }));
    const byKind = {};
    critical.steps.forEach((s) => { byKind[s.kind] = (byKind[s.kind] || 0) + s.end - s.start; });
    const kinds = [["attempt", "in attempts"], ["failed_attempt", "in failed attempts"], ["runtime_start", "starting runtimes"],
      ["waiting_for_work", "idle waiting for work"], ["waiting_for_delivery", "idle while work was queued"],
      ["waiting_for_retry", "waiting for retries"]].filter((k) => byKind[k[0]]);
    critChildren.push(el("p", { class: "hint", text: "On that slot: " + kinds.map((k) => pct(byKind[k[0]], D.wall) + " " + k[1]).join(", ") +
      ". Ordinary attempts (under 3× the median) in a row are folded; click a step to see it on the timeline." }));
    const stepRow = (s, n) => el("li", { class: n === critical.longest ? "longest" : "", "data-kind": s.kind, "data-batch": s.batch || "",
      title: "click: zoom the timeline to this step", onclick: () => zoomToStep(n) }, [
      el("span", { class: "n", text: String(n + 1) }), el("span", { class: "when", text: at(s.start) }),
      el("span", { class: "dur", text: dur(s.end - s.start) }),
      el("span", {}, [el("span", { class: "kind " + s.kind, text: s.kind.replace(/_/g, " ") }), s.text]),
    ]);
    const ordinary = (s, n) => s.kind === "attempt" && n !== critical.longest && s.end - s.start < 3 * Math.max(1, D.median);
    const list = el("ol", { class: "steps", id: "critical-steps" });
    for (let n = 0; n < critical.steps.length;) {
      let m = n;
      while (m < critical.steps.length && ordinary(critical.steps[m], m)) m++;
      if (m - n >= 4) {
        const from = n, to = m, first = critical.steps[from], last = critical.steps[to - 1];
        const folded = el("li", { class: "folded", title: "click: show these steps" }, [
          el("span", { class: "n", text: (from + 1) + "–" + to }), el("span", { class: "when", text: at(first.start) }),
          el("span", { class: "dur", text: dur(last.end - first.start) }),
          el("span", { class: "muted", text: (to - from) + " ordinary attempts, batches " + first.batch + " … " + last.batch + " (click to show)" }),
        ]);
        folded.addEventListener("click", () => {
          const frag = document.createDocumentFragment();
          for (let k = from; k < to; k++) frag.appendChild(stepRow(critical.steps[k], k));
          folded.replaceWith(frag);
        });
        list.appendChild(folded);
        n = m;
      } else {
        const end = Math.max(m, n + 1);
        for (let k = n; k < end; k++) list.appendChild(stepRow(critical.steps[k], k));
        n = end;
      }
    }
    critChildren.push(list);
  } else {
    critChildren.push(el("p", { text: "No critical path: no attempt on record." }));
  }
  // Right under the timeline: the question most readers come with.
  main.insertBefore(section("critical-path", "Critical path — what decided when the job ended", critChildren),
    resourcesSection);

  // ---- slowest batches and utilisation -------------------------------------------------------
  const slowRows = D.slowest.map((b) => {
    const last = A[b.last];
    return el("tr", { class: "clickable" + (b.outcome === "failed" ? " failed" : ""), title: "click: show it on the timeline",
      onclick: () => zoomTo(last[T], last[T + 5]) }, [
      el("td", { class: "mono", text: b.batch + (criticalAttempts.has(b.last) ? " ★" : "") }),
      el("td", { class: "num", text: String(b.attempts) }),
      el("td", { class: "num", text: dur(b.elapsed) }), el("td", { class: "num", text: dur(b.run) }),
      el("td", { class: "num", text: b.queue == null ? "" : dur(b.queue) }),
      el("td", { text: b.outcome }), el("td", { class: "mono", text: laneName(last[LANE]) }),
    ]);
  });
  const slowTable = el("div", { class: "table-wrap" }, [el("table", { id: "slowest" }, [
    el("thead", {}, [el("tr", {}, ["batch", "attempts", "total", "run()", "queued", "outcome", "last on"].map((h, k) =>
      el("th", { class: k >= 1 && k <= 4 ? "num" : "", text: h })))]),
    el("tbody", {}, slowRows)])]);
  const utilRows = [];
  const parts = (u) => [[u.phases[2], PHASE_COLORS[2], "run()"],
    [u.phases[1] + u.phases[3] + u.phases[4], PHASE_COLORS[1], "load, write, settle"],
    [u.phases[0], PHASE_COLORS[0], "starting runtimes"], [u.idle, IDLE, "idle"]];
  D.workers.forEach((w) => {
    const u = w.usage;
    utilRows.push(el("div", { class: "name", title: w.worker, text: w.worker }));
    utilRows.push(el("div", { class: "bar" }, parts(u).map((p) => el("span", {
      style: "width:" + (u.span ? p[0] * 100 / u.span : 0) + "%;background:" + p[1], title: p[2] + ": " + pct(p[0], u.span) }))));
    const starting = u.span && u.phases[0] * 100 / u.span >= 0.5 ? " · " + pct(u.phases[0], u.span) + " starting" : "";
    utilRows.push(el("div", { class: "pct", title: "busy: loading, run(), writing, settling",
      text: pct(u.span - u.idle - u.phases[0], u.span) + " busy · " + pct(u.idle, u.span) + " idle" + starting }));
  });
  const utilLegend = el("div", { class: "toolbar" }, [el("span", { class: "legend" }, parts(D.total).map((p) =>
    el("span", {}, [el("i", { class: "swatch", style: "background:" + p[1] }), p[2]])))]);
  main.appendChild(el("div", { class: "grid2" }, [
    section("slowest-section", "Slowest mini-batches (all attempts added up)", [slowTable]),
    section("workers-section", "Utilisation per worker (" + D.lanes.length + " slots, " + dur(D.wall) + " each)",
      [utilLegend, el("div", { class: "util", id: "workers" }, utilRows)]),
  ]));

  // ---- attempts table + CSV ------------------------------------------------------------------
  const COLUMNS = [
    ["batch", (a) => a[BATCH], false], ["attempt", (a) => a[TRY], true], ["worker", (a) => D.lanes[a[LANE]].worker, false],
    ["slot", (a) => D.lanes[a[LANE]].slot, true], ["outcome", outcome, false], ["received", (a) => a[T], true, at],
    ["queue", queue, true, dur], ["start", (a) => phase(a, 0), true, dur], ["load", (a) => phase(a, 1), true, dur],
    ["run", (a) => phase(a, 2), true, dur], ["write", (a) => phase(a, 3), true, dur], ["settle", (a) => phase(a, 4), true, dur],
    ["total", elapsed, true, dur], ["items in", (a) => a[IN], true], ["items out", (a) => a[OUTN], true],
    ["cpu s", (a) => a[CPU], true, (v) => v >= 0 ? v.toFixed(2) : ""], ["pid", (a) => a[PID], true, (v) => v >= 0 ? String(v) : ""],
    ["error", (a) => ((a[EKIND] || "") + " " + (a[ERR] || "")).trim(), false],
  ];
  const PAGE = 1000;
  const table = { sort: 12, desc: true, page: 0, rows: [] };
  const tbody = el("tbody");
  const pager = el("span", { id: "pager" });
  const headRow = el("tr", {}, COLUMNS.map((c, k) => el("th", { class: "sortable" + (c[2] ? " num" : ""), text: c[0],
    title: "sort by " + c[0], onclick: () => { table.desc = table.sort === k ? !table.desc : c[2]; table.sort = k; table.page = 0; fillTable(); } })));
  function rowsInOrder() {
    const rows = [];
    for (let i = 0; i < A.length; i++) if (visible(A[i])) rows.push(i);
    const get = COLUMNS[table.sort][1], dir = table.desc ? -1 : 1;
    rows.sort((x, y) => { const a = get(A[x]), b = get(A[y]); return a < b ? -dir : a > b ? dir : x - y; });
    return rows;
  }
  function fillTable() {
    table.rows = rowsInOrder();
    const pages = Math.max(1, Math.ceil(table.rows.length / PAGE));
    table.page = Math.min(table.page, pages - 1);
    const from = table.page * PAGE, to = Math.min(table.rows.length, from + PAGE);
    const frag = document.createDocumentFragment();
    for (let r = from; r < to; r++) {
      const i = table.rows[r], a = A[i];
      frag.appendChild(el("tr", { class: "clickable" + (a[OUT] === 1 ? " failed" : ""), onclick: () => zoomTo(a[T], a[T + 5]) },
        COLUMNS.map((c) => { const v = c[1](a); return el("td", { class: c[0] === "error" ? "err" : c[2] ? "num" : "mono",
          text: c[3] ? c[3](v) : String(v) }); })));
    }
    tbody.replaceChildren(frag);
    Array.from(headRow.children).forEach((th, k) => {
      th.classList.toggle("sorted", k === table.sort); th.classList.toggle("asc", k === table.sort && !table.desc);
    });
    pager.textContent = "rows " + (to ? from + 1 : 0).toLocaleString() + "–" + to.toLocaleString() + " of " +
      table.rows.length.toLocaleString() + (compact.on ? " (compact: over " + dur(compact.threshold) + ")" : "");
  }
  // The table's rows (all pages, its order and filter) as CSV, times in milliseconds.
  function csvText() {
    const lines = [COLUMNS.map((c) => c[0] + (c[3] === dur || c[3] === at ? " ms" : "")).join(",")];
    table.rows.forEach((i) => lines.push(COLUMNS.map((c) => { const v = c[1](A[i]); return csvCell(v === -1 ? "" : v); }).join(",")));
    return lines.join("\n") + "\n";
  }
  function downloadCsv() {
    const blob = new Blob([csvText()], { type: "text/csv" });
    const link = el("a", { href: URL.createObjectURL(blob), download: "attempts-" + D.job.id + ".csv" });
    document.body.appendChild(link); link.click(); link.remove();
  }
  main.appendChild(section("attempts-section", "Attempts", [
    el("div", { class: "toolbar" }, [
      el("button", { id: "download-csv", text: "Download CSV", onclick: downloadCsv }),
      el("button", { text: "‹", title: "previous rows", onclick: () => { table.page = Math.max(0, table.page - 1); fillTable(); } }),
      el("button", { text: "›", title: "next rows", onclick: () => { table.page++; fillTable(); } }),
      pager, el("span", { text: "click a header to sort, a row to see it on the timeline" }),
    ]),
    el("div", { class: "table-wrap" }, [el("table", { id: "attempts" }, [el("thead", {}, [headRow]), tbody])]),
  ]));
  function applyCompact() {
    compact.on = compactBox.checked;
    const s = parseFloat(thresholdInput.value);
    if (!isNaN(s) && s >= 0) compact.threshold = s * 1000;
    table.page = 0; fillTable(); draw();
  }
  compactBox.addEventListener("change", applyCompact);
  thresholdInput.addEventListener("change", applyCompact);
  window.addEventListener("resize", redraw);

  // ---- first render --------------------------------------------------------------------------
  fillTable();
  const drawn = draw();
  body.dataset.barsDrawn = String(drawn);
  body.dataset.criticalPath = String(critical ? critical.steps.length : 0);
  // `profile.html#selftest`: exercise the interactive parts once, for the headless test.
  if (location.hash === "#selftest") {
    compactBox.checked = true; applyCompact();
    const compactRows = table.rows.length, compactBars = draw();
    compactBox.checked = false; applyCompact();
    headRow.children[9].click();
    const sorted = table.rows.every((row, k) => k === 0 || phase(A[table.rows[k - 1]], 2) >= phase(A[row], 2));
    zoomToStep(critical ? critical.longest : null);
    const zoomedBars = draw();
    view.t0 = 0; view.t1 = Math.max(D.wall, 1); draw();
    body.dataset.selftest = JSON.stringify({ compactRows: compactRows, compactBars: compactBars, sorted: sorted,
      zoomedBars: zoomedBars, csvLines: csvText().trim().split("\n").length, tableRows: tbody.children.length });
  }
  body.dataset.ready = "1";
})();
