// A tenant's page: its figures now, its history plotted, and its state in
// detail (as `sluice stats TENANT` shows it).
"use strict";

const tenant = decodeURIComponent(location.pathname.slice("/tenants/".length));
document.getElementById("tenant-name").textContent = tenant;
document.title = "sluice · " + tenant;

function showPolicy(t) {
  const p = document.getElementById("policy");
  if (!t.policy) {
    p.replaceChildren("No policy applies (no policy of its own and no default *): not limited.");
  } else {
    p.replaceChildren(t.policy === t.tenant ? "Policy " : t.policy === "*" ? "Follows the default policy * " : "Policy " + t.policy + " ",
      el("code", {}, t.rules || "(no rules)"));
  }
}

function showSummary(doc) {
  const t = doc.tenant;
  const s = doc.stats;
  document.getElementById("summary").replaceChildren(...[
    card("Starts / s", rate(t.starts_per_s), t.limit ? "limit " + t.limit : "no rate rule", "starts"),
    card("In flight", count(t.in_flight), t.cap >= 0 ? "cap " + t.cap : "no concurrency rule", "in_flight"),
    card("Waiting", count(t.waiting), t.waiting > 0 ? "the oldest for " + duration(t.oldest_wait_ms) : "in its line", "waiting"),
    card("Reserved", count(t.reserved), "jobs holding a future slot", "reserved"),
    card("Cooldown", t.cooldown_ms > 0 ? duration(t.cooldown_ms) : "none", t.cooldown_ms > 0 ? "left" : "", "cooldown"),
    card("Started", count(s.started), "while its state is alive", "started"),
    t.learned ? card("Learned limit", t.limit_learned ? t.limit : "not applied", t.learned, "learned") : null,
    t.shadow ? card("Shadow would deny", t.shadow.decisions ? (100 * t.shadow.denied_share).toFixed(t.shadow.denied_share > 0 && t.shadow.denied_share < 0.1 ? 1 : 0) + "%" : "–",
      t.shadow.rules + ", not enforced" + (t.shadow.since ? ", since " + clock(t.shadow.since) : ""), "shadow") : null,
    s.adaptive ? card("Adaptive limit", s.adaptive.rate, `${s.adaptive.floor}..${s.adaptive.ceiling}: ${s.adaptive.increases} up, ${s.adaptive.decreases} down`, "adaptive") : null,
    t.settled_refunded || t.settled_extra ? card("Settled", `-${count(t.settled_refunded)} / +${count(t.settled_extra)}`, "refunded / charged extra after jobs ran", "settled") : null,
  ].filter(Boolean));
}

function showCharts(doc) {
  const pts = doc.points;
  const now = pts.length ? pts[pts.length - 1].t : Date.parse(doc.now || new Date());
  const first = pts.length ? pts[0].t : now;
  const span = Math.min(Math.max(now - first, 60000), doc.history_ms);
  const spacing = pts.length > 1 ? pts[1].t - pts[0].t : 0;
  const opts = { now, span, gap: 2.5 * Math.max(doc.interval_ms, spacing) };
  document.getElementById("history-from").textContent = doc.history_from === "prometheus"
    ? "History from Prometheus, then the dashboard's own samples."
    : "History: the dashboard's own samples since it started" + (doc.history_error ? ` (Prometheus: ${doc.history_error})` : "") + ".";
  const series = (name, colour, f, extra) => Object.assign({ name, colour, values: pts.map((p) => [p.t, f(p)]) }, extra || {});

  const starts = [series("starts/s", "#2563eb", (p) => p.starts_per_s)];
  if (pts.some((p) => p.limit_per_s > 0)) starts.push(series("limit", "#94a3b8", (p) => p.limit_per_s, { dashed: true, step: true }));
  lineChart(document.getElementById("chart-starts"), starts, opts);

  // jobs in flight are counted against a concurrency rule only: a tenant
  // that has had none in its history gets no chart
  const capped = doc.tenant.cap >= 0 || pts.some((p) => p.cap >= 0);
  document.getElementById("chart-inflight").closest(".chart-panel").hidden = !capped;
  if (capped) {
    const inflight = [series("in flight", "#0891b2", (p) => p.in_flight, { step: true })];
    inflight.push(series("cap", "#94a3b8", (p) => Math.max(p.cap, 0), { dashed: true, step: true }));
    lineChart(document.getElementById("chart-inflight"), inflight, { ...opts, integer: true });
  }

  const waiting = [series("reserved", "#d97706", (p) => p.reserved, { step: true })];
  waiting.push(series("waiting", "#7c3aed", (p) => p.waiting, { step: true }));
  lineChart(document.getElementById("chart-waiting"), waiting, { ...opts, integer: true });

  const box = document.getElementById("chart-decisions");
  if (!pts.some((p) => p.decisions)) {
    box.replaceChildren(el("p", { class: "hint" },
      "The workers count the gate's decisions in their metrics. Start the dashboard with ",
      el("code", {}, "--metrics http://WORKER:9464/metrics"), " for each worker, and the workers with ",
      el("code", {}, "--tenant-labels"), ", to plot this tenant's decisions by rule."));
    return;
  }
  const rules = [...new Set(pts.flatMap((p) => (p.decisions ? Object.keys(p.decisions.denied_per_s) : [])))].sort();
  const dec = [series("allowed", ALLOWED_COLOUR, (p) => (p.decisions ? p.decisions.allowed_per_s : 0))];
  for (const r of rules) dec.push(series("denied by " + r, ruleColour(rules, r), (p) => (p.decisions ? p.decisions.denied_per_s[r] || 0 : 0)));
  lineChart(box, dec, opts);
}

function showDetail(doc) {
  const s = doc.stats;
  const rows = [];
  const add = (k, ...v) => rows.push(el("tr", {}, el("td", {}, k), el("td", {}, ...v)));
  for (const r of s.rates) {
    add(r.rule, el("code", {}, r.rate), ` — ${r.available} of ${r.burst} back-to-back starts free` +
      (r.ahead_ms > 0 ? `; reservations run ${duration(r.ahead_ms)} ahead` : ""));
  }
  if (s.window) add("window", el("code", {}, s.window.window), ` — ${s.window.started} started and ${s.window.planned} planned in the last ${duration(s.window.period_ms)}`);
  if (s.quota) add("quota", el("code", {}, s.quota.quota), ` — ${count(s.quota.used)} used, ${count(s.quota.remaining)} left until ${new Date(s.quota.window_end).toLocaleString("en-GB")}`);
  if (s.concurrency) {
    add("concurrency", `${s.concurrency.in_flight} of ${s.concurrency.limit} running`);
    const shown = 5;
    for (const h of s.concurrency.holders.slice(0, shown)) add("", el("code", {}, h.id), ` lease ends ${clock(h.lease_end)}`);
    if (s.concurrency.holders.length > shown) add("", `and ${s.concurrency.holders.length - shown} more`);
  }
  add("reserved", s.reservations ? `${plural(s.reservations, "job holds", "jobs hold")} future slots, the last at ${clock(s.last_slot)}` : "0");
  add("cooldown", s.cooldown_until ? "until " + clock(s.cooldown_until) : "none");
  add("waiting", count(s.waiting) + (s.backlog_cap ? " of " + count(s.backlog_cap) : "") + (s.waiting === 1 ? " job" : " jobs") + " in its line" + (s.waiting_since ? ", the oldest since " + clock(s.waiting_since) : ""));
  if (s.settled_refunded || s.settled_extra) {
    add("settled", `${count(s.settled_refunded)} refunded, ${count(s.settled_extra)} charged extra (jobs' actual costs against their estimates)`);
  }
  for (const n of doc.next || []) {
    const when = n.held_by === "turn" ? "its turn" : n.held_by === "concurrency" ? `after ${n.running_first} end (concurrency)` : `in ${duration(n.expected_in_ms)} (${n.held_by})`;
    // a job of high or low priority is tagged; normal shows nothing
    const tag = n.priority && n.priority !== "normal"
      ? el("span", { class: "badge prio " + n.priority, "data-priority": n.priority, title: n.priority + " priority in the tenant's line" }, n.priority)
      : null;
    add(n.ahead === 0 ? "next out" : "", el("a", { href: "/jobs/" + encodeURIComponent(n.id) + "?queue=" + encodeURIComponent(n.queue) }, el("code", {}, n.id)), tag, ` ${n.queue}: ${when}`);
  }
  if (s.shadow) {
    const sh = s.shadow;
    const by = Object.keys(sh.denied_by || {}).sort().map((r) => `${r} ${count(sh.denied_by[r])}`).join(", ");
    add("shadow", el("code", {}, sh.rules), ` (${sh.name}, not enforced) — ` + (sh.decisions
      ? `would have denied ${count(sh.denied)} of ${plural(sh.decisions, "start", "starts")} since ${clock(sh.since)}` + (by ? `; by ${by}` : "")
      : "no job has started since it was set"));
  }
  if (s.adaptive) {
    const a = s.adaptive;
    add("adaptive", el("code", {}, a.rate), ` now, between ${a.floor} and ${a.ceiling} per ${duration(a.period_ms)}: +${a.step} every ${duration(a.every_ms)} while answers are good, ×0.75 on 429/503` +
      (a.until ? `; lapses at ${clock(a.until)} without reports` : "; not begun: the policy's rate"));
    const why = { start: "began at the policy's rate", policy: "the policy changed", increase: "answers were good", throttled: "the downstream answered 429/503", latency: "answers were slow" };
    const shown = 10;
    for (const c of a.history.slice(-shown).reverse()) add("", `${clock(c.at)}: ${c.from} → ${c.to}, ${why[c.reason] || c.reason}`);
    if (a.history.length > shown) add("", `and ${plural(a.history.length - shown, "earlier change", "earlier changes")}`);
  }
  if (s.learned) add("learned", el("code", {}, s.learned.rate), ` from ${s.learned.source || "the downstream"} until ${clock(s.learned.until)}` + (s.learned.rule ? `, applied as ${s.learned.rule}` : `, not applied: ${s.learned.note}`));
  document.querySelector("#detail tbody").replaceChildren(...rows);
}

poll("/api/tenants/" + encodeURIComponent(tenant), (doc) => {
  showPolicy(doc.tenant);
  showSummary(doc);
  showCharts(doc);
  showDetail(doc);
});
