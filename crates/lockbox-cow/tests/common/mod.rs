//! Test helpers: real overlay mounts in an unprivileged user namespace (`unshare -Urm`),
//! whole-tree snapshots and hashes. No mocks.

#![allow(dead_code, clippy::unwrap_used, clippy::expect_used)] // test helpers may panic

use std::collections::BTreeMap;
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::process::Command;

use lockbox_cow::Branch;

/// True if an overlay can be mounted in a user namespace here. Skips are loud; with
/// `LOCKBOX_TEST_REQUIRE=all` a missing feature fails the test instead.
pub fn require_overlay() -> bool {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    for sub in ["l", "u", "w"] {
        std::fs::create_dir(d.join(sub)).unwrap();
    }
    let ok = Command::new("unshare")
        .args(["-Urm", "sh", "-c"])
        .arg(format!(
            "mount -t overlay overlay -o lowerdir={0}/l,upperdir={0}/u,workdir={0}/w,userxattr {0}/l",
            d.display()
        ))
        .status()
        .map(|s| s.success())
        .unwrap_or(false);
    if !ok {
        if std::env::var("LOCKBOX_TEST_REQUIRE").as_deref() == Ok("all") {
            panic!("overlayfs in a user namespace is required (LOCKBOX_TEST_REQUIRE=all)");
        }
        eprintln!("SKIP: cannot mount overlayfs in an unprivileged user namespace here");
    }
    ok
}

fn sh_quote(p: &Path) -> String {
    format!("'{}'", p.display().to_string().replace('\'', "'\\''"))
}

/// Runs `script` (sh) with cwd = the workdir, inside a user+mount namespace where the workdir
/// is overlaid by the branch, exactly as the sandbox will see it. Returns sh's exit status.
pub fn run_in_branch(branch: &Branch, script: &str) -> bool {
    let wd = sh_quote(branch.workdir());
    let full = format!(
        "mount -t overlay overlay -o lowerdir={wd},upperdir={},workdir={},userxattr {wd} || exit 99\ncd {wd} || exit 98\n{script}",
        sh_quote(&branch.upper_dir()),
        sh_quote(&branch.work_dir()),
    );
    let st = Command::new("unshare")
        .args(["-Urm", "sh", "-c", &full])
        .status()
        .unwrap();
    assert!(
        !matches!(st.code(), Some(98 | 99)),
        "overlay setup failed: {st}"
    );
    st.success()
}

/// Runs `script` directly in `dir`, as root of a user namespace (same privileges as in
/// [`run_in_branch`], without the overlay).
pub fn run_direct(dir: &Path, script: &str) -> bool {
    Command::new("unshare")
        .args(["-Ur", "sh", "-c"])
        .arg(format!("cd {} || exit 98\n{script}", sh_quote(dir)))
        .status()
        .unwrap()
        .success()
}

/// Runs `script` in `dir` as the current user (no namespace).
pub fn sh(dir: &Path, script: &str) {
    let st = Command::new("sh")
        .args(["-c", script])
        .current_dir(dir)
        .status()
        .unwrap();
    assert!(st.success(), "script failed: {script}");
}

/// One node of a tree snapshot.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Node {
    /// A regular file: mode and content.
    File(u32, Vec<u8>),
    /// A directory: mode.
    Dir(u32),
    /// A symlink: target.
    Symlink(PathBuf),
    /// Anything else: its file type bits.
    Other(u32),
}

/// Content, type, mode and symlink targets of every entry below `root` (not following
/// symlinks). The root itself is not included.
pub fn snapshot(root: &Path) -> BTreeMap<PathBuf, Node> {
    let mut out = BTreeMap::new();
    walk(root, Path::new(""), &mut out, false);
    out
}

/// Like [`snapshot`] but also records mtimes, ctimes, inode numbers and link counts: for
/// "nothing at all changed" checks.
pub fn hash_tree(root: &Path) -> BTreeMap<PathBuf, (Node, String)> {
    let mut out = BTreeMap::new();
    for (p, n) in snapshot(root) {
        let md = std::fs::symlink_metadata(root.join(&p)).unwrap();
        let extra = format!(
            "mtime={}.{} ctime={}.{} ino={} nlink={} uid={}",
            md.mtime(),
            md.mtime_nsec(),
            md.ctime(),
            md.ctime_nsec(),
            md.ino(),
            md.nlink(),
            md.uid()
        );
        out.insert(p, (n, extra));
    }
    let md = std::fs::symlink_metadata(root).unwrap();
    out.insert(
        PathBuf::from("."),
        (
            Node::Dir(md.mode() & 0o7777),
            format!("mtime={}.{}", md.mtime(), md.mtime_nsec()),
        ),
    );
    out
}

fn walk(root: &Path, rel: &Path, out: &mut BTreeMap<PathBuf, Node>, _: bool) {
    let dir = root.join(rel);
    // Make unreadable dirs readable for the snapshot, restoring the mode after.
    let md = std::fs::symlink_metadata(&dir).unwrap();
    let mode = md.mode() & 0o7777;
    let fixed = mode & 0o500 != 0o500;
    if fixed {
        std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(mode | 0o700)).unwrap();
    }
    let mut names: Vec<_> = std::fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap().file_name())
        .collect();
    names.sort();
    for name in names {
        let r = rel.join(&name);
        let p = root.join(&r);
        let md = std::fs::symlink_metadata(&p).unwrap();
        let ft = md.file_type();
        let node = if ft.is_symlink() {
            Node::Symlink(std::fs::read_link(&p).unwrap())
        } else if ft.is_dir() {
            Node::Dir(md.mode() & 0o7777)
        } else if ft.is_file() {
            let mode = md.mode() & 0o7777;
            let content = if mode & 0o400 == 0 {
                std::fs::set_permissions(&p, std::fs::Permissions::from_mode(mode | 0o400))
                    .unwrap();
                let c = std::fs::read(&p).unwrap();
                std::fs::set_permissions(&p, std::fs::Permissions::from_mode(mode)).unwrap();
                c
            } else {
                std::fs::read(&p).unwrap()
            };
            Node::File(mode, content)
        } else {
            Node::Other(md.mode() & 0o170000)
        };
        let is_dir = matches!(node, Node::Dir(_));
        out.insert(r.clone(), node);
        if is_dir {
            walk(root, &r, out, false);
        }
    }
    if fixed {
        std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(mode)).unwrap();
    }
}

/// A scratch area: a state dir, a workdir `wd` and an `outside` dir next to it (which no
/// commit may touch). World-accessible so helpers run as uid 65534 as well.
pub struct Scratch {
    pub tmp: tempfile::TempDir,
    pub state: PathBuf,
    pub wd: PathBuf,
    pub outside: PathBuf,
}

impl Scratch {
    pub fn new() -> Scratch {
        let tmp = tempfile::tempdir().unwrap();
        let state = tmp.path().join("state");
        let wd = tmp.path().join("wd");
        let outside = tmp.path().join("outside");
        for d in [&state, &wd, &outside] {
            std::fs::create_dir(d).unwrap();
        }
        std::fs::write(outside.join("secret"), "outside\n").unwrap();
        Scratch {
            tmp,
            state,
            wd,
            outside,
        }
    }

    pub fn branch(&self) -> Branch {
        // The stale-base reference is the kernel's coarse clock: let one tick pass so the
        // setup writes above are strictly older than the branch.
        std::thread::sleep(std::time::Duration::from_millis(15));
        Branch::create(
            &self.state,
            &self.wd,
            serde_json::json!({"command": ["test"]}),
        )
        .unwrap()
    }
}

/// Waits one coarse clock tick, so a host write after this is newer than the branch base.
pub fn tick() {
    std::thread::sleep(std::time::Duration::from_millis(15));
}

/// Waits until the coarse clock behind file timestamps (`CLOCK_REALTIME_COARSE`) has just
/// ticked, so that what follows within well under a tick (1-4 ms) gets one timestamp: the
/// clock edge a "written just before" test needs, made deterministic.
pub fn at_tick_start() {
    use rustix::time::{clock_gettime, ClockId};
    let first = clock_gettime(ClockId::RealtimeCoarse);
    while clock_gettime(ClockId::RealtimeCoarse) == first {
        std::hint::spin_loop();
    }
}
