//! The upper layer a branch's changes are read from ([`crate::Branch::view`]): its own
//! `upper/` for a branch of the workdir; for a fork of a snapshot, its upper and the
//! snapshot's layers flattened into one directory of the branch (`.view-*`), removed when
//! the [`View`] is dropped. Flattening links files, which is safe: a view is only read,
//! and a commit copies what it stages.

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU32, Ordering};

use crate::CowError;

/// An upper layer to read a branch's changes from.
#[derive(Debug)]
pub struct View {
    path: PathBuf,
    /// Made for this view (removed on drop), not the branch's own upper.
    flattened: bool,
}

impl View {
    /// The directory.
    pub fn path(&self) -> &Path {
        &self.path
    }

    pub(crate) fn of(
        branch_dir: &Path,
        upper: PathBuf,
        layers: &[PathBuf],
    ) -> Result<View, CowError> {
        View::in_dir(branch_dir, ".view-", upper, layers)
    }

    /// A view of `upper` over `layers`, flattened (when there are layers) into a new
    /// directory of `dir` named `PREFIX<pid>-<n>`.
    pub(crate) fn in_dir(
        dir: &Path,
        prefix: &str,
        upper: PathBuf,
        layers: &[PathBuf],
    ) -> Result<View, CowError> {
        if layers.is_empty() {
            return Ok(View {
                path: upper,
                flattened: false,
            });
        }
        static NEXT: AtomicU32 = AtomicU32::new(0);
        let path = dir.join(format!(
            "{prefix}{}-{}",
            std::process::id(),
            NEXT.fetch_add(1, Ordering::Relaxed)
        ));
        std::fs::create_dir(&path).map_err(|source| CowError::Stage {
            path: path.clone(),
            source,
        })?;
        let view = View {
            path,
            flattened: true,
        };
        let mut stack = Vec::with_capacity(1 + layers.len());
        stack.push(upper);
        stack.extend(layers.iter().cloned());
        crate::layers::flatten(&stack, &view.path)?;
        Ok(view)
    }
}

impl Drop for View {
    fn drop(&mut self) {
        if !self.flattened {
            return;
        }
        if let (Some(parent), Some(name)) = (self.path.parent(), self.path.file_name()) {
            // Best effort: a leftover is removed with its branch.
            let _ = crate::beneath::open_root(parent)
                .and_then(|fd| crate::beneath::remove_tree_at(std::os::fd::AsFd::as_fd(&fd), name));
        }
    }
}
