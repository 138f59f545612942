#!/usr/bin/env python3
"""Page load of the review console for a 1,000-file change set, in headless Chromium.

Starts `lockbox serve` ($LOCKBOX_BIN, default target/release/lockbox), keeps a branch of
1,000 changed files made by a real `lockbox run --workdir`, then loads its review page
`--runs` times, each in a fresh document, and reads the page's own performance marks:

- whole: navigation start → the file tree painted (HTML, scripts, session check, the change
  list from the server, the tree's DOM, the paint): what a person waits for;
- list: the change list's request, asked → received (the server's share);
- console: the change list received → the tree painted (the console's own work).

Usage: python3 bench/console/bench.py [--runs 21] [--files 1000]
Needs Chromium and chromium-driver (apt) and Selenium (pip), as the browser tests do.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
sys.path.insert(0, os.path.join(ROOT, "python", "tests"))
os.environ.setdefault("LOCKBOX_BIN", os.path.join(ROOT, "target", "release", "lockbox"))

import console_util  # noqa: E402  (the browser tests' server and browser helpers)

MARKS = """
    const at = (n) => { const m = performance.getEntriesByName(n); return m.length ? m[0].startTime : null; };
    const painted = at('review-tree-painted');
    if (painted === null) return null;
    const api = performance.getEntriesByType('resource').filter(r => /\\/v1\\/branches\\/[^/]+$/.test(r.name))[0];
    const nav = performance.getEntriesByType('navigation')[0];
    return {whole: painted, html: nav.responseEnd, scripts: nav.domContentLoadedEventEnd,
            asked: api.startTime, received: api.responseEnd, rendered: at('review-tree-rendered')};
"""


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--runs", type=int, default=21)
    ap.add_argument("--files", type=int, default=1000)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="lockbox-console-bench-") as tmp:
        work = os.path.join(tmp, "work")
        for i in range(args.files):
            d = os.path.join(work, f"dir{i % 10}")
            os.makedirs(d, exist_ok=True)
            with open(os.path.join(d, f"file{i:04}.txt"), "w") as f:
                f.write(f"{i}\n")
        server = console_util.start_server(state_dir=os.path.join(tmp, "state"))
        driver = None
        try:
            env = dict(os.environ, LOCKBOX_STATE_DIR=server.state_dir)
            subprocess.run([console_util.server_binary(), "run", "--workdir", work, "--on-exit", "keep", "--",
                            "sh", "-c", 'for f in dir*/*.txt; do echo changed >> "$f"; done'],
                           env=env, check=True, capture_output=True)
            _, body, _ = server.api("GET", "/v1/branches")
            branch = body["branches"][0]["id"]
            driver = console_util.chrome()
            driver.get(server.base + "/ui")
            console_util.login(driver, server.base, server.token)
            rows = []
            for run in range(args.runs + 1):
                driver.get("about:blank")  # a fresh document: a full page load
                driver.get(f"{server.base}/ui/#/branches/{branch}")
                m = console_util.wait_for(lambda: driver.execute_script(MARKS), what="the tree painted")
                n = driver.execute_script("return document.querySelectorAll('#file-tree .file').length")
                assert n == args.files, n
                if run:  # the first load warms the browser's caches
                    rows.append((m["whole"], m["html"], m["scripts"], m["asked"], m["received"] - m["asked"],
                                 m["rendered"] - m["received"], m["whole"] - m["received"]))
        finally:
            if driver:
                driver.quit()
            console_util.stop_server(server, remove_state=False)
    print(f"{args.files}-file review page, {args.runs} loads, ms (median / p90 / max):")
    names = ["whole page: navigation → tree painted", "  HTML received", "  scripts run (DOMContentLoaded)",
             "  change list asked", "  change list (server)", "  tree in the document", "  console: list → painted"]
    for i, name in enumerate(names):
        v = sorted(r[i] for r in rows)
        p90 = v[min(len(v) - 1, int(len(v) * 0.9))]
        print(f"  {name:40} {statistics.median(v):6.0f} {p90:6.0f} {v[-1]:6.0f}")


if __name__ == "__main__":
    main()
