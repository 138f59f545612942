// Kept branches: the list and one branch's review page.

import { get, post, seg } from "./api.js";
import { h, fill, empty, when } from "./dom.js";
import { nameText, nameNode, nameQuery, visible } from "./names.js";
import { review } from "./review.js";

let notice = "";

export async function branchList(view) {
  document.title = "Branches · lockbox console";
  const flash = notice;
  notice = "";
  const { branches } = await get("/v1/branches");
  fill(
    view,
    h("h1", {}, "Kept branches"),
    flash ? h("p", { class: "ok", id: "notice" }, flash) : null,
    h("p", { class: "muted" }, "Changes that runs left for review (lockbox run --workdir DIR --on-exit keep, or a failed run). Open one to review and commit it."),
  );
  if (!branches.length) {
    view.appendChild(empty("No kept branches: every run's changes were committed or aborted."));
    return;
  }
  const rows = branches.map((b) =>
    h(
      "tr",
      {},
      h("td", {}, h("a", { href: `#/branches/${seg(b.id)}`, class: "branch-link" }, b.id)),
      h("td", { class: "name" }, nameNode(b.workdir)),
      h("td", {}, b.state),
      h("td", { class: "num" }, b.changes === null || b.changes === undefined ? "unknown" : String(b.changes)),
      h("td", {}, when(b.created)),
      h("td", { class: "cmd" }, commandText(b.command)),
    ),
  );
  view.appendChild(
    h(
      "div",
      { class: "table-wrap" },
      h("table", { class: "list", id: "branches" }, h("thead", {}, h("tr", {}, ["Branch", "Workdir", "State", "Changes", "Created", "Command"].map((t) => h("th", {}, t)))), h("tbody", {}, rows)),
    ),
  );
}

/** An argv as a shell would take it back: arguments with spaces or quotes single-quoted. */
export function commandText(cmd) {
  if (!cmd) return "";
  if (!Array.isArray(cmd)) return visible(String(cmd));
  return cmd
    .map((a) => {
      const text = visible(typeof a === "string" ? a : nameText(a));
      return /^[A-Za-z0-9_@%+=:,./-]+$/.test(text) ? text : `'${text.replaceAll("'", "'\\''")}'`;
    })
    .join(" ");
}

export async function branchPage(view, id) {
  document.title = `Branch ${id} · lockbox console`;
  const base = `/v1/branches/${seg(id)}`;
  const head = h("div", { class: "page-head" }, h("h1", {}, "Review branch ", h("span", { class: "id" }, id)));
  const meta = h("dl", { class: "meta" });
  view.append(head, meta);
  const reviewBox = h("div", { class: "review" });
  view.appendChild(reviewBox);
  let first = true;
  return review(reviewBox, {
    canDrop: true,
    async load() {
      const b = await get(base);
      if (first) {
        first = false;
        fill(
          meta,
          h("dt", {}, "Workdir"),
          h("dd", { class: "name" }, nameNode(b.workdir)),
          h("dt", {}, "Command"),
          h("dd", { class: "cmd clamp", title: commandText(b.command) }, commandText(b.command)),
          h("dt", {}, "Created"),
          h("dd", {}, when(b.created)),
          h("dt", {}, "State"),
          h("dd", { title: b.status || "" }, b.state),
        );
      }
      return b.change_list || [];
    },
    diff: (name) => get(`${base}/diff?${nameQuery(name)}`),
    commit: (body) => post(`${base}/commit`, body),
    abort: () => post(`${base}/abort`),
    keep() {
      notice = `Branch ${id} is kept as it was; review it later.`;
      location.hash = "#/branches";
    },
    done(text) {
      notice = `Branch ${id}: ${text}`;
      location.hash = "#/branches";
    },
  });
}
