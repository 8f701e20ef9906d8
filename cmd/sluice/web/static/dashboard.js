// Shared by the dashboard's pages: building elements, number formats, the
// header, the polling loop and the line charts (inline SVG). Data from the
// server is only ever set as text, never parsed as HTML.
"use strict";

const SVG = "http://www.w3.org/2000/svg";

// el builds an element: el("td", {class: "num"}, "12", child).
function el(tag, attrs, ...children) {
  const n = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs || {})) {
    if (v !== undefined && v !== null && v !== false) n.setAttribute(k, v);
  }
  for (const c of children) {
    if (c === null || c === undefined) continue;
    n.append(c instanceof Node ? c : String(c));
  }
  return n;
}

// card is one figure of a page's summary.
function card(label, value, sub, field) {
  return el("div", { class: "card", "data-card": field },
    el("div", { class: "label" }, label),
    el("div", { class: "value" }, value),
    sub ? el("div", { class: "sub" }, sub) : null);
}

function svg(tag, attrs) {
  const n = document.createElementNS(SVG, tag);
  for (const [k, v] of Object.entries(attrs || {})) n.setAttribute(k, v);
  return n;
}

// rate formats a per-second figure: 0, 0.4, 12.5, 340.
function rate(v) {
  if (!v) return "0";
  if (v >= 100) return Math.round(v).toString();
  return v.toFixed(1);
}

function count(v) {
  return (v || 0).toLocaleString("en-US");
}

// plural is a count with the noun that agrees with it: "1 job", "3 jobs".
function plural(n, one, many) {
  return n === 1 ? "1 " + one : count(n) + " " + many;
}

// duration formats milliseconds for people: 350ms, 1.2s, 4m10s.
function duration(ms) {
  if (ms <= 0) return "0s";
  if (ms < 1000) return Math.round(ms) + "ms";
  if (ms < 60000) return (ms / 1000).toFixed(1) + "s";
  const s = Math.round(ms / 1000);
  if (s < 3600) return Math.floor(s / 60) + "m" + (s % 60 ? (s % 60) + "s" : "");
  return Math.floor(s / 3600) + "h" + (Math.floor(s / 60) % 60 ? (Math.floor(s / 60) % 60) + "m" : "");
}

function clock(t) {
  return new Date(t).toLocaleTimeString("en-GB", { hour12: false });
}

function tenantURL(name) {
  return "/tenants/" + encodeURIComponent(name);
}

// Colours of the rules in charts and legends.
const RULE_COLOURS = ["#dc2626", "#d97706", "#7c3aed", "#db2777", "#0891b2", "#65a30d", "#9a3412", "#475569"];
const ALLOWED_COLOUR = "#16a34a";
const FAIL_OPEN_COLOUR = "#64748b";

function ruleColour(rules, rule) {
  const i = rules.indexOf(rule);
  return RULE_COLOURS[(i < 0 ? 0 : i) % RULE_COLOURS.length];
}

// showHeader fills the header's Redis, prefix, mode and status from a
// document of the API, and the error banner.
function showHeader(doc, fetchError) {
  if (doc) {
    document.getElementById("where").replaceChildren(
      "Redis ", el("b", {}, doc.redis), " · prefix ", el("b", {}, doc.prefix),
      doc.read_only ? el("span", { class: "badge" }, "read-only") : el("span", { class: "badge write" }, "writes allowed"));
  }
  const status = document.getElementById("status");
  const updated = document.getElementById("updated");
  const banner = document.getElementById("banner");
  let problem = fetchError || (doc && doc.error ? "Redis: " + doc.error + " (since " + clock(doc.error_since) + "; the figures are from the last good sample)" : "");
  status.className = "status " + (problem ? "bad" : "ok");
  updated.textContent = doc && doc.now ? "updated " + clock(doc.now) : "waiting for the first sample";
  banner.hidden = !problem;
  banner.textContent = problem;
}

// poll fetches url now and then every interval the server samples at, and
// hands each document to show. A failed fetch shows in the banner.
function poll(url, show) {
  let interval = 1000;
  let last = null;
  async function once() {
    let resp;
    try {
      resp = await fetch(url, { cache: "no-store" });
    } catch (e) {
      showHeader(last, "The dashboard does not answer (" + e.message + "); is sluice dashboard still running?");
      setTimeout(once, Math.max(interval, 250));
      return;
    }
    try {
      const doc = await resp.json();
      if (!resp.ok) throw new Error(doc.error || resp.statusText);
      last = doc;
      interval = doc.interval_ms || interval;
      showHeader(doc, "");
      show(doc);
    } catch (e) {
      showHeader(last, e.message);
    }
    setTimeout(once, Math.max(interval, 250));
  }
  once();
}

// ticks returns the axis's top and step: 3 to 5 steps of 1, 2 or 5 times a
// power of ten (whole numbers only when integer) that reach v.
function ticks(v, integer) {
  if (!(v > 0)) v = integer ? 4 : 1;
  let raw = v / 4;
  const p = Math.pow(10, Math.floor(Math.log10(raw)));
  let step = [1, 2, 5, 10].map((m) => m * p).find((s) => s >= raw);
  if (integer) step = Math.max(1, Math.round(step));
  return { top: Math.ceil(v / step) * step, step };
}

// lineChart draws series [{name, colour, values: [[t, v], ...], dashed,
// step}] into the element box, over the last span ms up to now. Points
// further apart than gap ms are not joined.
function lineChart(box, series, { now, span, gap, integer }) {
  const width = box.clientWidth || 500;
  const height = box.clientHeight || 190;
  const m = { l: 46, r: 12, t: 8, b: 40 };
  const w = width - m.l - m.r;
  const h = height - m.t - m.b;
  const t0 = now - span;
  let top = 0;
  for (const s of series) for (const [t, v] of s.values) if (t >= t0 && v > top) top = v;
  const axis = ticks(top * 1.05, integer);
  top = axis.top;
  const x = (t) => m.l + ((t - t0) / span) * w;
  const y = (v) => m.t + h - (v / top) * h;

  const root = svg("svg", { width, height, viewBox: `0 0 ${width} ${height}` });
  for (let v = 0; v <= top + axis.step / 2; v += axis.step) {
    root.append(svg("line", { class: "axis", x1: m.l, x2: m.l + w, y1: y(v), y2: y(v) }));
    const label = svg("text", { x: m.l - 6, y: y(v) + 4, "text-anchor": "end" });
    label.textContent = Number.isInteger(v) ? v.toString() : parseFloat(v.toFixed(2)).toString();
    root.append(label);
  }
  const step = span <= 120000 ? 15000 : span <= 600000 ? 60000 : 300000;
  for (let t = Math.ceil(t0 / step) * step; t <= now; t += step) {
    const label = svg("text", { x: x(t), y: m.t + h + 16, "text-anchor": "middle" });
    label.textContent = clock(t).slice(0, step < 60000 ? 8 : 5);
    root.append(label);
  }
  let drawn = false;
  for (const s of series) {
    let d = "";
    let prev = null;
    for (const [t, v] of s.values) {
      if (t < t0) continue;
      const px = x(t).toFixed(1);
      const py = y(v).toFixed(1);
      if (prev === null || t - prev[0] > gap) d += `M${px},${py}`;
      else if (s.step) d += `H${px}V${py}`;
      else d += `L${px},${py}`;
      prev = [t, v];
    }
    if (!d) continue;
    drawn = true;
    root.append(svg("path", {
      class: "series", "data-series": s.name, d, fill: "none", stroke: s.colour,
      "stroke-width": s.dashed ? 1.5 : 2, "stroke-dasharray": s.dashed ? "5 4" : "none",
      "stroke-linejoin": "round",
    }));
  }
  if (!drawn) {
    const t = svg("text", { class: "nodata", x: m.l + w / 2, y: m.t + h / 2, "text-anchor": "middle" });
    t.textContent = "no data yet";
    root.append(t);
  }
  // The legend sits under the axis.
  let lx = m.l;
  for (const s of series) {
    if (s.legend === false) continue;
    root.append(svg("line", { x1: lx, x2: lx + 14, y1: height - 7, y2: height - 7, stroke: s.colour, "stroke-width": 2, "stroke-dasharray": s.dashed ? "4 3" : "none" }));
    const label = svg("text", { x: lx + 19, y: height - 3 });
    label.textContent = s.name;
    root.append(label);
    lx += 30 + s.name.length * 6.3;
  }
  box.replaceChildren(root);
}
