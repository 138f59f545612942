//! Copying a regular file's data as it is stored: only the ranges that hold data, so a file
//! with holes stays sparse. A sandbox's `truncate -s 100G f` costs the host 100 GiB of holes,
//! not 100 GiB of zeros, when it is imported, flattened, staged or committed. Every copy of
//! file data in this crate goes through [`copy_into`].
//!
//! The data ranges come from `lseek(SEEK_DATA / SEEK_HOLE)` (lseek(2); ext4, xfs, btrfs and
//! tmpfs report holes exactly, at block granularity; a filesystem without support reports the
//! whole file as data, and the copy is then dense as before). Each range is copied with
//! `copy_file_range(2)`, which stays in the kernel and shares blocks where the filesystem can
//! (reflinks on btrfs and xfs), or with `pread`/`pwrite` where the kernel refuses it (across
//! filesystems of different types: `EXDEV`). Data the sandbox wrote, zeros included, stays
//! allocated: the copy allocates what the source allocated, no more, no less.

use std::ffi::OsStr;
use std::fs::File;
use std::io;
use std::os::fd::BorrowedFd;
use std::os::unix::fs::FileExt;

use rustix::fs::{Mode, OFlags, SeekFrom};
use rustix::io::Errno;

/// The largest range handed to one `copy_file_range` call (the kernel caps a call anyway).
const CHUNK: u64 = 1 << 30;
/// The buffer of the read/write fallback.
const BUF: usize = 256 * 1024;

/// Copies the data of `from` into `to`, which must be empty, preserving holes, and sets the
/// length of `to` to that of `from`. Returns the bytes of data copied (holes not counted).
/// Fails with `UnexpectedEof` if `from` shrinks during the copy.
fn copy_data(from: &File, to: &File) -> io::Result<u64> {
    let len = from.metadata()?.len();
    let mut copier = Copier::default();
    let mut pos = 0;
    while pos < len {
        let Some(start) = next_data(from, pos, len)? else {
            break;
        };
        let end = next_hole(from, start, len)?;
        copier.copy(from, to, start, end)?;
        pos = end;
    }
    to.set_len(len)?;
    Ok(copier.copied)
}

/// Creates the regular file `dir/name` (which must not exist; mode 0600 until the caller sets
/// the real one) holding the data of `from`, holes kept; returns it and the bytes of data
/// copied.
pub(crate) fn copy_into(from: &File, dir: BorrowedFd<'_>, name: &OsStr) -> io::Result<(File, u64)> {
    let to = File::from(rustix::fs::openat(
        dir,
        name,
        OFlags::WRONLY | OFlags::CREATE | OFlags::EXCL | OFlags::NOFOLLOW | OFlags::CLOEXEC,
        Mode::from_raw_mode(0o600),
    )?);
    let copied = copy_data(from, &to)?;
    Ok((to, copied))
}

/// The start of the first data range at or after `pos`, `None` if only a hole is left.
fn next_data(from: &File, pos: u64, len: u64) -> io::Result<Option<u64>> {
    match rustix::fs::seek(from, SeekFrom::Data(pos)) {
        Ok(start) if start < len => Ok(Some(start)),
        Ok(_) | Err(Errno::NXIO) => Ok(None),
        // No SEEK_DATA here: everything is data.
        Err(Errno::INVAL | Errno::OPNOTSUPP) => Ok(Some(pos)),
        Err(e) => Err(e.into()),
    }
}

/// The end of the data range that starts at `start` (the end of the file at most).
fn next_hole(from: &File, start: u64, len: u64) -> io::Result<u64> {
    match rustix::fs::seek(from, SeekFrom::Hole(start)) {
        Ok(end) => Ok(end.min(len)),
        Err(Errno::INVAL | Errno::OPNOTSUPP | Errno::NXIO) => Ok(len),
        Err(e) => Err(e.into()),
    }
}

#[derive(Default)]
struct Copier {
    /// `copy_file_range` was refused once: the rest goes through the buffer.
    buf: Option<Vec<u8>>,
    copied: u64,
}

impl Copier {
    fn copy(&mut self, from: &File, to: &File, start: u64, end: u64) -> io::Result<()> {
        let (mut off_in, mut off_out) = (start, start);
        while off_in < end {
            let want = (end - off_in).min(CHUNK);
            let n = match &mut self.buf {
                None => match rustix::fs::copy_file_range(
                    from,
                    Some(&mut off_in),
                    to,
                    Some(&mut off_out),
                    want as usize,
                ) {
                    // The kernel advanced both offsets.
                    Ok(n) => n as u64,
                    Err(Errno::XDEV | Errno::INVAL | Errno::NOSYS | Errno::OPNOTSUPP) => {
                        self.buf = Some(vec![0u8; BUF]);
                        continue;
                    }
                    Err(e) => return Err(e.into()),
                },
                Some(buf) => {
                    let take = want.min(buf.len() as u64) as usize;
                    let n = from.read_at(&mut buf[..take], off_in)?;
                    to.write_all_at(&buf[..n], off_out)?;
                    off_in += n as u64;
                    off_out += n as u64;
                    n as u64
                }
            };
            if n == 0 {
                return Err(io::Error::new(
                    io::ErrorKind::UnexpectedEof,
                    "file shrank while it was copied",
                ));
            }
            self.copied += n;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;
    use std::os::unix::fs::MetadataExt;

    fn blocks(f: &File) -> u64 {
        f.metadata().unwrap().blocks()
    }

    #[test]
    fn holes_stay_holes_and_data_stays_data() {
        let dir = tempfile::tempdir().unwrap();
        let src = File::create_new(dir.path().join("src")).unwrap();
        // 64 MiB: data at 0, a hole, 1 MiB of written zeros at 32 MiB, a trailing hole.
        src.write_all_at(b"head", 0).unwrap();
        src.write_all_at(&vec![0u8; 1 << 20], 32 << 20).unwrap();
        src.set_len(64 << 20).unwrap();
        src.sync_all().unwrap();
        let src = File::open(dir.path().join("src")).unwrap();
        let dst = File::create_new(dir.path().join("dst")).unwrap();
        let copied = copy_data(&src, &dst).unwrap();
        dst.sync_all().unwrap();
        assert_eq!(dst.metadata().unwrap().len(), 64 << 20);
        assert!(
            copied < 2 << 20,
            "copied {copied} bytes of a 64 MiB sparse file"
        );
        assert_eq!(blocks(&dst), blocks(&src), "allocated blocks differ");
        let (mut a, mut b) = (vec![0u8; 1 << 20], vec![0u8; 1 << 20]);
        for off in (0..64u64 << 20).step_by(1 << 20) {
            src.read_exact_at(&mut a, off).unwrap();
            dst.read_exact_at(&mut b, off).unwrap();
            assert!(a == b, "content differs at {off}");
        }
    }

    #[test]
    fn empty_and_all_hole_files() {
        let dir = tempfile::tempdir().unwrap();
        for len in [0u64, 1, 4096, 10 << 20] {
            let p = dir.path().join(format!("s{len}"));
            File::create_new(&p).unwrap().set_len(len).unwrap();
            let q = dir.path().join(format!("d{len}"));
            let dst = File::create_new(&q).unwrap();
            assert_eq!(copy_data(&File::open(&p).unwrap(), &dst).unwrap(), 0);
            assert_eq!(dst.metadata().unwrap().len(), len);
            assert_eq!(blocks(&dst), 0);
        }
    }
}
