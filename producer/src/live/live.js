// batchfleet's live page: polls api/jobs/<id>/state every 2 s (workers write their attempt
// records every 2 s) and draws it. No network beyond this server, no library. For a headless test it keeps on <body>: data-updates (polls
// drawn), data-ended (mini-batches ended), data-history (every ended count drawn, in order),
// data-failures and data-tracebacks (failure records and tracebacks shown), data-finished,
// data-errors (script errors) and data-ready="1" once the first state is drawn; of a pipeline,
// data-pipeline-steps (`name:state,…`) and data-pipeline-edges (arrows drawn).
(function () {
  "use strict";
  var body = document.body;
  var params = new URLSearchParams(location.search);
  var token = params.get("token");
  var POLL_MS = 2000;
  var jobId = params.get("job");
  var profileLoadedAt = 0;
  var history = [];

  function withToken(path) {
    return token ? path + (path.indexOf("?") < 0 ? "?" : "&") + "token=" + encodeURIComponent(token) : path;
  }
  function $(id) { return document.getElementById(id); }
  function esc(text) {
    return String(text == null ? "" : text).replace(/[&<>"']/g, function (c) {
      return { "&": "&amp;", "<": "&lt;", ">": "&gt;", '"': "&quot;", "'": "&#39;" }[c];
    });
  }
  function num(n) { return n == null ? "–" : Number(n).toLocaleString("en-US"); }
  function dur(s) {
    if (s == null || !isFinite(s)) return "–";
    if (s < 1) return Math.round(s * 1000) + " ms";
    if (s < 60) return s.toFixed(1) + " s";
    if (s < 3600) return Math.floor(s / 60) + " min " + Math.round(s % 60) + " s";
    return Math.floor(s / 3600) + " h " + Math.round((s % 3600) / 60) + " min";
  }
  function pct(p) { return p == null ? "–" : (p > 0 && p < 0.5 ? "<1 %" : Math.round(p) + " %"); }
  function tile(key, value, sub, cls) {
    return '<div class="tile ' + (cls || "") + '"><div class="k">' + esc(key) + '</div><div class="v">' +
      esc(value) + '</div>' + (sub ? '<div class="s">' + esc(sub) + "</div>" : "") + "</div>";
  }
  function getJSON(path) {
    return fetch(withToken(path), { cache: "no-store" }).then(function (r) {
      return r.json().then(function (j) { if (!r.ok) throw new Error(j.error || r.status); return j; });
    });
  }

  function drawTiles(s) {
    var c = s.counts, r = s.rate, cost = s.cost;
    var planned = c.planned == null ? "planning…" : num(c.planned);
    var share = c.planned ? Math.round(100 * c.ended / Math.max(1, c.planned)) + " % ended" : "";
    var html = tile("ended of planned", num(c.ended) + " / " + planned, share);
    html += tile("succeeded", num(c.succeeded), num(c.items_succeeded) + " items", "ok");
    html += tile("failed", num(c.failed), num(c.items_failed) + " items failed; " + num(c.failed_attempts) + " failed attempts", c.failed || c.failed_attempts ? "fail" : "");
    html += tile("cancelled", num(c.cancelled), "");
    html += tile("rate", r.per_s == null ? "–" : r.per_s.toFixed(2) + " /s", r.basis);
    html += tile("ETA", s.job.finished ? "done" : dur(r.eta_s), r.eta_basis || "");
    html += tile("cost so far", cost ? cost.worker_seconds.toFixed(1) + " w·s" : "–",
      cost ? (cost.money != null ? "$" + cost.money.toFixed(4) + " · " : "") + pct(cost.utilisation_pct) + " slots busy" : "");
    html += tile("elapsed", s.job.elapsed, num(c.attempts) + " attempts on record");
    $("tiles").innerHTML = html;
    var total = Math.max(1, c.planned || c.ended);
    $("bar-ok").style.width = (100 * c.succeeded / total) + "%";
    $("bar-failed").style.width = (100 * c.failed / total) + "%";
    $("bar-cancelled").style.width = (100 * c.cancelled / total) + "%";
    $("progress-basis").textContent = r.eta_basis ? "— " + r.eta_basis : "";
  }

  function drawChart(s) {
    var canvas = $("chart"), ratio = window.devicePixelRatio || 1;
    var w = canvas.clientWidth || 800, h = 190;
    canvas.width = w * ratio; canvas.height = h * ratio;
    var g = canvas.getContext("2d");
    g.scale(ratio, ratio);
    g.clearRect(0, 0, w, h);
    var pts = s.progress, planned = s.counts.planned || s.counts.ended || 1;
    var tEnd = Math.max(1, (s.job.now_ms - s.job.started_ms) / 1000);
    var eta = s.rate.eta_s && !s.job.finished ? s.rate.eta_s : 0;
    var tMax = Math.max(tEnd + eta, tEnd);
    var L = 46, R = 10, T = 8, B = 22;
    function x(t) { return L + (w - L - R) * t / tMax; }
    function y(n) { return T + (h - T - B) * (1 - n / planned); }
    g.strokeStyle = "#e5e7eb"; g.fillStyle = "#6b7280"; g.font = "11px sans-serif"; g.lineWidth = 1;
    // Up to 4 gridlines at whole mini-batches (a job of 2 gets 0, 1, 2).
    var steps = Math.min(4, planned);
    for (var i = 0; i <= steps; i++) {
      var n = Math.round(planned * i / steps);
      g.beginPath(); g.moveTo(L, y(n)); g.lineTo(w - R, y(n)); g.stroke();
      g.fillText(Math.round(n).toLocaleString("en-US"), 4, y(n) + 4);
    }
    for (var k = 0; k <= 5; k++) {
      var t = tMax * k / 5, label = dur(t);
      g.fillText(label, Math.min(x(t) - 10, w - R - g.measureText(label).width), h - 6);
    }
    g.strokeStyle = "#2563eb"; g.lineWidth = 2; g.beginPath();
    pts.forEach(function (p, j) { if (j === 0) g.moveTo(x(p[0]), y(p[1])); else g.lineTo(x(p[0]), y(p[1])); });
    var last = pts[pts.length - 1];
    g.lineTo(x(tEnd), y(last[1])); g.stroke();
    if (eta > 0) {
      g.setLineDash([5, 4]); g.strokeStyle = "#93c5fd"; g.beginPath();
      g.moveTo(x(tEnd), y(last[1])); g.lineTo(x(tEnd + eta), y(planned)); g.stroke(); g.setLineDash([]);
      g.fillStyle = "#2563eb"; g.fillText("ETA", x(tEnd + eta) - 26, y(planned) + 12);
    }
  }

  function drawFailures(s) {
    var f = s.failures, el = $("failures").querySelector(".body");
    body.dataset.failures = String(f.total);
    if (!f.total) { el.className = "body muted"; el.textContent = "none so far"; body.dataset.tracebacks = "0"; return; }
    var open = {};
    el.querySelectorAll("details[open]").forEach(function (d) { open[d.dataset.key] = true; });
    var tracebacks = 0;
    var html = '<div class="muted">' + num(f.total) + " failed attempts, " + num(f.groups_total) + " distinct messages</div>";
    f.groups.forEach(function (grp, gi) {
      html += '<div class="group"><div><span class="n">×' + grp.count + '</span><span class="msg">' + esc(grp.message) + "</span></div>";
      grp.failures.forEach(function (x, xi) {
        var link = withToken("jobs/" + encodeURIComponent(s.job.id) + "/" + x.key);
        var key = x.key;
        var first = gi === 0 && xi === 0;
        if (x.traceback) tracebacks++;
        html += '<details data-key="' + esc(key) + '"' + (open[key] || (first && open[key] !== false && !el.dataset.touched) ? " open" : "") + "><summary>mini-batch " + esc(x.batch) +
          ", attempt " + x.attempt + " · " + esc(x.kind) + " · " + esc(x.worker) + ' · <a href="' + esc(link) +
          '" target="_blank" rel="noopener">record</a></summary>' +
          '<pre class="traceback">' + esc(x.traceback || x.message) + "</pre></details>";
      });
      if (grp.count > grp.failures.length) html += '<div class="muted">and ' + (grp.count - grp.failures.length) + " more</div>";
      html += "</div>";
    });
    el.className = "body scroll"; el.innerHTML = html;
    el.onclick = function () { el.dataset.touched = "1"; };
    body.dataset.tracebacks = String(tracebacks);
  }

  function drawRetries(s) {
    var r = s.retries, el = $("retries").querySelector(".body");
    if (!r.batches) { el.className = "body muted"; el.textContent = "no attempt failed or was given back"; return; }
    var html = '<div>' + num(r.batches) + " mini-batches retried or to be retried; causes of their attempts that did not settle them: " +
      r.causes.map(function (c) { return '<span class="chip">' + esc(c[0]) + " × " + c[1] + "</span>"; }).join("") + "</div>";
    html += "<table><tr><th>mini-batch</th><th>attempts</th><th>causes</th><th>last</th></tr>";
    r.shown.forEach(function (b) {
      html += "<tr><td>" + esc(b.batch) + "</td><td>" + b.attempts + "</td><td>" + esc(b.causes.join(", ")) + "</td><td>" + esc(b.last) + "</td></tr>";
    });
    el.className = "body scroll"; el.innerHTML = html + "</table>";
  }

  function drawSlots(s) {
    var lanes = s.slots.lanes, el = $("slots").querySelector(".body");
    if (!lanes.length) return;
    var html = "<table><tr><th>worker</th><th>slot</th><th>busy</th><th>attempts</th><th>last mini-batch</th><th>last heard</th></tr>";
    lanes.forEach(function (l) {
      var heard = l.heard_ago_ms == null ? "–" : dur(l.heard_ago_ms / 1000) + " ago";
      html += "<tr><td>" + esc(l.worker) + "</td><td>" + l.slot + '</td><td><span class="meter"><i style="width:' +
        Math.min(100, l.busy_pct).toFixed(0) + '%"></i></span>' + pct(l.busy_pct) + "</td><td>" + l.attempts +
        "</td><td>" + esc(l.last_batch || "") + " " + esc(l.last_outcome || "") + "</td><td>" + heard + "</td></tr>";
    });
    el.className = "body scroll"; el.innerHTML = html + "</table>";
  }

  function drawStragglers(s) {
    var st = s.stragglers, el = $("stragglers").querySelector(".body");
    var html = '<div class="muted">median attempt ' + dur(st.median_ms / 1000) + "; listed: " + st.ratio + "× it or more</div>";
    if (st.silent.length) {
      html += "<table><tr><th>slot not heard from</th><th>for</th><th>× median</th></tr>";
      st.silent.forEach(function (x) { html += "<tr><td>" + esc(x.slot) + "</td><td>" + dur(x.ms / 1000) + "</td><td>" + x.ratio.toFixed(1) + "</td></tr>"; });
      html += "</table>";
    }
    if (st.ended.length) {
      html += "<table><tr><th>mini-batch</th><th>attempt</th><th>slot</th><th>took</th><th>× median</th></tr>";
      st.ended.forEach(function (x) {
        html += "<tr><td>" + esc(x.batch) + "</td><td>" + x.attempt + "</td><td>" + esc(x.slot) + "</td><td>" + dur(x.ms / 1000) + "</td><td>" + x.ratio.toFixed(1) + "</td></tr>";
      });
      html += "</table>";
    }
    if (!st.silent.length && !st.ended.length) html += "<div>none</div>";
    el.className = "body"; el.innerHTML = html;
  }

  function drawCost(s) {
    var c = s.cost, el = $("cost").querySelector(".body");
    if (!c) return;
    var html = "<div>" + esc(c.line) + "</div>";
    if (c.projected_worker_seconds != null && !s.job.finished) {
      html += "<div>projected: " + c.projected_worker_seconds.toFixed(1) + " worker-seconds" +
        (c.projected_money != null ? " ($" + c.projected_money.toFixed(4) + ")" : "") + ' <span class="muted">(' + esc(c.projected_basis) + ")</span></div>";
    }
    html += c.money != null ? "<div>at $" + c.price_per_hour + " per worker-hour: $" + c.money.toFixed(4) + " so far</div>"
      : '<div class="muted">give --live-price PRICE (per worker-hour) to see money</div>';
    el.className = "body"; el.innerHTML = html;
  }

  function drawProfile(s, force) {
    var url = withToken("jobs/" + encodeURIComponent(s.job.id) + "/profile");
    $("profile-open").href = url;
    var now = Date.now();
    var due = !profileLoadedAt || (!s.job.finished && now - profileLoadedAt > 30000) || force;
    if (s.counts.attempts > 0 && due) {
      $("profile-frame").src = url;
      profileLoadedAt = now;
    }
  }

  var lastState = null, finishedDrawn = false;
  function draw(s) {
    lastState = s;
    $("job-name").textContent = (s.job.name ? s.job.name + " · " : "") + s.job.id;
    document.title = s.counts.ended + "/" + (s.counts.planned == null ? "?" : s.counts.planned) + " · " + s.job.id;
    var st = $("state");
    st.textContent = s.job.result || (s.job.cancelled ? "stopping: " + s.job.cancelled : "running");
    st.className = "badge" + (s.job.result ? (/^succeeded/.test(s.job.result) ? " ok" : " bad") : "");
    drawTiles(s); drawChart(s); drawFailures(s); drawRetries(s); drawSlots(s); drawStragglers(s); drawCost(s);
    drawProfile(s, s.job.finished && !finishedDrawn);
    if (s.job.finished) finishedDrawn = true;
    history.push(s.counts.ended);
    body.dataset.ended = String(s.counts.ended);
    body.dataset.history = history.join(",");
    body.dataset.finished = s.job.finished ? "1" : "0";
    body.dataset.updates = String(Number(body.dataset.updates) + 1);
    body.dataset.ready = "1";
    $("updated").textContent = "updated " + new Date().toLocaleTimeString();
  }

  // A pipeline's steps as a graph, left to right: a step's column is one past the furthest of
  // the steps it reads from (they come in dependency order), an arrow from each of those.
  var pipelineLoadedAt = 0, pipelineResult = null;
  function drawPipeline(p) {
    $("pipeline").hidden = false;
    $("pipeline-name").textContent = p.id;
    var st = $("pipeline-state");
    st.textContent = p.error ? "cannot read it" : (p.result || "running");
    st.className = "badge" + (p.result ? (/^succeeded/.test(p.result) ? " ok" : " bad") : "");
    $("pipeline-summary").textContent = p.error || p.summary || "";
    var url = withToken("pipelines/" + encodeURIComponent(p.id) + "/profile");
    $("pipeline-open").href = url;
    if (!pipelineLoadedAt || p.result !== pipelineResult || Date.now() - pipelineLoadedAt > 30000) {
      $("pipeline-frame").src = url; pipelineLoadedAt = Date.now(); pipelineResult = p.result;
    }
    var steps = p.steps || [], col = {}, row = [], at = {}, W = 190, H = 54, GX = 60, GY = 16;
    steps.forEach(function (s) {
      var c = 0;
      s.after.forEach(function (a) { if (col[a] != null) c = Math.max(c, col[a] + 1); });
      col[s.name] = c; row[c] = (row[c] || 0) + 1;
      at[s.name] = { x: 10 + c * (W + GX), y: 10 + (row[c] - 1) * (H + GY) };
    });
    var width = 20 + row.length * (W + GX) - GX, height = 20 + Math.max.apply(null, row.concat([1])) * (H + GY) - GY;
    var svg = '<defs><marker id="arrow" viewBox="0 0 10 10" refX="9" refY="5" markerWidth="7" markerHeight="7" orient="auto"><path d="M0,0 L10,5 L0,10 z" fill="#94a3b8"/></marker></defs>';
    var edges = 0;
    steps.forEach(function (s) {
      s.after.forEach(function (a) {
        var from = at[a], to = at[s.name];
        if (!from) return;
        var x1 = from.x + W, y1 = from.y + H / 2, x2 = to.x, y2 = to.y + H / 2, mx = (x1 + x2) / 2;
        var critical = s.critical && steps.some(function (o) { return o.name === a && o.critical; });
        svg += '<path class="edge' + (critical ? " critical" : "") + '" d="M' + x1 + "," + y1 + " C" + mx + "," + y1 + " " + mx + "," + y2 + " " + x2 + "," + y2 + '"/>';
        edges++;
      });
    });
    steps.forEach(function (s) {
      var a = at[s.name], cls = "node " + s.state.replace(/ /g, "-") + (s.critical ? " critical" : "");
      svg += '<g class="' + cls + '" data-step="' + esc(s.name) + '"><title>' + esc(s.name + " (" + s.kind + "): " + s.state +
        (s.after.length ? "; reads from " + s.after.join(", ") : "")) + "</title>" +
        '<rect x="' + a.x + '" y="' + a.y + '" width="' + W + '" height="' + H + '"/>' +
        '<text class="name" x="' + (a.x + 10) + '" y="' + (a.y + 21) + '">' + (s.critical ? "★ " : "") + esc(s.name) + "</text>" +
        '<text class="sub" x="' + (a.x + 10) + '" y="' + (a.y + 40) + '">' + esc(s.kind + " · " + s.state + (s.total_ms ? " · " + dur(s.total_ms / 1000) : "")) + "</text></g>";
    });
    var g = $("pipeline-graph");
    g.setAttribute("width", width); g.setAttribute("height", height); g.setAttribute("viewBox", "0 0 " + width + " " + height);
    g.innerHTML = svg;
    body.dataset.pipelineSteps = steps.map(function (s) { return s.name + ":" + s.state; }).join(",");
    body.dataset.pipelineEdges = String(edges);
  }
  function pollPipelines() {
    return getJSON("api/pipelines").then(function (j) {
      if (j.pipelines.length) drawPipeline(j.pipelines[j.pipelines.length - 1]);
    }, function () {});
  }

  function poll() {
    if (!jobId) { schedule(); return; }
    getJSON("api/jobs/" + encodeURIComponent(jobId) + "/state").then(draw, function (e) {
      $("state").textContent = "cannot read the job: " + e.message; $("state").className = "badge bad";
    }).then(schedule);
  }
  function schedule() {
    var done = lastState && lastState.job.finished;
    setTimeout(pickJob, done ? 5 * POLL_MS : POLL_MS);
  }
  function pickJob() {
    pollPipelines().then(function () { return getJSON("api/jobs"); }).then(function (j) {
      var sel = $("jobs");
      sel.hidden = j.jobs.length < 2;
      if (!jobId || j.jobs.indexOf(jobId) < 0) jobId = j.jobs.length ? j.jobs[j.jobs.length - 1] : null;
      sel.innerHTML = j.jobs.map(function (id) { return "<option" + (id === jobId ? " selected" : "") + ">" + esc(id) + "</option>"; }).join("");
      if (!jobId) { $("state").textContent = "no job yet"; }
    }, function () {}).then(poll);
  }
  $("jobs").onchange = function () { jobId = this.value; lastState = null; history = []; profileLoadedAt = 0; };
  $("profile-reload").onclick = function () { if (lastState) drawProfile(lastState, true); };
  $("pipeline-reload").onclick = function () { pipelineLoadedAt = 0; pollPipelines(); };
  window.addEventListener("resize", function () { if (lastState) drawChart(lastState); });
  pickJob();
})();
