//! For tests that run real sandboxes through `lockbox-runtime`: the `lockbox-agent` binary
//! from the outer build ([`built_agent`]) and a copy of it every user can execute
//! ([`agent_exe`]), scratch directories that go even with overlayfs work directories in
//! them ([`Scratch`]), re-running a test as uid 65534 ([`also_as_nobody`]) or in a process
//! of its own ([`in_own_process`]), and counting a test process's sandbox agents
//! ([`host_agents`]).
//!
//! Cargo gives a package's tests only its own binaries (`CARGO_BIN_EXE_*`), and the agent's
//! binary lives in its own crate, so it comes from the outer build: `$LOCKBOX_AGENT_EXE` if
//! set, else `lockbox-agent` in the calling test's own target directory and profile
//! (`cargo build -p lockbox-agent`, which `scripts/test.sh` runs first; `--release` for
//! benchmarks). Never built from here: a nested `cargo build` cost a second build of the
//! agent's dependencies and raced the outer build's lock. A missing or stale agent (older
//! than a source file it is built from) is an error saying what to run.

use std::os::unix::fs::PermissionsExt;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::time::SystemTime;

/// Overrides where the agent is (a path to the executable).
pub const AGENT_EXE_VAR: &str = "LOCKBOX_AGENT_EXE";

/// Set in a test's re-run as uid 65534 ([`also_as_nobody`]).
pub const NOBODY_VAR: &str = "LOCKBOX_RT_TEST_NOBODY";

/// Names the agent's copy for the re-run as uid 65534.
const AGENT_COPY_VAR: &str = "LOCKBOX_RT_TEST_AGENT";

/// Set in the process [`in_own_process`] runs a test in.
const OWN_PROCESS_VAR: &str = "LOCKBOX_TEST_OWN_PROCESS";

/// The path of the built `lockbox-agent` binary; panics saying how to build it when it is
/// missing or older than its sources.
pub fn built_agent() -> PathBuf {
    if let Some(exe) = std::env::var_os(AGENT_EXE_VAR) {
        let exe = PathBuf::from(exe);
        assert!(
            exe.is_file(),
            "{AGENT_EXE_VAR}={} does not exist",
            exe.display()
        );
        return exe;
    }
    let exe = std::env::current_exe().unwrap();
    // TARGET/PROFILE/deps/NAME-HASH
    let profile_dir = exe.parent().and_then(|d| d.parent()).unwrap().to_owned();
    let flag = match profile_dir.file_name().and_then(|n| n.to_str()) {
        Some("debug") | None => String::new(),
        Some("release") => " --release".to_owned(),
        Some(other) => format!(" --profile {other}"),
    };
    let agent = profile_dir.join("lockbox-agent");
    let built = std::fs::metadata(&agent).and_then(|m| m.modified()).ok();
    let Some(built) = built else {
        panic!(
            "the agent {} is not built: run `cargo build{flag} -p lockbox-agent` first \
             (scripts/test.sh does), or set {AGENT_EXE_VAR}",
            agent.display()
        );
    };
    let crates = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    // What the agent is built from (crates/lockbox-agent and its workspace dependencies).
    for dir in [
        "lockbox-agent",
        "lockbox-confine",
        "lockbox-policy",
        "lockbox-netsup",
        "lockbox-codes",
    ] {
        if let Some(newer) = newer_than(&crates.join(dir), built) {
            panic!(
                "the agent {} is older than {}: run `cargo build{flag} -p lockbox-agent` \
                 (scripts/test.sh does), or set {AGENT_EXE_VAR}",
                agent.display(),
                newer.display()
            );
        }
    }
    agent
}

/// A file under `dir` (its `src/` and `Cargo.toml`) modified after `t`, if any.
fn newer_than(dir: &Path, t: SystemTime) -> Option<PathBuf> {
    let mut stack = vec![dir.join("src"), dir.join("Cargo.toml")];
    while let Some(p) = stack.pop() {
        let Ok(md) = std::fs::metadata(&p) else {
            continue;
        };
        if md.is_dir() {
            stack.extend(std::fs::read_dir(&p).ok()?.flatten().map(|e| e.path()));
        } else if md.modified().is_ok_and(|m| m > t) {
            return Some(p);
        }
    }
    None
}

/// The agent binary, copied where uid 65534 can execute it. The re-run as uid 65534 gets
/// the copy root made (it could not run cargo in the target directory).
pub fn agent_exe() -> &'static Path {
    static BIN: std::sync::OnceLock<PathBuf> = std::sync::OnceLock::new();
    BIN.get_or_init(|| match std::env::var_os(AGENT_COPY_VAR) {
        Some(copy) => PathBuf::from(copy),
        None => executable_copy(&built_agent(), "lockbox-agent"),
    })
}

/// Host processes running the sandbox agent that descend from this test process. Count them
/// only in a process of the test's own ([`in_own_process`], or its re-run as uid 65534):
/// the other tests of a crate's one test binary start and stop sandboxes beside it. Other
/// test runs on the machine are not counted.
pub fn host_agents() -> usize {
    let me = std::process::id();
    let parent = |pid: u32| -> Option<u32> {
        let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
        // After the command name's closing parenthesis: state, then the parent's pid.
        stat.rsplit_once(')')?
            .1
            .split_whitespace()
            .nth(1)?
            .parse()
            .ok()
    };
    let descends = |mut pid: u32| {
        while pid > 1 {
            if pid == me {
                return true;
            }
            match parent(pid) {
                Some(p) => pid = p,
                None => return false,
            }
        }
        false
    };
    std::fs::read_dir("/proc")
        .unwrap()
        .flatten()
        .filter_map(|e| e.file_name().to_str()?.parse::<u32>().ok())
        .filter(|pid| {
            std::fs::read(format!("/proc/{pid}/cmdline"))
                .is_ok_and(|c| c.split(|&b| b == 0).any(|a| a == b"__lockbox_agent"))
        })
        .filter(|&pid| descends(pid))
        .count()
}

/// A scratch directory every test user can write to, under `$TMPDIR`.
pub fn scratch() -> Scratch {
    let dir = tempfile::Builder::new()
        .prefix("lockbox-test-")
        .tempdir()
        .unwrap();
    std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o777)).unwrap();
    Scratch(dir)
}

/// A scratch directory, removed when dropped even when a sandbox a test left running kept
/// its branch there: overlayfs makes its work directories mode 000, which only root could
/// remove as they are (uid 65534's runs would leave them in /tmp).
#[derive(Debug)]
pub struct Scratch(pub(crate) tempfile::TempDir);

impl Scratch {
    pub fn path(&self) -> &Path {
        self.0.path()
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        fn open_up(dir: &Path) {
            let _ = std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o700));
            for entry in std::fs::read_dir(dir).into_iter().flatten().flatten() {
                if entry.file_type().is_ok_and(|t| t.is_dir()) {
                    open_up(&entry.path());
                }
            }
        }
        if std::fs::remove_dir_all(self.0.path()).is_err() {
            open_up(self.0.path());
        }
    }
}

/// A copy of `src` every user can execute, shared by test runs of the same build: `name`
/// in a directory named by `name`, the size and the mtime (see [`shared_file_with`]).
pub fn executable_copy(src: &Path, name: &str) -> PathBuf {
    let md = std::fs::metadata(src).unwrap();
    let mtime = md
        .modified()
        .unwrap()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap();
    let key = format!("{name}-{}-{}", md.len(), mtime.as_nanos());
    shared_file_with(&key, name, |dst| link_or_copy(src, dst))
}

/// `contents` as a file `name` every test user can read and execute, shared by every test
/// process of every run (named by a hash of the contents; see [`shared_file_with`]). For a
/// test's `static`: a `TempDir` there is never dropped, so each run would leave one in /tmp.
pub fn shared_file(name: &str, contents: &[u8]) -> PathBuf {
    use std::hash::{Hash, Hasher};
    let mut hash = std::hash::DefaultHasher::new();
    contents.hash(&mut hash);
    shared_file_with(&format!("{name}-{:016x}", hash.finish()), name, |dst| {
        std::fs::write(dst, contents).unwrap();
        std::fs::set_permissions(dst, std::fs::Permissions::from_mode(0o755)).unwrap();
    })
}

/// `$TMPDIR/lockbox-test-bin/KEY/NAME`, made by `fill` (given the path to write) the first
/// time, in a directory of its own so that it can go on a `PATH`; every user can enter it
/// (the checkout may be under a directory only root can enter, and the re-runs as uid 65534
/// find root's copy ready). Made under a temporary name and renamed into place: a test
/// process racing another uses whichever copy won. Entries unused for a day go when a new
/// one is made, so nothing piles up in /tmp, and runs of other builds going on at the same
/// time keep theirs.
pub fn shared_file_with(key: &str, name: &str, fill: impl FnOnce(&Path)) -> PathBuf {
    let root = std::env::temp_dir().join("lockbox-test-bin");
    let dir = root.join(key);
    let file = dir.join(name);
    if file.exists() {
        // In use: not stale for another day (best effort: uid 65534 cannot touch root's).
        let _ = std::fs::File::open(&dir).and_then(|d| d.set_modified(SystemTime::now()));
        return file;
    }
    std::fs::create_dir_all(&root).unwrap();
    let _ = std::fs::set_permissions(&root, std::fs::Permissions::from_mode(0o755));
    let tmp = root.join(format!(".{key}.{}.tmp", std::process::id()));
    let _ = std::fs::remove_dir_all(&tmp);
    std::fs::create_dir(&tmp).unwrap();
    std::fs::set_permissions(&tmp, std::fs::Permissions::from_mode(0o755)).unwrap();
    fill(&tmp.join(name));
    if std::fs::rename(&tmp, &dir).is_err() {
        let _ = std::fs::remove_dir_all(&tmp);
    }
    for old in std::fs::read_dir(&root).into_iter().flatten().flatten() {
        if old.file_name() != key && unused_for_a_day(&old.path()) {
            let _ = std::fs::remove_dir_all(old.path());
        }
    }
    file
}

/// `dst` as a hard link to `src` when they share a filesystem (test binaries are large and
/// CI shares its disk), else as a copy; either way executable by every user.
fn link_or_copy(src: &Path, dst: &Path) {
    if std::fs::hard_link(src, dst).is_ok()
        && std::fs::metadata(dst).unwrap().permissions().mode() & 0o005 == 0o005
    {
        return;
    }
    let _ = std::fs::remove_file(dst);
    std::fs::copy(src, dst).unwrap();
    std::fs::set_permissions(dst, std::fs::Permissions::from_mode(0o755)).unwrap();
}

fn unused_for_a_day(path: &Path) -> bool {
    std::fs::symlink_metadata(path)
        .and_then(|m| m.modified())
        .ok()
        .and_then(|t| t.elapsed().ok())
        .is_some_and(|age| age > std::time::Duration::from_secs(24 * 3600))
}

/// The re-run's temporary directory: ours when everyone may write to it (it holds the
/// agent's copy made above), else `/tmp`.
fn nobody_tmp() -> PathBuf {
    let ours = std::env::temp_dir();
    let shared = std::fs::metadata(&ours).is_ok_and(|m| m.permissions().mode() & 0o1777 == 0o1777);
    if shared {
        ours
    } else {
        PathBuf::from("/tmp")
    }
}

/// When run as root, runs the test `name` (a [`crate::test_name!`]) again as uid 65534, in
/// a copy of this test binary it can execute and in a process of its own, and asserts it
/// passed. Does nothing in that re-run, nor in a process [`in_own_process`] made.
pub fn also_as_nobody(name: &str) {
    if !crate::is_root()
        || std::env::var_os(NOBODY_VAR).is_some()
        || std::env::var_os(OWN_PROCESS_VAR).is_some()
    {
        return;
    }
    // The re-run cannot create the agent's copy in a directory root made.
    agent_exe();
    static COPY: std::sync::OnceLock<PathBuf> = std::sync::OnceLock::new();
    let copy = COPY.get_or_init(|| {
        let exe = std::env::current_exe().unwrap();
        let name = exe.file_name().unwrap().to_string_lossy().into_owned();
        executable_copy(&exe, &name)
    });
    let out = std::process::Command::new(copy)
        .args([name, "--exact", "--nocapture", "--test-threads=1"])
        .env(NOBODY_VAR, "1")
        .env(AGENT_COPY_VAR, agent_exe())
        .env("TMPDIR", nobody_tmp())
        .current_dir("/")
        .uid(65534)
        .gid(65534)
        .output()
        .unwrap();
    assert_passed(&out, "as uid 65534");
}

/// For a test that counts its process's sandbox agents ([`host_agents`]) or children, which
/// the other tests of the same test binary, running beside it, would change: returns `true`
/// in a process of the test's own (made here, or its re-run as uid 65534), where its body
/// runs. Anywhere else it runs the test `name` (a [`crate::test_name!`]) in such a process,
/// asserts it passed, and returns `false`: the caller returns.
pub fn in_own_process(name: &str) -> bool {
    if std::env::var_os(OWN_PROCESS_VAR).is_some() || std::env::var_os(NOBODY_VAR).is_some() {
        return true;
    }
    let out = crate::child(name, OWN_PROCESS_VAR, "1").output().unwrap();
    assert_passed(&out, "in a process of its own");
    false
}

/// Asserts that a run of one test passed, showing its output otherwise.
fn assert_passed(out: &std::process::Output, how: &str) {
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        out.status.success() && text.contains("1 passed"),
        "{how}: {text}"
    );
}
