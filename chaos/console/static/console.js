// railmq console: renders the live feed (/api/events) and sends button presses (/api/faults).
// Everything is built with DOM calls and textContent: names from the cluster never become markup.
"use strict";

const HISTORY_POINTS = 240;      // rate chart: the last 240 snapshots (about 2 minutes at 500 ms)
const SPARK_POINTS = 60;
const TIMELINE_SHOWN = 400;
const CATEGORIES = ["election", "isr", "storage", "group", "dead-letter", "topic", "process", "fault"];

const state = { snapshot: null, timeline: [], history: [], sparks: new Map(), hidden: new Set(["process"]),
  lastSnapshotMs: 0, explained: null, renderedEvents: [] };
window.railmqConsole = state;  // for tests and the benchmark: what the page has rendered

function h(tag, attrs, ...children) {
  const element = document.createElement(tag);
  for (const [key, value] of Object.entries(attrs || {})) {
    if (value === undefined || value === null || value === false) continue;
    if (key === "class") element.className = value;
    else if (key.startsWith("on")) element.addEventListener(key.slice(2), value);
    else if (key === "dataset") Object.assign(element.dataset, value);
    else element.setAttribute(key, value === true ? "" : value);
  }
  for (const child of children.flat()) {
    if (child === null || child === undefined || child === false) continue;
    element.append(child instanceof Node ? child : document.createTextNode(String(child)));
  }
  return element;
}

const svgNS = "http://www.w3.org/2000/svg";
function s(tag, attrs, text) {
  const element = document.createElementNS(svgNS, tag);
  for (const [key, value] of Object.entries(attrs || {})) element.setAttribute(key, value);
  if (text !== undefined) element.textContent = text;
  return element;
}

function rate(value) {
  if (value === null || value === undefined) return "-";
  return value >= 100 ? value.toFixed(0) : value >= 10 ? value.toFixed(1) : value.toFixed(2);
}
function number(value) { return value === null || value === undefined ? "-" : Number(value).toLocaleString("en"); }
function bytes(value) {
  if (value === null || value === undefined) return "-";
  const units = ["B", "KiB", "MiB", "GiB"];
  let index = 0;
  while (value >= 1024 && index < units.length - 1) { value /= 1024; index += 1; }
  return `${value.toFixed(index ? 1 : 0)} ${units[index]}`;
}
function clock(timeNs) {
  const date = new Date(timeNs / 1e6);
  return date.toLocaleTimeString("en-GB", { hour12: false }) + "." + String(date.getMilliseconds()).padStart(3, "0");
}

function toast(text, bad) {
  const element = document.getElementById("toast");
  element.textContent = text;
  element.className = "toast show" + (bad ? " bad" : "");
  clearTimeout(toast.timer);
  toast.timer = setTimeout(() => { element.className = "toast"; }, 4000);
}

// ------------------------------------------------------------------ buttons

async function fault(action, kind, name) {
  try {
    const response = await fetch("/api/faults", { method: "POST", headers: { "Content-Type": "application/json" },
      body: JSON.stringify({ action, kind, name: String(name || "") }) });
    const outcome = await response.json();
    toast(`${outcome.action || action} ${outcome.target || name}: ${outcome.sentence || outcome.error}`, !response.ok);
  } catch (error) {
    toast(`${action} failed: ${error}`, true);
  }
}

function faultButtons(kind, name, { paused, isolated }) {
  const controls = (state.snapshot && state.snapshot.controls) || {};
  const label = kind === "node" ? `node ${name}` : kind === "replica" ? name : kind;
  return [
    h("button", { class: "danger", title: `SIGKILL ${label}`, dataset: { action: "kill", target: label },
      onclick: () => fault("kill", kind, name) }, "kill"),
    paused
      ? h("button", { title: `SIGCONT ${label}`, dataset: { action: "resume", target: label },
        onclick: () => fault("resume", kind, name) }, "resume")
      : h("button", { title: `SIGSTOP ${label}`, dataset: { action: "pause", target: label },
        onclick: () => fault("pause", kind, name) }, "pause"),
    isolated
      ? h("button", { title: `restore ${label}'s links`, dataset: { action: "heal", target: label },
        onclick: () => fault("heal", kind, name) }, "heal")
      : h("button", { disabled: !controls.isolate, dataset: { action: "isolate", target: label },
        title: controls.isolate ? `cut ${label} off from every peer` : "isolating needs the cluster secret (--data-dir)",
        onclick: () => fault("isolate", kind, name) }, "isolate"),
  ];
}

// ------------------------------------------------------------------ rendering

// A re-render between a button's mousedown and mouseup would swallow the click: hold it back.
document.addEventListener("pointerdown", () => { state.pointerDown = true; });
document.addEventListener("pointerup", () => setTimeout(() => {
  state.pointerDown = false;
  if (state.renderPending) { state.renderPending = false; render(); }
}, 0));

function render() {
  const snapshot = state.snapshot;
  if (!snapshot) return;
  if (state.pointerDown) { state.renderPending = true; return; }
  document.getElementById("cluster-id").textContent = snapshot.cluster_id || "?";
  document.getElementById("bootstrap").textContent = snapshot.bootstrap;
  const problems = document.getElementById("problems");
  problems.replaceChildren(...snapshot.problems.map((text) => h("div", {}, text)),
    ...snapshot.notes.map((text) => h("div", { class: "note" }, text)));
  renderTiles(snapshot);
  renderChart();
  const isolated = new Set(snapshot.isolated || []);
  renderServices(snapshot, isolated);
  renderNodes(snapshot, isolated);
  renderTopics(snapshot, isolated);
  renderGroups(snapshot);
  renderExplainChoices(snapshot);
}

function consumeRate(snapshot) {
  const values = Object.values(snapshot.group_rates || {});
  return values.length ? values.reduce((a, b) => a + b, 0) : null;
}

function renderTiles(snapshot) {
  const tile = (value, words, bad, testid) => h("div", { class: "tile" + (bad ? " bad" : ""), "data-testid": testid },
    h("b", {}, value), h("span", {}, words));
  document.getElementById("tiles").replaceChildren(
    tile(number(snapshot.partitions.length), "partitions", false, "tile-partitions"),
    tile(number(snapshot.offline_partitions), "offline", snapshot.offline_partitions > 0, "tile-offline"),
    tile(number(snapshot.under_replicated_partitions), "under-replicated", snapshot.under_replicated_partitions > 0,
      "tile-under-replicated"),
    tile(number(snapshot.under_min_isr_partitions), "under min ISR", snapshot.under_min_isr_partitions > 0, "tile-min-isr"),
    tile(rate(snapshot.produce_rate_per_s), "produced / s", false, "tile-produce"),
    tile(rate(consumeRate(snapshot)), "committed / s", false, "tile-consume"),
    tile(number(snapshot.groups.length), "groups", false, "tile-groups"));
}

function renderChart() {
  const width = 960, height = 170, left = 48, right = 12, top = 18, bottom = 22;
  const points = state.history;
  const svg = s("svg", { viewBox: `0 0 ${width} ${height}`, role: "img", "aria-label": "produce and commit rates" });
  if (points.length < 2) { document.getElementById("chart").replaceChildren(svg); return; }
  const start = points[0].t, end = points[points.length - 1].t;
  const high = Math.max(1, ...points.map((p) => Math.max(p.produce || 0, p.consume || 0)));
  const x = (t) => left + (t - start) / Math.max(1, end - start) * (width - left - right);
  const y = (v) => top + (1 - v / high) * (height - top - bottom);
  for (const fraction of [0, 0.5, 1]) {
    svg.append(s("line", { x1: left, x2: width - right, y1: y(high * fraction), y2: y(high * fraction), stroke: "#e3e6ec" }));
    svg.append(s("text", { x: left - 6, y: y(high * fraction) + 3, "text-anchor": "end" }, rate(high * fraction)));
  }
  for (const entry of state.timeline) {
    const t = entry.time_ns / 1e6;
    if (t < start || t > end || !["election", "fault"].includes(entry.category)) continue;
    svg.append(s("line", { x1: x(t), x2: x(t), y1: top, y2: height - bottom,
      stroke: entry.category === "fault" ? "#6b3fa0" : "#b3261e", "stroke-dasharray": "3 3" }));
  }
  for (const [key, color, words] of [["produce", "#1f5fa8", "produced / s"], ["consume", "#d9822b", "committed / s"]]) {
    const path = points.filter((p) => p[key] !== null).map((p) => `${x(p.t).toFixed(1)},${y(p[key]).toFixed(1)}`);
    if (path.length > 1) svg.append(s("polyline", { points: path.join(" "), fill: "none", stroke: color, "stroke-width": 1.6 }));
    svg.append(s("text", { x: key === "produce" ? left : left + 110, y: 11, fill: color }, "— " + words));
  }
  svg.append(s("text", { x: width - right, y: 11, "text-anchor": "end" },
    `last ${Math.round((end - start) / 1000)} s; dashed: elections (red) and console faults (purple)`));
  document.getElementById("chart").replaceChildren(svg);
}

function spark(key) {
  const values = state.sparks.get(key) || [];
  const width = 90, height = 18;
  const svg = s("svg", { width, height, viewBox: `0 0 ${width} ${height}`, class: "spark" });
  const high = Math.max(1, ...values);
  if (values.length > 1) {
    const path = values.map((v, i) => `${(i / (SPARK_POINTS - 1) * width).toFixed(1)},${(height - 1 - v / high * (height - 2)).toFixed(1)}`);
    svg.append(s("polyline", { points: path.join(" "), fill: "none", stroke: "#1f5fa8", "stroke-width": 1.2 }));
  }
  return svg;
}

// Sections are rebuilt only when their structure changes (a leader, the ISR, a badge, a
// button); numbers that move every refresh are updated in place, so a button under the pointer
// stays the same element and a click is never lost to a redraw.
function rebuild(container, signature, build) {
  if (container.dataset.signature === signature) return false;
  container.replaceChildren(...build());
  container.dataset.signature = signature;
  return true;
}

function updateLive(container, values) {
  for (const element of container.querySelectorAll("[data-live]")) {
    const value = values.get(element.dataset.live);
    if (value !== undefined && element.textContent !== value) element.textContent = value;
  }
  for (const element of container.querySelectorAll("[data-spark]")) element.replaceChildren(spark(element.dataset.spark));
}

function live(key, values, text) {
  values.set(key, text);
  return h("span", { "data-live": key }, text);
}

function serviceFacts(service) {
  return `pid ${service.pid || "?"} · ${rate(service.messages_in_per_s)} msg/s in · ${service.endpoint}`;
}

function nodeFacts(node) {
  return `${node.replicas_alive}/${node.replicas} replicas alive · leads ${node.leaders} · ${bytes(node.log_size_bytes)}`;
}

function serviceBox(service, isolated) {
  return h("div", { class: "box" + (service.answering ? "" : " down"), "data-testid": `service-${service.name}` },
    h("div", { class: "title" }, service.name, service.paused ? h("span", { class: "badge warn" }, "paused") : null,
      isolated.has(service.name) ? h("span", { class: "badge warn" }, "isolated") : null,
      service.answering ? null : h("span", { class: "badge bad" }, "not answering")),
    h("div", { class: "facts", "data-live": `service:${service.name}` }, serviceFacts(service)),
    h("div", {}, faultButtons(service.name, "", { paused: service.paused, isolated: isolated.has(service.name) })));
}

function renderServices(snapshot, isolated) {
  const container = document.getElementById("services");
  const signature = JSON.stringify([snapshot.services.map((s) => [s.name, s.pid, s.endpoint, s.answering, s.paused,
    isolated.has(s.name)]), snapshot.controls]);
  rebuild(container, signature, () => snapshot.services.map((service) => serviceBox(service, isolated)));
  updateLive(container, new Map(snapshot.services.map((service) => [`service:${service.name}`, serviceFacts(service)])));
}

function renderNodes(snapshot, isolated) {
  const container = document.getElementById("nodes");
  const pausedNodes = snapshot.nodes.map((node) => snapshot.paused.some((name) => name.endsWith(`/n${node.node}`)));
  const signature = JSON.stringify([snapshot.nodes.map((n) => [n.node, n.replicas, n.replicas_alive, n.leaders]),
    pausedNodes, [...isolated], snapshot.controls]);
  rebuild(container, signature, () => snapshot.nodes.map((node) => {
    const nodePaused = snapshot.paused.some((name) => name.endsWith(`/n${node.node}`));
    const label = `node ${node.node}`;
    return h("div", { class: "box" + (node.replicas_alive < node.replicas ? " down" : ""), "data-testid": `node-${node.node}` },
      h("div", { class: "title" }, label, nodePaused ? h("span", { class: "badge warn" }, "paused") : null,
        isolated.has(label) ? h("span", { class: "badge warn" }, "isolated") : null),
      h("div", { class: "facts", "data-live": `node:${node.node}` }, nodeFacts(node)),
      h("div", {}, faultButtons("node", node.node, { paused: nodePaused, isolated: isolated.has(label) })));
  }));
  updateLive(container, new Map(snapshot.nodes.map((node) => [`node:${node.node}`, nodeFacts(node)])));
}

function storageBadge(replica) {
  const state = replica.storage_state;
  const kind = state === "ok" ? "ok" : state === "new" ? "info" : state === "repairing" ? "warn" : "bad";
  const damage = replica.storage_damage.map(([a, b]) => `${a}..${b < 0 ? "?" : b}`).join(", ");
  const title = [replica.storage_detail, damage ? `damaged offsets ${damage}` : "",
    replica.clean_shutdown ? "closed cleanly last time" : "not closed cleanly last time"].filter(Boolean).join("; ");
  return h("span", { class: `badge ${kind}`, title, "data-testid": "storage" }, state);
}

function replicaChip(partition, replica, isolated, values) {
  const classes = ["replica", replica.role === "leader" ? "leader" : "", replica.in_isr ? "" : "out", replica.alive ? "" : "dead"];
  const title = `${replica.actor} pid ${replica.pid} · log ${replica.log_start_offset}..${replica.log_end_offset}` +
    (replica.behind_leader ? ` · ${replica.behind_leader} behind the leader` : "") + ` · ${bytes(replica.log_size_bytes)}`;
  return h("span", { class: classes.filter(Boolean).join(" "), title, "data-testid": "replica",
    dataset: { node: replica.node, role: replica.role } },
    `n${replica.node}`, replica.role === "leader" ? " ★ " : " ",
    live(`replica-end:${partition.topic}/${partition.partition}/${replica.node}`, values, number(replica.log_end_offset)),
    replica.in_isr ? null : h("span", { class: "badge warn" }, replica.eligible ? "ELR" : "out of ISR"),
    replica.alive ? null : h("span", { class: "badge bad" }, "silent"),
    replica.paused ? h("span", { class: "badge warn" }, "paused") : null,
    isolated.has(replica.actor) ? h("span", { class: "badge warn" }, "isolated") : null,
    storageBadge(replica), " ",
    faultButtons("replica", replica.actor, { paused: replica.paused, isolated: isolated.has(replica.actor) }));
}

function topicFacts(topic) {
  return ` · ${topic.partitions} partition(s) · replication ${topic.replication_factor} · ` +
    `min ISR ${topic.min_insync_replicas} · ${rate(topic.produce_rate_per_s)} msg/s` +
    (topic.dead_letter ? ` · dead letters: ${number(topic.depth)}` : "");
}

function renderTopics(snapshot, isolated) {
  const container = document.getElementById("topics");
  const values = new Map();
  const signature = JSON.stringify([snapshot.topics.map((t) => [t.name, t.partitions]), snapshot.partitions.map((p) =>
    [p.topic, p.partition, p.leader, p.leader_epoch, p.partition_epoch, p.isr, p.offline, p.offline_reason, p.under_min_isr,
      p.under_replicated, p.hot, p.replicas.map((r) => [r.node, r.role, r.alive, r.in_isr, r.eligible, r.storage_state,
        r.storage_damage, r.paused, r.pid])]), [...isolated], snapshot.controls]);
  rebuild(container, signature, () => topicBlocks(snapshot, isolated, values));
  for (const topic of snapshot.topics) values.set(`topic:${topic.name}`, topicFacts(topic));
  for (const p of snapshot.partitions) {
    const key = `${p.topic}/${p.partition}`;
    values.set(`high:${key}`, number(p.high_watermark));
    values.set(`end:${key}`, number(p.log_end_offset));
    values.set(`rate:${key}`, rate(p.produce_rate_per_s));
    for (const r of p.replicas) values.set(`replica-end:${key}/${r.node}`, number(r.log_end_offset));
  }
  updateLive(container, values);
}

function topicBlocks(snapshot, isolated, values) {
  const blocks = [];
  for (const topic of snapshot.topics) {
    const rows = snapshot.partitions.filter((p) => p.topic === topic.name).map((p) => {
      const key = `${p.topic}/${p.partition}`;
      const flags = [p.offline ? h("span", { class: "badge bad", title: p.offline_reason }, "OFFLINE") : null,
        p.under_min_isr ? h("span", { class: "badge bad" }, "under min ISR") : null,
        !p.under_min_isr && p.under_replicated ? h("span", { class: "badge warn" }, "under-replicated") : null,
        p.hot ? h("span", { class: "badge hot" }, "hot") : null];
      const leader = p.replicas.find((r) => r.role === "leader");
      return h("tr", { class: p.offline ? "offline" : p.under_replicated ? "under" : "", "data-testid": "partition",
        dataset: { topic: p.topic, partition: p.partition, leader: p.leader, epoch: p.leader_epoch } },
        h("td", { class: "n" }, p.partition),
        h("td", { "data-testid": "leader" }, p.leader >= 0 ? `n${p.leader}` : "none", flags,
          p.offline && p.offline_reason ? h("div", { class: "meta" }, p.offline_reason) : null),
        h("td", { class: "n" }, `${p.leader_epoch} / ${p.partition_epoch}`),
        h("td", {}, `[${p.isr.map((n) => "n" + n).join(", ")}]`),
        h("td", { class: "n" }, live(`high:${key}`, values, number(p.high_watermark))),
        h("td", { class: "n" }, live(`end:${key}`, values, number(p.log_end_offset))),
        h("td", { class: "n" }, live(`rate:${key}`, values, rate(p.produce_rate_per_s))),
        h("td", { "data-spark": key }, spark(key)),
        h("td", {}, p.replicas.map((r) => replicaChip(p, r, isolated, values))),
        h("td", {}, leader ? h("button", { class: "danger", "data-testid": "kill-leader",
          title: `SIGKILL the leader ${leader.actor}`, onclick: () => fault("kill", "replica", leader.actor) }, "kill leader") : null));
    });
    blocks.push(h("div", { class: "topic-title", "data-testid": "topic", dataset: { topic: topic.name } }, topic.name,
      h("span", { class: "meta", "data-live": `topic:${topic.name}` }, topicFacts(topic))));
    blocks.push(h("table", {}, h("thead", {}, h("tr", {}, ["p", "leader", "epoch / part. epoch", "ISR", "high wm",
      "log end", "msg/s", "", "replicas (★ leader; log end; storage)", ""].map((t) => h("th", {}, t)))), h("tbody", {}, rows)));
  }
  if (!snapshot.topics.length) blocks.push(h("p", { class: "meta" }, "no topics yet"));
  return blocks;
}

function renderGroups(snapshot) {
  const blocks = snapshot.groups.map((group) => {
    const rows = group.partitions.map((row) => {
      const rateKey = `${group.group_id}|${row.topic}|${row.partition}`;
      return h("tr", { "data-testid": "group-partition" },
        h("td", {}, `${row.topic}/${row.partition}`), h("td", {}, row.client_id || row.member_id || h("span", { class: "meta" }, "no owner")),
        h("td", { class: "n" }, number(row.committed_offset)), h("td", { class: "n" }, number(row.log_end_offset)),
        h("td", { class: "n" }, number(row.lag_messages)),
        h("td", { class: "n" }, row.lag_seconds === null ? "-" : row.lag_seconds.toFixed(1)),
        h("td", { class: "n" }, rate((snapshot.group_rates || {})[rateKey])),
        h("td", {}, row.hot ? h("span", { class: "badge hot", title: row.hot_reasons.join(", ") }, "hot: " + row.hot_reasons.join(", ")) : null));
    });
    return h("div", { "data-testid": "group", dataset: { group: group.group_id } },
      h("div", { class: "topic-title" }, group.group_id, h("span", { class: "meta" },
        ` · ${group.kind} · ${group.state} · generation ${group.generation} · ${group.members.length} member(s) · lag ${number(group.total_lag_messages)}`)),
      h("table", {}, h("thead", {}, h("tr", {}, ["partition", "owner", "committed", "high wm", "lag", "lag s", "commits/s", ""]
        .map((t) => h("th", {}, t)))), h("tbody", {}, rows)));
  });
  document.getElementById("groups").replaceChildren(...(blocks.length ? blocks : [h("p", { class: "meta" }, "no groups yet")]));
}

// ------------------------------------------------------------------ timeline

function renderFilters() {
  document.getElementById("filters").replaceChildren(...CATEGORIES.map((category) => h("label", {},
    h("input", { type: "checkbox", checked: !state.hidden.has(category), onchange: (event) => {
      if (event.target.checked) state.hidden.delete(category); else state.hidden.add(category);
      renderTimeline();
    } }), " " + category)));
}

function timelineItem(entry) {
  return h("li", { class: `${entry.severity} ${entry.category}`, "data-testid": "timeline-entry",
    dataset: { event: entry.event, sequence: entry.sequence, category: entry.category } },
    h("span", { class: "when" }, clock(entry.time_ns)), " ", h("span", { class: "cat" }, entry.category), entry.text);
}

function renderTimeline() {
  const shown = state.timeline.filter((entry) => !state.hidden.has(entry.category)).slice(-TIMELINE_SHOWN).reverse();
  document.getElementById("timeline").replaceChildren(...shown.map(timelineItem));
}

function addEvents(entries) {
  const now = Date.now();
  for (const entry of entries) state.renderedEvents.push({ event: entry.event, time_ns: entry.time_ns, rendered_ms: now });
  state.renderedEvents.splice(0, Math.max(0, state.renderedEvents.length - 2000));
  state.timeline.push(...entries);
  state.timeline.splice(0, Math.max(0, state.timeline.length - 2000));
  renderTimeline();
}

// ------------------------------------------------------------------ explain

function renderExplainChoices(snapshot) {
  const select = document.getElementById("explain-topic");
  const names = snapshot.topics.map((t) => t.name);
  if (select.dataset.names === names.join("\n")) return;
  const chosen = select.value;
  select.replaceChildren(...names.map((name) => h("option", { value: name, selected: name === chosen }, name)));
  select.dataset.names = names.join("\n");
}

function stepTime(step) {
  if (step.time_ns === null || step.time_ns === undefined) return "";
  if (step.after_ns) return `${clock(step.after_ns)} – ${clock(step.time_ns)}`;
  return clock(step.time_ns);
}

async function explain(event) {
  event.preventDefault();
  const topic = document.getElementById("explain-topic").value;
  const partition = document.getElementById("explain-partition").value;
  const offset = document.getElementById("explain-offset").value;
  const story = document.getElementById("story");
  story.replaceChildren(h("p", { class: "meta" }, "reading the batch and the trace…"));
  const query = new URLSearchParams({ topic, partition, offset });
  const response = await fetch(`/api/explain?${query}`);
  const result = await response.json();
  state.explained = result;
  if (!response.ok || result.error) { story.replaceChildren(h("p", { class: "badge bad" }, result.error)); return; }
  const facts = [];
  if (result.record) {
    facts.push(h("div", { "data-testid": "story-record" }, `offset ${result.offset}: key `, h("code", {}, String(result.record.key)),
      " value ", h("code", {}, String(result.record.value)), ` · ${result.record.headers} header(s)`));
  }
  story.replaceChildren(h("div", { class: "story" }, facts,
    h("ol", {}, result.steps.map((step) => h("li", { class: step.kind, "data-testid": "story-step", dataset: { kind: step.kind } },
      h("span", { class: "when" }, stepTime(step)), step.what, h("span", { class: "source" }, step.source))))));
}

// ------------------------------------------------------------------ labs

async function renderLabs() {
  const container = document.getElementById("labs");
  const response = await fetch("/api/labs");
  const labs = await response.json();
  if (!labs.available) { container.replaceChildren(h("p", { class: "meta" }, labs.why)); return; }
  const select = h("select", { id: "lab-name" }, labs.labs.map((lab) => h("option", { value: lab.name }, `${lab.number}. ${lab.name}: ${lab.title}`)));
  const quick = h("input", { type: "checkbox", id: "lab-quick", checked: true });
  const start = h("button", { onclick: async () => {
    const reply = await fetch("/api/labs", { method: "POST", headers: { "Content-Type": "application/json" },
      body: JSON.stringify({ name: select.value, quick: quick.checked }) });
    const body = await reply.json();
    if (!reply.ok) toast(body.error, true); else pollLab();
  } }, "start");
  container.replaceChildren(h("div", {}, select, " ", h("label", {}, quick, " quick"), " ", start),
    h("div", { id: "lab-run" }));
  pollLab();
}

async function pollLab() {
  const response = await fetch("/api/labs/run");
  const run = await response.json();
  const target = document.getElementById("lab-run");
  if (!target || !run.lab) return;
  const parts = [h("p", {}, `lab ${run.lab}: ${run.running ? "running…" : "finished"}`),
    h("div", { class: "lines" }, run.lines.join("\n"))];
  if (run.result) {
    parts.push(h("p", {}, h("b", {}, run.result.verdict), run.result.error ? ` — ${run.result.error}` : ""));
    parts.push(h("table", {}, h("thead", {}, h("tr", {}, ["measure", "expected", "band", "measured", "verdict"].map((t) => h("th", {}, t)))),
      h("tbody", {}, run.result.measures.map((m) => h("tr", {}, h("td", {}, m.name), h("td", { class: "n" }, number(m.expected)),
        h("td", {}, m.band), h("td", { class: "n" }, m.measured === null ? "-" : number(m.measured)), h("td", {}, m.verdict))))));
    for (const svg of run.result.plots) {
      const holder = h("div", {});
      holder.innerHTML = svg;  // drawn and escaped by chaos/labs/plots.py on the server
      parts.push(holder);
    }
  }
  target.replaceChildren(...parts);
  if (run.running) setTimeout(pollLab, 1000);
}

// ------------------------------------------------------------------ the feed

function onSnapshot(snapshot) {
  state.snapshot = snapshot;
  state.lastSnapshotMs = Date.now();
  state.history.push({ t: snapshot.time_ns / 1e6, produce: snapshot.produce_rate_per_s, consume: consumeRate(snapshot) });
  state.history.splice(0, Math.max(0, state.history.length - HISTORY_POINTS));
  for (const p of snapshot.partitions) {
    const key = `${p.topic}/${p.partition}`;
    const values = state.sparks.get(key) || [];
    values.push(p.produce_rate_per_s || 0);
    values.splice(0, Math.max(0, values.length - SPARK_POINTS));
    state.sparks.set(key, values);
  }
  render();
}

function connect() {
  const live = document.getElementById("live");
  const source = new EventSource("/api/events");
  source.addEventListener("open", () => { live.textContent = "live"; live.className = "live on"; });
  source.addEventListener("error", () => { live.textContent = "reconnecting"; live.className = "live off"; });
  source.addEventListener("snapshot", (message) => onSnapshot(JSON.parse(message.data)));
  source.addEventListener("timeline", (message) => { state.timeline = []; addEvents(JSON.parse(message.data)); });
  source.addEventListener("events", (message) => { addEvents(JSON.parse(message.data)); renderChart(); });
}

setInterval(() => {
  const age = state.lastSnapshotMs ? ((Date.now() - state.lastSnapshotMs) / 1000).toFixed(1) + " s ago" : "-";
  document.getElementById("age").textContent = age;
}, 500);

document.getElementById("explain-form").addEventListener("submit", explain);
renderFilters();
renderLabs();
connect();
