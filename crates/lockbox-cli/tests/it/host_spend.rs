//! What a sandbox can make the host spend (docs/security.md, "What a sandbox can make the
//! host spend"): kernel objects it holds while it runs — tmpfs inodes, per-user quotas,
//! pseudo-terminals — and what a bounded branch costs the host's disk, each measured from
//! the host side, as the current user and (when root) as uid 65534. Also what the sandbox
//! learns of the caller from `/proc/1`.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use crate::common;

use common::{binary, command_as, give, lockbox, scratch, text, users, User};
use std::io::{BufRead, BufReader};
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};

/// Creates entries (`f` empty files, `d` directories, `s` symlinks) in DIR until LIMIT or
/// the first error; prints how many and the error's name.
const FILL: &str = r#"
import errno, os, sys
d, kind, limit = sys.argv[1], sys.argv[2], int(sys.argv[3])
n, err = 0, "none"
make = {"f": os.mknod, "d": os.mkdir, "s": lambda p: os.symlink("x", p)}[kind]
try:
    while n < limit:
        make(f"{d}/{kind}{n}")
        n += 1
except OSError as e:
    err = errno.errorcode.get(e.errno, str(e))
print(n, err, flush=True)
"#;

/// A scratch directory holding the test's Python scripts, readable by every test user.
struct Scripts {
    dir: crate::common::Scratch,
}

impl Scripts {
    fn new(scripts: &[(&str, &str)]) -> Scripts {
        let dir = scratch();
        for (name, body) in scripts {
            std::fs::write(dir.path().join(name), body).unwrap();
        }
        Scripts { dir }
    }

    fn path(&self, name: &str) -> String {
        self.dir.path().join(name).to_str().unwrap().to_owned()
    }

    fn root(&self) -> &str {
        self.dir.path().to_str().unwrap()
    }
}

/// A sandbox whose command has done what `script` does and now holds it: `script`'s output
/// lines, and the sandbox's processes, seen from the host. Killed when dropped.
struct Held {
    lockbox: Child,
    lines: Vec<String>,
}

impl Held {
    fn start(user: User, args: &[&str], script: &str) -> Held {
        let mut lockbox = command_as(user)
            .arg("run")
            .args(args)
            .args([
                "--",
                "sh",
                "-c",
                &format!("{script}\necho ready; exec sleep 120"),
            ])
            .current_dir("/")
            .stdout(Stdio::piped())
            .spawn()
            .unwrap();
        let mut lines = Vec::new();
        for line in BufReader::new(lockbox.stdout.take().unwrap()).lines() {
            let line = line.unwrap();
            if line == "ready" {
                return Held { lockbox, lines };
            }
            lines.push(line);
        }
        let status = lockbox.wait().unwrap();
        panic!("the sandbox ended ({status}) before it was ready: {lines:?}");
    }

    /// The sandboxed command's `/proc` directory on the host (the init's only child).
    fn command_proc(&self) -> PathBuf {
        let init = only_child(self.lockbox.id());
        Path::new("/proc").join(only_child(init).to_string())
    }
}

impl Drop for Held {
    fn drop(&mut self) {
        let _ = self.lockbox.kill();
        let _ = self.lockbox.wait();
    }
}

/// The single child of `pid`, from the host's `/proc`.
fn only_child(pid: u32) -> u32 {
    let children: Vec<u32> = std::fs::read_dir("/proc")
        .unwrap()
        .flatten()
        .filter_map(|e| e.file_name().to_str()?.parse::<u32>().ok())
        .filter(|p| {
            let stat = std::fs::read_to_string(format!("/proc/{p}/stat")).unwrap_or_default();
            let after = stat.rfind(')').map_or("", |i| &stat[i + 1..]);
            after.split_whitespace().nth(1) == Some(&pid.to_string())
        })
        .collect();
    assert_eq!(children.len(), 1, "children of {pid}: {children:?}");
    children[0]
}

/// (total, free) inodes of the filesystem at `path`, as `df -i` says, read from the host.
fn inodes(path: &Path) -> (u64, u64) {
    let out = Command::new("stat")
        .args(["-f", "-c", "%c %d"])
        .arg(path)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "stat -f {}: {}",
        path.display(),
        text(&out)
    );
    let s = String::from_utf8(out.stdout).unwrap();
    let mut it = s.split_whitespace().map(|n| n.parse::<u64>().unwrap());
    (it.next().unwrap(), it.next().unwrap())
}

/// "N ERR" of a FILL line.
fn filled(line: &str) -> (u64, &str) {
    let (n, err) = line.split_once(' ').unwrap();
    (n.parse().unwrap(), err)
}

#[test]
fn scratch_tmpfs_mounts_hold_at_most_262144_inodes_by_default() {
    let s = Scripts::new(&[("fill.py", FILL)]);
    let fill = s.path("fill.py");
    // One more than the bound (about 2 s), in one scratch mount per user; both mounts of
    // every sandbox are checked from the host.
    for (user, filled_mount) in users().into_iter().zip(["tmp", "dev/shm"]) {
        let script = format!("python3 {fill} /{filled_mount} f 262145");
        let held = Held::start(user, &["-r", s.root()], &script);
        let (n, err) = filled(&held.lines[0]);
        assert_eq!(err, "ENOSPC", "{user:?} /{filled_mount}: {:?}", held.lines);
        assert!(n < 262_144 && n > 262_000, "{user:?}: {:?}", held.lines);
        for mount in ["tmp", "dev/shm"] {
            let (total, free) = inodes(&held.command_proc().join("root").join(mount));
            assert_eq!(total, 262_144, "{user:?} /{mount} from the host");
            if mount == filled_mount {
                assert_eq!(free, 0, "{user:?} /{mount} from the host");
            }
        }
    }
}

#[test]
fn scratch_inodes_follow_max_memory_and_max_inodes() {
    let s = Scripts::new(&[("fill.py", FILL)]);
    let fill = s.path("fill.py");
    for user in users() {
        let held = Held::start(user, &["--max-memory", "64M"], "true");
        for mount in ["tmp", "dev/shm"] {
            let (total, _) = inodes(&held.command_proc().join("root").join(mount));
            assert_eq!(total, 65_536, "{user:?} /{mount} under --max-memory 64M");
        }
        drop(held);
        let script = format!("python3 {fill} /tmp d 1001; python3 {fill} /dev/shm s 1001");
        let held = Held::start(user, &["-r", s.root(), "--max-inodes", "1000"], &script);
        for (line, mount) in held.lines.iter().zip(["tmp", "dev/shm"]) {
            let (n, err) = filled(line);
            assert_eq!(err, "ENOSPC", "{user:?} /{mount}: {line}");
            assert!(n < 1000 && n > 990, "{user:?} /{mount}: {line}");
            let (total, free) = inodes(&held.command_proc().join("root").join(mount));
            assert_eq!((total, free), (1000, 0), "{user:?} /{mount} from the host");
        }
    }
}

/// Bytes the tree at `root` takes on disk (`du`: blocks of every entry, directories too)
/// and how many entries it has.
fn disk_use(root: &Path) -> (u64, u64) {
    let meta = std::fs::symlink_metadata(root).unwrap();
    let (mut bytes, mut entries) = (meta.blocks() * 512, 1);
    if meta.is_dir() {
        for entry in std::fs::read_dir(root).unwrap() {
            let (b, e) = disk_use(&entry.unwrap().path());
            bytes += b;
            entries += e;
        }
    }
    (bytes, entries)
}

#[test]
fn a_max_disk_branch_holds_one_inode_per_4k_and_costs_the_host_about_twice_max_disk() {
    let s = Scripts::new(&[("fill.py", FILL)]);
    let fill = s.path("fill.py");
    for user in users() {
        let tmp = scratch();
        let (work, state) = (tmp.path().join("work"), tmp.path().join("state"));
        std::fs::create_dir(&work).unwrap();
        give(tmp.path(), user);
        // Neither directories nor short symlinks count against a tmpfs's size.
        let script = format!("python3 {fill} . d 128; python3 {fill} . s 5000");
        let out = lockbox(
            user,
            Path::new("/"),
            &[
                "run",
                "-r",
                s.root(),
                "--workdir",
                work.to_str().unwrap(),
                "--state-dir",
                state.to_str().unwrap(),
                "--max-disk",
                "1M",
                "--on-exit",
                "keep",
                "--",
                "sh",
                "-c",
                &script,
            ],
        );
        assert_eq!(out.status.code(), Some(0), "{user:?} {}", text(&out));
        let stdout = String::from_utf8_lossy(&out.stdout);
        let lines: Vec<&str> = stdout.lines().collect();
        assert_eq!(lines[0], "128 none", "{user:?} {}", text(&out));
        // 1M / 4K = 256 inodes for the sandbox, 128 of them directories.
        assert_eq!(lines[1], "128 ENOSPC", "{user:?} {}", text(&out));
        let branches = state.join("branches");
        // `.new` is where branches are built before they are renamed into place.
        let ids: Vec<PathBuf> = std::fs::read_dir(&branches)
            .unwrap()
            .map(|e| e.unwrap().path())
            .filter(|p| !p.file_name().unwrap().to_string_lossy().starts_with('.'))
            .collect();
        assert_eq!(ids.len(), 1, "{user:?}: {ids:?}");
        let (bytes, entries) = disk_use(&ids[0].join("upper"));
        assert!(
            entries <= 257,
            "{user:?}: the kept branch has {entries} entries"
        );
        assert!(
            bytes <= 2 << 20,
            "{user:?}: the kept branch takes {bytes} bytes on the host"
        );
    }
    let out = lockbox(
        User::Current,
        Path::new("/"),
        &["run", "--workdir", "/tmp", "--max-disk", "0", "--", "true"],
    );
    assert_eq!(out.status.code(), Some(2), "{}", text(&out));
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("greater than zero"),
        "{}",
        text(&out)
    );
}

/// Takes inotify instances until refused; prints how many and why.
const INOTIFY_GREED: &str = r#"
import ctypes, errno
libc = ctypes.CDLL(None, use_errno=True)
n = 0
while n < 100000 and libc.inotify_init1(0) >= 0:
    n += 1
print(n, errno.errorcode.get(ctypes.get_errno()), flush=True)
"#;

/// What the host user can still do: one inotify instance, one POSIX message queue, one
/// queued real-time signal.
const HOST_CHECK: &str = r#"
import ctypes, errno, os, signal, sys
libc = ctypes.CDLL(None, use_errno=True)
def err():
    return errno.errorcode.get(ctypes.get_errno())
what = sys.argv[1]
if what == "inotify":
    print("ok" if libc.inotify_init1(0) >= 0 else err())
elif what == "mq":
    name = f"/lockbox-host-{os.getpid()}".encode()
    q = libc.mq_open(name, os.O_CREAT | os.O_RDWR, 0o600, None)
    print("ok" if q >= 0 else err())
    libc.mq_unlink(name)
else:
    signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGRTMIN})
    print("ok" if libc.sigqueue(os.getpid(), signal.SIGRTMIN, None) == 0 else err())
"#;

/// Runs HOST_CHECK `what` on the host as `user`.
fn host_can(user: User, s: &Scripts, what: &str) -> String {
    let mut cmd = Command::new("python3");
    if let User::Nobody = user {
        std::os::unix::process::CommandExt::uid(&mut cmd, 65534);
        std::os::unix::process::CommandExt::gid(&mut cmd, 65534);
    }
    let out = cmd
        .args([&s.path("host.py"), what])
        .current_dir("/")
        .output()
        .unwrap();
    String::from_utf8_lossy(&out.stdout).trim().to_owned()
}

/// Issue 32: a sandbox of uid 65534 took all 128 of its caller's inotify instances (only a
/// root caller's sandboxes were bounded). Any caller's sandbox now writes its own user
/// namespace's limits: a quarter of the caller's, root or not.
#[test]
fn issue_32_the_host_users_inotify_survives_a_sandbox_that_takes_all_it_can() {
    let s = Scripts::new(&[("greed.py", INOTIFY_GREED), ("host.py", HOST_CHECK)]);
    let host_max: u64 = std::fs::read_to_string("/proc/sys/user/max_inotify_instances")
        .unwrap()
        .trim()
        .parse()
        .unwrap();
    for user in users() {
        let held = Held::start(
            user,
            &["-r", s.root()],
            &format!("python3 {}", s.path("greed.py")),
        );
        let (n, err) = filled(&held.lines[0]);
        assert_eq!(err, "EMFILE", "{user:?} {:?}", held.lines);
        assert_eq!(
            host_can(user, &s, "inotify"),
            "ok",
            "{user:?}: the sandbox took {n}"
        );
        assert!(
            n <= host_max / 4,
            "{user:?}: the sandbox took {n} of {host_max}"
        );
        drop(held);
        let report = scratch();
        let report = report.path().join("r.json");
        let out = lockbox(
            user,
            Path::new("/"),
            &["run", "--report", report.to_str().unwrap(), "--", "true"],
        );
        assert_eq!(out.status.code(), Some(0), "{}", text(&out));
        let json: serde_json::Value =
            serde_json::from_str(&std::fs::read_to_string(&report).unwrap()).unwrap();
        let quota = &json["enforcement"]["user_quotas"]["inotify_instances"];
        assert_eq!(quota, host_max / 4, "{user:?} {json}");
    }
}

/// Fills the POSIX message queue and pending-signal quotas (a queue is charged even when
/// Landlock then refuses to open it: EACCES), prints how many of each and why it stopped.
const QUEUE_GREED: &str = r#"
import ctypes, errno, os, signal
libc = ctypes.CDLL(None, use_errno=True)
class Attr(ctypes.Structure):
    _fields_ = [("flags", ctypes.c_long), ("maxmsg", ctypes.c_long),
                ("msgsize", ctypes.c_long), ("curmsgs", ctypes.c_long),
                ("pad", ctypes.c_long * 4)]
attr = Attr(0, 10, 8192, 0)
made, why = 0, None
for i in range(1000):
    q = libc.mq_open(f"/greed-{i}".encode(), os.O_CREAT | os.O_RDWR, 0o600, ctypes.byref(attr))
    e = ctypes.get_errno()
    if q < 0 and e != errno.EACCES:
        why = errno.errorcode.get(e)
        break
    made += 1
print("queues", made, why, flush=True)
signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGRTMIN})
queued = 0
# sigqueue, not kill: kill() never fails for want of a queue entry (the value is lost).
while queued < 1_000_000 and libc.sigqueue(os.getpid(), signal.SIGRTMIN, None) == 0:
    queued += 1
print("signals", queued, errno.errorcode.get(ctypes.get_errno()), flush=True)
"#;

#[test]
fn the_host_users_message_queues_and_signal_queue_survive_a_greedy_sandbox() {
    let s = Scripts::new(&[("greed.py", QUEUE_GREED), ("host.py", HOST_CHECK)]);
    for user in users() {
        let held = Held::start(
            user,
            &["-r", s.root()],
            &format!("python3 {}", s.path("greed.py")),
        );
        assert!(
            held.lines[0].ends_with("EMFILE"),
            "{user:?} {:?}",
            held.lines
        );
        assert!(
            held.lines[1].ends_with("EAGAIN"),
            "{user:?} {:?}",
            held.lines
        );
        assert_eq!(host_can(user, &s, "mq"), "ok", "{user:?} {:?}", held.lines);
        assert_eq!(
            host_can(user, &s, "signal"),
            "ok",
            "{user:?} {:?}",
            held.lines
        );
    }
}

/// Opens pseudo-terminals until refused; prints how many and why.
const PTY_GREED: &str = r#"
import errno, os, resource
soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
held, why = [], None
try:
    while len(held) < 5000:
        held.append(os.openpty())
except OSError as e:
    why = errno.errorcode.get(e.errno)
print(len(held), why, flush=True)
"#;

#[test]
fn a_sandbox_takes_a_quarter_of_the_shared_ptys_and_leaves_the_rest_to_others() {
    let s = Scripts::new(&[("ptys.py", PTY_GREED)]);
    let read = |name: &str| -> u64 {
        std::fs::read_to_string(format!("/proc/sys/kernel/pty/{name}"))
            .unwrap()
            .trim()
            .parse()
            .unwrap()
    };
    let share = (read("max") - read("reserve")) / 4;
    for user in users() {
        let held = Held::start(
            user,
            &["-r", s.root()],
            &format!("python3 {}", s.path("ptys.py")),
        );
        assert_eq!(held.lines[0], format!("{share} ENOSPC"), "{user:?}");
        // Another sandbox still gets a terminal.
        let out = lockbox(
            user,
            Path::new("/"),
            &[
                "run",
                "--",
                "python3",
                "-c",
                "import os; os.openpty(); print('ok')",
            ],
        );
        assert_eq!(
            String::from_utf8_lossy(&out.stdout),
            "ok\n",
            "{user:?} {}",
            text(&out)
        );
    }
}

#[test]
fn proc_1_shows_the_init_by_name_and_nothing_of_the_callers_command_line() {
    let secret = format!("hunter2-{}", std::process::id());
    let bin = binary().to_str().unwrap().to_owned();
    for user in users() {
        let out = lockbox(
            user,
            Path::new("/"),
            &[
                "run",
                "--env",
                &format!("TOKEN={secret}"),
                "--hostname",
                "decoy-arg",
                "--",
                "sh",
                "-c",
                "for f in cmdline comm environ status; do echo \"== $f\"; cat /proc/1/$f; echo; done; \
                 echo \"== exe\"; readlink /proc/1/exe; echo \"== stat\"; cat /proc/1/stat",
            ],
        );
        let stdout = String::from_utf8_lossy(&out.stdout);
        let cmdline = stdout
            .split("== cmdline\n")
            .nth(1)
            .and_then(|s| s.split("\n== comm").next())
            .unwrap_or_default();
        assert_eq!(cmdline, "lockbox-init\0", "{user:?} {}", text(&out));
        assert!(stdout.contains("== comm\nlockbox-init\n"), "{}", text(&out));
        assert!(stdout.contains("Name:\tlockbox-init\n"), "{}", text(&out));
        for leak in [secret.as_str(), "decoy-arg", "--env", bin.as_str()] {
            assert!(
                !stdout.contains(leak),
                "{user:?} sees {leak:?}: {}",
                text(&out)
            );
        }
    }
}
