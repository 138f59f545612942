//! Files and directories of the root being built: mkdir, chmod, rmdir, unlink, whiteouts,
//! symlinks, small writes, random bytes and `chdir`.

use super::fd::{close, open, write_all};
use super::{check, check_int, Errno};
use std::ffi::CStr;

/// `mkdir(path, mode)`; an existing entry is not an error.
pub fn mkdir_exist_ok(path: &CStr, mode: libc::mode_t) -> Result<(), Errno> {
    // SAFETY: `path` is a live C string.
    match check_int(unsafe { libc::mkdir(path.as_ptr(), mode) }) {
        Err(Errno(libc::EEXIST)) | Ok(_) => Ok(()),
        Err(e) => Err(e),
    }
}

/// `chmod(path, mode)` (mkdir's mode is filtered by the umask; this is not).
pub fn chmod(path: &CStr, mode: libc::mode_t) -> Result<(), Errno> {
    // SAFETY: `path` is a live C string.
    check_int(unsafe { libc::chmod(path.as_ptr(), mode) }).map(drop)
}

/// `rmdir(path)`.
pub fn rmdir(path: &CStr) -> Result<(), Errno> {
    // SAFETY: `path` is a live C string.
    check_int(unsafe { libc::rmdir(path.as_ptr()) }).map(drop)
}

/// `unlink(path)`.
pub fn unlink(path: &CStr) -> Result<(), Errno> {
    // SAFETY: `path` is a live C string.
    check_int(unsafe { libc::unlink(path.as_ptr()) }).map(drop)
}

/// Fills `buf` from the kernel's random source (`getrandom(2)`, which may return fewer bytes
/// than asked only for requests above 256 bytes or when interrupted: retried).
pub fn random_bytes(buf: &mut [u8]) -> Result<(), Errno> {
    let mut filled = 0;
    while filled < buf.len() {
        let rest = &mut buf[filled..];
        // SAFETY: `rest` is a live, writable buffer of `rest.len()` bytes.
        let n = unsafe { libc::getrandom(rest.as_mut_ptr().cast(), rest.len(), 0) };
        match check(n as libc::c_long) {
            Ok(n) => filled += usize::try_from(n).map_err(|_| Errno(libc::EINVAL))?,
            Err(Errno(libc::EINTR)) => {}
            Err(e) => return Err(e),
        }
    }
    Ok(())
}

/// Creates an overlayfs whiteout (a 0/0 character device; unprivileged since Linux 5.8).
pub fn mknod_whiteout(path: &CStr) -> Result<(), Errno> {
    // SAFETY: `path` is a live C string.
    check_int(unsafe { libc::mknod(path.as_ptr(), libc::S_IFCHR, 0) }).map(drop)
}

/// `symlink(target, path)`; an existing entry is not an error.
pub fn symlink_exist_ok(target: &CStr, path: &CStr) -> Result<(), Errno> {
    // SAFETY: both are live C strings.
    match check_int(unsafe { libc::symlink(target.as_ptr(), path.as_ptr()) }) {
        Err(Errno(libc::EEXIST)) | Ok(_) => Ok(()),
        Err(e) => Err(e),
    }
}

/// Creates (or truncates) `path` with `mode` and writes `data` to it.
pub fn write_file(path: &CStr, data: &[u8], mode: libc::mode_t) -> Result<(), Errno> {
    let fd = open(path, libc::O_WRONLY | libc::O_CREAT | libc::O_TRUNC, mode)?;
    let result = write_all(fd, data);
    // SAFETY: `fd` was opened just above, is ours alone and is not used after.
    unsafe { close(fd) };
    result
}

/// Whether the directory `path` is empty and has permission bits `mode` (`stat` and one
/// `getdents64`).
pub fn is_empty_dir_with_mode(path: &CStr, mode: libc::mode_t) -> Result<bool, Errno> {
    let fd = open(path, libc::O_RDONLY | libc::O_DIRECTORY, 0)?;
    // SAFETY: stat is plain data; `st` is a valid out pointer for fstat on our descriptor.
    let mut st: libc::stat = unsafe { std::mem::zeroed() };
    // SAFETY: as above.
    let stat = check_int(unsafe { libc::fstat(fd, &mut st) });
    // Room for ".", ".." and one more entry: a third entry means not empty.
    let mut buf = [0u8; 1024];
    // SAFETY: `buf` is a live, writable buffer of the given length.
    let read =
        check(unsafe { libc::syscall(libc::SYS_getdents64, fd, buf.as_mut_ptr(), buf.len()) });
    // SAFETY: `fd` was opened above, is ours alone and is not used after.
    unsafe { close(fd) };
    stat?;
    let len = read? as usize;
    let mut entries = 0;
    let mut at = 0;
    while at + 19 <= len {
        // struct linux_dirent64: d_ino (8), d_off (8), d_reclen (2), d_type (1), d_name.
        let reclen = u16::from_ne_bytes([buf[at + 16], buf[at + 17]]) as usize;
        if reclen == 0 {
            break;
        }
        entries += 1;
        at += reclen;
    }
    Ok(entries <= 2 && st.st_mode & 0o7777 == mode)
}

/// `chdir(path)`.
pub fn chdir(path: &CStr) -> Result<(), Errno> {
    // SAFETY: `path` is a live C string.
    check_int(unsafe { libc::chdir(path.as_ptr()) }).map(drop)
}
