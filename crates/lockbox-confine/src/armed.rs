//! The command of a pre-armed sandbox ([`crate::Spawn::armed`]), which it learns only at its
//! go: argv, environment and where `execve` looks for the program, written by the caller
//! into a sealed memfd ([`ArmedCommand`]) that the go carries to the sandbox's command
//! child. The child, which may not allocate, maps it and points into it ([`decode`]).
//!
//! Layout (native endian, both ends are one machine): four `u32` — [`MAGIC`], the number of
//! exec candidates, of argv strings, of environment strings — then every string, each
//! NUL-terminated, in that order.

use crate::error::SetupError;
use std::ffi::{CStr, OsString};
use std::io::Write;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;

const MAGIC: u32 = 0x4c42_4143; // "LBAC"
const HEADER: usize = 16;

/// The most strings (candidates, argv and environment together) one command may have: the
/// child's room for pointers to them is allocated before the sandbox is armed.
pub const MAX_STRINGS: usize = 16 * 1024;

/// The most bytes of one command (the kernel's own `ARG_MAX` is 2 MiB by default).
pub const MAX_BYTES: usize = 4 << 20;

/// A command for a pre-armed sandbox: a sealed memfd in the layout above.
#[derive(Debug)]
pub struct ArmedCommand {
    fd: OwnedFd,
    program: String,
}

impl ArmedCommand {
    /// `argv` with environment `env` (`NAME=value` each). The program is looked up along
    /// `env`'s `PATH` (else the default `PATH`) as a direct start does. Fails for an empty
    /// argv, a NUL inside a string, or a command above `MAX_STRINGS` strings or `MAX_BYTES`
    /// bytes (16 Ki and 4 MiB).
    pub fn new(argv: &[OsString], env: &[(String, String)]) -> Result<ArmedCommand, SetupError> {
        let program = argv.first().ok_or_else(crate::spawn::no_command)?;
        let path_var = env
            .iter()
            .find(|(k, _)| k == "PATH")
            .map_or(lockbox_policy::DEFAULT_PATH, |(_, v)| v.as_str());
        let candidates = crate::spawn::exec_candidates(program, path_var);
        let env: Vec<Vec<u8>> = env
            .iter()
            .map(|(k, v)| format!("{k}={v}").into_bytes())
            .collect();
        let strings = candidates.len() + argv.len() + env.len();
        let mut bytes = Vec::with_capacity(HEADER + 256);
        for word in [
            MAGIC,
            candidates.len() as u32,
            argv.len() as u32,
            env.len() as u32,
        ] {
            bytes.extend_from_slice(&word.to_ne_bytes());
        }
        let too_big = |what: String| SetupError::Path {
            path: program.into(),
            what: "handing over",
            source: std::io::Error::other(what),
        };
        let all = candidates
            .iter()
            .map(|c| c.to_bytes())
            .chain(argv.iter().map(|a| a.as_bytes()))
            .chain(env.iter().map(Vec::as_slice));
        for s in all {
            if s.contains(&0) {
                return Err(too_big("an argument or variable holds a NUL byte".into()));
            }
            bytes.extend_from_slice(s);
            bytes.push(0);
        }
        if strings > MAX_STRINGS || bytes.len() > MAX_BYTES {
            return Err(too_big(format!(
                "{strings} strings, {} bytes: a pre-armed start takes at most {MAX_STRINGS} and {MAX_BYTES}",
                bytes.len()
            )));
        }
        let fd = sealed_memfd(&bytes).map_err(|source| SetupError::Path {
            path: program.into(),
            what: "handing over",
            source,
        })?;
        Ok(ArmedCommand {
            fd,
            program: program.to_string_lossy().into_owned(),
        })
    }

    /// A command another process made with [`ArmedCommand::new`] and sent as `fd`
    /// ([`ArmedCommand::fd`]); `program` names it in messages. The sandbox checks the layout.
    pub fn from_fd(fd: OwnedFd, program: String) -> ArmedCommand {
        ArmedCommand { fd, program }
    }

    /// The memfd, to send to another process.
    pub fn fd(&self) -> BorrowedFd<'_> {
        self.fd.as_fd()
    }

    /// The program as given (argv\[0\]), for messages.
    pub fn program(&self) -> &str {
        &self.program
    }
}

fn sealed_memfd(bytes: &[u8]) -> std::io::Result<OwnedFd> {
    use rustix::fs::{MemfdFlags, SealFlags};
    let fd = rustix::fs::memfd_create(
        c"lockbox-command",
        MemfdFlags::CLOEXEC | MemfdFlags::ALLOW_SEALING,
    )?;
    let mut file = std::fs::File::from(fd);
    file.write_all(bytes)?;
    rustix::fs::fcntl_add_seals(
        &file,
        SealFlags::WRITE | SealFlags::GROW | SealFlags::SHRINK | SealFlags::SEAL,
    )?;
    Ok(OwnedFd::from(file))
}

/// Where the strings of a decoded command start in the pointer room: candidates, then the
/// NULL-terminated argv, then the NULL-terminated environment.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Decoded {
    pub(crate) candidates: usize,
    pub(crate) argv: usize,
    pub(crate) env: usize,
}

/// Fills `room` with pointers into `bytes` (which must outlive their use): the candidates at
/// `0..c`, argv at `c..c+a` and a NULL, the environment after it and a NULL. Allocation-free
/// (the command child runs it); `None` for anything but the layout above, or too many
/// strings for `room`.
pub(crate) fn decode(bytes: &[u8], room: &mut [*const libc::c_char]) -> Option<Decoded> {
    let word = |i: usize| {
        let w = bytes.get(i * 4..i * 4 + 4)?;
        Some(u32::from_ne_bytes([w[0], w[1], w[2], w[3]]) as usize)
    };
    if word(0)? != MAGIC as usize {
        return None;
    }
    let (c, a, e) = (word(1)?, word(2)?, word(3)?);
    // The two NULLs after argv and the environment.
    let total = c.checked_add(a)?.checked_add(e)?.checked_add(2)?;
    if a == 0 || total > room.len() {
        return None;
    }
    let mut rest = bytes.get(HEADER..)?;
    let mut slot = 0;
    for (count, null_after) in [(c, false), (a, true), (e, true)] {
        for _ in 0..count {
            let s = CStr::from_bytes_until_nul(rest).ok()?;
            room[slot] = s.as_ptr();
            slot += 1;
            rest = &rest[s.to_bytes_with_nul().len()..];
        }
        if null_after {
            room[slot] = std::ptr::null();
            slot += 1;
        }
    }
    rest.is_empty().then_some(Decoded {
        candidates: c,
        argv: c,
        env: c + a + 1,
    })
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)]
mod tests {
    use super::*;
    use std::io::Read;

    fn bytes_of(cmd: &ArmedCommand) -> Vec<u8> {
        let mut out = Vec::new();
        let mut file = std::fs::File::from(cmd.fd.try_clone().unwrap());
        std::io::Seek::rewind(&mut file).unwrap();
        file.read_to_end(&mut out).unwrap();
        out
    }

    /// The strings `room[from..from + n]` point at, read back from `bytes` by offset.
    fn strings(bytes: &[u8], room: &[*const libc::c_char], from: usize, n: usize) -> Vec<String> {
        room[from..from + n]
            .iter()
            .map(|&p| {
                let at = p as usize - bytes.as_ptr() as usize;
                let s = CStr::from_bytes_until_nul(&bytes[at..]).unwrap();
                s.to_string_lossy().into_owned()
            })
            .collect()
    }

    #[test]
    fn a_command_comes_back_as_the_child_executes_it() {
        let argv = ["ls".into(), "-l".into(), "".into()];
        let env = [
            ("PATH".to_owned(), "/a:/b".to_owned()),
            ("X".into(), "y=z".into()),
        ];
        let cmd = ArmedCommand::new(&argv, &env).unwrap();
        let bytes = bytes_of(&cmd);
        let mut room = vec![std::ptr::null(); 16];
        let d = decode(&bytes, &mut room).unwrap();
        assert_eq!(strings(&bytes, &room, 0, d.candidates), ["/a/ls", "/b/ls"]);
        assert_eq!(strings(&bytes, &room, d.argv, 3), ["ls", "-l", ""]);
        assert!(room[d.argv + 3].is_null());
        assert_eq!(strings(&bytes, &room, d.env, 2), ["PATH=/a:/b", "X=y=z"]);
        assert!(room[d.env + 2].is_null());
    }

    #[test]
    fn the_memfd_cannot_be_changed_once_made() {
        let cmd = ArmedCommand::new(&["true".into()], &[]).unwrap();
        let mut file = std::fs::File::from(cmd.fd.try_clone().unwrap());
        assert!(file.write_all(b"x").is_err());
    }

    #[test]
    fn garbage_and_overflow_are_refused() {
        let cmd = ArmedCommand::new(&["true".into(), "a".into()], &[]).unwrap();
        let bytes = bytes_of(&cmd);
        let mut room = vec![std::ptr::null(); 64];
        assert!(decode(&bytes, &mut room).is_some());
        // Truncated, trailing bytes, a wrong magic, too little room.
        assert!(decode(&bytes[..bytes.len() - 1], &mut room).is_none());
        let mut longer = bytes.clone();
        longer.push(b'x');
        assert!(decode(&longer, &mut room).is_none());
        let mut wrong = bytes.clone();
        wrong[0] ^= 1;
        assert!(decode(&wrong, &mut room).is_none());
        assert!(decode(&bytes, &mut room[..3]).is_none());
        assert!(decode(&bytes[..8], &mut room).is_none());
        // A count far beyond the bytes.
        let mut huge = bytes;
        huge[8..12].copy_from_slice(&u32::MAX.to_ne_bytes());
        assert!(decode(&huge, &mut room).is_none());
    }

    #[test]
    fn a_nul_inside_an_argument_is_refused() {
        let argv = [OsString::from("a\0b")];
        assert!(ArmedCommand::new(&argv, &[]).is_err());
        assert!(ArmedCommand::new(&[], &[]).is_err());
    }
}
