// The Node.js runner of lockbox code contexts (embedded in the agent, run as `node -e`).
// Requests on fd 4: "<length>\n<code>", after "env <count>\n" and count "<length>\nNAME=VALUE"
// for a run's own variables (set for the run, given their earlier values back after it);
// events on fd 3: "<length>\n<json>" ({"result": ...}, {"error": ...}, {"done": ...}), as the
// Python runner. Code runs in one vm context, so globals, `var`, `let`, `const` and functions
// stay for the next run; the value of the last expression is the main result (util.inspect
// as text/plain). Code with a top-level `await` is rewritten as Node's own REPL rewrites it
// (its internal processTopLevelAwait: declarations kept, the last value returned), and
// awaited; static `import`s become `require`s. SIGINT interrupts a run (breakOnSigint while
// it runs, or the promise it awaits) and is ignored between runs.
"use strict";
const fs = require("fs");
const vm = require("vm");
const util = require("util");

const REQ = 4;
const EV = 3;
// Rejects the promise a run awaits, on SIGINT.
let interruptAwait = null;
process.on("SIGINT", () => {
  if (interruptAwait) interruptAwait();
});
// Node's REPL rewrite for top-level await (node --expose-internals); null when this Node
// has none, and then such code is the SyntaxError it is in a script.
let processTopLevelAwait = null;
try {
  ({ processTopLevelAwait } = require("internal/repl/await"));
} catch (e) { /* left out */ }

// `import ... from "m"` and `import "m"` statements, each on its own line, as `require`s
// (a vm script has no modules): the default import is the module's `default`, else the
// module itself.
function importsAsRequires(code) {
  const binding = (names) => names.trim().replace(/\s+as\s+/g, ": ");
  return code
    .replace(/^([ \t]*)import\s+(["'])([^"']+)\2[ \t]*;?[ \t]*$/gm, "$1require($2$3$2);")
    .replace(/^([ \t]*)import\s+([^"';]+?)\s+from\s+(["'])([^"']+)\3[ \t]*;?[ \t]*$/gm,
      (all, indent, clause, q, name) => {
        const mod = `require(${q}${name}${q})`;
        const out = [];
        let rest = clause.trim();
        const star = rest.match(/^\*\s+as\s+([\w$]+)$/);
        if (star) return `${indent}var ${star[1]} = ${mod};`;
        const braces = rest.match(/\{([^}]*)\}/);
        if (braces) rest = rest.replace(braces[0], "").replace(/,\s*$/, "").trim();
        if (rest) out.push(`var ${rest.replace(/,$/, "")} = ((m) => m && m.__esModule ? m.default : (m && m.default !== undefined ? m.default : m))(${mod});`);
        if (braces) out.push(`var { ${binding(braces[1])} } = ${mod};`);
        return indent + out.join(" ");
      });
}

function send(obj) {
  const data = Buffer.from(JSON.stringify(obj));
  const out = Buffer.concat([Buffer.from(`${data.length}\n`), data]);
  let off = 0;
  while (off < out.length) off += fs.writeSync(EV, out, off, out.length - off);
}

function readInto(buf, off, n) {
  for (;;) {
    try {
      return fs.readSync(REQ, buf, off, n, null);
    } catch (e) {
      if (e.code === "EAGAIN" || e.code === "EINTR") continue;
      throw e;
    }
  }
}

function readLine() {
  const one = Buffer.alloc(1);
  let line = "";
  for (;;) {
    if (readInto(one, 0, 1) === 0) return null;
    const c = one.toString("latin1");
    if (c === "\n") return line;
    line += c;
  }
}

function readFrame(line) {
  const n = parseInt(line, 10);
  const buf = Buffer.alloc(n);
  let off = 0;
  while (off < n) {
    const got = readInto(buf, off, n - off);
    if (got === 0) return null;
    off += got;
  }
  return buf.toString("utf8");
}

// [env, code], or null at the end: the run's own variables ("env N" and N frames
// "NAME=VALUE") come before its code.
function readRequest() {
  let line = readLine();
  if (line === null) return null;
  const env = [];
  if (line.startsWith("env ")) {
    for (let i = parseInt(line.slice(4), 10); i > 0; i--) {
      const l = readLine();
      const entry = l === null ? null : readFrame(l);
      if (entry === null) return null;
      const eq = entry.indexOf("=");
      env.push([entry.slice(0, eq), entry.slice(eq + 1)]);
    }
    line = readLine();
    if (line === null) return null;
  }
  const code = readFrame(line);
  return code === null ? null : [env, code];
}

const sandbox = { require, console, process, Buffer, setTimeout, clearTimeout, setInterval,
  clearInterval, setImmediate, clearImmediate, URL, TextEncoder, TextDecoder, module, exports };
sandbox.display = (...objs) => {
  for (const o of objs) send({ result: { data: bundle(o), is_main_result: false } });
};
const context = vm.createContext(sandbox);
let count = 0;

function bundle(value) {
  const data = { "text/plain": util.inspect(value) };
  if (value && typeof value === "object") {
    for (const [method, mime] of [["_repr_html_", "text/html"], ["_repr_svg_", "image/svg+xml"],
      ["_repr_png_", "image/png"], ["_repr_json_", "application/json"]]) {
      if (typeof value[method] === "function") {
        try { data[mime] = value[method](); } catch (e) { /* left out */ }
      }
    }
  }
  return data;
}

// The script to run for `code`, and whether its value is a promise of {value} to await.
function compile(code, filename) {
  try {
    return [new vm.Script(code, { filename }), false];
  } catch (e) {
    if (!(e instanceof SyntaxError)) throw e;
    let source = code;
    if (/Cannot use import statement/.test(e.message)) source = importsAsRequires(source);
    let wrapped = null;
    try {
      wrapped = processTopLevelAwait ? processTopLevelAwait(source) : null;
    } catch (e2) { /* not rewritable: the script's own error stands */ }
    if (wrapped !== null) return [new vm.Script(wrapped, { filename }), true];
    if (source !== code) return [new vm.Script(source, { filename }), false];
    throw e;
  }
}

async function main() {
  for (;;) {
    const request = readRequest();
    if (request === null) break;
    const [env, code] = request;
    const saved = env.map(([k]) => [k, Object.prototype.hasOwnProperty.call(process.env, k) ? process.env[k] : undefined]);
    for (const [k, v] of env) process.env[k] = v;
    count += 1;
    try {
      const [script, awaited] = compile(code, `<cell ${count}>`);
      let value = script.runInContext(context, { breakOnSigint: true });
      if (awaited) {
        const interrupted = new Promise((_, reject) => {
          interruptAwait = () => {
            const e = new Error("Script execution was interrupted by `SIGINT`");
            e.code = "ERR_SCRIPT_EXECUTION_INTERRUPTED";
            reject(e);
          };
        });
        // A promise nothing will settle leaves the event loop empty, and Node would exit:
        // this keeps it waiting for the SIGINT of the run's timeout.
        const alive = setInterval(() => {}, 1 << 30);
        try {
          const got = await Promise.race([value, interrupted]);
          value = got && got.value;
        } finally {
          clearInterval(alive);
          interruptAwait = null;
        }
      }
      if (value !== undefined) send({ result: { data: bundle(value), is_main_result: true } });
    } catch (e) {
      const interrupted = e && e.code === "ERR_SCRIPT_EXECUTION_INTERRUPTED";
      const name = interrupted ? "KeyboardInterrupt" : (e && e.name) || "Error";
      const value = e && e.message !== undefined ? e.message : String(e);
      // The stack up to the runner's own frames (vm's and the runner's).
      const lines = String((e && e.stack) || "").split("\n");
      const end = lines.findIndex((l) => /node:vm|\[eval\]|sigintHandlersWrap/.test(l));
      const traceback = (end < 0 ? lines : lines.slice(0, end)).join("\n");
      send({ error: { name, value, traceback } });
    } finally {
      // Backwards, so that a name given twice gets its value from before the run.
      for (const [k, v] of saved.reverse()) {
        if (v === undefined) delete process.env[k];
        else process.env[k] = v;
      }
    }
    send({ done: { exit_code: null } });
  }
  process.exit(0);
}

main();
