// The console's terminal: xterm.js (vendored unmodified in ui/vendor/xterm/, see its README)
// with its fit addon, in an element that sizes it: the terminal takes as many columns and rows
// as fit the element, and `onResize` tells the page (which tells the PTY) when that changes.
// Keys typed into it go to `onInput` as terminal bytes. Keeps SCROLLBACK lines above the screen.

import { Terminal as XTerm } from "../vendor/xterm/xterm.mjs";
import { FitAddon } from "../vendor/xterm/addon-fit.mjs";
import { h } from "./dom.js";

const SCROLLBACK = 5000;
const encoder = new TextEncoder();

// xterm.js's DOM renderer writes its theme, fonts and cell sizes into <style> elements it
// creates, and true colours (24-bit SGR) into `style` attributes of the cells' spans. Both are
// inline styles, which the console's CSP (`style-src 'self'`) refuses. Style sheets built
// through the CSSOM are not inline styles: the <style> xterm.js asks the document for is a
// hidden stand-in whose text goes into a constructed sheet the document adopts, and a span's
// `style` attribute becomes its `style.cssText`. The console itself creates neither (the CSP
// would refuse them), so nothing else sees the difference.
let stylesAllowed = false;
function allowXtermStyles() {
  if (stylesAllowed) return;
  stylesAllowed = true;
  const createElement = Document.prototype.createElement;
  Document.prototype.createElement = function createElementOrSheet(name, options) {
    if (String(name).toLowerCase() !== "style") return createElement.call(this, name, options);
    const doc = this;
    const standIn = createElement.call(doc, "span");
    standIn.hidden = true;
    const sheet = new CSSStyleSheet();
    doc.adoptedStyleSheets = [...doc.adoptedStyleSheets, sheet];
    let text = "";
    Object.defineProperty(standIn, "textContent", {
      get: () => text,
      set: (value) => {
        text = String(value ?? "");
        sheet.replaceSync(text);
      },
    });
    const remove = standIn.remove.bind(standIn);
    standIn.remove = () => {
      doc.adoptedStyleSheets = doc.adoptedStyleSheets.filter((s) => s !== sheet);
      remove();
    };
    return standIn;
  };
  const setAttribute = Element.prototype.setAttribute;
  HTMLSpanElement.prototype.setAttribute = function setAttributeOrStyle(name, value) {
    if (String(name).toLowerCase() === "style") this.style.cssText = String(value);
    else setAttribute.call(this, name, value);
  };
}

export class Terminal {
  /**
   * `onInput(bytes)`: what the keyboard (or a paste) typed, as a Uint8Array. `readOnly`: no
   * input (a log). `onResize({cols, rows})`: the screen's size changed.
   */
  constructor({ onInput, onResize, readOnly = false } = {}) {
    allowXtermStyles();
    this.el = h("div", { class: "terminal" });
    // The page's tests read the screen through this (`#terminal`'s `lockboxTerminal`).
    this.el.lockboxTerminal = this;
    this.xterm = new XTerm({
      scrollback: SCROLLBACK,
      disableStdin: readOnly,
      cursorBlink: false,
      fontFamily: 'ui-monospace, "DejaVu Sans Mono", "Liberation Mono", Menlo, monospace',
      fontSize: matchMedia("(max-width: 760px)").matches ? 12 : 14, // as app.css's phone width
      theme: { background: "#15181c", foreground: "#d7dae0", cursor: "#d7dae0", cursorAccent: "#15181c" },
    });
    this.fit = new FitAddon();
    this.xterm.loadAddon(this.fit);
    if (onInput && !readOnly) {
      this.xterm.onData((s) => onInput(encoder.encode(s)));
      // Some mouse reports are bytes that are not UTF-8: one char code per byte.
      this.xterm.onBinary((s) => onInput(Uint8Array.from(s, (c) => c.charCodeAt(0) & 0xff)));
    }
    if (onResize) this.xterm.onResize(({ cols, rows }) => onResize({ cols, rows }));
    // xterm.js measures its font when opened, so it opens once the element is in the page
    // and has a size; from then on it follows the element's size.
    this.opened = false;
    this.focusOnOpen = false;
    this.observer = new ResizeObserver(() => this.layout());
    this.observer.observe(this.el);
  }

  layout(tries = 0) {
    if (!this.el.isConnected || this.el.clientWidth === 0) return;
    if (!this.opened) {
      this.xterm.open(this.el);
      this.opened = true;
      if (this.focusOnOpen) this.xterm.focus();
    }
    // Until xterm.js has measured a cell there is no size to propose: try again next frame.
    if (!this.fit.proposeDimensions()) {
      if (tries < 120) requestAnimationFrame(() => this.layout(tries + 1));
      return;
    }
    this.fit.fit();
  }

  /** The screen's size: {cols, rows}. */
  size() {
    return { cols: this.xterm.cols, rows: this.xterm.rows };
  }

  /** Gives the terminal the keyboard (once it is open, when it is not yet). */
  focus() {
    if (this.opened) this.xterm.focus();
    else this.focusOnOpen = true;
  }

  /** Whether it is open and its screen is the size that fits its element (for tests). */
  fitted() {
    const fits = this.opened && this.fit.proposeDimensions();
    return Boolean(fits) && fits.cols === this.xterm.cols && fits.rows === this.xterm.rows;
  }

  /** Feed output: a Uint8Array/ArrayBuffer (bytes, UTF-8) or a string. */
  write(data) {
    this.xterm.write(data instanceof ArrayBuffer ? new Uint8Array(data) : data);
  }

  /** A line of the console's own (not from the process), e.g. "[process exited]". */
  note(text) {
    // After what was written before it: the cursor's column is known once that is parsed.
    this.xterm.write("", () => {
      const start = this.xterm.buffer.active.cursorX > 0 ? "\r\n" : "";
      this.xterm.write(`${start}\x1b[0;3;94m${text.replace(/[\x00-\x1f\x7f]/g, " ")}\x1b[0m\r\n`);
    });
  }

  /** The lines of the active buffer (the scrollback and the screen), trailing spaces trimmed. */
  lines() {
    const b = this.xterm.buffer.active;
    const out = [];
    for (let y = 0; y < b.length; y += 1) out.push(b.getLine(y).translateToString(true).trimEnd());
    return out;
  }

  /** The lines on the screen now (the active buffer's last `rows`), trailing spaces trimmed. */
  screen() {
    const b = this.xterm.buffer.active;
    const out = [];
    for (let y = b.baseY; y < b.baseY + this.xterm.rows; y += 1) {
      const line = b.getLine(y);
      out.push(line ? line.translateToString(true).trimEnd() : "");
    }
    return out;
  }

  /** The text of every line, for tests. */
  text() {
    return this.lines().join("\n");
  }

  dispose() {
    this.observer.disconnect();
    this.xterm.dispose();
  }
}
