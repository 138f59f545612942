//! The check behind [`crate::Stage::writable`] that Landlock cannot make: Landlock stops a
//! restricted stage from creating, writing, truncating, renaming and removing files outside
//! its writable paths, but not from changing their metadata (chmod, chown, utimes, xattrs),
//! and overlayfs records such a change by copying the file up into the stage's layer. So
//! after the stage ran, anything in its layer outside the writable paths is a change it was
//! not allowed to make, and fails the stage.

use std::fs;
use std::io;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

/// The paths (relative to the workdir) that the layer `upper` changes outside `writable`
/// (relative to the workdir). `lowers` (top first) are the layers below it: a directory
/// that keeps the owner and mode it has there was only copied up on the way to a change
/// below it, and a new directory above a writable path was made by lockbox.
pub(crate) fn changes_outside(
    upper: &Path,
    lowers: &[PathBuf],
    writable: &[PathBuf],
) -> io::Result<Vec<PathBuf>> {
    let mut outside = Vec::new();
    walk(upper, Path::new(""), lowers, writable, &mut outside)?;
    outside.sort();
    Ok(outside)
}

fn walk(
    upper: &Path,
    rel: &Path,
    lowers: &[PathBuf],
    writable: &[PathBuf],
    outside: &mut Vec<PathBuf>,
) -> io::Result<()> {
    for entry in fs::read_dir(upper.join(rel))? {
        let path = rel.join(entry?.file_name());
        if writable.iter().any(|w| path.starts_with(w)) {
            continue;
        }
        let meta = fs::symlink_metadata(upper.join(&path))?;
        let below = lowers
            .iter()
            .find_map(|l| fs::symlink_metadata(l.join(&path)).ok());
        let descend = meta.is_dir()
            && match below {
                // Copied up on the way to something below it.
                Some(b) => {
                    b.is_dir()
                        && b.mode() == meta.mode()
                        && b.uid() == meta.uid()
                        && b.gid() == meta.gid()
                }
                // Made by lockbox: a missing writable directory or one of its parents.
                None => writable.iter().any(|w| w.starts_with(&path)),
            };
        if descend {
            walk(upper, &path, lowers, writable, outside)?;
        } else {
            outside.push(path);
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn only_entries_outside_the_writable_paths_and_changed_parents_count() {
        let dir = tempfile::tempdir().unwrap();
        let (upper, lower) = (dir.path().join("upper"), dir.path().join("lower"));
        for d in [
            "lower/a/web",
            "lower/b",
            "upper/a/web/deep",
            "upper/new/out",
            "upper/b",
        ] {
            fs::create_dir_all(dir.path().join(d)).unwrap();
        }
        fs::write(upper.join("a/web/deep/f"), "x").unwrap();
        fs::write(upper.join("b/chmodded"), "x").unwrap();
        fs::write(upper.join("top"), "x").unwrap();
        let writable = [PathBuf::from("a/web"), PathBuf::from("new/out")];
        let lowers = [lower.clone()];
        assert_eq!(
            changes_outside(&upper, &lowers, &writable).unwrap(),
            [PathBuf::from("b/chmodded"), PathBuf::from("top")]
        );
        // A parent of a writable path whose mode changed is a change too.
        use std::os::unix::fs::PermissionsExt;
        fs::set_permissions(upper.join("a"), fs::Permissions::from_mode(0o700)).unwrap();
        fs::set_permissions(lower.join("a"), fs::Permissions::from_mode(0o755)).unwrap();
        assert!(changes_outside(&upper, &lowers, &writable)
            .unwrap()
            .contains(&PathBuf::from("a")));
    }
}
