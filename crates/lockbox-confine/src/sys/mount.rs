//! Mounts: `mount`, detached trees (`open_tree`, `mount_setattr`, `move_mount`), `umount2`
//! and `pivot_root`.

use super::{check, check_int, opt_ptr, Errno};
use std::ffi::CStr;
use std::os::fd::RawFd;

/// `mount(2)`.
pub fn mount(
    source: Option<&CStr>,
    target: &CStr,
    fstype: Option<&CStr>,
    flags: libc::c_ulong,
    data: Option<&CStr>,
) -> Result<(), Errno> {
    // SAFETY: all pointers are live C strings or null; mount(2) does not keep them.
    let rc = unsafe {
        libc::mount(
            opt_ptr(source),
            target.as_ptr(),
            opt_ptr(fstype),
            flags,
            opt_ptr(data).cast(),
        )
    };
    check_int(rc).map(drop)
}

/// `umount2(target, MNT_DETACH)`.
pub fn umount_detach(target: &CStr) -> Result<(), Errno> {
    // SAFETY: `target` is a live C string.
    check_int(unsafe { libc::umount2(target.as_ptr(), libc::MNT_DETACH) }).map(drop)
}

const OPEN_TREE_CLONE: libc::c_uint = 1;
const AT_RECURSIVE: libc::c_uint = 0x8000;
const MOVE_MOUNT_F_EMPTY_PATH: libc::c_uint = 0x4;
const MOUNT_ATTR_RDONLY: u64 = 0x1;
const MOUNT_ATTR_NOSUID: u64 = 0x2;
const MOUNT_ATTR_NODEV: u64 = 0x4;

/// `open_tree(OPEN_TREE_CLONE | AT_RECURSIVE)`: a detached copy of the mount tree at `path`.
pub fn open_tree_clone(path: &CStr) -> Result<RawFd, Errno> {
    // SAFETY: `path` is a live C string; the returned fd is owned by the caller.
    let rc = unsafe {
        libc::syscall(
            libc::SYS_open_tree,
            libc::AT_FDCWD,
            path.as_ptr(),
            OPEN_TREE_CLONE | AT_RECURSIVE | libc::O_CLOEXEC as libc::c_uint,
        )
    };
    check(rc).map(|fd| fd as RawFd)
}

#[repr(C)]
struct MountAttr {
    attr_set: u64,
    attr_clr: u64,
    propagation: u64,
    userns_fd: u64,
}

/// `mount_setattr(fd, "", AT_EMPTY_PATH [| AT_RECURSIVE])` making the mount(s) read-only,
/// nosuid and nodev.
pub fn mount_set_readonly(fd: RawFd, recursive: bool) -> Result<(), Errno> {
    let mut attr = MountAttr {
        attr_set: MOUNT_ATTR_RDONLY | MOUNT_ATTR_NOSUID | MOUNT_ATTR_NODEV,
        attr_clr: 0,
        propagation: 0,
        userns_fd: 0,
    };
    let flags = libc::AT_EMPTY_PATH as libc::c_uint | if recursive { AT_RECURSIVE } else { 0 };
    // SAFETY: `attr` is a valid mount_attr of the size passed; "" is a static C string.
    let rc = unsafe {
        libc::syscall(
            libc::SYS_mount_setattr,
            fd,
            c"".as_ptr(),
            flags,
            &mut attr as *mut MountAttr,
            std::mem::size_of::<MountAttr>(),
        )
    };
    check(rc).map(drop)
}

/// `move_mount(fd, "", AT_FDCWD, target, MOVE_MOUNT_F_EMPTY_PATH)`: attach a detached tree.
pub fn move_mount_to(fd: RawFd, target: &CStr) -> Result<(), Errno> {
    // SAFETY: pointers are live C strings; `fd` is a mount fd owned by the caller.
    let rc = unsafe {
        libc::syscall(
            libc::SYS_move_mount,
            fd,
            c"".as_ptr(),
            libc::AT_FDCWD,
            target.as_ptr(),
            MOVE_MOUNT_F_EMPTY_PATH,
        )
    };
    check(rc).map(drop)
}

/// `pivot_root(".", ".")`: the current directory becomes the root, the old root is stacked
/// on top of it and must then be detached with `umount2(".", MNT_DETACH)`.
pub fn pivot_root_here() -> Result<(), Errno> {
    // SAFETY: static C strings.
    let rc = unsafe { libc::syscall(libc::SYS_pivot_root, c".".as_ptr(), c".".as_ptr()) };
    check(rc).map(drop)
}
