// batchfleet profile pages: the helpers both pages' scripts use (profile.js, pipeline.js),
// inlined before them by producer/src/report/page.rs. No network.
const BF = (function () {
  "use strict";
  // An element with attributes (`text`, `class`, `on<event>` handlers, any other attribute)
  // and children (nodes or strings).
  function el(tag, attrs, children) {
    const node = document.createElement(tag);
    if (attrs) for (const k in attrs) {
      if (k === "text") node.textContent = attrs[k];
      else if (k === "class") node.className = attrs[k];
      else if (k.startsWith("on")) node.addEventListener(k.slice(2), attrs[k]);
      else node.setAttribute(k, attrs[k]);
    }
    (children || []).forEach((c) => node.appendChild(typeof c === "string" ?
      document.createTextNode(c) : c));
    return node;
  }
  // A duration for people: "850 ms", "4.25 s", "3 min 20 s".
  function dur(ms) {
    if (ms == null || ms < 0) return "";
    if (ms < 1000) return Math.round(ms) + " ms";
    if (ms < 60000) return (ms / 1000).toFixed(ms < 10000 ? 2 : 1) + " s";
    if (ms < 3600000) return Math.floor(ms / 60000) + " min " + Math.floor(ms % 60000 / 1000) + " s";
    return Math.floor(ms / 3600000) + " h " + Math.floor(ms % 3600000 / 60000) + " min";
  }
  // An axis label: as short as the tick step allows.
  function tick(ms, step) {
    if (ms === 0) return "0";
    if (step >= 60000 && ms >= 60000) return Math.floor(ms / 60000) + " min" + (ms % 60000 ? " " + Math.round(ms % 60000 / 1000) + " s" : "");
    if (step >= 1000) return (ms / 1000) + " s";
    if (step >= 100 && ms >= 1000) return (ms / 1000).toFixed(1) + " s";
    return Math.round(ms) + " ms";
  }
  // A round tick step (1, 2, 5 × 10^n ms) for `span` ms over `ticks` ticks.
  function tickStep(span, ticks) {
    const raw = span / Math.max(1, ticks);
    const pow = Math.pow(10, Math.floor(Math.log10(Math.max(raw, 1))));
    for (const m of [1, 2, 5, 10]) if (m * pow >= raw) return m * pow;
    return 10 * pow;
  }
  function section(id, title, children) {
    return el("section", { id: id }, [el("h2", { text: title })].concat(children));
  }
  // A CSV cell, quoted when it must be.
  function csvCell(v) {
    const s = v == null ? "" : String(v);
    return /[",\n]/.test(s) ? '"' + s.replace(/"/g, '""') + '"' : s;
  }
  return { el: el, dur: dur, tick: tick, tickStep: tickStep, section: section, csvCell: csvCell };
})();
