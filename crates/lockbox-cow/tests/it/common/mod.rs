//! Test helpers: real overlay mounts in an unprivileged user namespace (`unshare -Urm`),
//! whole-tree snapshots and hashes. No mocks.

#![allow(dead_code, clippy::unwrap_used, clippy::expect_used)] // test helpers may panic

use std::collections::BTreeMap;
use std::ffi::{OsStr, OsString};
use std::io::Read;
use std::os::fd::{AsFd, BorrowedFd};
use std::os::unix::ffi::{OsStrExt, OsStringExt};
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::process::Command;

use rustix::fs::{AtFlags, FileType, Mode, OFlags};

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
    lockbox_testkit::requirement(
        ok,
        "cannot mount overlayfs in an unprivileged user namespace here",
    )
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
    let st = Command::new("timeout")
        .args([SCRIPT_TIMEOUT, "unshare", "-Urm", "sh", "-c", &full])
        .status()
        .unwrap();
    assert!(
        !matches!(st.code(), Some(98 | 99)),
        "overlay setup failed: {st}"
    );
    assert_ne!(st.code(), Some(124), "script timed out:\n{script}");
    st.success()
}

/// Runs `script` directly in `dir`, as root of a user namespace (same privileges as in
/// [`run_in_branch`], without the overlay).
pub fn run_direct(dir: &Path, script: &str) -> bool {
    let st = Command::new("timeout")
        .args([SCRIPT_TIMEOUT, "unshare", "-Ur", "sh", "-c"])
        .arg(format!("cd {} || exit 98\n{script}", sh_quote(dir)))
        .status()
        .unwrap();
    assert_ne!(st.code(), Some(124), "script timed out:\n{script}");
    st.success()
}

/// A script that blocks (on a FIFO, say) fails its test instead of hanging it.
const SCRIPT_TIMEOUT: &str = "120";

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
    entries(root)
        .into_iter()
        .map(|(p, e)| (p, e.node))
        .collect()
}

/// Every entry with, for a regular file, its data ranges.
pub type Tree = BTreeMap<PathBuf, (Node, Vec<(u64, u64)>)>;

/// Like [`snapshot`], with the data ranges of every regular file (`SEEK_DATA`/`SEEK_HOLE`),
/// so that a file with holes only equals a file with the same holes.
pub fn snapshot_with_extents(root: &Path) -> Tree {
    entries(root)
        .into_iter()
        .map(|(p, e)| (p, (e.node, e.extents)))
        .collect()
}

/// The paths at which two [`snapshot_with_extents`] trees differ, each with a short
/// description of both sides (file contents by length and first bytes): readable where a
/// whole tree of multi-megabyte files would not be.
pub fn tree_diff(got: &Tree, want: &Tree) -> String {
    let show = |e: Option<&(Node, Vec<(u64, u64)>)>| match e {
        None => "absent".to_string(),
        Some((Node::File(mode, c), ext)) => format!(
            "file {mode:o}, {} bytes {:?}..., data {ext:?}",
            c.len(),
            &c[..c.len().min(16)]
        ),
        Some((n, _)) => format!("{n:?}"),
    };
    let mut out = String::new();
    for path in got
        .keys()
        .chain(want.keys())
        .collect::<std::collections::BTreeSet<_>>()
    {
        let (g, w) = (got.get(path), want.get(path));
        if g != w {
            out.push_str(&format!(
                "{}: got {}, want {}\n",
                path.display(),
                show(g),
                show(w)
            ));
        }
    }
    out
}

/// Like [`snapshot`] but also records mtimes, ctimes, inode numbers and link counts: for
/// "nothing at all changed" checks. (An unreadable directory is made readable for the walk
/// and restored, which changes its ctime: keep those out of such checks.)
pub fn hash_tree(root: &Path) -> BTreeMap<PathBuf, (Node, String)> {
    let mut out = BTreeMap::new();
    for (p, e) in entries(root) {
        let st = &e.stat;
        let extra = format!(
            "mtime={}.{} ctime={}.{} ino={} nlink={} uid={}",
            st.st_mtime,
            st.st_mtime_nsec,
            st.st_ctime,
            st.st_ctime_nsec,
            st.st_ino,
            st.st_nlink,
            st.st_uid
        );
        out.insert(p, (e.node, extra));
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

/// What the walk records of one entry.
pub struct Entry {
    pub node: Node,
    /// As found, before the walk made anything readable.
    pub stat: rustix::fs::Stat,
    /// Data ranges of a regular file.
    pub extents: Vec<(u64, u64)>,
}

/// Every entry below `root`, walked with directory descriptors one component at a time
/// (paths may be longer than `PATH_MAX`). Directories and files their owner may not read are
/// made readable for the walk and restored after it.
pub fn entries(root: &Path) -> BTreeMap<PathBuf, Entry> {
    let mut out = BTreeMap::new();
    let fd = rustix::fs::open(
        root,
        OFlags::RDONLY | OFlags::DIRECTORY | OFlags::CLOEXEC,
        Mode::empty(),
    )
    .unwrap();
    walk(fd.as_fd(), Path::new(""), &mut out);
    out
}

fn walk(dir: BorrowedFd<'_>, rel: &Path, out: &mut BTreeMap<PathBuf, Entry>) {
    let mut names: Vec<OsString> = rustix::fs::Dir::read_from(dir)
        .unwrap()
        .map(|e| OsStr::from_bytes(e.unwrap().file_name().to_bytes()).to_owned())
        .filter(|n| n.as_bytes() != b"." && n.as_bytes() != b"..")
        .collect();
    names.sort();
    for name in names {
        let r = rel.join(&name);
        let st = rustix::fs::statat(dir, &name, AtFlags::SYMLINK_NOFOLLOW).unwrap();
        let mode = st.st_mode & 0o7777;
        let mut extents = Vec::new();
        let node = match FileType::from_raw_mode(st.st_mode) {
            FileType::Symlink => Node::Symlink(PathBuf::from(OsString::from_vec(
                rustix::fs::readlinkat(dir, &name, Vec::new())
                    .unwrap()
                    .into_bytes(),
            ))),
            FileType::Directory => Node::Dir(mode),
            FileType::RegularFile => {
                let grant = mode & 0o400 == 0;
                if grant {
                    chmodat(dir, &name, mode | 0o400);
                }
                let fd = rustix::fs::openat(
                    dir,
                    &name,
                    OFlags::RDONLY | OFlags::NOFOLLOW | OFlags::CLOEXEC,
                    Mode::empty(),
                )
                .unwrap();
                if grant {
                    chmodat(dir, &name, mode);
                }
                let mut f = std::fs::File::from(fd);
                let mut content = Vec::new();
                f.read_to_end(&mut content).unwrap();
                extents = data_extents(&f);
                Node::File(mode, content)
            }
            _ => Node::Other(st.st_mode & 0o170000),
        };
        let is_dir = matches!(node, Node::Dir(_));
        out.insert(
            r.clone(),
            Entry {
                node,
                stat: st,
                extents,
            },
        );
        if is_dir {
            let grant = mode & 0o500 != 0o500;
            if grant {
                chmodat(dir, &name, mode | 0o700);
            }
            let child = rustix::fs::openat(
                dir,
                &name,
                OFlags::RDONLY | OFlags::DIRECTORY | OFlags::NOFOLLOW | OFlags::CLOEXEC,
                Mode::empty(),
            )
            .unwrap();
            walk(child.as_fd(), &r, out);
            if grant {
                chmodat(dir, &name, mode);
            }
        }
    }
}

fn chmodat(dir: BorrowedFd<'_>, name: &OsStr, mode: u32) {
    rustix::fs::chmodat(dir, name, Mode::from_raw_mode(mode), AtFlags::empty()).unwrap();
}

/// The data ranges of a file, as `SEEK_DATA`/`SEEK_HOLE` report them.
pub fn data_extents(f: &std::fs::File) -> Vec<(u64, u64)> {
    let len = f.metadata().unwrap().len();
    let mut out = Vec::new();
    let mut pos = 0;
    while pos < len {
        let start = match rustix::fs::seek(f, rustix::fs::SeekFrom::Data(pos)) {
            Ok(s) => s,
            Err(rustix::io::Errno::NXIO) => break,
            Err(e) => panic!("SEEK_DATA: {e}"),
        };
        let end = rustix::fs::seek(f, rustix::fs::SeekFrom::Hole(start)).unwrap();
        out.push((start, end));
        pos = end;
    }
    out
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
