//! The OCI tar stream of a layer directory in overlayfs format: what its diff id is the
//! sha256 of, and what a push or save would send. Whiteouts (0:0 character devices) become
//! `.wh.NAME` entries, opaque directories (`user.overlay.opaque=y`) a `.wh..wh..opq` entry;
//! entries are in name order, owned by 0:0 (how lockbox presents image files), with their
//! modes and modification times.

use crate::error::ImageError;
use crate::unpack::OPAQUE_XATTR;
use std::io::Write;
use std::os::unix::fs::{FileTypeExt, MetadataExt};
use std::path::Path;

/// Writes the layer at `root` as an OCI tar stream to `out`.
pub(crate) fn write_layer_tar<W: Write>(root: &Path, out: W) -> Result<W, ImageError> {
    let mut b = tar::Builder::new(out);
    b.follow_symlinks(false);
    walk(&mut b, root, Path::new(""))?;
    b.into_inner()
        .map_err(|e| ImageError::io("write a layer's tar stream", root, e))
}

/// Whether `md` is an overlayfs whiteout (a 0:0 character device).
pub(crate) fn is_whiteout(md: &std::fs::Metadata) -> bool {
    md.file_type().is_char_device() && md.rdev() == 0
}

/// Whether the directory `path` is opaque.
pub(crate) fn is_opaque(path: &Path) -> bool {
    let mut buf = [0u8; 4];
    matches!(rustix::fs::lgetxattr(path, OPAQUE_XATTR, &mut buf), Ok(n) if buf[..n] == *b"y")
}

fn header(md: &std::fs::Metadata, kind: tar::EntryType, size: u64) -> tar::Header {
    let mut h = tar::Header::new_gnu();
    h.set_entry_type(kind);
    h.set_mode(md.mode() & 0o7777);
    h.set_uid(0);
    h.set_gid(0);
    h.set_mtime(u64::try_from(md.mtime()).unwrap_or(0));
    h.set_size(size);
    h
}

fn walk<W: Write>(b: &mut tar::Builder<W>, root: &Path, rel: &Path) -> Result<(), ImageError> {
    let dir = root.join(rel);
    let mut names: Vec<_> = std::fs::read_dir(&dir)
        .map_err(|e| ImageError::io("read a layer directory", &dir, e))?
        .map(|e| e.map(|e| e.file_name()))
        .collect::<Result<_, _>>()
        .map_err(|e| ImageError::io("read a layer directory", &dir, e))?;
    names.sort();
    let io = |e, p: &Path| ImageError::io("write a layer's tar stream", p, e);
    for name in names {
        let path = dir.join(&name);
        let entry = rel.join(&name);
        let md = std::fs::symlink_metadata(&path).map_err(|e| io(e, &path))?;
        let ft = md.file_type();
        if is_whiteout(&md) {
            let mut wh = std::ffi::OsString::from(".wh.");
            wh.push(&name);
            let mut h = header(&md, tar::EntryType::Regular, 0);
            h.set_mode(0o644);
            b.append_data(&mut h, rel.join(wh), std::io::empty())
                .map_err(|e| io(e, &path))?;
        } else if ft.is_dir() {
            let mut h = header(&md, tar::EntryType::Directory, 0);
            b.append_data(&mut h, &entry, std::io::empty())
                .map_err(|e| io(e, &path))?;
            if is_opaque(&path) {
                let mut h = header(&md, tar::EntryType::Regular, 0);
                h.set_mode(0o644);
                b.append_data(&mut h, entry.join(".wh..wh..opq"), std::io::empty())
                    .map_err(|e| io(e, &path))?;
            }
            walk(b, root, &entry)?;
        } else if ft.is_symlink() {
            let target = std::fs::read_link(&path).map_err(|e| io(e, &path))?;
            let mut h = header(&md, tar::EntryType::Symlink, 0);
            b.append_link(&mut h, &entry, target)
                .map_err(|e| io(e, &path))?;
        } else if ft.is_file() {
            let f = std::fs::File::open(&path).map_err(|e| io(e, &path))?;
            let mut h = header(&md, tar::EntryType::Regular, md.len());
            b.append_data(&mut h, &entry, f).map_err(|e| io(e, &path))?;
        }
        // FIFOs, sockets and other devices are not part of a layer.
    }
    Ok(())
}

/// A writer that only hashes and counts.
pub(crate) struct HashingSink {
    pub hasher: sha2::Sha256,
    pub count: u64,
}

impl Write for HashingSink {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        use sha2::Digest as _;
        self.hasher.update(buf);
        self.count += buf.len() as u64;
        Ok(buf.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A layer written as a tar stream and unpacked again is the same layer: files, modes,
    /// symlinks, whiteouts and opaque directories survive, and the stream is the same twice.
    #[test]
    fn a_layers_tar_stream_unpacks_to_the_same_layer_and_is_stable() {
        let d = tempfile::tempdir().unwrap();
        let src = d.path().join("src");
        std::fs::create_dir_all(src.join("app/opq")).unwrap();
        std::fs::write(src.join("app/file"), "content").unwrap();
        std::fs::set_permissions(
            src.join("app/file"),
            std::os::unix::fs::PermissionsExt::from_mode(0o750),
        )
        .unwrap();
        std::os::unix::fs::symlink("file", src.join("app/link")).unwrap();
        rustix::fs::mknodat(
            rustix::fs::CWD,
            src.join("app/gone"),
            rustix::fs::FileType::CharacterDevice,
            rustix::fs::Mode::from_raw_mode(0o644),
            0,
        )
        .unwrap();
        rustix::fs::setxattr(
            src.join("app/opq"),
            OPAQUE_XATTR,
            b"y",
            rustix::fs::XattrFlags::empty(),
        )
        .unwrap();
        let tar = write_layer_tar(&src, Vec::new()).unwrap();
        assert_eq!(tar, write_layer_tar(&src, Vec::new()).unwrap());
        let names: Vec<String> = tar::Archive::new(&tar[..])
            .entries()
            .unwrap()
            .map(|e| e.unwrap().path().unwrap().to_string_lossy().into_owned())
            .collect();
        assert!(names.contains(&"app/.wh.gone".to_owned()), "{names:?}");
        assert!(
            names.contains(&"app/opq/.wh..wh..opq".to_owned()),
            "{names:?}"
        );

        let back = d.path().join("back");
        std::fs::create_dir(&back).unwrap();
        crate::unpack(&tar[..], &back, "test").unwrap();
        assert_eq!(
            std::fs::read_to_string(back.join("app/file")).unwrap(),
            "content"
        );
        let md = std::fs::metadata(back.join("app/file")).unwrap();
        assert_eq!(md.mode() & 0o7777, 0o750);
        assert_eq!(
            std::fs::read_link(back.join("app/link")).unwrap(),
            Path::new("file")
        );
        assert!(is_whiteout(
            &std::fs::symlink_metadata(back.join("app/gone")).unwrap()
        ));
        assert!(is_opaque(&back.join("app/opq")));
        // And the unpacked layer writes the same stream: its diff id is stable.
        assert_eq!(tar, write_layer_tar(&back, Vec::new()).unwrap());
    }
}
