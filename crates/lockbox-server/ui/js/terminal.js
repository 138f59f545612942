// A small terminal view: a screen of lines with a cursor, fed bytes (UTF-8, decoded as a
// stream). Handles CR, LF, backspace, tab, the common cursor and erase sequences, and SGR
// colours (as classes: the CSP allows no inline styles); other escape sequences are dropped.
// Keeps SCROLLBACK lines. Keys typed into it go to `onInput` as terminal bytes.

import { h } from "./dom.js";

const SCROLLBACK = 5000;

export class Terminal {
  constructor({ onInput, readOnly = false } = {}) {
    this.el = h("div", { class: "terminal", tabindex: "0", role: "log", "aria-label": "Terminal" });
    this.screen = h("div", { class: "screen" });
    this.el.appendChild(this.screen);
    this.lines = [[]];
    this.rows = [];
    this.row = 0;
    this.col = 0;
    this.cls = "";
    this.dirty = new Set([0]);
    this.decoder = new TextDecoder("utf-8");
    this.pending = "";
    this.frame = 0;
    this.onInput = onInput;
    if (!readOnly) {
      this.el.addEventListener("keydown", (e) => this.key(e));
      this.el.addEventListener("paste", (e) => {
        const text = e.clipboardData ? e.clipboardData.getData("text") : "";
        if (text && this.onInput) this.onInput(text.replace(/\r?\n/g, "\r"));
        e.preventDefault();
      });
    }
  }

  /** Columns and rows that fit the element (for resize messages). */
  size() {
    const probe = h("span", { class: "probe" }, "MMMMMMMMMM");
    this.screen.appendChild(probe);
    const r = probe.getBoundingClientRect();
    probe.remove();
    const cw = r.width / 10 || 8;
    const ch = r.height || 16;
    const box = this.el.getBoundingClientRect();
    return {
      cols: Math.max(20, Math.floor((box.width - 16) / cw)),
      rows: Math.max(5, Math.floor((box.height - 16) / ch)),
    };
  }

  /** Feed output: a Uint8Array/ArrayBuffer (bytes) or a string. */
  write(data) {
    const text = typeof data === "string" ? data : this.decoder.decode(data instanceof ArrayBuffer ? new Uint8Array(data) : data, { stream: true });
    this.parse(this.pending + text);
    this.schedule();
  }

  /** A line of the console's own (not from the process), e.g. "[process exited]". */
  note(text) {
    if (this.col > 0) this.newline();
    const saved = this.cls;
    this.cls = "note";
    this.parse(`${text}\n`);
    this.cls = saved;
    this.col = 0;
    this.schedule();
  }

  text() {
    return this.lines.map((l) => l.map((c) => c.ch).join("")).join("\n");
  }

  parse(s) {
    this.pending = "";
    let i = 0;
    while (i < s.length) {
      const ch = s[i];
      if (ch === "\x1b") {
        const used = this.escape(s, i);
        if (used === 0) {
          this.pending = s.slice(i);
          return;
        }
        i += used;
        continue;
      }
      i += 1;
      if (ch === "\r") this.col = 0;
      else if (ch === "\n") this.newline();
      else if (ch === "\b") this.col = Math.max(0, this.col - 1);
      else if (ch === "\t") this.col = (Math.floor(this.col / 8) + 1) * 8;
      else if (ch === "\x07" || ch < " " || ch === "\x7f") continue;
      else this.put(ch);
    }
  }

  // Returns the length of the escape sequence at s[i], or 0 when it is incomplete.
  escape(s, i) {
    if (i + 1 >= s.length) return 0;
    const next = s[i + 1];
    if (next === "[") {
      let j = i + 2;
      while (j < s.length && !/[\x40-\x7e]/.test(s[j])) j += 1;
      if (j >= s.length) return s.length - i > 64 ? s.length - i : 0;
      this.csi(s.slice(i + 2, j), s[j]);
      return j - i + 1;
    }
    if (next === "]") {
      // OSC (window title ...): up to BEL or ESC \
      for (let j = i + 2; j < s.length; j += 1) {
        if (s[j] === "\x07") return j - i + 1;
        if (s[j] === "\x1b" && s[j + 1] === "\\") return j - i + 2;
      }
      return s.length - i > 4096 ? s.length - i : 0;
    }
    if (next === "(" || next === ")") return i + 2 < s.length ? 3 : 0;
    return 2;
  }

  csi(params, final) {
    const nums = params.replace(/^[?>=]/, "").split(";").map((p) => (p === "" ? NaN : Number(p)));
    const n = Number.isNaN(nums[0]) ? 1 : nums[0];
    const line = this.lines[this.row];
    switch (final) {
      case "m":
        this.sgr(params === "" ? [0] : nums.map((x) => (Number.isNaN(x) ? 0 : x)));
        break;
      case "K": {
        const mode = Number.isNaN(nums[0]) ? 0 : nums[0];
        if (mode === 0) line.length = Math.min(line.length, this.col);
        else if (mode === 1) for (let k = 0; k < Math.min(this.col + 1, line.length); k += 1) line[k] = { ch: " ", cls: "" };
        else line.length = 0;
        this.dirty.add(this.row);
        break;
      }
      case "J": {
        const mode = Number.isNaN(nums[0]) ? 0 : nums[0];
        if (mode === 2 || mode === 3) {
          // Clear the visible screen: keep the scrollback, start a fresh page.
          this.newline();
          this.col = 0;
        } else if (mode === 0) {
          line.length = Math.min(line.length, this.col);
          this.dirty.add(this.row);
        }
        break;
      }
      case "C":
        this.col += n;
        break;
      case "D":
        this.col = Math.max(0, this.col - n);
        break;
      case "G":
        this.col = Math.max(0, n - 1);
        break;
      case "A":
        this.row = Math.max(0, this.row - n);
        break;
      case "B":
        for (let k = 0; k < n; k += 1) this.down();
        break;
      case "H":
      case "f":
        this.col = Number.isNaN(nums[1]) || nums[1] === undefined ? 0 : Math.max(0, nums[1] - 1);
        break;
      case "P": {
        line.splice(this.col, n);
        this.dirty.add(this.row);
        break;
      }
      case "@": {
        line.splice(this.col, 0, ...Array.from({ length: n }, () => ({ ch: " ", cls: "" })));
        this.dirty.add(this.row);
        break;
      }
      default:
        break;
    }
  }

  sgr(codes) {
    const set = new Set(this.cls ? this.cls.split(" ") : []);
    const drop = (prefix) => {
      for (const c of [...set]) if (c.startsWith(prefix)) set.delete(c);
    };
    for (let k = 0; k < codes.length; k += 1) {
      const c = codes[k];
      if (c === 0) set.clear();
      else if (c === 1) set.add("b");
      else if (c === 2) set.add("dim");
      else if (c === 3) set.add("i");
      else if (c === 4) set.add("u");
      else if (c === 7) set.add("rev");
      else if (c === 22) {
        set.delete("b");
        set.delete("dim");
      } else if (c === 23) set.delete("i");
      else if (c === 24) set.delete("u");
      else if (c === 27) set.delete("rev");
      else if (c >= 30 && c <= 37) {
        drop("fg");
        set.add(`fg${c - 30}`);
      } else if (c >= 90 && c <= 97) {
        drop("fg");
        set.add(`fg${c - 90 + 8}`);
      } else if (c === 39) drop("fg");
      else if (c >= 40 && c <= 47) {
        drop("bg");
        set.add(`bg${c - 40}`);
      } else if (c >= 100 && c <= 107) {
        drop("bg");
        set.add(`bg${c - 100 + 8}`);
      } else if (c === 49) drop("bg");
      else if (c === 38 || c === 48) {
        // 256-colour or RGB: skip its arguments.
        k += codes[k + 1] === 5 ? 2 : codes[k + 1] === 2 ? 4 : 0;
      }
    }
    this.cls = [...set].join(" ");
  }

  put(ch) {
    const line = this.lines[this.row];
    while (line.length < this.col) line.push({ ch: " ", cls: "" });
    line[this.col] = { ch, cls: this.cls };
    this.col += 1;
    this.dirty.add(this.row);
  }

  down() {
    this.row += 1;
    if (this.row >= this.lines.length) {
      this.lines.push([]);
      this.dirty.add(this.row);
    }
    this.trim();
  }

  newline() {
    this.down();
    this.col = 0;
  }

  trim() {
    const extra = this.lines.length - SCROLLBACK;
    if (extra > 0) {
      this.lines.splice(0, extra);
      this.row -= extra;
      const gone = this.rows.splice(0, extra);
      for (const el of gone) el.remove();
      this.dirty = new Set([...this.dirty].map((r) => r - extra).filter((r) => r >= 0));
    }
  }

  schedule() {
    if (this.frame) return;
    this.frame = requestAnimationFrame(() => {
      this.frame = 0;
      this.render();
    });
  }

  render() {
    const atBottom = this.el.scrollTop + this.el.clientHeight >= this.el.scrollHeight - 4;
    while (this.rows.length < this.lines.length) {
      const el = h("div", { class: "tline" });
      this.rows.push(el);
      this.screen.appendChild(el);
      this.dirty.add(this.rows.length - 1);
    }
    for (const r of this.dirty) {
      const el = this.rows[r];
      if (!el) continue;
      el.replaceChildren();
      let run = "";
      let cls = null;
      const flush = () => {
        if (!run) return;
        if (cls) el.appendChild(h("span", { class: cls }, run));
        else el.appendChild(document.createTextNode(run));
        run = "";
      };
      for (const c of this.lines[r]) {
        if (c.cls !== cls) {
          flush();
          cls = c.cls;
        }
        run += c.ch;
      }
      flush();
      if (!el.firstChild) el.appendChild(document.createTextNode("\u200b"));
    }
    this.dirty.clear();
    for (const el of this.screen.querySelectorAll(".cursor")) el.classList.remove("cursor");
    const cur = this.rows[this.row];
    if (cur) cur.classList.add("cursor");
    if (atBottom) this.el.scrollTop = this.el.scrollHeight;
  }

  key(e) {
    if (!this.onInput) return;
    const k = e.key;
    let out = null;
    if (e.ctrlKey && !e.altKey && k.length === 1) {
      const c = k.toUpperCase().charCodeAt(0);
      if (c >= 64 && c <= 95) out = String.fromCharCode(c - 64);
      else if (k === " ") out = "\x00";
      if (k === "c" && window.getSelection && String(window.getSelection())) out = null;
      if (k === "v") return; // paste
    } else if (k.length === 1 && !e.metaKey) {
      out = e.altKey ? `\x1b${k}` : k;
    } else {
      out =
        {
          Enter: "\r",
          Backspace: "\x7f",
          Tab: "\t",
          Escape: "\x1b",
          ArrowUp: "\x1b[A",
          ArrowDown: "\x1b[B",
          ArrowRight: "\x1b[C",
          ArrowLeft: "\x1b[D",
          Home: "\x1b[H",
          End: "\x1b[F",
          Delete: "\x1b[3~",
          PageUp: "\x1b[5~",
          PageDown: "\x1b[6~",
        }[k] || null;
    }
    if (out !== null) {
      e.preventDefault();
      this.onInput(out);
    }
  }
}
