// File names from the API: a string, or {"bytes": base64} when not UTF-8. Shown with control
// characters made visible (never interpreted): as C escapes (newline → \n, ESC → \x1b), C1
// and bidirectional controls as \u{…}, bytes that are not UTF-8 as \xNN. `nameNode` puts each
// escape in a highlighted span, so it cannot be mistaken for a literal backslash.

const BIDI = /[\u061c\u200e\u200f\u202a-\u202e\u2066-\u2069]/;

const SHORT = { 0: "\\0", 7: "\\a", 8: "\\b", 9: "\\t", 10: "\\n", 11: "\\v", 12: "\\f", 13: "\\r" };

function visibleChar(ch, keepTab) {
  const c = ch.codePointAt(0);
  if (keepTab && c === 9) return ch;
  if (c < 0x20 || c === 0x7f) return SHORT[c] || `\\x${c.toString(16).padStart(2, "0")}`;
  if ((c >= 0x80 && c < 0xa0) || BIDI.test(ch) || c === 0xfeff) {
    return `\\u{${c.toString(16)}}`;
  }
  return ch;
}

const SPECIAL = /[\u0000-\u001f\u007f-\u009f\u061c\u200e\u200f\u202a-\u202e\u2066-\u2069\ufeff]/u;

/** Text with control characters visible (tabs kept when keepTab). */
export function visible(text, keepTab = false) {
  if (!SPECIAL.test(text)) return text;
  let out = "";
  for (const ch of text) out += visibleChar(ch, keepTab);
  return out;
}

function decodeBase64(b64) {
  const bin = atob(b64);
  const out = new Uint8Array(bin.length);
  for (let i = 0; i < bin.length; i += 1) out[i] = bin.charCodeAt(i);
  return out;
}

/** A name for display. */
export function nameText(name) {
  if (typeof name === "string") return visible(name);
  if (name && typeof name.bytes === "string") {
    const raw = decodeBase64(name.bytes);
    let out = "";
    for (const b of raw) {
      out += b >= 0x20 && b < 0x7f ? String.fromCharCode(b) : `\\x${b.toString(16).padStart(2, "0")}`;
    }
    return out;
  }
  return String(name);
}

/** A stable key for a name (for maps). */
export function nameKey(name) {
  return typeof name === "string" ? `s:${name}` : `b:${name && name.bytes}`;
}

/** The query string that names `name` for `GET diff`. */
export function nameQuery(name) {
  if (typeof name === "string") return `path=${encodeURIComponent(name)}`;
  return `path_bytes=${encodeURIComponent(name.bytes)}`;
}

/** The sort string of a name. */
export function nameSort(name) {
  return typeof name === "string" ? name : nameText(name);
}

/** A name as DOM: text with each escape in <span class="esc">. */
export function nameNode(name) {
  const frag = document.createDocumentFragment();
  const add = (text, esc) => {
    if (!text) return;
    if (esc) {
      const span = document.createElement("span");
      span.className = "esc";
      span.textContent = text;
      frag.appendChild(span);
    } else frag.appendChild(document.createTextNode(text));
  };
  if (name && typeof name === "object" && typeof name.bytes === "string") {
    let run = "";
    for (const b of decodeBase64(name.bytes)) {
      if (b >= 0x20 && b < 0x7f) run += String.fromCharCode(b);
      else {
        add(run, false);
        run = "";
        add(`\\x${b.toString(16).padStart(2, "0")}`, true);
      }
    }
    add(run, false);
    return frag;
  }
  const text = String(name);
  let run = "";
  for (const ch of text) {
    const v = visibleChar(ch, false);
    if (v === ch) run += ch;
    else {
      add(run, false);
      run = "";
      add(v, true);
    }
  }
  add(run, false);
  return frag;
}
