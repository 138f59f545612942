//! The command child's end of the network (or rename) supervisor: installing the filter that
//! hands calls over and getting its notification listener. The supervisor's end, and the
//! notification calls, are `lockbox_netsup::sys`.
//!
//! Like `sys`, one small safe function per kernel call, and it does not allocate: the command
//! child calls it before `execve`.

use crate::sys::Errno;
use std::os::fd::RawFd;

pub use lockbox_netsup::sys::RET_USER_NOTIF;

impl From<lockbox_netsup::sys::Errno> for Errno {
    fn from(e: lockbox_netsup::sys::Errno) -> Errno {
        Errno(e.0)
    }
}

const FILTER_FLAG_NEW_LISTENER: libc::c_ulong = 1 << 3;
const FILTER_FLAG_WAIT_KILLABLE_RECV: libc::c_ulong = 1 << 5;

fn check(rc: libc::c_long) -> Result<libc::c_long, Errno> {
    if rc < 0 {
        Err(Errno(
            std::io::Error::last_os_error()
                .raw_os_error()
                .unwrap_or(libc::EIO),
        ))
    } else {
        Ok(rc)
    }
}

/// Installs `program` as a seccomp filter of the calling thread and returns its
/// notification listener. Asks for killable waits once the supervisor has received a
/// notification (Linux 5.19), so a signal cannot restart a call the supervisor is
/// performing; falls back without on older kernels.
pub fn seccomp_listener(program: &[seccompiler::sock_filter]) -> Result<RawFd, Errno> {
    let prog = libc::sock_fprog {
        len: program.len() as libc::c_ushort,
        filter: program.as_ptr() as *mut libc::sock_filter,
    };
    let mut result = Err(Errno(libc::EINVAL));
    for flags in [
        FILTER_FLAG_NEW_LISTENER | FILTER_FLAG_WAIT_KILLABLE_RECV,
        FILTER_FLAG_NEW_LISTENER,
    ] {
        // SAFETY: seccompiler's sock_filter has the kernel's layout; `prog` points into a
        // live slice; the kernel copies the program.
        let rc = unsafe {
            libc::syscall(
                libc::SYS_seccomp,
                libc::SECCOMP_SET_MODE_FILTER,
                flags,
                &prog as *const libc::sock_fprog,
            )
        };
        result = check(rc).map(|fd| fd as RawFd);
        if result != Err(Errno(libc::EINVAL)) {
            break;
        }
    }
    result
}
