//! Random scripts of file operations for property tests (shared with lockbox-cli's
//! `--workdir` property test, which includes this file by path and uses [`op`] only).
//!
//! [`rich_op`] adds what a hostile command can make: paths longer than `PATH_MAX` (a tree
//! `deep/` of [`DEEP_LEVELS`] components of 200 bytes, reached with `cd -P`), names that are
//! not UTF-8 or hold control characters, directories of mode 000/300/100, sparse files, hard
//! links and FIFOs.

#![allow(dead_code)] // each including test uses part of it

use proptest::prelude::*;

const PATHS: [&str; 12] = [
    "a", "b", "d", "d/a", "d/b", "d/e", "d/e/f", "e", "e/a", "e/d", "sp ace", "d/ü",
];
/// [`PATHS`] and more, for [`rich_op`]; the first [`PATHS`]`.len()` are the same.
const RICH_PATHS: [&[u8]; 17] = [
    b"a",
    b"b",
    b"d",
    b"d/a",
    b"d/b",
    b"d/e",
    b"d/e/f",
    b"e",
    b"e/a",
    b"e/d",
    b"sp ace",
    "d/ü".as_bytes(),
    b"caf\xe9",
    b"d/\xff\xfe",
    b"e/new\nline",
    b"deep",
    b"deep/x",
];
const LINK_TARGETS: [&str; 6] = ["a", "d", "d/e", "missing", "e/a", "."];
/// Directory-safe modes (owner keeps rwx, so the tree stays walkable without privilege).
const MODES: [u32; 6] = [0o700, 0o755, 0o711, 0o750, 0o744, 0o775];
/// Modes a hostile command leaves on directories: its owner may not read or search them.
const LOCKS: [u32; 5] = [0o000, 0o300, 0o100, 0o500, 0o700];
/// Levels of `deep/`: 21 components of 200 bytes make paths longer than `PATH_MAX` (4096).
pub const DEEP_LEVELS: usize = 21;
const SIZES: [u64; 4] = [0, 4097, 1 << 20, 4 << 20];
const OFFSETS: [u64; 4] = [0, 5000, 1 << 20, 3 << 20];

#[derive(Debug, Clone)]
pub enum Op {
    Write(usize, String),
    Append(usize, String),
    Truncate(usize, u8),
    Chmod(usize, usize),
    ReadOnlyFile(usize),
    Touch(usize),
    Mkdir(usize),
    Rmdir(usize),
    RmR(usize),
    Mv(usize, usize),
    Symlink(usize, usize),
    DirToFile(usize),
    FileToDir(usize),
    /// `mkdir -p` the whole of `deep/`.
    DeepMkdir,
    /// Write `deep/<level components>/f`.
    DeepWrite(usize, String),
    /// chmod the directory at `level + 1` below `deep/` to a [`LOCKS`] mode.
    DeepLock(usize, usize),
    /// `rm -rf` the directory at `level + 1` below `deep/`.
    DeepRm(usize),
    /// chmod a directory to a [`LOCKS`] mode.
    Lock(usize, usize),
    /// `truncate -s` a [`SIZES`] size: a file of holes.
    Sparse(usize, usize),
    /// Write one byte at an [`OFFSETS`] offset (a hole before it).
    Poke(usize, usize),
    /// `ln a b`.
    Link(usize, usize),
    /// `mkfifo p`.
    Fifo(usize),
}

/// The plain operations over the paths of `n` (the first `n` of [`RICH_PATHS`]).
fn plain(n: usize) -> BoxedStrategy<Op> {
    let p = 0..n;
    let text = "[a-z]{0,12}";
    prop_oneof![
        3 => (p.clone(), text).prop_map(|(p, t)| Op::Write(p, t)),
        2 => (p.clone(), text).prop_map(|(p, t)| Op::Append(p, t)),
        1 => (p.clone(), 0u8..20).prop_map(|(p, n)| Op::Truncate(p, n)),
        1 => (p.clone(), 0..MODES.len()).prop_map(|(p, m)| Op::Chmod(p, m)),
        1 => p.clone().prop_map(Op::ReadOnlyFile),
        1 => p.clone().prop_map(Op::Touch),
        3 => p.clone().prop_map(Op::Mkdir),
        1 => p.clone().prop_map(Op::Rmdir),
        2 => p.clone().prop_map(Op::RmR),
        2 => (p.clone(), p.clone()).prop_map(|(a, b)| Op::Mv(a, b)),
        1 => (0..LINK_TARGETS.len(), p.clone()).prop_map(|(t, p)| Op::Symlink(t, p)),
        1 => p.clone().prop_map(Op::DirToFile),
        1 => p.prop_map(Op::FileToDir),
    ]
    .boxed()
}

pub fn op() -> impl Strategy<Value = Op> {
    plain(PATHS.len())
}

/// What a workdir may already hold: [`rich_op`] without directories its owner cannot enter,
/// hard links (overlayfs breaks a lower file's links on copy-up) and FIFOs (never committed).
pub fn rich_setup_op() -> impl Strategy<Value = Op> {
    let n = RICH_PATHS.len();
    let level = 0..DEEP_LEVELS;
    prop_oneof![
        12 => plain(n),
        2 => Just(Op::DeepMkdir),
        2 => (level.clone(), "[a-z]{0,8}").prop_map(|(l, t)| Op::DeepWrite(l, t)),
        1 => level.prop_map(Op::DeepRm),
        1 => (0..n, 0..SIZES.len()).prop_map(|(p, s)| Op::Sparse(p, s)),
        1 => (0..n, 0..OFFSETS.len()).prop_map(|(p, o)| Op::Poke(p, o)),
    ]
}

/// What a hostile command may do to a workdir.
pub fn rich_op() -> impl Strategy<Value = Op> {
    let n = RICH_PATHS.len();
    let level = 0..DEEP_LEVELS;
    prop_oneof![
        10 => rich_setup_op(),
        1 => (level, 0..LOCKS.len()).prop_map(|(l, m)| Op::DeepLock(l, m)),
        2 => (0..n, 0..LOCKS.len()).prop_map(|(p, m)| Op::Lock(p, m)),
        1 => (0..n, 0..n).prop_map(|(a, b)| Op::Link(a, b)),
        1 => (0..n).prop_map(Op::Fifo),
    ]
}

/// A shell word for a path: quoted, or built with `printf` for bytes that are not printable
/// ASCII (a trailing newline would be eaten by `$(...)`, so names end otherwise).
fn q(p: usize) -> String {
    let bytes = RICH_PATHS[p];
    if bytes
        .iter()
        .all(|&b| (0x20..0x7f).contains(&b) && b != b'\'')
    {
        return format!("'{}'", String::from_utf8_lossy(bytes));
    }
    let escaped: String = bytes.iter().map(|b| format!("\\{b:03o}")).collect();
    format!("\"$(printf '{escaped}')\"")
}

/// A guard before opening `p` for writing: a FIFO without a reader would block forever.
fn no_fifo(p: usize) -> String {
    format!("[ ! -p {} ] && ", q(p))
}

/// Defines `$N` (one 200-byte component) and `godeep L` (`cd -P` into `deep/` and L
/// components below it; whole paths that long are refused by the kernel).
const DEEP_PRELUDE: &str = "N=$(printf '%0200d' 0 | tr 0 x)\n\
godeep() { cd -P deep || return 1; i=0; while [ $i -lt $1 ]; do cd -P $N || return 1; i=$((i+1)); done; }\n";

pub fn to_sh(ops: &[Op]) -> String {
    let mut s = String::new();
    if ops.iter().any(|op| {
        matches!(
            op,
            Op::DeepMkdir | Op::DeepWrite(..) | Op::DeepLock(..) | Op::DeepRm(..)
        )
    }) {
        s.push_str(DEEP_PRELUDE);
    }
    for op in ops {
        let line = match op {
            Op::Write(p, t) => format!("{}printf '%s\\n' '{t}' > {}", no_fifo(*p), q(*p)),
            Op::Append(p, t) => format!("{}printf '%s' '{t}' >> {}", no_fifo(*p), q(*p)),
            Op::Truncate(p, n) => format!("{}truncate -s {n} {}", no_fifo(*p), q(*p)),
            Op::Chmod(p, m) => format!("chmod {:o} {}", MODES[*m], q(*p)),
            Op::ReadOnlyFile(p) => {
                let p = q(*p);
                format!("[ -f {p} ] && [ ! -L {p} ] && chmod 444 {p}")
            }
            Op::Touch(p) => format!("touch -h -d @1000000000 {}", q(*p)),
            Op::Mkdir(p) => format!("mkdir {}", q(*p)),
            Op::Rmdir(p) => format!("rmdir {}", q(*p)),
            Op::RmR(p) => format!("rm -rf {}", q(*p)),
            // Inside a bare overlay (the cow tests mount one, without lockbox's rename
            // supervisor: docs/cow.md, "Renaming a directory") a directory rename is a copy
            // (no `redirect_dir`), and `mv` copies by whole path names, which fails beyond
            // PATH_MAX: there the overlay differs from direct execution, so deep trees are
            // not moved.
            Op::Mv(a, b) if RICH_PATHS[*a].starts_with(b"deep") => {
                format!("[ ! -d {0} ] && mv {0} {1}", q(*a), q(*b))
            }
            Op::Mv(a, b) => format!("mv {} {}", q(*a), q(*b)),
            Op::Symlink(t, p) => format!("ln -s {} {}", LINK_TARGETS[*t], q(*p)),
            Op::DirToFile(p) => format!("rm -rf {0} && printf 'was dir\\n' > {0}", q(*p)),
            Op::FileToDir(p) => format!("rm -f {0} && mkdir {0}", q(*p)),
            Op::DeepMkdir => format!("mkdir -p deep/{}", vec!["$N"; DEEP_LEVELS].join("/")),
            Op::DeepWrite(l, t) => format!("( godeep {l} && printf '%s\\n' '{t}' > f )"),
            Op::DeepLock(l, m) => format!("( godeep {l} && chmod {:o} $N )", LOCKS[*m]),
            Op::DeepRm(l) => format!("( godeep {l} && rm -rf $N )"),
            Op::Lock(p, m) => {
                let p = q(*p);
                format!("[ -d {p} ] && [ ! -L {p} ] && chmod {:o} {p}", LOCKS[*m])
            }
            Op::Sparse(p, n) => {
                let p = q(*p);
                format!(
                    "[ ! -d {p} ] && [ ! -p {p} ] && truncate -s {} {p}",
                    SIZES[*n]
                )
            }
            Op::Poke(p, o) => format!(
                "{}printf x | dd of={} bs=1 seek={} conv=notrunc status=none",
                no_fifo(*p),
                q(*p),
                OFFSETS[*o]
            ),
            Op::Link(a, b) => format!("ln {} {}", q(*a), q(*b)),
            Op::Fifo(p) => format!("mkfifo {}", q(*p)),
        };
        s.push_str(&format!("{{ {line}; }} 2>/dev/null\n"));
    }
    s.push_str("exit 0\n");
    s
}
