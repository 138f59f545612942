//! The walls: capabilities, Landlock and seccomp.

use super::process::prctl;
use super::{check, Errno};
use std::os::fd::RawFd;
use std::ptr;

/// Drops every capability: bounding set, ambient set, and the effective, permitted and
/// inheritable sets, and locks securebits so that an `execve` as uid 0 regains none.
pub fn drop_all_capabilities(last_cap: u32) -> Result<(), Errno> {
    for cap in 0..=last_cap {
        match prctl(libc::PR_CAPBSET_DROP, cap as libc::c_ulong) {
            Ok(_) | Err(Errno(libc::EINVAL)) => {}
            Err(e) => return Err(e),
        }
    }
    prctl(
        libc::PR_CAP_AMBIENT,
        libc::PR_CAP_AMBIENT_CLEAR_ALL as libc::c_ulong,
    )?;
    // SECBIT_NOROOT | SECBIT_NO_SETUID_FIXUP | SECBIT_KEEP_CAPS_LOCKED |
    // SECBIT_NO_CAP_AMBIENT_RAISE and each one's lock bit (capabilities(7)).
    const SECUREBITS: libc::c_ulong = 0x01 | 0x02 | 0x04 | 0x08 | 0x20 | 0x40 | 0x80;
    prctl(libc::PR_SET_SECUREBITS, SECUREBITS)?;
    #[repr(C)]
    struct CapHeader {
        version: u32,
        pid: libc::c_int,
    }
    #[repr(C)]
    struct CapData {
        effective: u32,
        permitted: u32,
        inheritable: u32,
    }
    let mut header = CapHeader {
        version: 0x2008_0522, // _LINUX_CAPABILITY_VERSION_3
        pid: 0,
    };
    let data = [
        CapData {
            effective: 0,
            permitted: 0,
            inheritable: 0,
        },
        CapData {
            effective: 0,
            permitted: 0,
            inheritable: 0,
        },
    ];
    // SAFETY: header and the two data words are valid for capset(2) version 3.
    let rc = unsafe {
        libc::syscall(
            libc::SYS_capset,
            &mut header as *mut CapHeader,
            data.as_ptr(),
        )
    };
    check(rc).map(drop)
}

/// `landlock_create_ruleset(attr, size, flags)`.
pub fn landlock_create_ruleset(attr: Option<&[u8]>, flags: u32) -> Result<RawFd, Errno> {
    let (ptr, len) = attr.map_or((ptr::null(), 0), |a| (a.as_ptr(), a.len()));
    // SAFETY: `ptr` is null or a live buffer of `len` bytes holding a landlock_ruleset_attr.
    let rc = unsafe { libc::syscall(libc::SYS_landlock_create_ruleset, ptr, len, flags) };
    check(rc).map(|fd| fd as RawFd)
}

/// `landlock_add_rule(ruleset, LANDLOCK_RULE_PATH_BENEATH, {access, parent_fd})`.
pub fn landlock_add_path_rule(ruleset: RawFd, parent: RawFd, access: u64) -> Result<(), Errno> {
    #[repr(C, packed)]
    struct PathBeneath {
        allowed_access: u64,
        parent_fd: i32,
    }
    let attr = PathBeneath {
        allowed_access: access,
        parent_fd: parent,
    };
    // SAFETY: `attr` is a valid, packed landlock_path_beneath_attr.
    let rc = unsafe {
        libc::syscall(
            libc::SYS_landlock_add_rule,
            ruleset,
            1,
            &attr as *const PathBeneath,
            0,
        )
    };
    check(rc).map(drop)
}

/// `landlock_restrict_self(ruleset, 0)`.
pub fn landlock_restrict_self(ruleset: RawFd) -> Result<(), Errno> {
    // SAFETY: no pointer arguments.
    let rc = unsafe { libc::syscall(libc::SYS_landlock_restrict_self, ruleset, 0) };
    check(rc).map(drop)
}

/// Installs a seccomp BPF filter on the calling thread.
pub fn seccomp_set_filter(program: &[seccompiler::sock_filter]) -> Result<(), Errno> {
    let prog = libc::sock_fprog {
        len: program.len() as libc::c_ushort,
        filter: program.as_ptr() as *mut libc::sock_filter,
    };
    // SAFETY: seccompiler's sock_filter has the kernel's layout; `prog` points into a live
    // slice; the kernel copies the program.
    let rc = unsafe {
        libc::syscall(
            libc::SYS_seccomp,
            libc::SECCOMP_SET_MODE_FILTER,
            0,
            &prog as *const libc::sock_fprog,
        )
    };
    check(rc).map(drop)
}

/// `seccomp(SECCOMP_GET_ACTION_AVAIL, action)`: whether the kernel knows a filter action.
pub fn seccomp_action_available(action: u32) -> bool {
    // SAFETY: `action` outlives the call.
    let rc = unsafe {
        libc::syscall(
            libc::SYS_seccomp,
            libc::SECCOMP_GET_ACTION_AVAIL,
            0,
            &action as *const u32,
        )
    };
    rc == 0
}

/// Whether this kernel implements syscall `nr`: called with every argument -1 (a bad
/// descriptor, pointer and flags), an implemented syscall fails with something else than
/// `ENOSYS` before doing anything.
#[cfg(test)]
pub fn syscall_exists(nr: i64) -> bool {
    // SAFETY: only invalid arguments are passed; nothing is read or written through them.
    let rc = unsafe { libc::syscall(nr, -1i64, -1i64, -1i64, -1i64, -1i64, -1i64) };
    rc != -1 || Errno::last().0 != libc::ENOSYS
}
