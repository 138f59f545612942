//! What the command sees of the sandbox's init in `/proc/1`: a name of its own instead of
//! the caller's command line.
//!
//! The init is a fork of the caller, so its memory holds the caller's argument and
//! environment strings, and `/proc/1/cmdline` (readable by every process of the sandbox,
//! unlike `environ`, which non-dumpability closes) would show the host path of the lockbox
//! binary and all of its arguments, `--env NAME=VALUE` values included. The init therefore
//! overwrites both areas with zeros in its own copy of that memory, writes [`TITLE`] at the
//! start (this alone works on every kernel, and `/proc/1/cmdline` then reads `lockbox-init`
//! followed by NULs), then points the kernel's argument area at a buffer holding just
//! [`TITLE`] with `prctl(PR_SET_MM, PR_SET_MM_MAP)` (needs `CONFIG_CHECKPOINT_RESTORE`, no
//! privilege, and is cosmetic: the NUL padding goes), and sets its `comm` to the same name.
//!
//! The addresses come from `/proc/self/stat` of the caller: they are fixed at `execve`
//! (only `brk` moves, and the init reads that itself).

use crate::error::SetupError;

/// The init's name in `/proc/1/cmdline`, `/proc/1/comm` and `/proc/1/status`.
pub const TITLE: &[u8] = b"lockbox-init\0";

/// The caller's memory layout that `PR_SET_MM_MAP` must be given back unchanged, and the
/// areas to wipe. Only made from `/proc/self/stat` ([`Layout::of_self`]), so its areas are
/// the kernel's: [`crate::sys::wipe_exec_strings`] relies on that.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct Layout {
    start_code: u64,
    end_code: u64,
    start_stack: u64,
    start_data: u64,
    end_data: u64,
    start_brk: u64,
    arg_start: u64,
    arg_end: u64,
    env_start: u64,
    env_end: u64,
}

impl Layout {
    /// Reads this process's layout from `/proc/self/stat`.
    pub(crate) fn of_self() -> Result<Layout, SetupError> {
        let path = "/proc/self/stat";
        let text = std::fs::read_to_string(path).map_err(|source| SetupError::Path {
            path: path.into(),
            what: "reading the memory layout in",
            source,
        })?;
        Layout::parse(&text).ok_or_else(|| SetupError::Path {
            path: path.into(),
            what: "reading the memory layout in",
            source: std::io::Error::other("unexpected format (Linux 3.5 or newer is required)"),
        })
    }

    /// Parses `/proc/PID/stat` (proc(5): fields 26–28 and 45–51, counted from 1; the
    /// command name, field 2, may hold spaces and parentheses, so fields are counted from
    /// the last `)`).
    fn parse(stat: &str) -> Option<Layout> {
        let rest = &stat[stat.rfind(')')? + 1..];
        let fields: Vec<u64> = rest
            .split_whitespace()
            .skip(1) // field 3, the state letter
            .map(|f| f.parse().unwrap_or(0))
            .collect();
        let field = |n: usize| fields.get(n - 4).copied();
        let layout = Layout {
            start_code: field(26)?,
            end_code: field(27)?,
            start_stack: field(28)?,
            start_data: field(45)?,
            end_data: field(46)?,
            start_brk: field(47)?,
            arg_start: field(48)?,
            arg_end: field(49)?,
            env_start: field(50)?,
            env_end: field(51)?,
        };
        (layout.arg_start <= layout.arg_end && layout.env_start <= layout.env_end).then_some(layout)
    }

    /// Where the kernel put the argument strings at `execve`: (start, length).
    pub(crate) fn args(&self) -> (u64, usize) {
        (self.arg_start, (self.arg_end - self.arg_start) as usize)
    }

    /// Where the kernel put the environment strings at `execve`: (start, length).
    pub(crate) fn env(&self) -> (u64, usize) {
        (self.env_start, (self.env_end - self.env_start) as usize)
    }

    /// The layout with the argument area moved to `title` (a NUL-terminated string in
    /// anonymous memory) and an empty environment area right after it, for
    /// `PR_SET_MM_MAP`; `brk` is the current program break. Does not allocate.
    pub(crate) fn with_title(&self, title: &[u8], brk: u64) -> rustix::process::PrctlMmMap {
        let start = title.as_ptr() as u64;
        let end = start + title.len() as u64;
        rustix::process::PrctlMmMap {
            start_code: self.start_code,
            end_code: self.end_code,
            start_data: self.start_data,
            end_data: self.end_data,
            start_brk: self.start_brk,
            brk,
            start_stack: self.start_stack,
            arg_start: start,
            arg_end: end,
            env_start: end,
            env_end: end,
            auxv: std::ptr::null_mut(),
            auxv_size: 0,
            exe_fd: -1,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_layout_is_read_after_the_last_parenthesis() {
        // A command name with a space and a parenthesis, then fields 3..=52.
        let mut stat = String::from("4242 (we) ird) S");
        for n in 4..=52 {
            stat.push_str(&format!(" {n}"));
        }
        let layout = Layout::parse(&stat).unwrap();
        assert_eq!(layout.start_code, 26);
        assert_eq!(layout.start_stack, 28);
        assert_eq!(layout.start_data, 45);
        assert_eq!((layout.arg_start, layout.arg_end), (48, 49));
        assert_eq!((layout.env_start, layout.env_end), (50, 51));
        assert_eq!(layout.args(), (48, 1));
        let map = layout.with_title(TITLE, 7);
        assert_eq!(map.arg_end - map.arg_start, TITLE.len() as u64);
        assert_eq!((map.env_start, map.env_end), (map.arg_end, map.arg_end));
        assert_eq!((map.start_code, map.brk, map.exe_fd), (26, 7, -1));
        assert!(Layout::parse("1 (x) S 1 2 3").is_none());
    }

    #[test]
    fn this_process_has_a_layout_with_its_arguments_in_it() {
        let layout = Layout::of_self().unwrap();
        assert!(layout.start_code < layout.end_code);
        assert!(layout.arg_start < layout.arg_end, "{layout:?}");
    }
}
