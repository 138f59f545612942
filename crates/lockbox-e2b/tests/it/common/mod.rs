//! Helpers of the runtime's end-to-end tests: a runtime over a scratch state directory with
//! the `lockbox-agent` binary (see [`agent_bin`]), and re-running a test as uid 65534.
#![allow(dead_code, clippy::unwrap_used, clippy::expect_used)]

pub mod agent_bin;

use lockbox_runtime::{ExecRequest, ExecResult, Runtime, RuntimeConfig, Sandbox, SandboxSpec};
use std::os::unix::fs::PermissionsExt;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};

/// Host processes running the sandbox agent that descend from this test process (count them
/// only in a test binary of its own: other tests in the same binary start and stop
/// sandboxes; other test runs on the machine are not counted).
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

/// A scratch directory every test user can write to.
pub fn scratch() -> Scratch {
    let dir = tempfile::Builder::new()
        .prefix("lockbox-rt-test-")
        .tempdir()
        .unwrap();
    std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o777)).unwrap();
    Scratch(dir)
}

/// A scratch directory, removed when dropped even when a sandbox a test left running kept
/// its branch there: overlayfs makes its work directories mode 000, which only root could
/// remove as they are (uid 65534's runs would leave them in /tmp).
#[derive(Debug)]
pub struct Scratch(tempfile::TempDir);

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

/// A copy of `src` that every user can execute, shared by test runs of the same build (named
/// by size and mtime; older builds' copies are removed after a day, so nothing piles up).
fn executable_copy(src: &Path, name: &str) -> PathBuf {
    let md = std::fs::metadata(src).unwrap();
    let mtime = md
        .modified()
        .unwrap()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap();
    let dir = std::env::temp_dir().join("lockbox-rt-bin");
    std::fs::create_dir_all(&dir).unwrap();
    // Made by root in the first run; uid 65534 re-runs find it ready.
    let _ = std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o755));
    let bin = dir.join(format!("{name}-{}-{}", md.len(), mtime.as_nanos()));
    if !bin.exists() {
        let tmp = dir.join(format!("{name}.{}.tmp", std::process::id()));
        let _ = std::fs::remove_file(&tmp);
        link_or_copy(src, &tmp);
        std::fs::rename(&tmp, &bin).unwrap();
        // Copies of older builds go after a day: one per build would pile up in /tmp, and a
        // run of another build going on now keeps its own.
        let prefix = format!("{name}-");
        for old in std::fs::read_dir(&dir).unwrap().flatten() {
            if old.path() != bin
                && old.file_name().to_string_lossy().starts_with(&prefix)
                && stale_copy(&old.path())
            {
                let _ = std::fs::remove_file(old.path());
            }
        }
    }
    bin
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

/// The agent binary, copied where uid 65534 can execute it. The re-run as uid 65534 gets
/// the copy root made (it could not run cargo in the target directory).
pub fn agent_exe() -> &'static Path {
    static BIN: std::sync::OnceLock<PathBuf> = std::sync::OnceLock::new();
    BIN.get_or_init(|| match std::env::var_os(AGENT_COPY_VAR) {
        Some(copy) => PathBuf::from(copy),
        None => executable_copy(&agent_bin::built_agent(), "lockbox-agent"),
    })
}

/// Names the agent's copy for the re-run as uid 65534.
const AGENT_COPY_VAR: &str = "LOCKBOX_RT_TEST_AGENT";

pub async fn runtime(state: &Path) -> Runtime {
    let mut config = RuntimeConfig::new(state);
    config.agent_exe = Some(agent_exe().to_owned());
    Runtime::open(config).unwrap()
}

/// A runtime and a running sandbox with the default policy.
pub async fn sandbox(state: &Path) -> (Runtime, Sandbox) {
    sandbox_with(state, SandboxSpec::default()).await
}

pub async fn sandbox_with(state: &Path, spec: SandboxSpec) -> (Runtime, Sandbox) {
    let rt = runtime(state).await;
    let info = rt.create_sandbox(spec).await.unwrap();
    let sb = rt.sandbox(&info.id).unwrap();
    (rt, sb)
}

pub fn req(command: &str) -> ExecRequest {
    ExecRequest {
        command: command.into(),
        ..ExecRequest::default()
    }
}

pub async fn run(sb: &Sandbox, command: &str) -> ExecResult {
    sb.exec(req(command)).await.unwrap()
}

pub fn out(r: &ExecResult) -> String {
    String::from_utf8_lossy(&r.stdout).into_owned()
}

fn is_root() -> bool {
    std::fs::read_to_string("/proc/self/status")
        .unwrap()
        .lines()
        .any(|l| l.starts_with("Uid:") && l.split_whitespace().nth(1) == Some("0"))
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

/// When run as root, runs the test `name` again as uid 65534 (in a copy of this test
/// binary it can execute) and asserts it passed. Does nothing in that re-run.
pub fn also_as_nobody(name: &str) {
    if !is_root() || std::env::var_os("LOCKBOX_RT_TEST_NOBODY").is_some() {
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
        .env("LOCKBOX_RT_TEST_NOBODY", "1")
        .env(AGENT_COPY_VAR, agent_exe())
        .env("TMPDIR", nobody_tmp())
        .current_dir("/")
        .uid(65534)
        .gid(65534)
        .output()
        .unwrap();
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        out.status.success() && text.contains("1 passed"),
        "as uid 65534: {text}"
    );
}

/// Whether a copy of another build was made more than a day ago (see [`executable_copy`]).
fn stale_copy(path: &Path) -> bool {
    std::fs::symlink_metadata(path)
        .and_then(|m| m.modified())
        .ok()
        .and_then(|t| t.elapsed().ok())
        .is_some_and(|age| age > std::time::Duration::from_secs(24 * 3600))
}
