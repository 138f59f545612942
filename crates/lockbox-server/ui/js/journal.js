// Journal runs (lockbox serve --journal URL): their status and steps.

import { get, seg } from "./api.js";
import { h, fill, empty, when } from "./dom.js";
import { visible } from "./names.js";

export async function journalList(view) {
  document.title = "Journal · lockbox console";
  const { journal, runs } = await get("/v1/journal/runs");
  fill(view, h("h1", {}, "Journal runs"));
  if (!journal) {
    view.appendChild(empty("No journal: start the server with --journal URL (or LOCKBOX_JOURNAL) to see durable runs here."));
    return;
  }
  view.appendChild(h("p", { class: "muted" }, "Journal: ", h("span", { class: "name" }, visible(journal))));
  if (!runs.length) {
    view.appendChild(empty("No runs in this journal yet."));
    return;
  }
  const rows = runs.map((r) =>
    h(
      "tr",
      {},
      h("td", {}, h("a", { href: `#/journal/${seg(r.id)}` }, r.id)),
      h("td", {}, h("span", { class: `state state-${r.status}` }, String(r.status))),
      h("td", { class: "num" }, String(r.steps ?? "")),
      h("td", { class: "num" }, String(r.entries ?? "")),
      h("td", {}, r.version ? visible(r.version) : ""),
      h("td", { class: "mono" }, r.metadata && Object.keys(r.metadata).length ? visible(JSON.stringify(r.metadata)) : ""),
    ),
  );
  view.appendChild(
    h(
      "div",
      { class: "table-wrap" },
      h("table", { class: "list", id: "runs" }, h("thead", {}, h("tr", {}, ["Run", "Status", "Steps", "Entries", "Version", "Metadata"].map((c) => h("th", {}, c)))), h("tbody", {}, rows)),
    ),
  );
}

export async function journalPage(view, id) {
  document.title = `Run ${id} · lockbox console`;
  const run = await get(`/v1/journal/runs/${seg(id)}`);
  const entries = run.entries || [];
  fill(
    view,
    h("h1", {}, "Journal run ", h("span", { class: "id" }, id)),
    h("dl", { class: "meta" }, h("dt", {}, "Status"), h("dd", {}, String(run.status)), h("dt", {}, "Steps"), h("dd", {}, String(run.steps ?? "")), h("dt", {}, "Entries"), h("dd", {}, String(entries.length))),
    h("h2", {}, "Entries"),
    entries.length
      ? h(
          "ol",
          { class: "entries" },
          entries.map((e) => h("li", { class: "mono pre" }, visible(JSON.stringify(e, null, 1), true), e.at || e.time ? ` ${when(e.at || e.time)}` : "")),
        )
      : empty("No entries."),
  );
}
