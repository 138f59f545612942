// Sandboxes: the list, one sandbox (sessions, processes, its changes), a process's
// terminal (the PTY WebSocket) and a process's log following (SSE).

import { get, post, seg } from "./api.js";
import { h, fill, empty, errorBox, when, bytes } from "./dom.js";
import { nameNode, nameQuery, visible } from "./names.js";
import { review } from "./review.js";
import { commandText } from "./branches.js";
import { Terminal } from "./terminal.js";

function labelsText(labels) {
  const entries = Object.entries(labels || {});
  return entries.length ? entries.map(([k, v]) => `${visible(k)}=${visible(String(v))}`).join(", ") : "";
}

function duration(ms) {
  if (ms < 1000) return `${ms} ms`;
  if (ms < 60_000) return `${(ms / 1000).toFixed(ms < 10_000 ? 1 : 0)} s`;
  if (ms < 3_600_000) return `${Math.round(ms / 60_000)} min`;
  return `${(ms / 3_600_000).toFixed(1)} h`;
}

function netText(p) {
  const n = p.net_destinations.length;
  switch (p.net) {
    case "none":
      return "no network (loopback only)";
    case "host":
      return "the host's network";
    case "allow":
      return `only ${n} destination${n === 1 ? "" : "s"}`;
    case "deny":
      return `all but ${n} destination${n === 1 ? "" : "s"}`;
    default:
      return visible(String(p.net));
  }
}

function limitsText(p) {
  const out = [];
  if (p.max_memory_bytes !== null) out.push(`memory ${bytes(p.max_memory_bytes)}`);
  if (p.max_processes !== null) out.push(`${p.max_processes} processes`);
  if (p.max_cpu_time_ms !== null) out.push(`CPU ${duration(p.max_cpu_time_ms)} per process`);
  if (p.max_file_size_bytes !== null) out.push(`files up to ${bytes(p.max_file_size_bytes)}`);
  return out.length ? out.join(", ") : "none set";
}

/** One line for the list: network, direct host writes, limits. */
function policyLine(p) {
  if (!p) return "unknown";
  const parts = [netText(p)];
  if (p.fs_writable.length) parts.push(`writes ${p.fs_writable.length} host path${p.fs_writable.length === 1 ? "" : "s"}`);
  const limits = limitsText(p);
  if (limits !== "none set") parts.push(limits);
  return parts.join(" · ");
}

/** One line for the list: processes, memory, CPU. */
function usageLine(u) {
  if (!u) return "";
  return `${u.processes} proc, ${bytes(u.rss_bytes)}, CPU ${duration(u.cpu_ms)}`;
}

function pathList(list) {
  return list.length ? h("ul", { class: "paths" }, list.map((p) => h("li", { class: "name" }, nameNode(p)))) : "none";
}

/** The sandbox page's "Policy" definitions. */
function policyFields(p, workdir) {
  if (!p) return [h("dt", {}, "Policy"), h("dd", {}, "unknown (its spec could not be read)")];
  return [
    h("dt", {}, "Network"),
    h("dd", {}, netText(p), p.net_destinations.length ? h("ul", { class: "paths" }, p.net_destinations.map((d) => h("li", { class: "mono" }, visible(String(d))))) : null),
    h("dt", {}, "Reads"),
    h("dd", {}, p.default_reads ? "the default system paths" : "no default system paths", p.fs_readable.length ? [", and:", pathList(p.fs_readable)] : null),
    h("dt", {}, "Writes to the host"),
    h("dd", { id: "policy-writes" }, p.fs_writable.length ? pathList(p.fs_writable) : workdir ? "none (the workdir is written through its branch)" : "none"),
    h("dt", {}, "Limits"),
    h("dd", {}, limitsText(p)),
    h("dt", {}, "Idle timeout"),
    h("dd", {}, p.idle_timeout_ms === null ? "none" : duration(p.idle_timeout_ms)),
  ];
}

function usageText(u) {
  if (!u) return "not running";
  return `${u.processes} process${u.processes === 1 ? "" : "es"} (${u.threads} thread${u.threads === 1 ? "" : "s"}), ${bytes(u.rss_bytes)} resident, CPU ${duration(u.cpu_ms)}`;
}

export async function sandboxList(view) {
  document.title = "Sandboxes · lockbox console";
  const { sandboxes } = await get("/v1/sandboxes");
  fill(view, h("h1", {}, "Sandboxes"), h("p", { class: "muted" }, "Sandboxes of this server: running ones and recently stopped ones."));
  if (!sandboxes.length) {
    view.appendChild(empty("No sandboxes: none was created on this server yet (POST /v1/sandboxes, or the Python Client)."));
    return;
  }
  const rows = sandboxes.map((sb) =>
    h(
      "tr",
      {},
      h("td", {}, h("a", { href: `#/sandboxes/${seg(sb.id)}`, class: "sandbox-link" }, sb.id)),
      h("td", {}, h("span", { class: `state state-${sb.state}` }, sb.state)),
      h("td", { class: "num" }, String(sb.sessions ?? "")),
      h("td", { class: "num" }, String(sb.processes ?? "")),
      h("td", { class: "name" }, sb.workdir ? nameNode(sb.workdir) : "none"),
      h("td", {}, labelsText(sb.labels) || "none"),
      h("td", { class: "policy" }, policyLine(sb.policy)),
      h("td", { class: "usage" }, usageLine(sb.usage)),
      h("td", {}, when(sb.created_at)),
    ),
  );
  view.appendChild(
    h(
      "div",
      { class: "table-wrap" },
      h(
        "table",
        { class: "list", id: "sandboxes" },
        h("thead", {}, h("tr", {}, ["Sandbox", "State", "Sessions", "Processes", "Workdir", "Labels", "Policy", "Use now", "Created"].map((t) => h("th", {}, t)))),
        h("tbody", {}, rows),
      ),
    ),
  );
}

export async function sandboxPage(view, id) {
  document.title = `Sandbox ${id} · lockbox console`;
  const base = `/v1/sandboxes/${seg(id)}`;
  const [sb, sessions, processes, ports] = await Promise.all([
    get(base),
    get(`${base}/sessions`).catch((e) => e),
    get(`${base}/processes`).catch((e) => e),
    get(`${base}/ports`).catch((e) => e),
  ]);
  const message = h("div", { class: "status", role: "status" });
  const usage = h("dd", { id: "usage" }, usageText(sb.usage));
  // Resource use changes while the page is open: read it again every 2 s.
  const timer = sb.state === "running" ? setInterval(async () => {
    try {
      usage.textContent = usageText((await get(base)).usage);
    } catch {
      clearInterval(timer);
    }
  }, 2000) : 0;
  const stop = () => clearInterval(timer);
  const newTerminal = h(
    "button",
    {
      type: "button",
      id: "new-terminal",
      onclick: async () => {
        try {
          const size = { cols: 100, rows: 30 };
          // xterm.js (js/terminal.js) is an xterm: programs may use its colours and keys.
          const p = await post(`${base}/processes`, { argv: ["bash", "-i"], env: { TERM: "xterm-256color" }, pty: size });
          location.hash = `#/sandboxes/${seg(id)}/terminal/${seg(p.id)}`;
        } catch (err) {
          fill(message, errorBox(err));
        }
      },
    },
    "New terminal",
  );
  fill(
    view,
    h("div", { class: "page-head" }, h("h1", {}, "Sandbox ", h("span", { class: "id" }, sb.id)), sb.state === "running" ? newTerminal : null),
    message,
    h(
      "dl",
      { class: "meta" },
      h("dt", {}, "State"),
      h("dd", {}, h("span", { class: `state state-${sb.state}` }, sb.state)),
      h("dt", {}, "Created"),
      h("dd", {}, when(sb.created_at)),
      h("dt", {}, "Workdir"),
      h("dd", { class: "name" }, sb.workdir ? nameNode(sb.workdir) : "none (no copy-on-write branch)"),
      sb.branch ? [h("dt", {}, "Branch"), h("dd", {}, String(sb.branch))] : null,
      h("dt", {}, "Labels"),
      h("dd", {}, labelsText(sb.labels) || "none"),
      h("dt", {}, "Use now"),
      usage,
      policyFields(sb.policy, Boolean(sb.workdir)),
    ),
    h("h2", {}, "Sessions"),
    sessionsTable(sessions),
    h("h2", {}, "Processes"),
    processesTable(id, processes),
    h("h2", {}, "Exposed ports"),
    portsTable(ports),
  );
  if (!sb.workdir) return stop;
  view.appendChild(h("h2", {}, "Changes"));
  const box = h("div", { class: "review" });
  view.appendChild(box);
  let reviewDone;
  try {
    reviewDone = await review(box, {
      canDrop: false,
      keepLabel: "Back to the list",
      load: async () => (await get(`${base}/changes`)).changes || [],
      diff: (name) => get(`${base}/diff?${nameQuery(name)}`),
      commit: (body) => post(`${base}/commit`, body),
      abort: () => post(`${base}/abort`),
      keep() {
        location.hash = "#/sandboxes";
      },
      done(text) {
        fill(box, h("p", { class: "ok" }, text));
      },
    });
  } catch (err) {
    stop();
    throw err;
  }
  return () => {
    stop();
    if (reviewDone) reviewDone();
  };
}

function sessionsTable(reply) {
  if (reply instanceof Error) return errorBox(reply);
  const list = reply.sessions || [];
  if (!list.length) return empty("No sessions: exec calls create the default session on first use.");
  return h(
    "div",
    { class: "table-wrap" },
    h(
      "table",
      { class: "list", id: "sessions" },
      h("thead", {}, h("tr", {}, ["Session", "Shell pid", "Busy", "Created"].map((t) => h("th", {}, t)))),
      h("tbody", {}, list.map((s) => h("tr", {}, h("td", {}, visible(String(s.id))), h("td", { class: "num" }, String(s.pid)), h("td", {}, s.busy ? "running a command" : "idle"), h("td", {}, when(s.created_at))))),
    ),
  );
}

// A port's pages open on the port's own origin (its open_url sets its access cookie there),
// never on this one: what they set cannot reach the console (docs/server.md, "Exposed ports").
function portsTable(reply) {
  if (reply instanceof Error) return errorBox(reply);
  const list = reply.ports || [];
  if (!list.length) return empty("No exposed ports: expose one with POST /v1/sandboxes/{id}/ports.");
  const rows = list.map((p) =>
    h(
      "tr",
      {},
      h("td", { class: "num" }, String(p.port)),
      h("td", { class: "name" }, p.origin || "no ports listener (lockbox serve --ports-listen off)"),
      h("td", {}, p.host_address || ""),
      h("td", { class: "actions" }, p.open_url ? h("a", { href: p.open_url, target: "_blank", rel: "noopener noreferrer", class: "port-link" }, "Open") : null),
    ),
  );
  return h(
    "div",
    { class: "table-wrap" },
    h("table", { class: "list", id: "ports" }, h("thead", {}, h("tr", {}, ["Port", "Its origin", "Host loopback", ""].map((t) => h("th", {}, t)))), h("tbody", {}, rows)),
  );
}

function processesTable(id, reply) {
  if (reply instanceof Error) return errorBox(reply);
  const list = reply.processes || [];
  if (!list.length) return empty("No processes: start one with POST /v1/sandboxes/{id}/processes or New terminal.");
  const rows = list.map((p) => {
    const exit = p.state === "running" ? "" : p.signal ? `signal ${p.signal}` : p.exit_code !== null && p.exit_code !== undefined ? `exit ${p.exit_code}` : "";
    return h(
      "tr",
      {},
      h("td", {}, p.id),
      h("td", { class: "cmd" }, commandText(p.command)),
      h("td", {}, h("span", { class: `state state-${p.state}` }, p.state), exit ? ` (${exit})` : ""),
      h("td", {}, p.pty ? "PTY" : "pipes"),
      h("td", { class: "num" }, bytes(p.log_end)),
      h("td", {}, when(p.started_at)),
      h(
        "td",
        { class: "actions" },
        p.pty ? h("a", { href: `#/sandboxes/${seg(id)}/terminal/${seg(p.id)}`, class: "terminal-link" }, "Terminal") : null,
        " ",
        h("a", { href: `#/sandboxes/${seg(id)}/logs/${seg(p.id)}`, class: "logs-link" }, "Follow log"),
      ),
    );
  });
  return h(
    "div",
    { class: "table-wrap" },
    h("table", { class: "list", id: "processes" }, h("thead", {}, h("tr", {}, ["Process", "Command", "State", "I/O", "Output", "Started", ""].map((t) => h("th", {}, t)))), h("tbody", {}, rows)),
  );
}

export async function terminalPage(view, id, pid) {
  document.title = `Terminal ${pid} · lockbox console`;
  const state = h("span", { id: "terminal-state", class: "muted" }, "Connecting…");
  const term = new Terminal({ onInput: (bytes) => send(bytes), onResize: () => resize() });
  term.el.id = "terminal";
  // A line to send, for a phone's keyboard (which a focused <div> does not open) or a paste.
  const lineInput = h("input", { id: "terminal-line", type: "text", autocomplete: "off", autocapitalize: "off", spellcheck: "false", "aria-label": "A line to send" });
  const lineForm = h(
    "form",
    {
      class: "line-form",
      onsubmit: (e) => {
        e.preventDefault();
        send(encoder.encode(`${lineInput.value}\r`));
        lineInput.value = "";
      },
    },
    lineInput,
    h("button", { type: "submit" }, "Send line"),
  );
  fill(
    view,
    h(
      "div",
      { class: "page-head" },
      h("h1", {}, "Terminal ", h("span", { class: "id" }, pid), " in ", h("a", { href: `#/sandboxes/${seg(id)}` }, id)),
      state,
    ),
    h("p", { class: "muted" }, "Click the terminal and type; what the process printed so far is replayed first (5,000 lines kept above the screen). The screen takes the size of the window."),
    term.el,
    lineForm,
  );
  const proto = location.protocol === "https:" ? "wss:" : "ws:";
  const ws = new WebSocket(`${proto}//${location.host}/v1/sandboxes/${seg(id)}/processes/${seg(pid)}/pty`);
  ws.binaryType = "arraybuffer";
  const encoder = new TextEncoder();
  let open = false;
  function send(bytes) {
    if (open) ws.send(bytes);
  }
  function resize() {
    if (open) ws.send(JSON.stringify({ resize: term.size() }));
  }
  ws.addEventListener("open", () => {
    open = true;
    state.textContent = "Connected";
    state.dataset.connected = "yes";
    resize();
    term.focus();
  });
  ws.addEventListener("message", (e) => {
    if (typeof e.data !== "string") {
      term.write(new Uint8Array(e.data));
      return;
    }
    let msg = null;
    try {
      msg = JSON.parse(e.data);
    } catch {
      term.write(e.data);
      return;
    }
    if (msg && msg.exited) {
      const p = msg.exited;
      const how = p.signal ? `killed by signal ${p.signal}` : `exit code ${p.exit_code}`;
      term.note(`[the process exited: ${how}]`);
    } else if (msg && msg.error) {
      term.note(`[error: ${msg.error.message || msg.error.code}]`);
    } else {
      term.write(e.data);
    }
  });
  ws.addEventListener("close", (e) => {
    open = false;
    state.textContent = e.code === 1000 ? "Closed" : `Disconnected (${e.code}${e.reason ? `: ${e.reason}` : ""})`;
    state.dataset.connected = "no";
  });
  ws.addEventListener("error", () => {
    state.textContent = "The connection failed: is the process still there and are you logged in?";
  });
  return () => {
    ws.close();
    term.dispose();
  };
}

function decodeSegment(d) {
  if (typeof d.data === "string") return d.data;
  if (typeof d.data_b64 === "string") {
    const bin = atob(d.data_b64);
    const out = new Uint8Array(bin.length);
    for (let i = 0; i < bin.length; i += 1) out[i] = bin.charCodeAt(i);
    return out;
  }
  return "";
}

export async function logsPage(view, id, pid) {
  document.title = `Log of ${pid} · lockbox console`;
  const state = h("span", { id: "log-state", class: "muted" }, "Connecting…");
  const term = new Terminal({ readOnly: true });
  term.el.id = "log";
  fill(
    view,
    h("div", { class: "page-head" }, h("h1", {}, "Log of ", h("span", { class: "id" }, pid), " in ", h("a", { href: `#/sandboxes/${seg(id)}` }, id)), state),
    h("p", { class: "muted" }, "Following the process's output (stdout and stderr merged, as the log keeps them)."),
    term.el,
  );
  const es = new EventSource(`/v1/sandboxes/${seg(id)}/processes/${seg(pid)}/logs?follow=true`);
  const onData = (e) => {
    try {
      term.write(decodeSegment(JSON.parse(e.data)));
    } catch {
      term.write(e.data);
    }
  };
  for (const name of ["stdout", "stderr", "pty"]) es.addEventListener(name, onData);
  es.addEventListener("open", () => {
    state.textContent = "Following";
  });
  es.addEventListener("truncated", () => term.note("[older output was evicted from the log]"));
  es.addEventListener("eof", () => {
    term.note("[the process exited; all its output is shown]");
    state.textContent = "Finished";
    es.close();
  });
  es.addEventListener("error", () => {
    if (es.readyState === EventSource.CLOSED) state.textContent = "The log cannot be followed (logged out, or the process is gone).";
    else state.textContent = "Connection lost; reconnecting…";
  });
  return () => {
    es.close();
    term.dispose();
  };
}
