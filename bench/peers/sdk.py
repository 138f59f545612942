"""The Python SDK's plain run of /bin/true, started directly and pre-armed, against
bubblewrap (issue 34, item 1: "pre-armed starts for `lockbox run` and the SDK").

    pip install ./python   # a release build of the extension (maturin's default for pip)
    python3 bench/peers/sdk.py [--rounds 300] [--no-fifo] [--ballast MB] [--rows ROWS]

Rows, interleaved (A B C D ... A B C D ...), each timed with perf_counter_ns in this process:
  true          posix_spawn + waitpid of /bin/true (the cost of starting any process)
  bwrap         the same of `bwrap --unshare-all --ro-bind / / --dev /dev --proc /proc /bin/true`
  sdk-direct    Sandbox().cmd(["/bin/true"]).run() with LOCKBOX_PRE_ARM=0
  sdk-prearmed  the same with LOCKBOX_PRE_ARM=1, handed to the SDK's pre-arm helper (started
                for the run in a directory of its own, stopped at the end)

The SDK's rows include what every SDK call does beside the sandbox: its pipes for stdin,
stdout and stderr and the threads that feed and drain them. After each pre-armed run the
runner pauses 30 ms, untimed, so that the helper's re-arming of the used spare is not timed
in the next row. As root the runner takes SCHED_FIFO priority 50 (the helper, started by it,
inherits it); --no-fifo measures without. "Above true" subtracts the median of true.
--ballast MB makes the runner hold that much memory of its own (written, so resident)
before it measures: a direct start forks the caller, a pre-armed one does not. --rows
chooses the rows (comma-separated; true is always measured): a direct start from a large
caller leaves work behind (its fork's teardown) that lands on the next row.
"""

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

from lockbox import Sandbox
from peers import run_once  # bench/peers/peers.py: one posix_spawn + waitpid, timed

SETTLE_S = 0.03
BWRAP = ["bwrap", "--unshare-all", "--ro-bind", "/", "/", "--dev", "/dev", "--proc", "/proc",
         "/bin/true"]


def sdk(box, switch, want_pre_armed):
    os.environ["LOCKBOX_PRE_ARM"] = switch
    t0 = time.perf_counter_ns()
    r = box.cmd(["/bin/true"]).run()
    elapsed = time.perf_counter_ns() - t0
    if r.returncode != 0:
        sys.exit(f"/bin/true in the SDK failed: {r.stages[0]}")
    if r.stages[0].pre_armed != want_pre_armed:
        return None  # a miss (no spare yet): not this row's measurement
    return elapsed / 1e6


def main():
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rounds", type=int, default=300)
    ap.add_argument("--warmup", type=int, default=20)
    ap.add_argument("--no-fifo", action="store_true")
    ap.add_argument("--rows", default="bwrap,sdk-direct,sdk-prearmed",
                    help="rows besides true (default: all)")
    ap.add_argument("--ballast", type=int, default=0, metavar="MB",
                    help="memory the runner holds (written) while it measures")
    args = ap.parse_args()
    ballast = bytearray(args.ballast << 20)
    for i in range(0, len(ballast), 4096):
        ballast[i] = 1
    fifo = not args.no_fifo and os.geteuid() == 0
    if fifo:
        os.sched_setscheduler(0, os.SCHED_FIFO, os.sched_param(50))
    bwrap = shutil.which("bwrap")
    if bwrap is None:
        sys.exit("bubblewrap (bwrap) is needed: apt-get install bubblewrap")
    scratch = tempfile.mkdtemp(prefix="lockbox-sdk-bench-")
    helper_dir = os.path.join(scratch, "pre-arm")
    os.mkdir(helper_dir, 0o700)
    os.environ["LOCKBOX_PRE_ARM_DIR"] = helper_dir
    cli = [sys.executable, "-m", "lockbox._cli", "pre-arm"]
    subprocess.run(cli + ["start", "--idle", "10m"], check=True, stdout=subprocess.DEVNULL)
    devnull = os.open(os.devnull, os.O_RDWR)
    box = Sandbox()
    rows = {
        "true": lambda: run_once(["/bin/true"], devnull),
        "bwrap": lambda: run_once([bwrap, *BWRAP[1:]], devnull),
        "sdk-direct": lambda: sdk(box, "0", False),
        "sdk-prearmed": lambda: sdk(box, "1", True),
    }
    wanted = {"true", *args.rows.split(",")}
    unknown = wanted - set(rows)
    if unknown:
        sys.exit(f"--rows: no row {', '.join(sorted(unknown))} (rows: {', '.join(rows)})")
    rows = {name: row for name, row in rows.items() if name in wanted}
    samples = {name: [] for name in rows}
    misses = 0
    try:
        for r in range(args.warmup + args.rounds):
            for name, row in rows.items():
                ms = row()
                if name == "sdk-prearmed":
                    time.sleep(SETTLE_S)
                    if ms is None:
                        misses += 1
                        continue
                if r >= args.warmup:
                    samples[name].append(ms)
        status = subprocess.run(cli + ["status", "--json"], capture_output=True, text=True,
                                check=False).stdout
        print(f"helper: {status.strip()}", file=sys.stderr)
    finally:
        subprocess.run(cli + ["stop"], stdout=subprocess.DEVNULL, check=False)
        shutil.rmtree(scratch, ignore_errors=True)

    med = {k: statistics.median(v) for k, v in samples.items()}
    true = med["true"]
    print(f"{args.rounds} interleaved rounds after {args.warmup} warm-up rounds; "
          f"{'SCHED_FIFO' if fifo else 'normal priority'}; load average {os.getloadavg()[0]:.2f}; "
          f"pre-armed misses (not counted): {misses}; the runner holds {args.ballast} MB more")
    print()
    print("| row | runs | median (ms) | p95 (ms) | above /bin/true (ms) |")
    print("|---|---:|---:|---:|---:|")
    for name, v in samples.items():
        s = sorted(v)
        print(f"| {name} | {len(v)} | {med[name]:.2f} | {s[int(0.95 * (len(s) - 1))]:.2f} | "
              f"{med[name] - true:.2f} |")
    if "bwrap" in med:
        bw = med["bwrap"] - true
        print()
        print("| ratio, above /bin/true | value | target |")
        print("|---|---:|---:|")
        for name, target in (("sdk-direct", ""), ("sdk-prearmed", "<= 0.5x")):
            if name in med:
                print(f"| {name} / bwrap | {(med[name] - true) / bw:.2f}x | {target} |")
    print(json.dumps({"medians_ms": med}), file=sys.stderr)


if __name__ == "__main__":
    main()
