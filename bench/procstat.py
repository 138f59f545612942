"""What the benchmarks read of a process in /proc (bench/*/bench.py import it): resident
memory, CPU time, descendants, and the host's memory counters."""
import os

TICK = os.sysconf("SC_CLK_TCK")


def meminfo():
    """/proc/meminfo in KiB, by field name."""
    out = {}
    with open("/proc/meminfo") as f:
        for line in f:
            k, v = line.split(":", 1)
            out[k] = int(v.split()[0])
    return out


def rss_kib(pid):
    """The process's resident set (VmRSS), in KiB; 0 when it has none (a zombie)."""
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    return 0


def _stat_fields(pid):
    # The fields after the command name, which may hold spaces and parentheses.
    with open(f"/proc/{pid}/stat") as f:
        return f.read().rsplit(")", 1)[1].split()


def cpu_s(pid):
    """User plus system CPU seconds the process has used."""
    fields = _stat_fields(pid)
    return (int(fields[11]) + int(fields[12])) / TICK


def name_and_ticks(pid):
    """The process's name and its user plus system CPU time in clock ticks (all threads)."""
    with open(f"/proc/{pid}/stat") as f:
        text = f.read()
    name = text[text.index("(") + 1:text.rindex(")")]
    fields = text.rsplit(")", 1)[1].split()
    return name, int(fields[11]) + int(fields[12])


def descendants(pid):
    """Every live descendant of `pid` (children, their children, ...)."""
    children = {}
    for p in os.listdir("/proc"):
        if not p.isdigit():
            continue
        try:
            ppid = int(_stat_fields(p)[1])
        except OSError:
            continue
        children.setdefault(ppid, []).append(int(p))
    out, todo = [], [pid]
    while todo:
        for c in children.get(todo.pop(), []):
            out.append(c)
            todo.append(c)
    return out


def fd_slots(pid):
    """The size of `pid`'s descriptor table (`FDSize`: slots, 8 bytes each), 0 if gone."""
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("FDSize:"):
                    return int(line.split()[1])
    except OSError:
        pass
    return 0
