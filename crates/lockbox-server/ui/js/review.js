// The change review: a file tree of the change set and one file's diff at a time (fetched
// when the file is selected, so a 1,000-file change set shows at once), with accept/reject
// per file and per hunk, and Commit / Keep / Abort.
//
// A commit names what this page showed (`review`: each listed path with the digest of the
// content shown, the diff's when it was opened), so the server refuses (409 STALE_REVIEW)
// to write anything else: a file changed or added since, by a sandbox still running. Then
// the page reloads the changes. Hunks beyond what a diff displays are rejected, never
// accepted unseen (issue 32).
//
// `source` adapts a kept branch or a live sandbox:
//   {load() → [Change], diff(name) → diff reply, commit(body) → reply, abort(), canDrop,
//    done(text) (after a commit that removed it / an abort), keep()}

import { h, fill, empty, errorBox, bytes } from "./dom.js";
import { nameText, nameNode, nameKey, nameSort, visible } from "./names.js";

const KIND = { added: "A", modified: "M", deleted: "D", type_changed: "T" };
const KIND_WORD = { added: "added", modified: "modified", deleted: "deleted", type_changed: "type changed" };
const MAX_LINES = 20000;
const FIRST_ROWS = 120;

export function reviewHelp() {
  return "Keys: j / k next / previous hunk · n / p next / previous file · a accept · r reject (hunk, or file when it has no hunks) · A / R whole file · v unified / side by side · ? this help";
}

export async function review(container, source) {
  const started = performance.now();
  const state = {
    files: [],
    current: -1,
    hunk: -1,
    mode: localStorage.getItem("lockbox.diffMode") === "split" ? "split" : "unified",
    token: 0,
  };

  const status = h("div", { id: "review-status", class: "status", role: "status" });
  const tree = h("div", { id: "file-tree", class: "tree", role: "listbox", "aria-label": "Changed files", onclick: (e) => onTreeClick(e) });
  const diff = h("section", { id: "diff", class: "diff", "aria-live": "polite" });
  const help = h("p", { id: "help", class: "help" }, reviewHelp());
  const modeButton = h("button", { id: "toggle-mode", type: "button", onclick: () => setMode(state.mode === "split" ? "unified" : "split") });
  const rest = source.canDrop
    ? h(
        "select",
        { id: "rest", "aria-label": "What happens to rejected changes" },
        h("option", { value: "keep" }, "Rejected changes stay in the branch"),
        h("option", { value: "drop" }, "Rejected changes are dropped"),
      )
    : null;
  const commitButton = h("button", { id: "commit", type: "button", class: "primary", onclick: () => commit(false) }, "Commit accepted");
  const keepButton = h("button", { id: "keep", type: "button", onclick: () => source.keep() }, source.keepLabel || "Keep for later");
  const abortButton = h("button", { id: "abort", type: "button", class: "danger", onclick: abort }, "Abort");
  const summary = h("span", { id: "decision-summary", class: "muted" });
  const toolbar = h("div", { class: "toolbar" }, modeButton, rest, commitButton, keepButton, abortButton, summary);
  const panes = h("div", { class: "panes" }, tree, diff);
  container.append(toolbar, help, status, panes);

  let changes;
  try {
    changes = await source.load();
  } catch (err) {
    fill(panes, errorBox(err));
    return () => {};
  }
  setFiles(changes);
  performance.mark("review-tree-rendered");
  container.dataset.loadMs = String(Math.round(performance.now() - started));
  // The first frame with the tree on screen (after style, layout and paint).
  updateMode();
  requestAnimationFrame(() =>
    setTimeout(() => {
      // The first file's diff only after the tree is on screen.
      if (state.files.length && state.current < 0) select(0, 0);
    }, 0),
  );

  const onKey = (event) => keyboard(event);
  document.addEventListener("keydown", onKey);
  return () => document.removeEventListener("keydown", onKey);

  function setFiles(list) {
    state.files = list
      .map((change) => ({
        change,
        key: nameKey(change.path),
        sort: nameSort(change.path),
        accept: true,
        hunks: null,
        diff: null,
        row: null,
      }))
      .sort((a, b) => (a.sort < b.sort ? -1 : a.sort > b.sort ? 1 : 0));
    renderTree();
    if (!state.files.length) {
      fill(diff, empty("No changes: nothing to review."));
      commitButton.disabled = true;
    }
  }

  function renderTree() {
    // One row is built once and cloned (faster than building 1,000 rows element by element);
    // clicks are handled once on the tree (see onTreeClick).
    const proto = h(
      "div",
      { class: "file", role: "option" },
      h("button", { type: "button", class: "decide", title: "Accept or reject this file" }),
      h("span", { class: "kind" }),
      h("span", { class: "name" }),
      h("span", { class: "size" }),
    );
    let dir = null;
    const build = (from, to) => {
      const frag = document.createDocumentFragment();
      for (let i = from; i < to; i += 1) {
        const file = state.files[i];
        const raw = typeof file.change.path === "string" ? file.change.path : null;
        const slash = raw === null ? -1 : raw.lastIndexOf("/");
        const d = slash >= 0 ? raw.slice(0, slash + 1) : "";
        if (d !== dir) {
          dir = d;
          if (d) frag.appendChild(h("div", { class: "dir" }, nameNode(d)));
        }
        const kind = KIND[file.change.kind] || "?";
        const row = proto.cloneNode(true);
        row.dataset.index = String(i);
        const [, kindEl, nameEl, sizeEl] = row.children;
        kindEl.className = `kind kind-${kind}`;
        kindEl.title = KIND_WORD[file.change.kind] || file.change.kind;
        kindEl.textContent = kind;
        if (d) nameEl.className = "name nested";
        nameEl.title = nameText(file.change.path);
        nameEl.appendChild(slash >= 0 ? nameNode(raw.slice(slash + 1)) : nameNode(file.change.path));
        if (file.change.size !== null && file.change.size !== undefined) sizeEl.textContent = bytes(file.change.size);
        file.row = row;
        paintFile(file);
        frag.appendChild(row);
      }
      return frag;
    };
    // A screenful and more now; the rest right after the first paint.
    const first = Math.min(FIRST_ROWS, state.files.length);
    fill(tree, build(0, first));
    // After the next frame (style, layout, paint: the tree is on screen), the rest.
    requestAnimationFrame(() =>
      setTimeout(() => {
        performance.mark("review-tree-painted");
        if (first < state.files.length) tree.appendChild(build(first, state.files.length));
        performance.mark("review-tree-complete");
      }, 0),
    );
    updateSummary();
  }

  function onTreeClick(event) {
    const row = event.target.closest(".file");
    if (!row) return;
    const i = Number(row.dataset.index);
    const file = state.files[i];
    if (!file) return;
    if (event.target.closest(".decide")) decideFile(i, fileStatus(file) === "rejected");
    else select(i, 0);
  }

  function fileStatus(file) {
    if (!file.hunks || !file.hunks.length) return file.accept ? "accepted" : "rejected";
    const n = file.hunks.filter(Boolean).length;
    if (n === file.hunks.length) return "accepted";
    if (n === 0) return "rejected";
    return "partial";
  }

  function paintFile(file) {
    if (!file.row) return; // not built yet: built with its current status
    const st = fileStatus(file);
    file.row.dataset.status = st;
    const b = file.row.firstChild;
    b.textContent = st === "accepted" ? "✓" : st === "rejected" ? "✗" : "◐";
    b.setAttribute("aria-label", st);
  }

  function updateSummary() {
    let acc = 0;
    let rej = 0;
    let part = 0;
    for (const f of state.files) {
      const st = fileStatus(f);
      if (st === "accepted") acc += 1;
      else if (st === "rejected") rej += 1;
      else part += 1;
    }
    const n = state.files.length;
    summary.textContent = `${n} file${n === 1 ? "" : "s"}: ${acc} accepted, ${part} in part, ${rej} rejected`;
  }

  function setMode(mode) {
    state.mode = mode;
    localStorage.setItem("lockbox.diffMode", mode);
    updateMode();
    if (state.current >= 0) renderDiff(state.files[state.current]);
  }

  function updateMode() {
    modeButton.textContent = state.mode === "split" ? "Unified view" : "Side-by-side view";
    diff.dataset.mode = state.mode;
  }

  async function select(i, hunk) {
    if (i < 0 || i >= state.files.length) return;
    const file = state.files[i];
    const prev = state.current >= 0 && state.files[state.current] ? state.files[state.current].row : null;
    if (prev) {
      prev.classList.remove("selected");
      prev.removeAttribute("aria-selected");
    }
    state.current = i;
    state.hunk = hunk;
    if (file.row) {
      file.row.classList.add("selected");
      file.row.setAttribute("aria-selected", "true");
      scrollIntoViewIfNeeded(file.row, tree);
    }
    if (!file.diff) {
      const token = ++state.token;
      fill(diff, h("p", { class: "muted" }, "Loading the diff of ", h("span", { class: "name" }, nameNode(file.change.path)), "…"));
      try {
        file.diff = await source.diff(file.change.path);
      } catch (err) {
        if (token === state.token) fill(diff, errorBox(err));
        return;
      }
      if (token !== state.token) return;
      // What the reviewer saw of this file: the diff's content, not the listing's.
      file.digest = file.diff.digest;
      if (file.diff.kind === "text") {
        file.shown = displayed(file.diff.hunks);
        file.hunks = file.diff.hunks.map((_, k) => file.accept && k < file.shown);
      }
    }
    if (hunk === "last") state.hunk = file.hunks && file.shown ? file.shown - 1 : 0;
    renderDiff(file);
  }

  function renderDiff(file) {
    const d = file.diff;
    const head = h(
      "div",
      { class: "diff-head" },
      h("span", { class: `kind kind-${KIND[file.change.kind]}` }, KIND[file.change.kind] || "?"),
      h("span", { class: "name path", id: "diff-path" }, nameNode(file.change.path)),
      h("span", { class: "muted" }, ` ${KIND_WORD[file.change.kind] || file.change.kind}`, file.change.mode ? ` · mode ${file.change.mode}` : "", file.change.size !== null && file.change.size !== undefined ? ` · ${bytes(file.change.size)}` : ""),
      h("button", { type: "button", class: "file-accept", onclick: () => decideFile(state.current, true) }, "Accept file"),
      h("button", { type: "button", class: "file-reject", onclick: () => decideFile(state.current, false) }, "Reject file"),
    );
    if (d.kind !== "text") {
      fill(diff, head, summaryBox(d));
      return;
    }
    if (!d.hunks.length) {
      fill(diff, head, empty("No line changes (only the file's metadata changed)."));
      return;
    }
    const body = h("div", { class: "hunks" });
    const shown = file.shown;
    for (let i = 0; i < shown; i += 1) body.appendChild(renderHunk(file, d.hunks[i], i));
    if (shown < d.hunks.length) {
      body.appendChild(h("p", { class: "muted", id: "hunks-not-shown" }, `Only the first ${shown} of ${d.hunks.length} hunks are shown (about ${MAX_LINES} lines); the other ${d.hunks.length - shown} are not committed from this page (they stay in the branch).`));
    }
    fill(diff, head, body);
    markHunk(false);
  }

  function renderHunk(file, hunk, i) {
    const accepted = file.hunks[i];
    const toggle = h(
      "button",
      { type: "button", class: "decide", onclick: () => decideHunk(i, !file.hunks[i]) },
      accepted ? "✓ accepted" : "✗ rejected",
    );
    const rows = state.mode === "split" ? splitRows(hunk) : unifiedRows(hunk);
    const el = h(
      "div",
      { class: `hunk ${accepted ? "accepted" : "rejected"}`, dataset: { hunk: String(i) }, onclick: () => { state.hunk = i; markHunk(false); } },
      h("div", { class: "hunk-head" }, toggle, h("code", {}, hunk.header)),
      h("div", { class: state.mode === "split" ? "lines split" : "lines unified" }, rows),
    );
    return el;
  }

  function unifiedRows(hunk) {
    const rows = [];
    let o = hunk.old_start;
    let n = hunk.new_start;
    for (const line of hunk.lines) {
      const cls = line.op === "+" ? "add" : line.op === "-" ? "del" : "ctx";
      rows.push(
        h(
          "div",
          { class: `line ${cls}` },
          h("span", { class: "ln" }, line.op === "+" ? "" : String(o)),
          h("span", { class: "ln" }, line.op === "-" ? "" : String(n)),
          h("span", { class: "op" }, line.op),
          h("span", { class: "code" }, visible(line.text, true)),
        ),
      );
      if (line.op !== "+") o += 1;
      if (line.op !== "-") n += 1;
    }
    noNewline(rows, hunk);
    return rows;
  }

  function splitRows(hunk) {
    const rows = [];
    let o = hunk.old_start;
    let n = hunk.new_start;
    const lines = hunk.lines;
    let i = 0;
    const cell = (cls, num, text) => [h("span", { class: `ln ${cls}` }, num), h("span", { class: `code ${cls}` }, text === null ? "" : visible(text, true))];
    while (i < lines.length) {
      if (lines[i].op === " ") {
        rows.push(h("div", { class: "line ctx" }, cell("ctx", String(o), lines[i].text), cell("ctx", String(n), lines[i].text)));
        o += 1;
        n += 1;
        i += 1;
        continue;
      }
      const dels = [];
      const adds = [];
      while (i < lines.length && lines[i].op === "-") dels.push(lines[i++]);
      while (i < lines.length && lines[i].op === "+") adds.push(lines[i++]);
      for (let k = 0; k < Math.max(dels.length, adds.length); k += 1) {
        const l = dels[k];
        const r = adds[k];
        rows.push(
          h(
            "div",
            { class: "line pair" },
            l ? cell("del", String(o++), l.text) : cell("none", "", null),
            r ? cell("add", String(n++), r.text) : cell("none", "", null),
          ),
        );
      }
    }
    noNewline(rows, hunk);
    return rows;
  }

  function noNewline(rows, hunk) {
    if (hunk.no_newline_old) rows.push(h("div", { class: "line note" }, "\\ No newline at end of the old file"));
    if (hunk.no_newline_new) rows.push(h("div", { class: "line note" }, "\\ No newline at end of the new file"));
  }

  function summaryBox(d) {
    const side = (s) => {
      if (!s || s.type === "absent") return "absent";
      if (s.type === "file") return `a file of ${bytes(s.size)} (${s.size} bytes)`;
      if (s.type === "dir") return "a directory";
      if (s.type === "symlink") return `a symbolic link to ${nameText(s.target)}`;
      return "a special file";
    };
    return h(
      "div",
      { class: "summary-box" },
      h("p", {}, "No line diff: binary, not UTF-8, large, or not a regular file on one side."),
      h("dl", {}, h("dt", {}, "Before"), h("dd", { class: "old-side" }, side(d.old)), h("dt", {}, "After"), h("dd", { class: "new-side" }, side(d.new))),
    );
  }

  function decideFile(i, accept) {
    const file = state.files[i];
    if (!file) return;
    file.accept = accept;
    // Only hunks on the page: one not displayed is never accepted unseen.
    if (file.hunks) file.hunks = file.hunks.map((_, k) => accept && k < file.shown);
    paintFile(file);
    updateSummary();
    if (i === state.current && file.diff) repaintHunks(file);
  }

  function decideHunk(i, accept) {
    const file = state.files[state.current];
    if (!file || !file.hunks || i < 0 || i >= file.shown) return;
    file.hunks[i] = accept;
    file.accept = file.hunks.some(Boolean);
    paintFile(file);
    updateSummary();
    repaintHunks(file);
  }

  function repaintHunks(file) {
    for (const el of diff.querySelectorAll(".hunk")) {
      const i = Number(el.dataset.hunk);
      const ok = file.hunks[i];
      el.classList.toggle("accepted", ok);
      el.classList.toggle("rejected", !ok);
      el.querySelector(".decide").textContent = ok ? "✓ accepted" : "✗ rejected";
    }
  }

  function markHunk(scroll) {
    for (const el of diff.querySelectorAll(".hunk.current")) el.classList.remove("current");
    const el = diff.querySelector(`.hunk[data-hunk="${state.hunk}"]`);
    if (el) {
      el.classList.add("current");
      if (scroll) el.scrollIntoView({ block: "nearest" });
    }
  }

  function hunkCount() {
    const f = state.files[state.current];
    return f && f.hunks ? f.shown : 0;
  }

  async function moveHunk(delta) {
    const count = hunkCount();
    const next = state.hunk + delta;
    if (next >= 0 && next < count) {
      state.hunk = next;
      markHunk(true);
    } else if (delta > 0 && state.current + 1 < state.files.length) {
      await select(state.current + 1, 0);
      markHunk(true);
    } else if (delta < 0 && state.current > 0) {
      await select(state.current - 1, "last");
      markHunk(true);
    }
  }

  function keyboard(event) {
    const t = event.target;
    if (event.ctrlKey || event.metaKey || event.altKey) return;
    if (t && (t.tagName === "INPUT" || t.tagName === "TEXTAREA" || t.tagName === "SELECT" || t.isContentEditable)) return;
    if (!state.files.length && event.key !== "?") return;
    const key = event.key;
    let handled = true;
    if (key === "j") moveHunk(1);
    else if (key === "k") moveHunk(-1);
    else if (key === "n") select(Math.min(state.current + 1, state.files.length - 1), 0);
    else if (key === "p") select(Math.max(state.current - 1, 0), 0);
    else if (key === "a" || key === "r") {
      if (hunkCount() > 0 && state.hunk >= 0) decideHunk(state.hunk, key === "a");
      else decideFile(state.current, key === "a");
    } else if (key === "A" || key === "R") decideFile(state.current, key === "A");
    else if (key === "v") setMode(state.mode === "split" ? "unified" : "split");
    else if (key === "?") help.classList.toggle("shown");
    else handled = false;
    if (handled) event.preventDefault();
  }

  function selection() {
    const exclude = [];
    const hunks = [];
    let any = false;
    for (const f of state.files) {
      const st = fileStatus(f);
      if (st === "rejected") exclude.push(f.change.path);
      else if (st === "partial") {
        any = true;
        hunks.push({ path: f.change.path, accept: f.hunks.flatMap((ok, i) => (ok ? [i] : [])) });
      } else any = true;
    }
    return { any, exclude, hunks };
  }

  async function commit(force) {
    const sel = selection();
    if (!sel.any) {
      fill(status, errorBox({ title: "Nothing accepted", message: "Every change is rejected: accept a file or a hunk to commit, or Abort to discard the branch." }));
      return;
    }
    // Every path listed, with the digest of what was shown of it.
    const review = state.files.map((f) => ({ path: f.change.path, digest: f.digest || f.change.digest }));
    const body = { exclude: sel.exclude, hunks: sel.hunks, force, review };
    if (rest) body.rest = rest.value;
    commitButton.disabled = true;
    fill(status, h("p", { class: "muted" }, "Committing…"));
    try {
      const reply = await source.commit(body);
      const report = reply && reply.report ? reply.report : reply;
      const remaining = reply && typeof reply.remaining === "number" ? reply.remaining : null;
      const words = reportWords(report);
      if ((rest && rest.value === "drop") || remaining === 0) {
        source.done(`Committed${words}. Nothing is left in the branch.`);
        return;
      }
      const list = await source.load();
      setFiles(list);
      fill(status, h("p", { class: "ok", id: "commit-result" }, `Committed${words}. ${list.length} change${list.length === 1 ? "" : "s"} left in the branch.`));
      if (state.files.length) {
        state.current = -1;
        select(0, 0);
      }
    } catch (err) {
      if (err.code === "CONFLICT") {
        fill(status, conflictBox(err));
      } else if (err.code === "STALE_REVIEW") {
        // The branch changed since this page showed it: show it again, decisions reset.
        try {
          setFiles(await source.load());
        } catch (again) {
          fill(status, errorBox(again));
          return;
        }
        fill(status, staleBox(err));
        if (state.files.length) {
          state.current = -1;
          select(0, 0);
        }
      } else if (err.code === "PART_COMMIT_FINISHED") {
        // An earlier partial commit, cut short (a crash), was finished instead: the diff
        // changed under the decisions on this page, so show it again.
        try {
          setFiles(await source.load());
        } catch (again) {
          fill(status, errorBox(again));
          return;
        }
        fill(status, errorBox({ title: "An interrupted commit was finished first", message: `${err.message}. The changes below are what is left; decide again.` }));
        if (state.files.length) {
          state.current = -1;
          select(0, 0);
        }
      } else {
        fill(status, errorBox(err));
      }
    } finally {
      commitButton.disabled = !state.files.length;
    }
  }

  function staleBox(err) {
    const paths = conflictPaths(err.details);
    return h(
      "div",
      { class: "error-box conflict", role: "alert", id: "stale-review" },
      h("strong", {}, "The changes are not what this page showed"),
      h("p", {}, "Nothing was committed: the branch changed after it was shown (a sandbox still running can write to it), at these paths. The changes were loaded again; review them and decide again."),
      paths.length ? h("ul", {}, paths.map((p) => h("li", { class: "name" }, nameNode(p)))) : null,
    );
  }

  function conflictBox(err) {
    const paths = conflictPaths(err.details);
    return h(
      "div",
      { class: "error-box conflict", role: "alert", id: "conflict" },
      h("strong", {}, "The workdir changed since this branch was made"),
      h("p", {}, "Committing now would overwrite changes made in the workdir after the agent started (a stale base). ", err.message),
      paths.length ? h("ul", {}, paths.map((p) => h("li", { class: "name" }, nameNode(p)))) : null,
      h("p", {}, "Look at the workdir first; commit anyway only if the branch's version should win."),
      h("button", { type: "button", id: "force", class: "danger", onclick: () => commit(true) }, "Commit anyway (force)"),
    );
  }

  async function abort() {
    if (abortButton.dataset.armed !== "yes") {
      abortButton.dataset.armed = "yes";
      abortButton.textContent = "Really abort? Click again";
      setTimeout(() => {
        abortButton.dataset.armed = "";
        abortButton.textContent = "Abort";
      }, 5000);
      return;
    }
    try {
      await source.abort();
      source.done("Aborted: the changes were discarded and the workdir is untouched.");
    } catch (err) {
      fill(status, errorBox(err));
    }
  }
}

// A stale-base 409 names the changed paths in `details.paths` (names in their JSON form).
function conflictPaths(details) {
  return details && Array.isArray(details.paths) ? details.paths : [];
}

// How many of `hunks` a diff displays: whole hunks, up to about MAX_LINES lines (at least
// one). The rest are never accepted from the page.
function displayed(hunks) {
  let budget = MAX_LINES;
  let shown = 0;
  for (const hunk of hunks) {
    if (budget <= 0) break;
    budget -= hunk.lines.length;
    shown += 1;
  }
  return shown;
}

function reportWords(report) {
  if (!report || typeof report !== "object") return "";
  const parts = [];
  for (const [k, v] of Object.entries(report)) {
    if (typeof v === "number") parts.push(`${v} ${k.replaceAll("_", " ")}`);
    else if (Array.isArray(v)) parts.push(`${v.length} ${k.replaceAll("_", " ")}`);
  }
  return parts.length ? ` (${parts.join(", ")})` : "";
}

function scrollIntoViewIfNeeded(el, box) {
  const r = el.getBoundingClientRect();
  const b = box.getBoundingClientRect();
  if (r.top < b.top || r.bottom > b.bottom) el.scrollIntoView({ block: "nearest" });
}
