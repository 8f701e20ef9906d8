// The tenants page: summary cards, the fleet's decisions by rule, one row
// per tenant and one per shared pool, refreshed at every sample.
"use strict";

let sortKey = "tenant";
let sortDesc = false;
let lastDoc = null;

// isPool tells a shared pool's line ("@openai") from a tenant's and
// @global's.
function isPool(t) {
  return t.kind === "pool";
}

function showSummary(doc) {
  let starts = 0, inFlight = 0, waiting = 0, reserved = 0, paused = 0;
  const tenants = doc.tenants.filter((t) => !isPool(t) && t.kind !== "key");
  // @global's, a pool's and a key's starts and jobs in flight are their
  // tenants' too: not counted twice
  for (const t of tenants.filter((t) => t.kind !== "global")) {
    starts += t.starts_per_s;
    inFlight += t.in_flight;
    waiting += t.waiting;
    reserved += t.reserved;
    if (t.paused) paused++;
  }
  const shown = tenants.length;
  const total = doc.tenants_total - (doc.pools_total || 0) - (doc.keys_total || 0);
  document.getElementById("summary").replaceChildren(
    card("Tenants", count(shown), shown < total ? `followed, of ${count(total)}` : "with a policy or state", "tenants"),
    card("Starts / s", rate(starts), "all tenants", "starts"),
    card("In flight", count(inFlight), "running now", "in_flight"),
    card("Waiting", count(waiting), "in the tenants' lines", "waiting"),
    card("Reserved", count(reserved), "jobs holding a future slot", "reserved"),
    pausedCard(doc, paused));
}

// pausedCard counts the tenants paused by a 429/503 since the sample
// before, as the decisions by rule are counted over it. A cooldown that
// begins and ends between two samples is seen only in the workers'
// decisions: without tenant labels the card says so rather than 0.
function pausedCard(doc, paused) {
  const span = "in the last " + duration(doc.interval_ms);
  const denied = doc.decisions && doc.decisions.denied_per_s.cooldown > 0 ? doc.decisions.denied_per_s.cooldown : 0;
  if (paused === 0 && denied > 0) {
    return card("In cooldown", "some", `paused between samples: ${rate(denied)}/s denied by cooldown ${span}`, "cooldown");
  }
  return card("In cooldown", count(paused), (paused === 1 ? "tenant" : "tenants") + " paused by a 429/503 " + span, "cooldown");
}

function showDecisions(doc) {
  const box = document.getElementById("decisions");
  const d = doc.decisions;
  if (!d) {
    box.replaceChildren(el("p", { class: "hint" },
      "The gate's decisions are counted by each worker, not in Redis: they show here once the workers' metrics are read ",
      "(found in the fleet's registry, or given with ", el("code", {}, "--metrics http://WORKER:9464/metrics"),
      "); add ", el("code", {}, "--tenant-labels"), " to the workers to see them per tenant."));
    return;
  }
  const rules = Object.keys(d.denied_per_s).sort();
  const parts = [{ name: "allowed", v: d.allowed_per_s, colour: ALLOWED_COLOUR }];
  // A rule that denied nothing in the last interval is left out.
  for (const r of rules) if (d.denied_per_s[r] > 0) parts.push({ name: "denied by " + r, v: d.denied_per_s[r], colour: ruleColour(rules, r) });
  if (d.fail_open_per_s > 0) parts.push({ name: "fail open", v: d.fail_open_per_s, colour: FAIL_OPEN_COLOUR });
  const total = parts.reduce((a, p) => a + p.v, 0);
  const stack = el("div", { class: "stack" });
  for (const p of parts) if (p.v > 0) stack.append(el("div", { style: `width:${(100 * p.v) / total}%;background:${p.colour}`, title: p.name }));
  const legend = el("div", { class: "legend" });
  for (const p of parts) {
    legend.append(el("span", { "data-decision": p.name }, el("i", { class: "swatch", style: `background:${p.colour}` }), p.name + " ", el("b", {}, rate(p.v) + "/s")));
  }
  const sources = el("div", { class: "sources" });
  if (doc.workers) {
    const up = doc.workers.filter((w) => w.up).length;
    sources.append(el("span", { id: "workers-up" }, `${up} of ${doc.workers.length} worker${doc.workers.length === 1 ? "" : "s"} up`),
      " (the fleet's registry)" + (doc.metrics_sources.length ? ": " : ""));
  } else {
    sources.append(`from ${doc.metrics_sources.length} worker${doc.metrics_sources.length === 1 ? "" : "s"}: `);
  }
  doc.metrics_sources.forEach((s, i) => {
    if (i) sources.append(", ");
    const name = s.worker ? s.worker + (s.url ? " " + s.url : "") : s.url;
    sources.append(s.ok ? el("span", {}, name) : el("span", { class: "err", title: s.error }, name + " (" + s.error + ")"));
  });
  if (!doc.tenant_labels) sources.append(" · per tenant when the workers run with --tenant-labels");
  const failing = [];
  for (const [kind, v] of Object.entries(d.room_errors_per_s || {})) {
    if (v > 0) failing.push(kind + " " + rate(v) + "/s");
  }
  const banner = failing.length
    ? el("p", { class: "err", id: "room-failing" }, "The waiting room is failing: errors " + failing.join(", ") +
        " (the workers' logs say why; sluice_worker_errors_total counts them)")
    : "";
  box.replaceChildren(el("div", { class: "decisions" }, banner, total > 0 ? stack : el("div", { class: "stack" }), legend, sources));
}

function sparkline(values, limit) {
  const w = 120, h = 26;
  const s = svg("svg", { class: "spark", width: w, height: h, viewBox: `0 0 ${w} ${h}` });
  const top = Math.max(limit || 0, ...values, 1) * 1.05;
  if (limit) {
    const y = (h - 2 - (limit / top) * (h - 4)).toFixed(1);
    s.append(svg("line", { x1: 0, x2: w, y1: y, y2: y, stroke: "#cbd5e1", "stroke-dasharray": "3 3" }));
  }
  if (values.length > 1) {
    const n = 60;
    const off = n - values.length;
    const pts = values.map((v, i) => `${(((off + i) / (n - 1)) * w).toFixed(1)},${(h - 2 - (v / top) * (h - 4)).toFixed(1)}`);
    s.append(svg("polyline", { points: pts.join(" "), fill: "none", stroke: "#2563eb", "stroke-width": 1.5, "stroke-linejoin": "round" }));
  }
  return s;
}

function meter(v, of) {
  if (!(of > 0)) return null;
  const f = v / of;
  const cls = f >= 0.999 ? "full" : f >= 0.8 ? "high" : "";
  return el("span", { class: "meter" }, el("i", { class: cls, style: `width:${Math.min(100, f * 100).toFixed(0)}%` }));
}

// The cells a tenant's row and a pool's share.
function nameCell(t) {
  return el("td", {},
    el("a", { class: "tenant-name", href: tenantURL(t.tenant) }, t.tenant),
    el("span", { class: "rules" }, t.policy ? (t.policy === t.tenant ? "" : t.policy + ": ") + (t.rules || "no limits") : "no policy: not limited"));
}

function startsCell(t) {
  return el("td", { class: "num", "data-field": "starts" },
    el("span", { "data-value": t.starts_per_s }, rate(t.starts_per_s)),
    t.limit ? el("span", { class: "of", title: t.learned || t.adaptive || "" }, " / " + t.limit + (t.limit_learned ? " learned" : t.limit_adaptive ? " adaptive" : "")) : null, meter(t.starts_per_s, t.limit_per_s));
}

function inFlightCell(t) {
  return el("td", { class: "num", "data-field": "in_flight" },
    el("span", { "data-value": t.in_flight }, count(t.in_flight)),
    t.cap >= 0 ? el("span", { class: "of" }, " / " + t.cap) : null, meter(t.in_flight, t.cap));
}

// settledCell is the cost settled after the jobs ran: refunded, charged
// extra.
function settledCell(t) {
  const td = el("td", { class: "num", "data-field": "settled" });
  if (!t.settled_refunded && !t.settled_extra) td.append(el("span", { class: "none" }, "–"));
  else td.append(`-${count(t.settled_refunded)} / +${count(t.settled_extra)}`);
  return td;
}

function row(t) {
  const name = nameCell(t);
  const starts = startsCell(t);
  const inFlight = inFlightCell(t);
  const waiting = el("td", { class: "num", "data-field": "waiting" },
    el("span", { "data-value": t.waiting, title: t.oldest_wait_ms > 0 ? "the oldest waits for " + duration(t.oldest_wait_ms) : "" }, count(t.waiting)),
    t.backlog_cap > 0 ? el("span", { class: "of" }, " / " + count(t.backlog_cap)) : null);
  const cooldown = el("td", { class: "num", "data-field": "cooldown" },
    t.cooldown_ms > 0 ? el("span", { class: "cool" }, duration(t.cooldown_ms)) : el("span", { class: "none" }, "–"));
  const denied = el("td", { "data-field": "denied" });
  if (!t.decisions) {
    denied.append(el("span", { class: "none", title: "the workers do not label their metrics by tenant" }, "–"));
  } else {
    const rules = Object.keys(t.decisions.denied_per_s).filter((r) => t.decisions.denied_per_s[r] > 0).sort();
    if (!rules.length) denied.append(el("span", { class: "none" }, "none"));
    for (const r of rules) denied.append(el("span", { class: "chip" }, `${r} ${rate(t.decisions.denied_per_s[r])}`));
  }
  return el("tr", { "data-tenant": t.tenant },
    name, starts, el("td", {}, sparkline(t.spark || [], t.limit_per_s)), inFlight, waiting,
    el("td", { class: "num", "data-field": "reserved" }, count(t.reserved)), cooldown, denied);
}

function showTenants(doc) {
  const filter = document.getElementById("filter").value.trim().toLowerCase();
  const tenants = doc.tenants.filter((t) => !isPool(t));
  const total = doc.tenants_total - (doc.pools_total || 0) - (doc.keys_total || 0);
  let list = tenants.filter((t) => !filter || t.tenant.toLowerCase().includes(filter));
  list.sort((a, b) => {
    const va = a[sortKey], vb = b[sortKey];
    const c = typeof va === "string" ? va.localeCompare(vb) : va - vb;
    return (sortDesc ? -c : c) || a.tenant.localeCompare(b.tenant);
  });
  document.querySelector("#tenants tbody").replaceChildren(...list.map(row));
  document.getElementById("tenant-count").textContent =
    `${tenants.length} followed` + (total > tenants.length ? ` of ${total}` : "") + ` · history of ${duration(doc.history_ms)}`;
  document.getElementById("empty").hidden = tenants.length > 0;
  for (const th of document.querySelectorAll("th[data-sort]")) {
    th.classList.toggle("sorted", th.dataset.sort === sortKey);
    th.classList.toggle("asc", !sortDesc);
  }
}

// showShadows lists the tenants with a shadow policy: what it would have
// denied since it was set, and in the last interval.
function showShadows(doc) {
  const list = doc.tenants.filter((t) => t.shadow).sort((a, b) => a.tenant.localeCompare(b.tenant));
  document.getElementById("shadows-panel").hidden = list.length === 0;
  document.querySelector("#shadows tbody").replaceChildren(...list.map((t) => {
    const s = t.shadow;
    const by = el("td", {});
    const rules = Object.keys(s.denied_by || {}).sort();
    if (!rules.length) by.append(el("span", { class: "none" }, "none"));
    for (const r of rules) by.append(el("span", { class: "chip" }, `${r} ${count(s.denied_by[r])}`));
    return el("tr", { "data-tenant": t.tenant },
      el("td", {}, el("a", { class: "tenant-name", href: tenantURL(t.tenant) }, t.tenant)),
      el("td", {}, el("code", {}, s.rules), s.name === "@shadow:*" ? el("span", { class: "rules" }, "the default's shadow") : null),
      el("td", { class: "num", "data-field": "shadow-denied", title: s.text }, s.decisions ? `${count(s.denied)} of ${count(s.decisions)} (${share(s.denied_share)})` : "no starts yet",
        el("span", { class: "of", "data-field": "shadow-since" }, s.since ? " since " + clock(s.since) : "")),
      el("td", { class: "num", "data-field": "shadow-now" }, `${rate(s.denied_per_s)} of ${rate(s.decisions_per_s)}`),
      by);
  }));
}

// showPools lists the shared pools: what the jobs drawing from each do
// against its rules, and the cost settled after they ran.
function showPools(doc) {
  const list = doc.tenants.filter(isPool).sort((a, b) => a.tenant.localeCompare(b.tenant));
  document.getElementById("pools-panel").hidden = list.length === 0;
  document.getElementById("pool-count").textContent = list.length < (doc.pools_total || 0) ? `${list.length} followed of ${doc.pools_total}` : "";
  document.querySelector("#pools tbody").replaceChildren(...list.map((t) =>
    el("tr", { "data-pool": t.tenant },
      nameCell(t), startsCell(t), el("td", {}, sparkline(t.spark || [], t.limit_per_s)), inFlightCell(t),
      el("td", { class: "num", "data-field": "reserved" }, count(t.reserved)), settledCell(t))));
}

function share(f) {
  return f === 0 || f >= 0.1 ? (100 * f).toFixed(0) + "%" : (100 * f).toFixed(1) + "%";
}

function show(doc) {
  lastDoc = doc;
  showSummary(doc);
  showDecisions(doc);
  showShadows(doc);
  showPools(doc);
  showTenants(doc);
}

for (const th of document.querySelectorAll("th[data-sort]")) {
  th.addEventListener("click", () => {
    if (sortKey === th.dataset.sort) sortDesc = !sortDesc;
    else { sortKey = th.dataset.sort; sortDesc = sortKey !== "tenant"; }
    if (lastDoc) showTenants(lastDoc);
  });
}
document.getElementById("filter").addEventListener("input", () => { if (lastDoc) showTenants(lastDoc); });
poll("/api/tenants", show);
