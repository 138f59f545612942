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
/// PATH). One copy per build, named by size and mtime and shared by every test process;
/// copies of older builds are removed after a day, so nothing piles up in /tmp (and test
/// runs of other builds going on at the same time keep theirs).
pub fn binary() -> &'static Path {
    static BIN: std::sync::OnceLock<PathBuf> = std::sync::OnceLock::new();
    BIN.get_or_init(|| {
        let src = Path::new(env!("CARGO_BIN_EXE_lockbox"));
        let md = std::fs::metadata(src).unwrap();
        let mtime = md
            .modified()
            .unwrap()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap();
        let root = std::env::temp_dir().join("lockbox-test-bin");
        let build = format!("{}-{}", md.len(), mtime.as_nanos());
        let dir = root.join(&build);
        let bin = dir.join("lockbox");
        if !bin.exists() {
            std::fs::create_dir_all(&root).unwrap();
            // Made by root in the first run; uid 65534 re-runs find it ready.
            let _ = std::fs::set_permissions(&root, std::fs::Permissions::from_mode(0o755));
            let tmp = root.join(format!(".{build}.{}.tmp", std::process::id()));
            let _ = std::fs::remove_dir_all(&tmp);
            std::fs::create_dir(&tmp).unwrap();
            std::fs::set_permissions(&tmp, std::fs::Permissions::from_mode(0o755)).unwrap();
            link_or_copy(src, &tmp.join("lockbox"));
            // Another test process may have won the race: its copy is as good.
            if std::fs::rename(&tmp, &dir).is_err() {
                let _ = std::fs::remove_dir_all(&tmp);
            }
            for old in std::fs::read_dir(&root).unwrap().flatten() {
                let name = old.file_name();
                if name != build.as_str()
                    && !name.to_string_lossy().starts_with('.')
                    && stale_copy(&old.path())
                {
                    let _ = std::fs::remove_dir_all(old.path());
                }
            }
        }
        bin
    })
}

/// `dst` as a hard link to `src` when they share a filesystem (debug binaries are large and
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

/// `contents` as a file `name` that every test user can read and execute, shared by every
/// test process of every run (named by a hash of the contents, beside [`binary`]'s copies and
/// removed like them). For a test's `static`: a `TempDir` there is never dropped, so each run
/// would leave one in /tmp.
pub fn shared_file(name: &str, contents: &[u8]) -> PathBuf {
    use std::hash::{Hash, Hasher};
    let mut hash = std::hash::DefaultHasher::new();
    contents.hash(&mut hash);
    let root = std::env::temp_dir().join("lockbox-test-bin");
    let key = format!("{name}-{:016x}", hash.finish());
    let dir = root.join(&key);
    let file = dir.join(name);
    if file.exists() {
        // Still in use: not stale for another day (best effort; uid 65534 cannot).
        let now = std::time::SystemTime::now();
        let _ = std::fs::File::open(&dir).and_then(|d| d.set_modified(now));
        return file;
    }
    std::fs::create_dir_all(&root).unwrap();
    let _ = std::fs::set_permissions(&root, std::fs::Permissions::from_mode(0o755));
    let tmp = root.join(format!(".{key}.{}.tmp", std::process::id()));
    let _ = std::fs::remove_dir_all(&tmp);
    std::fs::create_dir(&tmp).unwrap();
    std::fs::set_permissions(&tmp, std::fs::Permissions::from_mode(0o755)).unwrap();
    std::fs::write(tmp.join(name), contents).unwrap();
    std::fs::set_permissions(tmp.join(name), std::fs::Permissions::from_mode(0o755)).unwrap();
    // Another test process may have won the race: its file is the same.
    if std::fs::rename(&tmp, &dir).is_err() {
        let _ = std::fs::remove_dir_all(&tmp);
    }
    file
}

pub fn stale_copy(path: &Path) -> bool {
    std::fs::symlink_metadata(path)
        .and_then(|m| m.modified())
        .ok()
        .and_then(|t| t.elapsed().ok())
        .is_some_and(|age| age > std::time::Duration::from_secs(24 * 3600))
}
