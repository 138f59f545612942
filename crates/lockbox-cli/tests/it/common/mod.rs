//! Helpers shared by the end-to-end tests: the lockbox binary, test users, scratch
//! directories, tree snapshots.
#![allow(dead_code, clippy::unwrap_used, clippy::expect_used)]

pub mod journal;
pub mod testnet;

use std::collections::BTreeMap;
use std::os::unix::fs::PermissionsExt;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

#[derive(Debug, Clone, Copy)]
pub enum User {
    Current,
    Nobody,
}

pub fn users() -> Vec<User> {
    let status = std::fs::read_to_string("/proc/self/status").unwrap();
    let root = status
        .lines()
        .any(|l| l.starts_with("Uid:") && l.split_whitespace().nth(1) == Some("0"));
    if root {
        vec![User::Current, User::Nobody]
    } else {
        vec![User::Current]
    }
}

/// A scratch directory every test user can write to, removed when dropped (overlay work
/// directories a sandbox left included).
pub use lockbox_testkit::sandboxes::{scratch, Scratch};

/// The binary, copied where uid 65534 can execute it (the checkout may be under a
/// directory only root can enter), as `lockbox` in a directory of its own (tests put it on
/// PATH); one copy per build, shared by every test process
/// ([`lockbox_testkit::sandboxes::executable_copy`]).
pub fn binary() -> &'static Path {
    static BIN: std::sync::OnceLock<PathBuf> = std::sync::OnceLock::new();
    BIN.get_or_init(|| {
        lockbox_testkit::sandboxes::executable_copy(
            Path::new(env!("CARGO_BIN_EXE_lockbox")),
            "lockbox",
        )
    })
}

pub fn lockbox(user: User, dir: &Path, args: &[&str]) -> Output {
    command_as(user)
        .args(args)
        .current_dir(dir)
        .output()
        .unwrap()
}

pub fn text(out: &Output) -> String {
    format!(
        "status {:?}\nstdout: {}\nstderr: {}",
        out.status.code(),
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    )
}

/// One entry of a tree snapshot.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Node {
    /// Mode and content.
    File(u32, Vec<u8>),
    /// Mode.
    Dir(u32),
    /// Target.
    Symlink(PathBuf),
    /// File type bits of anything else.
    Other(u32),
}

/// Type, mode, content and symlink target of everything below `root` (symlinks not followed).
pub fn snapshot(root: &Path) -> BTreeMap<PathBuf, Node> {
    fn walk(root: &Path, dir: &Path, out: &mut BTreeMap<PathBuf, Node>) {
        for entry in std::fs::read_dir(dir).unwrap() {
            let path = entry.unwrap().path();
            let meta = std::fs::symlink_metadata(&path).unwrap();
            let rel = path.strip_prefix(root).unwrap().to_owned();
            let mode = meta.permissions().mode() & 0o7777;
            let node = if meta.file_type().is_symlink() {
                Node::Symlink(std::fs::read_link(&path).unwrap())
            } else if meta.is_dir() {
                walk(root, &path, out);
                Node::Dir(mode)
            } else if meta.is_file() {
                Node::File(mode, std::fs::read(&path).unwrap_or_default())
            } else {
                Node::Other(meta.permissions().mode() & 0o170000)
            };
            out.insert(rel, node);
        }
    }
    let mut out = BTreeMap::new();
    walk(root, root, &mut out);
    out
}

/// Makes `dir` and everything in it belong to `user` (so uid 65534 can work in it).
pub fn give(dir: &Path, user: User) {
    if let User::Nobody = user {
        // A second try: a file that vanished while `chown -R` walked (an SQLite `-wal` its
        // last connection removed) fails the first one.
        let chown = || {
            Command::new("chown")
                .args(["-R", "65534:65534"])
                .arg(dir)
                .status()
                .unwrap()
                .success()
        };
        assert!(chown() || chown(), "chown -R 65534 {}", dir.display());
    }
}

/// Runs a command as `user`.
pub fn command_as(user: User) -> Command {
    let mut cmd = Command::new(binary());
    if let User::Nobody = user {
        cmd.uid(65534).gid(65534);
    }
    cmd
}

/// Issue 15's read-modify-write racer, made deterministic: reads `counter`, says so by
/// creating `$SYNC/read-$ID`, waits until `$GO` exists, then writes counter + 1 with a fixed
/// mtime (so two racers that read the same value write the same bytes and mtime) and
/// `log_$ID`. Run in the workdir with `--write $SYNC` and `--env SYNC=.. ID=.. GO=..`.
pub const EQUAL_BYTES_RACER: &str = "n=$(cat counter) && touch \"$SYNC/read-$ID\" && \
     while [ ! -e \"$GO\" ]; do sleep 0.01; done && echo $((n+1)) > counter && \
     touch -d @1700000000 counter && echo x > log_$ID";

/// Waits (up to a minute) until `path` exists, while `child` runs; panics with the child's
/// output if it ends first.
pub fn wait_for_file(path: &Path, child: &mut std::process::Child) {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
    while !path.exists() {
        if let Some(status) = child.try_wait().unwrap() {
            let mut err = String::new();
            if let Some(mut e) = child.stderr.take() {
                let _ = std::io::Read::read_to_string(&mut e, &mut err);
            }
            panic!("ended ({status}) before {}: {err}", path.display());
        }
        assert!(
            std::time::Instant::now() < deadline,
            "{} never appeared",
            path.display()
        );
        std::thread::sleep(std::time::Duration::from_millis(5));
    }
}

/// `contents` as a file `name` every test user can read and execute, shared by every test
/// process of every run.
pub use lockbox_testkit::sandboxes::shared_file;
