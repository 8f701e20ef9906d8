// A job's page: where it stands, as `sluice jobs explain` says it; its
// place in its tenant's line; what is known of its history; and a link to
// its task in asynq's own pages.
"use strict";

const jobID = decodeURIComponent(location.pathname.slice("/jobs/".length));
const jobQueue = new URLSearchParams(location.search).get("queue");
document.getElementById("job-id").textContent = jobID;
document.title = "sluice · job " + jobID;

// when prints a moment: the time of day today, the date and time otherwise.
function when(t) {
  const d = new Date(t);
  return d.toDateString() === new Date().toDateString() ? clock(t) : d.toLocaleString("en-GB", { hour12: false });
}

function showJob(doc) {
  const j = doc.job;
  document.getElementById("job-what").replaceChildren(
    "type ", el("code", {}, j.type),
    " · tenant ", j.tenant ? el("a", { href: tenantURL(j.tenant) }, j.tenant) : "-",
    j.key ? " · key " + j.key : "",
    " · queue ", el("code", {}, j.queue));
  const l = doc.line;
  document.getElementById("summary").replaceChildren(...[
    card("State", j.state, l ? `#${count(l.position)} in its tenant's line` : "", "state"),
    l ? card("Expected to start", j.held_by === "turn" ? "its turn" : j.held_by === "concurrency" ? "after " + count(j.running_first) + " end" : "in " + duration(j.expected_in_ms),
      j.held_by ? "held by " + j.held_by : "", "expected") : null,
    card("Retried", `${j.retried} of ${j.max_retry}`, "handler errors; throttling uses none", "retried"),
  ].filter(Boolean));
  document.getElementById("explain").textContent = doc.explain;

  document.getElementById("line-panel").hidden = !l;
  const rows = [];
  const add = (k, ...v) => rows.push(el("tr", {}, el("td", {}, k), el("td", {}, ...v)));
  if (l) {
    add("place", `#${count(l.position)}: ` + (l.ahead === 1 ? "1 job" : count(l.ahead) + " jobs") + ` ahead of it, of cost ${count(l.cost_ahead)} in all; its own cost ${count(l.cost)}`);
    add("priority", l.priority + (l.priority === "normal" ? "" : " (its place among its tenant's jobs)"));
    add("waiting since", when(l.since));
    if (l.waiting) add("the tenant's line", (l.waiting === 1 ? "1 job waits" : count(l.waiting) + " jobs wait") + " in all its lines");
  }
  document.querySelector("#line tbody").replaceChildren(...rows);

  document.querySelector("#history tbody").replaceChildren(...doc.history.map((e) =>
    el("tr", { class: e.next ? "next" : "" }, el("td", {}, when(e.at)), el("td", {}, e.what))));
  document.getElementById("asynq-link").setAttribute("href", doc.asynq_url);
}

poll("/api/jobs/" + encodeURIComponent(jobID) + (jobQueue ? "?queue=" + encodeURIComponent(jobQueue) : ""), showJob);
