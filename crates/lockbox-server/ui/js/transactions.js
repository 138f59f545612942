// Transactions of the server's state directory (lockbox txn pipeline|gather): stages,
// outcome, conflicts, abort reason.

import { get, seg } from "./api.js";
import { h, fill, empty, when } from "./dom.js";
import { nameText, nameNode, visible } from "./names.js";

function reasonText(r) {
  if (!r) return "";
  const stage = r.name !== undefined ? `stage ${r.stage + 1} "${visible(r.name)}"` : "";
  switch (r.reason) {
    case "stage_failed":
      return `${stage} failed with exit code ${r.exit_code}`;
    case "outside_writable":
      return `${stage} wrote outside its writable paths: ${(r.paths || []).map(nameText).join(", ")}`;
    case "timed_out":
      return `${stage} timed out`;
    case "setup_failed":
      return `${stage} could not be set up: ${visible(r.message || "")}`;
    case "conflicts":
      return `${r.count} conflict${r.count === 1 ? "" : "s"}: the workdir changed under it`;
    case "dry_run":
      return "a dry run (nothing was to be committed)";
    case "aborted":
      return "aborted by the caller";
    default:
      return visible(JSON.stringify(r));
  }
}

function stageText(s) {
  const how = s.setup_error ? `setup failed: ${s.setup_error}` : s.timed_out ? "timed out" : s.signal ? `signal ${s.signal}` : `exit ${s.exit_code}`;
  return `${visible(s.name)} (${how})`;
}

function outcomeText(t) {
  if (t.state === "damaged") return `damaged record: ${t.error || ""}`;
  if (t.abort_reason) return `aborted: ${reasonText(t.abort_reason)}`;
  if (t.report) return `committed: ${reportText(t.report)}`;
  return t.state;
}

function reportText(r) {
  const parts = [];
  for (const [k, v] of Object.entries(r || {})) {
    if (typeof v === "number") parts.push(`${v} ${k.replaceAll("_", " ")}`);
    else if (Array.isArray(v)) parts.push(`${v.length} ${k.replaceAll("_", " ")}`);
  }
  return parts.join(", ");
}

function conflictsOf(t) {
  const c = (t.report && t.report.conflicts) || t.conflicts;
  return Array.isArray(c) ? c : [];
}

export async function txnList(view) {
  document.title = "Transactions · lockbox console";
  const { transactions } = await get("/v1/transactions");
  fill(view, h("h1", {}, "Transactions"), h("p", { class: "muted" }, "Pipelines and gathers of this state directory (lockbox txn), prepared or finished."));
  if (!transactions.length) {
    view.appendChild(empty("No transactions: none was run with this state directory."));
    return;
  }
  const rows = transactions.map((t) =>
    h(
      "tr",
      {},
      h("td", {}, t.id ? h("a", { href: `#/transactions/${seg(t.id)}` }, t.id) : nameText(t.dir)),
      h("td", {}, t.kind || ""),
      h("td", {}, h("span", { class: `state state-${t.state}` }, t.state)),
      h("td", {}, (t.stages || []).map(stageText).join(" → ")),
      h("td", {}, outcomeText(t)),
      h("td", { class: "num" }, String(conflictsOf(t).length || (t.abort_reason && t.abort_reason.count) || "")),
      h("td", { class: "name" }, t.workdir ? nameText(t.workdir) : ""),
    ),
  );
  view.appendChild(
    h(
      "div",
      { class: "table-wrap" },
      h(
        "table",
        { class: "list", id: "transactions" },
        h("thead", {}, h("tr", {}, ["Transaction", "Kind", "State", "Stages", "Outcome", "Conflicts", "Workdir", "Created"].map((c) => h("th", {}, c)))),
        h("tbody", {}, rows),
      ),
    ),
  );
}

export async function txnPage(view, id) {
  document.title = `Transaction ${id} · lockbox console`;
  const t = await get(`/v1/transactions/${seg(id)}`);
  const stages = (t.stages || []).map((s, i) =>
    h(
      "tr",
      {},
      h("td", { class: "num" }, String(i + 1)),
      h("td", {}, visible(s.name)),
      h("td", {}, s.setup_error ? `setup failed: ${visible(s.setup_error)}` : s.timed_out ? "timed out" : s.signal ? `signal ${s.signal}` : `exit ${s.exit_code}`),
      h("td", { class: "num" }, s.duration && typeof s.duration === "object" ? `${s.duration.secs}.${String(Math.floor((s.duration.nanos || 0) / 1e6)).padStart(3, "0")} s` : String(s.duration ?? "")),
      h("td", {}, String(s.attempts ?? "")),
      h("td", { class: "mono pre" }, visible(s.stderr_tail || "", true)),
    ),
  );
  const conflicts = conflictsOf(t);
  fill(
    view,
    h("h1", {}, "Transaction ", h("span", { class: "id" }, t.id)),
    h(
      "dl",
      { class: "meta" },
      h("dt", {}, "Kind"),
      h("dd", {}, t.kind),
      h("dt", {}, "State"),
      h("dd", {}, t.state),
      h("dt", {}, "Outcome"),
      h("dd", {}, outcomeText(t)),
      h("dt", {}, "Workdir"),
      h("dd", { class: "name" }, nameNode(t.workdir)),
      t.key ? [h("dt", {}, "Key"), h("dd", {}, visible(t.key))] : null,
      t.created ? [h("dt", {}, "Created"), h("dd", {}, when(t.created))] : null,
    ),
    h("h2", {}, "Stages"),
    stages.length
      ? h("div", { class: "table-wrap" }, h("table", { class: "list" }, h("thead", {}, h("tr", {}, ["#", "Stage", "Result", "Duration", "Attempts", "Last stderr"].map((c) => h("th", {}, c)))), h("tbody", {}, stages)))
      : empty("No stage ran."),
    h("h2", {}, "Conflicts"),
    conflicts.length ? h("ul", {}, conflicts.map((c) => h("li", { class: "name" }, nameText(c && typeof c === "object" && "path" in c ? c.path : c)))) : empty("No conflicts."),
  );
}
