"""Start-up of lockbox against bubblewrap and sandlock, interleaved (A B C ... A B C ...).

Run through bench/peers/run, which installs the peers and builds lockbox. Every command of
every job runs once per round, in the same order, so a slow moment of the machine lands on
all of them alike; each run is one posix_spawn + waitpid timed with perf_counter_ns.

Jobs (the same for each tool):
  plain          /bin/true in a sandbox
  workdir-none   a copy-on-write view of a directory, nothing written (nothing to commit)
  workdir-write  the same, writing one file, committed to the directory when the command ends

With --pre-armed, lockbox's plain job also runs handed over to a pre-arm helper started for
the run (`lockbox pre-arm`, docs/pre-arm.md) as "NAME-prearmed"; the other lockbox rows then
pass --no-pre-arm, so they stay direct starts. With workdir-write, two more rows then say
what a pre-armed --workdir run (not built: docs/benchmarks.md) could not go below: the same
command pre-armed without a workdir ("NAME-prearmed-no-workdir", writing in its own /tmp) and
the six fsyncs of a commit of one file, made by the runner itself ("six-fsyncs"); the
"floor" ratio adds the two. Every command's stdin is /dev/null. After
each pre-armed run the runner pauses SETTLE_S, untimed: the helper then arms the used
spare's replacement (a fork and a sandbox set-up, about 3 ms of CPU), which would otherwise
land on whichever row comes next -- in a fixed order, always the same one.

With --idle, the runner pauses SETTLE_S after every row and shuffles the rows' order each
round: every start then begins on an idle machine, as an agent's next command does after
its model has thought (a start made of several processes waking each other pays for each
wake-up from idle), and no row inherits another's leftovers (a namespace's teardown, which
the kernel finishes in the background).

As root the runner takes SCHED_FIFO priority 50 (inherited by every command): on a machine
where other jobs run, they then delay none of the tools; --no-fifo measures without it.

"Above true" subtracts the median of /bin/true run the same way (the cost of starting any
process), which is what the ratios compare.
"""

import argparse
import json
import os
import random
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

READS = ["-r", "/usr", "-r", "/lib", "-r", "/lib64", "-r", "/bin", "-r", "/etc"]
WRITE = "echo x > f"
SETTLE_S = 0.03


def commands(lockboxes, sandlock, dirs, prearmed):
    bwrap = ["bwrap", "--unshare-all", "--ro-bind", "/", "/", "--dev", "/dev", "--proc", "/proc"]
    sl = [sandlock, "run", *READS]

    def sl_cow(d):
        return [*sl, "-w", d, "--workdir", d]

    cmds = [
        ("plain", "true", ["/bin/true"]),
        ("plain", "bwrap", [*bwrap, "/bin/true"]),
        ("plain", "sandlock", [*sl, "--", "/bin/true"]),
    ]
    direct = ["--no-pre-arm"] if prearmed else []
    cmds += [("plain", name, [lb, "run", *direct, "--", "/bin/true"]) for name, lb in lockboxes]
    if prearmed:
        cmds += [("plain", f"{name}-prearmed", [lb, "run", "--", "/bin/true"])
                 for name, lb in lockboxes]
        # What a pre-armed --workdir run could not go below (docs/benchmarks.md): the same
        # command pre-armed without a workdir (it writes in its own /tmp), and the six
        # fsyncs of a commit of one file on this disk.
        cmds += [("workdir-write", f"{name}-prearmed-no-workdir",
                  [lb, "run", "--", "/bin/sh", "-c", "echo x > /tmp/f"]) for name, lb in lockboxes]
        cmds.append(("workdir-write", "six-fsyncs", lambda: six_fsyncs(dirs["fsyncs"])))
    cmds.append(("workdir-none", "sandlock", [*sl_cow(dirs["sl-none"]), "--", "/bin/true"]))
    cmds += [
        ("workdir-none", name,
         [lb, "run", *direct, "--workdir", dirs[f"{name}-none"], "--", "/bin/true"])
        for name, lb in lockboxes
    ]
    cmds.append(
        ("workdir-write", "sandlock", [*sl_cow(dirs["sl-write"]), "--", "/bin/sh", "-c", WRITE])
    )
    cmds += [
        (
            "workdir-write",
            name,
            [lb, "run", *direct, "--workdir", dirs[f"{name}-write"], "--", "/bin/sh", "-c", WRITE],
        )
        for name, lb in lockboxes
    ]
    return cmds


def six_fsyncs(d):
    """The durable steps of `lockbox run --workdir`'s commit of one new file, as `strace -f`
    shows them, timed here without a process start: the commit record (file, then its
    directory), the file's data, its rename into the workdir and that directory, and the
    branch's removal (its parent directory); six fsyncs in all. Milliseconds."""
    t0 = time.perf_counter_ns()
    branches, branch, workdir = d, os.path.join(d, "branch"), os.path.join(d, "workdir")
    for sub in (branch, workdir):
        os.makedirs(sub, exist_ok=True)

    def fsync_path(path, flags=os.O_RDONLY):
        fd = os.open(path, flags)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)

    def write_synced(path, data):
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        try:
            os.write(fd, data)
            os.fsync(fd)
        finally:
            os.close(fd)

    write_synced(os.path.join(branch, ".meta.tmp"), b'{"state": "committing"}\n')
    os.rename(os.path.join(branch, ".meta.tmp"), os.path.join(branch, "meta.json"))
    fsync_path(branch)
    write_synced(os.path.join(branch, "staged"), b"x\n")
    fsync_path(branch)
    os.rename(os.path.join(branch, "staged"), os.path.join(workdir, "f"))
    fsync_path(workdir)
    gone = os.path.join(branches, "gone")
    os.rename(branch, gone)
    fsync_path(branches)
    elapsed = time.perf_counter_ns() - t0
    shutil.rmtree(gone)
    os.unlink(os.path.join(workdir, "f"))
    return elapsed / 1e6


def _prearm_env(tool, lockboxes, scratch):
    """The environment of a pre-armed row's command (its helper's directory), else None."""
    for name, _ in lockboxes:
        if tool.startswith(f"{name}-prearmed"):
            return dict(os.environ, LOCKBOX_PRE_ARM_DIR=os.path.join(scratch, f"pre-arm-{name}"))
    return None


def run_once(argv, devnull, env=None):
    t0 = time.perf_counter_ns()
    pid = os.posix_spawn(argv[0] if "/" in argv[0] else shutil.which(argv[0]), argv,
                         env if env is not None else os.environ,
                         file_actions=[(os.POSIX_SPAWN_DUP2, devnull, 0),
                                       (os.POSIX_SPAWN_DUP2, devnull, 1),
                                       (os.POSIX_SPAWN_DUP2, devnull, 2)])
    _, status = os.waitpid(pid, 0)
    elapsed = time.perf_counter_ns() - t0
    if os.waitstatus_to_exitcode(status) != 0:
        sys.exit(f"failed (status {status}): {' '.join(argv)}")
    return elapsed / 1e6


def p95(xs):
    s = sorted(xs)
    return s[int(0.95 * (len(s) - 1))]


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rounds", type=int, default=300)
    ap.add_argument("--warmup", type=int, default=20)
    ap.add_argument("--lockbox", required=True)
    ap.add_argument("--lockbox-static", help="also measure this (statically linked) lockbox")
    ap.add_argument("--names", default="lockbox,lockbox-static",
                    help="the two lockbox binaries' names in the tables (e.g. before,after to "
                    "compare two builds)")
    ap.add_argument("--sandlock", required=True)
    ap.add_argument("--json", metavar="FILE", help="also write every sample as JSON")
    ap.add_argument("--jobs", default="plain,workdir-none,workdir-write",
                    help="comma-separated jobs to run (default: all three)")
    ap.add_argument("--pre-armed", action="store_true",
                    help="also run the plain job through a pre-arm helper (lockbox pre-arm)")
    ap.add_argument("--idle", action="store_true",
                    help="pause after every row and shuffle the rows each round (see above)")
    ap.add_argument("--no-fifo", action="store_true",
                    help="do not run under SCHED_FIFO (by default, as root, the runner and every "
                    "command it starts take real-time priority 50, so that other jobs on the "
                    "machine delay none of the tools)")
    args = ap.parse_args()
    fifo = not args.no_fifo and os.geteuid() == 0
    if fifo:
        os.sched_setscheduler(0, os.SCHED_FIFO, os.sched_param(50))

    scratch = tempfile.mkdtemp(prefix="lockbox-peers-")
    dirs = {}
    first, second = args.names.split(",")
    lockboxes = [(first, args.lockbox)]
    if args.lockbox_static:
        lockboxes.append((second, args.lockbox_static))
    names = ["sl"] + [name for name, _ in lockboxes]
    for name in [f"{n}-{job}" for n in names for job in ("none", "write")]:
        d = os.path.join(scratch, name)
        os.mkdir(d)
        with open(os.path.join(d, "a"), "w") as f:
            f.write("a\n")
        dirs[name] = d
    dirs["fsyncs"] = os.path.join(scratch, "fsyncs")
    os.mkdir(dirs["fsyncs"])
    jobs = args.jobs.split(",")
    cmds = [c for c in commands(lockboxes, args.sandlock, dirs, args.pre_armed) if c[0] in jobs]
    if args.pre_armed:
        # One helper per binary, in directories of this run's; stopped at the end.
        for name, lb in lockboxes:
            d = os.path.join(scratch, f"pre-arm-{name}")
            os.mkdir(d, 0o700)
            env = dict(os.environ, LOCKBOX_PRE_ARM_DIR=d)
            subprocess.run([lb, "pre-arm", "start", "--idle", "10m"], env=env, check=True,
                           stdout=subprocess.DEVNULL)
        cmds = [(job, tool, argv, _prearm_env(tool, lockboxes, scratch)) for job, tool, argv in cmds]
    else:
        cmds = [(job, tool, argv, None) for job, tool, argv in cmds]
    if not any(c[0] == "plain" and c[1] == "true" for c in cmds):
        sys.exit("--jobs must include plain (its /bin/true is the baseline)")
    devnull = os.open(os.devnull, os.O_RDWR)
    samples = {(job, tool): [] for job, tool, _, _ in cmds}
    try:
        for r in range(args.warmup + args.rounds):
            if args.idle:
                random.shuffle(cmds)
            for job, tool, argv, env in cmds:
                ms = argv() if callable(argv) else run_once(argv, devnull, env)
                if r >= args.warmup:
                    samples[(job, tool)].append(ms)
                if args.idle or "-prearmed" in tool:
                    time.sleep(SETTLE_S)
        if args.pre_armed:
            for name, lb in lockboxes:
                env = _prearm_env(f"{name}-prearmed", lockboxes, scratch)
                status = subprocess.run([lb, "pre-arm", "status", "--json"], env=env,
                                        capture_output=True, text=True).stdout
                print(f"{name} helper: {status.strip()}", file=sys.stderr)
        for name in [f"{n}-write" for n in names] if "workdir-write" in jobs else []:
            with open(os.path.join(dirs[name], "f")) as f:
                if f.read() != "x\n":
                    sys.exit(f"{name}: the written file was not committed")
    finally:
        if args.pre_armed:
            for name, lb in lockboxes:
                subprocess.run([lb, "pre-arm", "stop"], stdout=subprocess.DEVNULL,
                               env=_prearm_env(f"{name}-prearmed", lockboxes, scratch))
        shutil.rmtree(scratch, ignore_errors=True)

    med = {k: statistics.median(v) for k, v in samples.items()}
    true = med[("plain", "true")]
    print(f"{args.rounds} interleaved rounds after {args.warmup} warm-up rounds; "
          f"{'SCHED_FIFO' if fifo else 'normal priority'}"
          f"{'; idle between rows, shuffled' if args.idle else ''}; "
          f"load average {os.getloadavg()[0]:.2f}")
    print()
    print("| job | tool | median (ms) | p95 (ms) | above /bin/true (ms) |")
    print("|---|---|---:|---:|---:|")
    for (job, tool), v in samples.items():
        print(f"| {job} | {tool} | {med[(job, tool)]:.2f} | {p95(v):.2f} | "
              f"{med[(job, tool)] - true:.2f} |")
    above = {k: m - true for k, m in med.items()}
    print()
    print("| ratio | value | target |")
    print("|---|---:|---:|")
    for name, _ in lockboxes + ([(f"{n}-prearmed", lb) for n, lb in lockboxes]
                                if args.pre_armed else []):
        plain = above[("plain", name)]
        target = "<= 0.5x" if name.endswith("-prearmed") else "<= 0.6x"
        print(f"| plain: {name} / bwrap, above /bin/true | {plain / above[('plain', 'bwrap')]:.2f}x | {target} |")
        print(f"| plain: {name} / sandlock, above /bin/true | {plain / above[('plain', 'sandlock')]:.2f}x | |")
        if name.endswith("-prearmed"):
            if "workdir-write" in jobs:
                floor = med[("workdir-write", f"{name}-no-workdir")] + med[("workdir-write", "six-fsyncs")]
                print(f"| workdir-write floor: {name}-no-workdir + six-fsyncs / sandlock | "
                      f"{floor / med[('workdir-write', 'sandlock')]:.2f}x | (<= 0.5x needed) |")
            continue
        if "workdir-none" in jobs:
            none = med[("workdir-none", name)]
            print(f"| workdir-none: {name} - {name} plain | {none - med[('plain', name)]:+.2f} ms | <= +1.5 ms |")
            print(f"| workdir-none: {name} / sandlock | {none / med[('workdir-none', 'sandlock')]:.2f}x | |")
        if "workdir-write" in jobs:
            write = med[("workdir-write", name)]
            print(f"| workdir-write: {name} / sandlock | {write / med[('workdir-write', 'sandlock')]:.2f}x | <= 0.5x |")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({f"{j}/{t}": v for (j, t), v in samples.items()}, f)


if __name__ == "__main__":
    main()
