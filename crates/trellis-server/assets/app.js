// The Trellis web app: runs, a run (live graph, timeline, stage files, human gates, cancel and resume),
// and starting a run. It talks only to the JSON API of the server that serves it; text from runs is put
// into the page as text, never as markup.
"use strict";

const view = document.getElementById("view");
let cleanup = [];

// ---- helpers -----------------------------------------------------------------------------------------

function h(tag, attrs, ...children) {
  const el = document.createElement(tag);
  for (const [key, value] of Object.entries(attrs || {})) {
    if (value === undefined || value === null || value === false) continue;
    if (key.startsWith("on")) el.addEventListener(key.slice(2), value);
    else if (key === "class") el.className = value;
    else el.setAttribute(key, value === true ? "" : value);
  }
  for (const child of children.flat()) {
    if (child === undefined || child === null || child === false) continue;
    el.append(child instanceof Node ? child : document.createTextNode(String(child)));
  }
  return el;
}

async function api(path, options = {}) {
  const init = { credentials: "same-origin", headers: {}, ...options };
  if (options.json !== undefined) {
    init.method = init.method || "POST";
    init.headers["Content-Type"] = "application/json";
    init.body = JSON.stringify(options.json);
  }
  const response = await fetch(path, init);
  const type = response.headers.get("content-type") || "";
  const body = type.includes("json") ? await response.json() : await response.text();
  return { ok: response.ok, status: response.status, body };
}

function badge(status) {
  const text = status === "waiting_for_input" ? "waiting" : status;
  return h("span", { class: "badge " + status, "data-status": status }, text);
}

function duration(ms) {
  if (ms === null || ms === undefined || isNaN(ms)) return "";
  if (ms < 1000) return ms + " ms";
  const s = ms / 1000;
  if (s < 60) return s.toFixed(1) + " s";
  const m = Math.floor(s / 60);
  if (m < 60) return m + " min " + Math.round(s % 60) + " s";
  return Math.floor(m / 60) + " h " + (m % 60) + " min";
}

function since(start, end) {
  const a = Date.parse(start);
  const b = end ? Date.parse(end) : Date.now();
  return isNaN(a) ? "" : duration(Math.max(0, b - a));
}

function when(ts) {
  const d = new Date(ts);
  return isNaN(d) ? ts || "" : d.toLocaleString();
}

function every(ms, fn) {
  const id = setInterval(fn, ms);
  cleanup.push(() => clearInterval(id));
}

/// Replaces an element's children, leaving out the absent ones.
function fill(el, ...children) {
  el.replaceChildren(...children.flat().filter((c) => c !== null && c !== undefined && c !== false));
}

/// An option's label without its accelerator prefix (`[A] Approve` → `Approve`), shown beside its key.
function withoutKey(label) {
  return label.replace(/^\s*(\[\w\]|\(\w\)|\w\)|\w\s+-)\s*/, "");
}

function show(...children) {
  view.replaceChildren(...children);
}

// ---- runs ------------------------------------------------------------------------------------------------

/// The run board's groups, in the order shown.
const BOARD = [
  ["running", "Running"], ["waiting_for_input", "Waiting for input"], ["failed", "Failed"],
  ["interrupted", "Interrupted"], ["cancelled", "Cancelled"], ["succeeded", "Succeeded"],
];

/// Where the board shows a run: a running run with a question open waits for input.
function boardState(run) {
  return run.waiting && run.status === "running" ? "waiting_for_input" : run.status;
}

function cost(run) {
  if (run.cost_usd !== null && run.cost_usd !== undefined) return "$" + run.cost_usd.toFixed(4);
  return run.tokens ? run.tokens + " tokens" : "";
}

async function runsPage() {
  const filters = { status: "", workflow: "", q: "" };
  let limit = 200;
  const workflows = new Set();
  const chips = h("div", { class: "chips", id: "state-filter" });
  const workflowSelect = h("select", { id: "workflow-filter" });
  const search = h("input", { type: "search", id: "search", placeholder: "Search id, workflow or goal" });
  const board = h("div", { id: "board" });
  const more = h("div");
  const notice = h("div");
  show(h("h1", {}, "Runs", h("div", { class: "actions" }, h("a", { href: "#/new" }, h("button", { class: "primary" }, "Start a run")))),
    h("div", { class: "filters" }, chips, workflowSelect, search), notice, board, more);
  workflowSelect.addEventListener("change", () => { filters.workflow = workflowSelect.value; refresh(); });
  let typing = null;
  search.addEventListener("input", () => { clearTimeout(typing); typing = setTimeout(() => { filters.q = search.value.trim(); refresh(); }, 250); });

  function table(runs) {
    return h("table", { class: "runs" },
      h("thead", {}, h("tr", {}, ["Workflow", "Status", "Started", "Duration", "Cost", "Current stage", "Stages", "Run"].map((t) => h("th", {}, t)))),
      h("tbody", {}, runs.map((run) =>
        h("tr", { class: "row", "data-run": run.id, onclick: () => { location.hash = "#/runs/" + run.id; } },
          h("td", {}, h("a", { href: "#/runs/" + run.id }, run.workflow), run.goal ? h("div", { class: "muted goal" }, run.goal) : null),
          h("td", {}, badge(boardState(run))),
          h("td", {}, when(run.started_at)),
          h("td", {}, since(run.started_at, run.ended_at)),
          h("td", {}, cost(run)),
          h("td", {}, run.current || ""),
          h("td", {}, String(run.stage_count)),
          h("td", { class: "muted" }, run.id)))));
  }

  async function refresh() {
    const params = new URLSearchParams({ limit: String(limit) });
    for (const [key, value] of Object.entries(filters)) if (value) params.set(key, value);
    const answer = await api("/api/runs?" + params);
    if (!answer.ok) {
      notice.replaceChildren(h("div", { class: "notice error" }, answer.body.error || "cannot list runs"));
      return;
    }
    notice.replaceChildren();
    const { runs, counts, total } = answer.body;
    const all = Object.values(counts).reduce((a, b) => a + b, 0);
    fill(chips,
      h("button", { type: "button", class: filters.status ? "" : "active", "data-state": "", onclick: () => { filters.status = ""; refresh(); } }, "All ", h("span", { class: "count" }, String(all))),
      BOARD.map(([state, label]) => h("button", { type: "button", class: filters.status === state ? "active" : "", "data-state": state,
        onclick: () => { filters.status = filters.status === state ? "" : state; refresh(); } }, label + " ", h("span", { class: "count" }, String(counts[state] || 0)))));
    for (const run of runs) workflows.add(run.workflow);
    if (workflowSelect.options.length !== workflows.size + 1) {
      fill(workflowSelect, h("option", { value: "" }, "All workflows"), [...workflows].sort().map((w) => h("option", { value: w }, w)));
      workflowSelect.value = filters.workflow;
    }
    const groups = BOARD.map(([state, label]) => [state, label, runs.filter((r) => boardState(r) === state)]).filter(([, , rs]) => rs.length);
    if (groups.length === 0) {
      board.replaceChildren(h("p", { class: "muted" }, all === 0 && !filters.workflow && !filters.q ? "No runs yet. Start one." : "No runs match."));
    } else {
      board.replaceChildren(...groups.map(([state, label, rs]) =>
        h("section", { class: "group", "data-group": state }, h("h2", {}, label, " ", h("span", { class: "muted" }, String(counts[state] || rs.length))), table(rs))));
    }
    fill(more, total > runs.length
      ? h("button", { type: "button", id: "more", onclick: () => { limit += 200; refresh(); } }, "Show more (" + (total - runs.length) + " not shown)")
      : null);
  }
  await refresh();
  every(2000, refresh);
}

// ---- an agent's transcript -----------------------------------------------------------------------------

/// A tool call's arguments in one line: its path, command or pattern when it has one.
function callTarget(args) {
  if (!args || typeof args !== "object") return "";
  const named = args.path || args.file_path || args.command || args.pattern || args.query;
  const text = typeof named === "string" ? named : JSON.stringify(args);
  return text.length > 120 ? text.slice(0, 120) + "…" : text;
}

/// A long text cut to its start, with a button that shows the whole of it.
function expandable(text, limit = 1500) {
  const pre = h("pre", { class: "t-output" }, text.length > limit ? text.slice(0, limit) : text);
  if (text.length <= limit) return pre;
  const more = h("button", { type: "button", class: "t-more", onclick: () => { pre.textContent = text; more.remove(); } },
    "show all " + text.length + " characters");
  return h("div", {}, pre, more);
}

/// One transcript entry as an element (a tool's result goes into its call's element; `null` then); a
/// sub-agent's entries are indented and carry its id.
function transcriptEntry(e, calls) {
  const el = entryElement(e, calls);
  if (el && e.agent && e.type !== "subagent" && e.type !== "subagent_closed") {
    el.classList.add("t-sub");
    el.setAttribute("data-agent", e.agent);
    (el.querySelector("summary") || el).prepend(h("span", { class: "t-agent" }, e.agent), " ");
  }
  return el;
}

function entryElement(e, calls) {
  switch (e.type) {
    case "subagent":
      return h("div", { class: "t-entry t-note", "data-subagent": e.agent }, "sub-agent " + e.agent + " started: " + (e.task || ""));
    case "subagent_closed":
      return h("div", { class: "t-entry t-note" }, "sub-agent " + e.agent + " closed");
    case "user":
      return h("div", { class: "t-entry t-user" }, h("span", { class: "t-who" }, "user"), expandable(e.text || ""));
    case "steer":
      return h("div", { class: "t-entry t-steer", "data-steer": "" }, h("span", { class: "t-who" }, "steering"), h("div", { class: "t-text" }, e.text || ""));
    case "approval":
      return h("div", { class: "t-entry t-warn" }, h("span", { class: "t-who" }, "permission asked"), h("div", { class: "t-text" }, e.prompt || ""));
    case "approval_answer":
      return h("div", { class: "t-entry t-note" }, (e.asked ? "answered " : "nobody to ask: ") + (e.label || ""));
    case "steer_undelivered":
      return h("div", { class: "t-entry t-warn" }, "steering message not delivered (the agent had finished): " + (e.text || ""));
    case "turn":
      return h("div", { class: "t-turn", "data-turn": e.turn }, "turn " + e.turn);
    case "assistant":
      return h("div", { class: "t-entry t-assistant" }, h("span", { class: "t-who" }, "assistant"), h("div", { class: "t-text" }, e.text || ""));
    case "command":
      return h("div", { class: "t-entry t-note" }, "$ " + e.program + " " + (e.args || []).join(" "));
    case "tool_call": {
      const result = h("span", { class: "t-result muted" }, "running…");
      const el = h("details", { class: "t-entry t-call", "data-tool": e.tool, "data-call": e.call_id },
        h("summary", {}, h("code", {}, e.tool), " ", h("span", { class: "t-target" }, callTarget(e.arguments)), " ", result),
        h("pre", { class: "t-args" }, JSON.stringify(e.arguments, null, 2)));
      calls[e.call_id] = { el, result };
      return el;
    }
    case "tool_result": {
      const call = calls[e.call_id];
      const verdict = (e.is_error ? "error" : "ok") + (e.duration_ms !== undefined ? " · " + duration(e.duration_ms) : "");
      if (!call) return h("div", { class: "t-entry t-call" + (e.is_error ? " t-error" : "") }, h("code", {}, e.tool), " " + verdict, expandable(e.output || ""));
      call.result.textContent = verdict;
      call.el.classList.toggle("t-error", !!e.is_error);
      call.el.setAttribute("data-done", e.is_error ? "error" : "ok");
      call.el.append(expandable(e.output || ""));
      return null;
    }
    case "usage": {
      const u = e.usage || {};
      return h("div", { class: "t-usage muted" }, `tokens: ${u.input_tokens || 0} in (${u.cached_tokens || 0} cached), ${u.output_tokens || 0} out`);
    }
    case "loop_detected":
      return h("div", { class: "t-entry t-warn" }, "loop detected: " + (e.tools || []).join(", ") + (e.period ? " (every " + e.period + " calls)" : ""));
    case "compaction":
      return h("div", { class: "t-entry t-note" }, "the conversation was compacted (" + e.original_turn_count + " turns summarised)");
    case "error":
      return h("div", { class: "t-entry t-error" }, "error: " + e.message);
    default:
      return h("div", { class: "t-entry t-note" }, JSON.stringify(e));
  }
}

// ---- a run -----------------------------------------------------------------------------------------------

const STATES = ["pending", "running", "succeeded", "failed", "waiting", "cancelled", "interrupted", "skipped"];

async function runPage(id) {
  const title = h("h1", {}, "Run");
  const actions = h("div", { class: "actions" });
  const notice = h("div");
  const gateBox = h("div");
  const graph = h("div", { class: "graph panel", id: "graph" }, h("span", { class: "muted" }, "Drawing the workflow…"));
  const legend = h("div", { class: "legend" }, STATES.map((s) => h("span", { style: "color: var(--" + s + ")" }, s)));
  const timeline = h("ul", { class: "timeline", id: "timeline" });
  const stage = h("div", { class: "panel", id: "stage" }, h("span", { class: "muted" }, "Click a node or a stage to see its prompt, response, output and status."));
  const context = h("dl", { class: "kv" });
  const changesBody = h("div", {}, h("span", { class: "muted" }, "Loading…"));
  const changes = h("details", { class: "panel", id: "changes", ontoggle: () => { if (changes.open) loadChanges(); } },
    h("summary", {}, "What the run changed in its working directory"), changesBody);
  show(title, notice, gateBox,
    h("div", { class: "run-layout" },
      h("div", {}, graph, legend, h("h2", {}, "Context"), h("div", { class: "panel" }, context)),
      h("div", {}, h("h2", {}, "Timeline"), h("div", { class: "panel" }, timeline), h("h2", {}, "Stage"), stage,
        h("h2", {}, "Files changed"), changes)));

  /// The run's changes (from its start to its end, or to now): the files, then the diff.
  async function loadChanges() {
    const answer = await api("/api/runs/" + encodeURIComponent(id) + "/changes");
    if (!answer.ok) {
      changesBody.replaceChildren(h("span", { class: "muted", id: "changes-none" }, answer.body.error || "no changes recorded"));
      return;
    }
    const c = answer.body;
    const count = (n) => (n === null || n === undefined ? "binary" : String(n));
    const files = c.files.map((f) => h("li", {}, h("code", {}, f.path), " ",
      h("span", { class: "added" }, "+" + count(f.added)), " ", h("span", { class: "removed" }, "−" + count(f.removed))));
    const lines = c.diff.split("\n").map((line) => h("span", {
      class: line.startsWith("+") && !line.startsWith("+++") ? "added"
        : line.startsWith("-") && !line.startsWith("---") ? "removed"
          : line.startsWith("@@") ? "hunk" : "",
    }, line + "\n"));
    changesBody.replaceChildren(
      h("div", { id: "changes-summary" }, c.files.length ? `${c.files.length} file(s) changed` + (c.live ? " so far" : "") + (c.truncated ? "; the diff is cut" : "") : "No file changed" + (c.live ? " so far." : ".")),
      h("ul", { class: "changed-files" }, files),
      c.diff ? h("pre", { class: "diff", id: "changes-diff" }, lines) : null);
  }

  const state = { run: null, nodes: {}, edges: new Set(), stages: [], lastSeq: 0, source: null, selected: null };

  async function loadRun() {
    const answer = await api("/api/runs/" + encodeURIComponent(id));
    if (!answer.ok) {
      notice.replaceChildren(h("div", { class: "notice error" }, answer.body.error || "no such run"));
      return null;
    }
    state.run = answer.body;
    renderHeader();
    renderGate();
    renderContext();
    paint();
    return state.run;
  }

  function renderHeader() {
    const run = state.run;
    // A live run at a gate is running as far as its record goes; a person sees it waiting.
    const shown = run.status === "running" && (run.waiting || []).length ? "waiting_for_input" : run.status;
    title.replaceChildren(run.workflow, badge(shown), h("span", { class: "muted", style: "font-size: 13px; font-weight: normal" }, run.id), actions);
    const running = run.status === "running";
    const resumable = !running && !["succeeded", "failed"].includes(run.status);
    if (!actions.querySelector("#cancel-confirm")) {
      fill(actions,
        h("a", { href: "/api/runs/" + run.id + "/events?format=jsonl", target: "_blank", rel: "noopener" }, "Event log"),
        running ? h("button", { class: "danger", id: "cancel", onclick: confirmCancel }, "Cancel") : null,
        resumable ? h("button", { class: "primary", id: "resume", onclick: resume }, "Resume") : null);
    }
    if (run.error) notice.replaceChildren(h("div", { class: "notice error" }, run.error));
    if (["cancelled", "interrupted", "failed", "succeeded"].includes(run.status) && !run.live) settle(run.status === "succeeded" ? "succeeded" : run.status);
  }

  /// Cancelling asks once more, in place: a run stopped by a stray click loses its running stage.
  function confirmCancel() {
    fill(actions,
      h("span", { id: "cancel-confirm" }, "Cancel this run? Its running stage stops (resume runs it again). "),
      h("button", { class: "danger", id: "cancel-yes", onclick: () => { actions.replaceChildren(); cancel(); } }, "Yes, cancel"),
      h("button", { id: "cancel-no", onclick: () => { actions.replaceChildren(); renderHeader(); } }, "No"));
  }

  let shownGates = "";
  function renderGate() {
    const gates = state.run.waiting || [];
    // Drawn again only when the gates change, so text being typed into a form stays.
    const key = JSON.stringify(gates);
    if (key === shownGates) return;
    shownGates = key;
    if (gates.length === 0) { gateBox.replaceChildren(); return; }
    gateBox.replaceChildren(...gates.map((gate) => {
      const text = h("input", { type: "text", name: "answer", placeholder: "Your answer" });
      const message = h("div");
      async function send(answer) {
        const sent = await api("/api/runs/" + encodeURIComponent(id) + "/answers", { json: { gate: gate.gate, answer } });
        if (!sent.ok) { message.replaceChildren(h("div", { class: "notice error" }, sent.body.error || "not accepted")); return; }
        gateBox.replaceChildren(h("div", { class: "notice" }, "Answered “" + answer + "”."));
        connect();
        setTimeout(loadRun, 300);
      }
      return h("form", { class: "panel gate", id: "gate-" + gate.gate, "data-gate": gate.gate, onsubmit: (e) => { e.preventDefault(); if (text.value.trim()) send(text.value.trim()); } },
        h("strong", {}, "Waiting for your answer at ", h("code", {}, gate.gate)),
        h("p", {}, gate.prompt),
        h("div", { class: "options" }, gate.options.map((o) =>
          h("button", { type: "button", class: "primary", "data-option": o.label, "data-key": o.key, onclick: () => send(o.label) }, o.key ? h("kbd", {}, o.key) : null, o.key ? withoutKey(o.label) : o.label))),
        gate.freeform ? h("div", {}, text, h("button", { type: "submit" }, "Send")) : null,
        message);
    }));
  }

  function renderContext() {
    const entries = Object.entries(state.run.context || {});
    if (entries.length === 0) { context.replaceChildren(h("span", { class: "muted" }, "(empty)")); return; }
    context.replaceChildren(...entries.flatMap(([k, v]) => {
      let text = typeof v === "string" ? v : JSON.stringify(v);
      if (text.length > 300) text = text.slice(0, 300) + "…";
      return [h("dt", {}, k), h("dd", {}, text)];
    }));
  }

  async function cancel() {
    const answer = await api("/api/runs/" + encodeURIComponent(id) + "/cancel", { json: {} });
    if (!answer.ok) notice.replaceChildren(h("div", { class: "notice error" }, answer.body.error));
    refreshSoon();
  }

  async function resume() {
    const answer = await api("/api/runs/" + encodeURIComponent(id) + "/resume", { json: {} });
    if (!answer.ok) { notice.replaceChildren(h("div", { class: "notice error" }, answer.body.error)); return; }
    notice.replaceChildren();
    await loadRun();
    connect();
  }

  // Node states and the edges taken, from the event stream.
  function apply(event) {
    const node = event.node_id;
    switch (event.event) {
      case "StageStarted":
        state.nodes[node] = "running";
        state.stages.push({ node, dir: event.dir, visit: event.visit, attempt: event.attempt, type: event.type, started: event.ts, status: "running" });
        break;
      case "StageCompleted":
      case "StageFailed": {
        const failed = event.event === "StageFailed" || event.status === "failed";
        state.nodes[node] = failed ? "failed" : "succeeded";
        const s = [...state.stages].reverse().find((x) => x.node === node && x.status === "running");
        if (s) { s.status = event.status || (failed ? "failed" : "succeeded"); s.duration = event.duration_ms; }
        break;
      }
      case "HumanGateAsked":
        state.nodes[node] = "waiting";
        break;
      case "HumanGateAnswered":
        state.nodes[node] = "running";
        break;
      case "EdgeSelected":
        if (event.to) state.edges.add(node + "->" + event.to);
        break;
      case "WorkflowRunWaitingForInput":
        if (event.node) state.nodes[event.node] = "waiting";
        break;
      case "WorkflowRunCancelled":
      case "WorkflowRunCompleted":
      case "WorkflowRunFailed": {
        // Stages still running when the run ended stopped with it.
        const ended = event.event === "WorkflowRunCompleted" ? "succeeded"
          : event.event === "WorkflowRunCancelled" ? "cancelled"
            : event.status === "interrupted" ? "interrupted" : "failed";
        settle(ended);
        if (changes.open) loadChanges();
        break;
      }
    }
  }

  /// Marks what is still running as `status`: the run ended (or its process is gone) without them.
  function settle(status) {
    for (const [n, s] of Object.entries(state.nodes)) if (s === "running" || s === "waiting") state.nodes[n] = status;
    for (const s of state.stages) if (s.status === "running") s.status = status;
  }

  function paint() {
    const svg = graph.querySelector("svg");
    const finished = state.run && ["succeeded", "failed"].includes(state.run.status);
    if (svg) {
      const stats = nodeStats();
      for (const g of svg.querySelectorAll("g.node")) {
        const nodeId = (g.id || "").replace(/^node:/, "");
        showStats(g, stats[nodeId]);
        let st = state.nodes[nodeId] || (finished ? "skipped" : "pending");
        for (const s of STATES) g.classList.remove("st-" + s);
        g.classList.add("st-" + st);
        g.setAttribute("data-state", st);
        g.classList.toggle("selected", state.selected === nodeId);
      }
      for (const g of svg.querySelectorAll("g.edge")) {
        const t = g.querySelector("title");
        const key = t ? t.textContent.replace("&#45;", "-") : "";
        g.classList.toggle("taken", state.edges.has(key));
      }
    }
    timeline.replaceChildren(...state.stages.map((s, i) =>
      h("li", { "data-dir": s.dir, "data-node": s.node, class: state.selected === s.dir ? "selected" : "", onclick: () => openStage(s) },
        badge(s.status === "running" && state.nodes[s.node] === "waiting" ? "waiting" : s.status === "partial_success" ? "succeeded" : s.status),
        h("span", { class: "node" }, s.node),
        h("span", { class: "muted" }, s.type + (s.visit > 1 ? " · visit " + s.visit : "") + (s.attempt > 1 ? " · attempt " + s.attempt : "")),
        h("span", { class: "when" }, s.duration !== undefined ? duration(s.duration) : "…"))));
  }

  /// Each node's visits and the time its stages took, from the timeline.
  function nodeStats() {
    const stats = {};
    for (const s of state.stages) {
      const st = stats[s.node] || (stats[s.node] = { visits: 0, ms: 0, done: false });
      st.visits = Math.max(st.visits, s.visit || 1);
      if (s.duration !== undefined) { st.ms += s.duration; st.done = true; }
    }
    return stats;
  }

  /// Writes a node's visits and duration beside it in the picture.
  function showStats(g, st) {
    let label = g.querySelector("text.node-stat");
    if (!st || !st.done) { if (label) label.remove(); return; }
    if (!label) {
      const shape = g.querySelector("polygon, ellipse, path");
      if (!shape) return;
      const box = shape.getBBox();
      label = document.createElementNS("http://www.w3.org/2000/svg", "text");
      label.setAttribute("class", "node-stat");
      label.setAttribute("x", box.x + box.width + 4);
      label.setAttribute("y", box.y + box.height / 2 + 4);
      g.append(label);
    }
    label.textContent = (st.visits > 1 ? st.visits + " visits · " : "") + duration(st.ms);
    g.setAttribute("data-visits", st.visits);
    g.setAttribute("data-duration-ms", st.ms);
  }

  async function drawGraph() {
    const answer = await fetch("/api/runs/" + encodeURIComponent(id) + "/graph.svg", { credentials: "same-origin" });
    if (!answer.ok) { graph.replaceChildren(h("span", { class: "muted" }, "The workflow cannot be drawn.")); return; }
    const doc = new DOMParser().parseFromString(await answer.text(), "image/svg+xml");
    const svg = doc.documentElement;
    if (svg.nodeName !== "svg") { graph.replaceChildren(h("span", { class: "muted" }, "The workflow cannot be drawn.")); return; }
    for (const bad of svg.querySelectorAll("script, foreignObject")) bad.remove();
    for (const el of svg.querySelectorAll("*")) for (const a of [...el.attributes]) if (/^on/i.test(a.name) || /javascript:/i.test(a.value)) el.removeAttribute(a.name);
    // Tooltips duplicate the labels; the page shows details on click.
    for (const a of svg.querySelectorAll("a")) a.removeAttribute("xlink:title");
    graph.replaceChildren(document.importNode(svg, true));
    for (const g of graph.querySelectorAll("g.node")) {
      g.addEventListener("click", () => {
        const nodeId = (g.id || "").replace(/^node:/, "");
        const s = [...state.stages].reverse().find((x) => x.node === nodeId);
        if (s) openStage(s);
        else { state.selected = nodeId; paint(); stage.replaceChildren(h("strong", {}, nodeId), h("p", { class: "muted" }, "This node has not run.")); }
      });
    }
    paint();
  }

  // The open stage's output stream, closed when another stage opens or the page changes.
  let follow = null;
  function stopFollowing() { if (follow) { follow.close(); follow = null; } }
  cleanup.push(stopFollowing);

  async function openStage(s) {
    stopFollowing();
    state.selected = s.dir;
    paint();
    const base = "/api/runs/" + encodeURIComponent(id) + "/stages/" + encodeURIComponent(s.dir) + "/";
    const files = ["response.md", "prompt.md", "status.json"];
    const loaded = await Promise.all(files.map(async (f) => {
      const r = await fetch(base + encodeURIComponent(f), { credentials: "same-origin" });
      return r.ok ? [f, await r.text()] : null;
    }));
    if (state.selected !== s.dir) return;
    const present = Object.fromEntries(loaded.filter(Boolean));
    const ended = "status.json" in present && !/"waiting_for_input"\s*:\s*true/.test(present["status.json"]);
    const body = h("div");
    const tabs = h("div", { class: "tabs" });
    const output = h("pre", { id: "stage-output", "data-file": "output" });
    const outputNote = h("div");
    const outputView = h("div", {}, output, outputNote);
    const transcript = h("div", { id: "transcript", class: "transcript" });
    const views = {};
    let current = null;
    let chosen = false;
    function select(name, byPerson) {
      current = name;
      chosen = chosen || byPerson;
      for (const b of tabs.children) b.classList.toggle("active", b.dataset.file === name);
      body.replaceChildren(views[name]());
    }
    // Tabs in a fixed order, each added once it has something to show; until a person picks one,
    // the first of them is shown.
    const ORDER = ["transcript", "response.md", "output", "prompt.md", "status.json"];
    function addTab(name, view) {
      if (views[name]) return;
      views[name] = view;
      const button = h("button", { type: "button", "data-file": name, onclick: () => select(name, true) }, name);
      const after = [...tabs.children].find((b) => ORDER.indexOf(b.dataset.file) > ORDER.indexOf(name));
      tabs.insertBefore(button, after || null);
      if (!chosen && tabs.firstChild.dataset.file !== current) select(tabs.firstChild.dataset.file, false);
    }
    for (const name of ["response.md", "prompt.md", "status.json"]) {
      if (!(name in present)) continue;
      let text = present[name];
      if (name === "status.json") { try { text = JSON.stringify(JSON.parse(text), null, 2); } catch (_) { /* shown as is */ } }
      const pre = h("pre", { id: "stage-file", "data-file": name }, text || "(empty)");
      if (ended || name !== "response.md") addTab(name, () => pre);
    }
    let artifacts = [];
    if (present["status.json"]) { try { artifacts = JSON.parse(present["status.json"]).artifacts || []; } catch (_) { /* none */ } }
    const live = h("span", { class: "live muted", id: "stage-live" }, ended ? "" : "● live");
    // A running agent takes a course correction before its next model call.
    let steer = null;
    if (!ended && s.type === "agent") {
      const text = h("textarea", { id: "steer-text", rows: 2, placeholder: "Steer the agent: a message its model reads before its next call" });
      const said = h("div", { id: "steer-result" });
      steer = h("form", { class: "steer", id: "steer", onsubmit: async (e) => {
        e.preventDefault();
        if (!text.value.trim()) return;
        const sent = await api("/api/runs/" + encodeURIComponent(id) + "/steer", { json: { text: text.value, node: s.node } });
        if (sent.ok) { text.value = ""; said.replaceChildren(h("div", { class: "notice" }, "Sent: the agent reads it before its next model call.")); }
        else said.replaceChildren(h("div", { class: "notice error" }, sent.body.error || "not sent"));
      } }, text, h("button", { type: "submit", class: "primary", id: "steer-send" }, "Send"), said);
    }
    fill(stage,
      h("div", { style: "display:flex; gap:8px; align-items:center; margin-bottom:8px" }, h("strong", {}, s.node), badge(s.status), h("span", { class: "muted" }, s.dir), live),
      tabs, body, steer,
      artifacts.length ? h("div", {}, h("h2", {}, "Artifacts"), h("ul", {}, artifacts.map((a) =>
        h("li", {}, h("a", { href: "/api/runs/" + encodeURIComponent(id) + "/artifacts/" + encodeURIComponent(s.node) + "/attempt-" + s.attempt + "/" + a.path.split("/").map(encodeURIComponent).join("/"), target: "_blank", rel: "noopener" }, a.path), " ", h("span", { class: "muted" }, a.bytes + " bytes"))))) : null);

    // Output and transcript come from the stage's output stream: live while it runs, then whole.
    const calls = {};
    const source = new EventSource(base + "output");
    follow = source;
    function follows() { return output.scrollHeight - output.scrollTop - output.clientHeight < 40; }
    // A page holds the first 2 MB of a stage's output; the whole logs are a click away.
    const SHOWN_MAX = 2 << 20;
    let shownBytes = 0;
    for (const stream of ["stdout", "stderr"]) {
      source.addEventListener(stream, (message) => {
        const text = JSON.parse(message.data).text;
        if (shownBytes > SHOWN_MAX) return;
        shownBytes += text.length;
        if (shownBytes > SHOWN_MAX) {
          outputNote.replaceChildren(h("div", { class: "notice" }, "The output is longer than the page shows: ",
            h("a", { href: base + "stdout.log", target: "_blank", rel: "noopener" }, "stdout.log"), " · ",
            h("a", { href: base + "stderr.log", target: "_blank", rel: "noopener" }, "stderr.log")));
        }
        const stick = follows();
        output.append(stream === "stderr" ? h("span", { class: "stderr" }, text) : text);
        addTab("output", () => outputView);
        if (stick) output.scrollTop = output.scrollHeight;
      });
    }
    source.addEventListener("transcript", (message) => {
      for (const line of JSON.parse(message.data).text.split("\n")) {
        if (!line.trim()) continue;
        let entry;
        try { entry = JSON.parse(line); } catch (_) { continue; }
        const el = transcriptEntry(entry, calls);
        if (el) transcript.append(el);
      }
      addTab("transcript", () => transcript);
    });
    source.addEventListener("end", () => {
      source.close();
      if (follow === source) follow = null;
      live.replaceChildren();
      if (steer) steer.remove();
      if (!current) body.replaceChildren(h("span", { class: "muted" }, "This stage wrote nothing."));
      // A stage seen running is read again once it has ended: its answer and status are there now.
      if (!ended && state.selected === s.dir) setTimeout(() => { if (state.selected === s.dir) openStage(s); }, 300);
    });
    if (!current) body.replaceChildren(h("span", { class: "muted" }, ended ? "Reading the stage…" : "Waiting for the stage's output…"));
  }

  let refreshTimer = null;
  function refreshSoon() {
    clearTimeout(refreshTimer);
    refreshTimer = setTimeout(loadRun, 250);
  }

  function connect() {
    if (state.source) state.source.close();
    const source = new EventSource("/api/runs/" + encodeURIComponent(id) + "/events?after=" + state.lastSeq);
    state.source = source;
    source.onmessage = (message) => {
      let event;
      try { event = JSON.parse(message.data); } catch (_) { return; }
      if (event.seq <= state.lastSeq) return;
      state.lastSeq = event.seq;
      apply(event);
      paint();
      if (/^(HumanGate|WorkflowRun|StageCompleted|StageFailed|CheckpointSaved)/.test(event.event)) refreshSoon();
    };
    source.addEventListener("end", () => { source.close(); refreshSoon(); });
    cleanup.push(() => source.close());
  }

  // A waiting gate's accelerator keys answer it.
  const onKey = (e) => {
    if (e.ctrlKey || e.metaKey || e.altKey || /^(INPUT|TEXTAREA|SELECT)$/.test(e.target.tagName)) return;
    const button = gateBox.querySelector(`button[data-key="${CSS.escape(e.key.toUpperCase())}"]`);
    if (button) { e.preventDefault(); button.click(); }
  };
  document.addEventListener("keydown", onKey);
  cleanup.push(() => document.removeEventListener("keydown", onKey));

  if (!(await loadRun())) return;
  await drawGraph();
  connect();
}

// ---- start a run -------------------------------------------------------------------------------------

async function newPage() {
  const workflows = await api("/api/workflows");
  const files = workflows.ok ? workflows.body : [];
  const select = h("select", { id: "workflow" },
    h("option", { value: "" }, files.length ? "— choose a workflow file —" : "(no --workflows folder: paste a workflow below)"),
    files.map((f) => h("option", { value: f.path }, f.path + (f.name ? " · " + f.name : "") + (f.valid ? "" : f.needs_inputs ? " · needs inputs" : " · invalid"))));
  const source = h("textarea", { id: "source", rows: 12, placeholder: "…or paste a workflow (DOT or YAML)", spellcheck: "false" });
  const name = h("input", { type: "text", id: "name", value: "workflow.fabro" });
  const goal = h("input", { type: "text", id: "goal", placeholder: "Replace the workflow's goal (optional)" });
  const inputs = h("textarea", { id: "inputs", rows: 3, placeholder: "NAME=VALUE, one a line: what the workflow's {{ inputs.NAME }} read", spellcheck: "false" });
  const values = h("textarea", { id: "values", rows: 3, placeholder: "KEY=VALUE, one a line (JSON values are parsed)", spellcheck: "false" });
  const model = h("input", { type: "text", id: "model", placeholder: "For nodes that name none (optional)" });
  const provider = h("select", { id: "provider" },
    h("option", { value: "" }, "— the model's own, or the configured one —"),
    ["anthropic", "openai", "gemini", "openai-compatible", "local"].map((p) => h("option", { value: p }, p)));
  const simulate = h("input", { type: "checkbox", id: "simulate" });
  const dry = h("input", { type: "checkbox", id: "dry-run" });
  const report = h("div", { id: "diagnostics" });
  const message = h("div");

  function request() {
    const chosen = select.value;
    const body = chosen ? { workflow: chosen } : { source: source.value, name: name.value.trim() || "workflow.fabro" };
    return body;
  }

  function showReport(doc) {
    const file = (doc.files || [])[0];
    if (!file) { report.replaceChildren(); return; }
    const items = (file.diagnostics || []).map((d) =>
      h("li", { class: d.severity }, `${d.severity}[${d.rule}] ${file.file}:${d.line}:${d.column}: ${d.message}` + (d.help ? `\n  help: ${d.help}` : "")));
    const verdict = file.valid ? (file.warnings ? `Valid with ${file.warnings} warning(s).` : "Valid.")
      : file.needs_inputs ? `Needs inputs: give what the template(s) below name in Inputs (or Goal), ${file.errors} missing.`
      : `Invalid: ${file.errors} error(s), ${file.warnings} warning(s).`;
    const outline = file.workflow ? ` ${file.workflow.name}: ${file.workflow.nodes} nodes, ${file.workflow.edges} edges.` : "";
    report.replaceChildren(h("div", { class: "notice" + (file.valid ? "" : " error"), id: "verdict" }, verdict + outline), h("ul", { class: "diagnostics" }, items));
  }

  async function check() {
    const body = request();
    if (!body.workflow && !body.source.trim()) { report.replaceChildren(); return; }
    try { body.input = parseLines(inputs, "inputs", false); } catch (_) { /* said when it starts */ }
    const answer = await api("/api/validate", { json: body });
    if (answer.ok) showReport(answer.body);
    else report.replaceChildren(h("div", { class: "notice error" }, answer.body.error || "cannot validate"));
  }

  // KEY=VALUE lines as an object; with `json`, a value that parses as JSON is taken as such.
  function parseLines(field, what, json) {
    const out = {};
    for (const line of field.value.split("\n")) {
      if (!line.trim()) continue;
      const at = line.indexOf("=");
      if (at <= 0) throw new Error(what + " are KEY=VALUE lines: " + line);
      const key = line.slice(0, at).trim(), raw = line.slice(at + 1);
      if (!json) { out[key] = raw; continue; }
      try { out[key] = JSON.parse(raw); } catch (_) { out[key] = raw; }
    }
    return out;
  }

  async function start(e) {
    e.preventDefault();
    clearTimeout(typing);
    let set, input;
    try {
      set = parseLines(values, "values", true);
      input = parseLines(inputs, "inputs", false);
    } catch (error) { message.replaceChildren(h("div", { class: "notice error" }, error.message)); return; }
    const body = { ...request(), set, input, simulate: simulate.checked, dry_run: dry.checked };
    if (goal.value.trim()) body.goal = goal.value.trim();
    if (model.value.trim()) body.model = model.value.trim();
    if (provider.value) body.provider = provider.value;
    const answer = await api("/api/runs", { json: body });
    if (answer.status === 201) { location.hash = "#/runs/" + answer.body.id; return; }
    if (answer.status === 422 && answer.body.files) { showReport(answer.body); message.replaceChildren(h("div", { class: "notice error" }, "The workflow has errors; fix them first.")); return; }
    message.replaceChildren(h("div", { class: "notice error" }, answer.body.error || "the run did not start"));
  }

  let typing = null;
  select.addEventListener("change", () => { source.disabled = !!select.value; name.disabled = !!select.value; check(); });
  source.addEventListener("input", () => { clearTimeout(typing); typing = setTimeout(check, 400); });
  inputs.addEventListener("input", () => { clearTimeout(typing); typing = setTimeout(check, 400); });
  simulate.addEventListener("change", () => { if (simulate.checked) dry.checked = false; });
  dry.addEventListener("change", () => { if (dry.checked) simulate.checked = false; });

  show(h("h1", {}, "Start a run"),
    h("form", { class: "panel", id: "start-form", onsubmit: start },
      h("div", { class: "grid2" },
        h("div", {},
          h("label", { for: "workflow" }, "Workflow"), select,
          h("label", { for: "source" }, "Or its source"), source,
          h("label", { for: "name" }, "File name of the pasted source"), name),
        h("div", {},
          h("label", { for: "goal" }, "Goal"), goal,
          h("label", { for: "inputs" }, "Inputs"), inputs,
          h("label", { for: "values" }, "Values"), values,
          h("label", { for: "model" }, "Model"), model,
          h("label", { for: "provider" }, "Provider"), provider,
          h("div", { class: "checks" },
            h("label", {}, simulate, "Simulate models (run commands and gates)"),
            h("label", {}, dry, "Dry run (nothing runs)")),
          h("div", { style: "margin-top: 12px; display: flex; gap: 8px" },
            h("button", { type: "button", onclick: check }, "Check"),
            h("button", { type: "submit", class: "primary", id: "start" }, "Start")),
          message, report))));
}

// ---- routing ----------------------------------------------------------------------------------------

async function route() {
  for (const undo of cleanup) undo();
  cleanup = [];
  const hash = location.hash || "#/";
  document.getElementById("nav-runs").classList.toggle("active", hash === "#/" || hash.startsWith("#/runs"));
  document.getElementById("nav-new").classList.toggle("active", hash === "#/new");
  const run = hash.match(/^#\/runs\/([A-Za-z0-9]+)$/);
  try {
    if (run) await runPage(run[1]);
    else if (hash === "#/new") await newPage();
    else await runsPage();
  } catch (error) {
    show(h("div", { class: "notice error" }, "Something went wrong: " + error.message));
  }
}

window.addEventListener("hashchange", route);
route();
