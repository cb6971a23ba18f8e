// HCS console: draws /api/overview as it arrives on /api/events (Server-Sent
// Events), the plots from /api/history and the queue from /api/queue.
// Read-only; text from the bus is only ever set as textContent, never parsed
// as HTML.
"use strict";
(() => {
  const API = "../api/";
  const HISTORY_EVERY_MS = 5000;
  const QUEUE_EVERY_MS = 3000;
  const PALETTE = ["#5b8def", "#e8833a", "#2e9e5b", "#b65fc7", "#d64545", "#2bb0b8", "#8a6d3b", "#6b7280"];
  const HEALTH_COLORS = { healthy: "#2e9e5b", degraded: "#d99a1e", failed: "#d64545", stale: "#8a8f98" };
  let selected = null;
  let lastOverview = null;

  const $ = (id) => document.getElementById(id);

  // Opened as /console/?token=…: the server has set its cookie; keep the
  // token out of the address bar and the history.
  if (new URLSearchParams(location.search).has("token")) {
    history.replaceState(null, "", location.pathname);
  }

  function el(tag, props, ...children) {
    const node = document.createElement(tag);
    for (const [key, value] of Object.entries(props || {})) {
      if (value === undefined || value === null) continue;
      if (key === "text") node.textContent = value;
      else if (key === "className") node.className = value;
      else if (key === "onclick") node.addEventListener("click", value);
      else node.setAttribute(key, value);
    }
    for (const child of children) if (child) node.append(child);
    return node;
  }

  // One format per figure, as `hcs top` and its screen write them: ACU and GiB
  // whole, thousands separated; percentages and readings to one decimal.
  const WHOLE = new Intl.NumberFormat("en-US", { maximumFractionDigits: 0 });
  const ONE_DECIMAL = new Intl.NumberFormat("en-US", { maximumFractionDigits: 1 });
  const gib = (mib) => WHOLE.format(mib / 1024);
  const acu = (x) => WHOLE.format(Number(x));
  const num = (x) => ONE_DECIMAL.format(Number(x));
  const pct = (part, whole) => (whole > 0 ? (100 * part) / whole : 0);
  const clock = (s) => new Date(s * 1000).toLocaleTimeString();

  function bar(part, whole, label) {
    const width = Math.min(100, pct(part, whole)).toFixed(1) + "%";
    const fill = el("span");
    fill.style.width = width;
    return el("div", { className: "bar", title: label }, fill, el("em", { text: label }));
  }

  function fill(tbody, rows, empty) {
    tbody.replaceChildren(...(rows.length ? rows : [el("tr", {}, el("td", { text: empty, colspan: "20", className: "muted" }))]));
  }

  function card(title, big, sub, key) {
    return el("div", { className: "card", "data-total": key },
      el("div", { className: "sub", text: title }), el("div", { className: "big", text: big }), el("div", { className: "sub", text: sub }));
  }

  function renderTotals(t, ov) {
    $("totals").replaceChildren(
      card("nodes", WHOLE.format(t.nodes), `${ov.nodes_total} in the view`, "nodes"),
      card("devices", t.health.text, `${t.healthy} healthy · ${t.degraded} degraded · ${t.failed} failed · ${t.stale} stale`, "devices"),
      card("VRAM free (GiB)", gib(t.vram_free_mib), `${gib(t.vram_reserved_mib)} reserved · ${gib(t.vram_out_mib)} out of ${gib(t.vram_total_mib)}`, "vram"),
      card("ACU reserved", acu(t.acu_reserved), `of ${acu(t.acu_total)} ACU · ${acu(t.acu_out)} out`, "acu"),
    );
  }

  function renderClasses(classes) {
    const rows = classes.map((c) => el("tr", { "data-class": c.class },
      el("td", { text: c.class }),
      el("td", { className: "num", text: c.devices }),
      el("td", { className: "num", text: c.healthy }),
      el("td", { className: "num", text: c.degraded }),
      el("td", { className: "num", text: c.failed }),
      el("td", { className: "num", text: c.stale }),
      el("td", {}, bar(c.vram_reserved_mib, c.vram_total_mib, `${gib(c.vram_reserved_mib)} / ${gib(c.vram_total_mib)} GiB`)),
      el("td", { className: "num", text: `${gib(c.vram_free_mib)} GiB` }),
      el("td", {}, bar(c.acu_reserved, c.acu_total, `${acu(c.acu_reserved)} / ${acu(c.acu_total)}`)),
      el("td", { className: "num", text: `${num(c.utilisation_pct)} %` }),
      el("td", { className: "muted", text: c.profile ? `${num(c.profile.tflops_fp16)} TFLOPS fp16 · ${acu(c.profile.acu)} ACU · ${c.profile.interconnect}` : "unknown model" }),
    ));
    fill($("classes").tBodies[0], rows, "no devices reported yet");
  }

  function deviceCell(node, cell) {
    const owners = cell.owners.join(", ");
    const title = `${node}/${cell.index}: ${cell.health}` + (owners ? ` · ${owners} (${cell.reserved_pct}% VRAM)` : " · idle");
    return el("span", { className: "cell", title, "data-device": `${node}/${cell.index}`, "data-health": cell.health, "data-busy": owners ? "true" : "false" });
  }

  function renderNodes(nodes, total) {
    $("nodes-count").textContent = nodes.length < total ? `(${nodes.length} of ${total}, those needing a look first)` : `(${total})`;
    const cards = nodes.map((n) => el("div", { className: "node", "data-node": n.name, "data-state": n.state, onclick: () => select(n.name) },
      el("div", { className: "name", text: n.name }),
      el("div", { className: "meta", text: `${n.classes.join(", ")} · ${n.state}${n.blocked ? ` · no new pods: ${n.blocked}` : ""}` }),
      el("div", { className: "meta", text: `${gib(n.vram_free_mib)}/${gib(n.vram_total_mib)} GiB free · ${acu(n.acu)} ACU · ${n.pods.length} pods` }),
      el("div", { className: "cells" }, ...n.cells.map((c) => deviceCell(n.name, c))),
    ));
    $("nodes").replaceChildren(...cards);
  }

  async function select(name) {
    selected = selected === name ? null : name;
    await renderDetail();
  }

  async function renderDetail() {
    const box = $("node-detail");
    if (!selected) { box.hidden = true; box.replaceChildren(); return; }
    let answer, doc;
    try {
      answer = await fetch(API + "nodes/" + encodeURIComponent(selected));
      doc = await answer.json();
    } catch (err) {
      box.hidden = false;
      box.replaceChildren(el("p", { className: "muted", text: `cannot read ${selected}: ${err}` }));
      return;
    }
    if (!answer.ok) { box.hidden = false; box.replaceChildren(el("p", { className: "muted", text: doc.error })); return; }
    const rows = doc.device_list.map((d) => el("tr", { "data-health": d.health },
      el("td", { text: d.index }), el("td", { text: d.class }), el("td", { text: d.health }),
      el("td", { className: "num", text: d.health_score }),
      el("td", {}, bar(d.vram_reserved_mib, d.vram_total_mib, `${gib(d.vram_reserved_mib)} / ${gib(d.vram_total_mib)} GiB`)),
      el("td", { className: "num", text: acu(d.acu) }),
      el("td", { className: "num", text: `${num(d.utilisation_pct)} %` }),
      el("td", { className: "num", text: `${num(d.temperature_c)} °C` }),
      el("td", { text: d.owners.join(", ") || "—" }),
      el("td", { className: "muted", text: d.error || d.uuid }),
    ));
    const head = el("tr", {}, ...["#", "class", "health", "score", "VRAM reserved", "ACU", "util", "temp", "occupied by", "uuid / error"].map((h) => el("th", { text: h })));
    box.hidden = false;
    box.replaceChildren(
      el("h2", { text: `${doc.name} — ${doc.state}${doc.blocked ? `, no new pods: ${doc.blocked}` : ""}${doc.simulated ? " (simulated)" : ""}` }),
      el("table", {}, el("thead", {}, head), el("tbody", {}, ...rows)),
    );
  }

  function renderJobs(jobs, now) {
    const rows = jobs.map((j) => {
      const ck = j.checkpoint;
      const pods = j.pods.map((p) => `${p.pod} @ ${p.node} (${p.devices}, ${p.state})`).join("; ") || "no devices held";
      return el("tr", { "data-job": j.job },
        el("td", { text: j.job }), el("td", { text: pods }),
        el("td", { text: ck ? ck.uri : "none reported" }),
        el("td", { className: "num", text: ck ? ck.step : "" }),
        el("td", { className: "num", text: ck ? `${Math.round(ck.age_s)} s` : "" }));
    });
    fill($("jobs").tBodies[0], rows, "no job holds devices");
  }

  function quotaCell(used, hard, pctUsed, unit, format) {
    if (hard === null || hard === undefined) return el("td", { text: `${format(used)} ${unit} (no quota)` });
    return el("td", {}, bar(used, hard, `${format(used)} / ${format(hard)} ${unit} (${num(pctUsed)} %)`));
  }

  function renderNamespaces(namespaces) {
    const rows = namespaces.map((n) => el("tr", { "data-namespace": n.namespace },
      el("td", { text: n.namespace }), el("td", { className: "num", text: n.pods }),
      quotaCell(n.vram_mib, n.vram_mib_hard, n.vram_pct, "GiB", gib),
      quotaCell(n.acu, n.acu_hard, n.acu_pct, "ACU", acu)));
    fill($("namespaces").tBodies[0], rows, "no namespace holds devices");
  }

  function renderAlerts(alerts) {
    const rows = alerts.map((a) => el("tr", { "data-severity": a.severity, "data-alert-node": a.node },
      el("td", { text: clock(a.time_s) }), el("td", { text: a.severity }),
      el("td", { text: a.device === null ? a.node : `${a.node}/${a.device}` }),
      el("td", { text: (a.verdict || a.kind) + (a.code !== null ? ` ${a.code}` : "") }),
      el("td", { text: a.source }), el("td", { text: a.message })));
    fill($("alerts").tBodies[0], rows, "no alerts");
  }

  // -- queue (GET /api/queue: what `hcs queue --json` prints) ---------------
  // An amount is {acu, vram_mib}; null (or a null figure) is no limit.
  const amount = (a) => (a === null ? "no limit" :
    `${a.acu === null ? "∞" : acu(a.acu)} ACU · ${a.vram_mib === null ? "∞" : gib(a.vram_mib)} GiB`);

  function renderQueue(q) {
    const shares = q.namespaces.map((n) => el("tr", { "data-namespace": n.namespace },
      el("td", { text: n.namespace }), el("td", { className: "num", text: num(n.weight) }),
      el("td", { text: amount(n.guaranteed) }), el("td", { text: amount(n.used) }),
      el("td", { text: amount(n.borrowed) }), el("td", { text: amount(n.ceiling) }),
      el("td", { className: "num", text: n.dominant_share.toFixed(3) })));
    fill($("pool-shares").tBodies[0], shares, "no namespace in the ledger");
    const rows = q.queue.map((e) => el("tr", { "data-job": e.job, "data-position": e.position },
      el("td", { className: "num", text: e.position }), el("td", { text: e.job }),
      el("td", { text: e.namespace }), el("td", { className: "num", text: e.priority }),
      el("td", { className: "num", text: `${WHOLE.format(Math.round(e.waited_s))} s` }),
      el("td", { text: e.reason })));
    fill($("queue").tBodies[0], rows, "nothing waits");
    $("queue-count").textContent = `(${q.queue.length} waiting · ${q.running.length} running · pool ${acu(q.pool.acu)} ACU, ${gib(q.pool.vram_mib)} GiB)`;
  }

  async function refreshQueue() {
    try {
      const answer = await fetch(API + "queue");
      if (answer.ok) renderQueue(await answer.json());
    } catch (err) {
      console.warn("queue", err);
    }
  }

  function render(ov) {
    lastOverview = ov;
    renderTotals(ov.totals, ov);
    renderClasses(ov.classes);
    renderNodes(ov.nodes, ov.nodes_total);
    renderJobs(ov.jobs, ov.time_s);
    renderNamespaces(ov.namespaces);
    renderAlerts(ov.alerts);
    $("ready").textContent = ov.ready ? "view ready" : "view replaying";
    $("updated").textContent = `updated ${clock(ov.time_s)}`;
    if (selected) renderDetail();
  }

  // -- plots ---------------------------------------------------------------
  const plots = {};

  function plot(id, labels, colors, data, yMax) {
    const key = labels.join("|");
    const box = $(id);
    if (plots[id] && plots[id].key === key) { plots[id].chart.setData(data); return; }
    if (plots[id]) plots[id].chart.destroy();
    const series = [{}, ...labels.map((label, i) => ({ label, stroke: colors[i], width: 2, spanGaps: false }))];
    const opts = { width: Math.max(box.clientWidth, 300), height: 220, series, scales: { y: yMax ? { range: [0, yMax] } : {} } };
    plots[id] = { key, chart: new uPlot(opts, data, box) };
  }

  async function refreshHistory() {
    try {
      const answer = await fetch(API + "history");
      if (!answer.ok) return;
      const h = await answer.json();
      const names = Object.keys(h.classes);
      const colors = names.map((_, i) => PALETTE[i % PALETTE.length]);
      plot("plot-vram", names, colors, [h.time_s, ...names.map((c) => h.classes[c].vram_reserved_pct)], 100);
      plot("plot-util", names, colors, [h.time_s, ...names.map((c) => h.classes[c].utilisation_pct)], 100);
      const states = Object.keys(h.health);
      plot("plot-health", states, states.map((s) => HEALTH_COLORS[s]), [h.time_s, ...states.map((s) => h.health[s])], null);
    } catch (err) {
      console.warn("history", err);
    }
  }

  // -- live feed -----------------------------------------------------------
  function connect() {
    const feed = $("feed");
    const source = new EventSource(API + "events");
    source.addEventListener("overview", (event) => {
      feed.dataset.state = "live";
      feed.textContent = "live";
      render(JSON.parse(event.data));
    });
    source.addEventListener("error", async () => {
      feed.dataset.state = "lost";
      feed.textContent = "reconnecting…";
      if (source.readyState !== EventSource.CLOSED) return;
      const answer = await fetch(API + "overview").catch(() => null);
      if (answer && answer.status === 401) {
        feed.dataset.state = "unauthorized";
        feed.textContent = "needs the console token: open /console/?token=TOKEN";
      }
    });
    return source;
  }

  // The live feed never ends, so the first picture comes from one plain
  // request, and the feed starts only after the page has loaded and the
  // network has been quiet a while: a headless browser waiting for the load
  // or for network idle (to take a screenshot) sees both happen. The feed is
  // closed when the page is left, and opened again if the page comes back.
  const FEED_AFTER_MS = 1500;
  let feed = null;
  function start() {
    if (!feed) feed = connect();
  }
  async function firstPicture() {
    try {
      const answer = await fetch(API + "overview");
      if (answer.ok) render(await answer.json());
    } catch (err) {
      console.warn("overview", err);
    }
  }
  firstPicture();
  const later = () => setTimeout(start, FEED_AFTER_MS);
  if (document.readyState === "complete") later();
  else window.addEventListener("load", later, { once: true });
  window.addEventListener("pagehide", () => { if (feed) { feed.close(); feed = null; } });
  window.addEventListener("pageshow", (event) => { if (event.persisted) start(); });
  refreshHistory();
  setInterval(refreshHistory, HISTORY_EVERY_MS);
  refreshQueue();
  setInterval(refreshQueue, QUEUE_EVERY_MS);
  window.hcsConsole = { get overview() { return lastOverview; } };
})();
