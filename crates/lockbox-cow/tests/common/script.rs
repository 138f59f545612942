//! Random scripts of file operations for property tests (shared with lockbox-cli's
//! `--workdir` property test, which includes this file by path).

use proptest::prelude::*;

const PATHS: [&str; 12] = [
    "a", "b", "d", "d/a", "d/b", "d/e", "d/e/f", "e", "e/a", "e/d", "sp ace", "d/ü",
];
const LINK_TARGETS: [&str; 6] = ["a", "d", "d/e", "missing", "e/a", "."];
/// Directory-safe modes (owner keeps rwx, so the tree stays walkable without privilege).
const MODES: [u32; 6] = [0o700, 0o755, 0o711, 0o750, 0o744, 0o775];

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
}

pub fn op() -> impl Strategy<Value = Op> {
    let p = 0..PATHS.len();
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
}

fn q(p: &str) -> String {
    format!("'{p}'")
}

pub fn to_sh(ops: &[Op]) -> String {
    let mut s = String::new();
    for op in ops {
        let line = match op {
            Op::Write(p, t) => format!("printf '%s\\n' '{t}' > {}", q(PATHS[*p])),
            Op::Append(p, t) => format!("printf '%s' '{t}' >> {}", q(PATHS[*p])),
            Op::Truncate(p, n) => format!("truncate -s {n} {}", q(PATHS[*p])),
            Op::Chmod(p, m) => format!("chmod {:o} {}", MODES[*m], q(PATHS[*p])),
            Op::ReadOnlyFile(p) => {
                let p = q(PATHS[*p]);
                format!("[ -f {p} ] && [ ! -L {p} ] && chmod 444 {p}")
            }
            Op::Touch(p) => format!("touch -h -d @1000000000 {}", q(PATHS[*p])),
            Op::Mkdir(p) => format!("mkdir {}", q(PATHS[*p])),
            Op::Rmdir(p) => format!("rmdir {}", q(PATHS[*p])),
            Op::RmR(p) => format!("rm -rf {}", q(PATHS[*p])),
            Op::Mv(a, b) => format!("mv {} {}", q(PATHS[*a]), q(PATHS[*b])),
            Op::Symlink(t, p) => format!("ln -s {} {}", LINK_TARGETS[*t], q(PATHS[*p])),
            Op::DirToFile(p) => format!("rm -rf {0} && printf 'was dir\\n' > {0}", q(PATHS[*p])),
            Op::FileToDir(p) => format!("rm -f {0} && mkdir {0}", q(PATHS[*p])),
        };
        s.push_str(&format!("{{ {line}; }} 2>/dev/null\n"));
    }
    s.push_str("exit 0\n");
    s
}
