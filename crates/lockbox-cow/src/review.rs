//! Binding a commit to the review it follows (issue 32): what a reviewer approves is what
//! gets committed.
//!
//! A review (a change listing, a file's diff) gives each path a [`ContentDigest`] of what
//! the branch has there: SHA-256 of its type, permission bits and content (a file's bytes, a
//! symlink's target; `absent` for a deletion). A commit that follows a review names it
//! ([`Reviewed`] in [`crate::Selection::review`]): either the paths shown with their digests
//! ([`Reviewed::Paths`]: the console, HTTP, MCP, `lockbox branch commit -p`) or the token of a
//! whole listing ([`Reviewed::Token`]: `lockbox branch commit --review`). The commit checks,
//! under the workdir lock and on the frozen snapshot it commits from, that every path it
//! writes was shown with the digest it has now; a path written since the review, one the
//! review did not show (added after it), or a whole listing that differs, is refused with
//! [`crate::CowError::StaleReview`] before anything is staged. A hunk selection is checked
//! against the digest of the file *before* its hunks are applied, so hunk numbers always
//! refer to the content that was shown (and a text file made binary since has a new digest).
//!
//! The digest covers the branch side only: a change of the workdir side at a path the commit
//! writes is the stale-base rule's (refused unless forced).

use std::ffi::OsStr;
use std::fmt;
use std::io::Read;
use std::os::fd::{AsFd, BorrowedFd};
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};
use std::str::FromStr;

use rustix::fs::FileType as RawType;
use sha2::{Digest, Sha256};

use crate::Change;

/// Domain separation: a digest of a path's content is never one of anything else.
const DOMAIN: &[u8] = b"lockbox-review-1\0";

/// The digest of what a branch has at one path, or of a whole listing ([`Review::token`]).
/// Written `sha256:` and 64 lowercase hex digits.
#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ContentDigest([u8; 32]);

impl fmt::Display for ContentDigest {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("sha256:")?;
        self.0.iter().try_for_each(|b| write!(f, "{b:02x}"))
    }
}

impl fmt::Debug for ContentDigest {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(self, f)
    }
}

/// A string that is not `sha256:` and 64 hex digits.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("not a review digest (expected sha256: and 64 hex digits): {0:?}")]
pub struct BadDigest(pub String);

impl FromStr for ContentDigest {
    type Err = BadDigest;
    fn from_str(s: &str) -> Result<ContentDigest, BadDigest> {
        let bad = || BadDigest(s.chars().take(80).collect());
        let hex = s.strip_prefix("sha256:").ok_or_else(bad)?.as_bytes();
        if hex.len() != 64 {
            return Err(bad());
        }
        let mut out = [0u8; 32];
        for (i, pair) in hex.chunks(2).enumerate() {
            let digit = |c: u8| (c as char).to_digit(16).filter(|_| !c.is_ascii_uppercase());
            match (digit(pair[0]), digit(pair[1])) {
                (Some(a), Some(b)) => out[i] = (a * 16 + b) as u8,
                _ => return Err(bad()),
            }
        }
        Ok(ContentDigest(out))
    }
}

impl serde::Serialize for ContentDigest {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(self)
    }
}

impl<'de> serde::Deserialize<'de> for ContentDigest {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<ContentDigest, D::Error> {
        let s = String::deserialize(d)?;
        s.parse().map_err(serde::de::Error::custom)
    }
}

/// What [`ContentDigest`]'s `Deserialize` takes (`sha256:` and 64 lowercase hex digits), for
/// lockbox-server's OpenAPI document, which writes it in place (`#[schema(inline)]`).
#[cfg(feature = "openapi")]
impl utoipa::PartialSchema for ContentDigest {
    fn schema() -> utoipa::openapi::RefOr<utoipa::openapi::schema::Schema> {
        use utoipa::openapi::schema::{ObjectBuilder, Type};
        ObjectBuilder::new()
            .schema_type(Type::String)
            .pattern(Some("^sha256:[0-9a-f]{64}$"))
            .into()
    }
}

#[cfg(feature = "openapi")]
impl utoipa::ToSchema for ContentDigest {}

/// Feeds one entry into a digest (see the module doc).
pub(crate) struct EntryHasher(Sha256);

impl EntryHasher {
    fn new(tag: &str, mode: u32) -> EntryHasher {
        let mut h = Sha256::new();
        h.update(DOMAIN);
        h.update(tag.as_bytes());
        h.update([0]);
        h.update(mode.to_be_bytes());
        EntryHasher(h)
    }

    /// A regular file of permission bits `mode`; its bytes follow ([`EntryHasher::update`]).
    pub(crate) fn file(mode: u32) -> EntryHasher {
        EntryHasher::new("file", mode)
    }

    pub(crate) fn update(&mut self, bytes: &[u8]) {
        self.0.update(bytes);
    }

    pub(crate) fn finish(self) -> ContentDigest {
        ContentDigest(self.0.finalize().into())
    }
}

/// Nothing at the path (a deletion).
pub(crate) fn absent() -> ContentDigest {
    EntryHasher::new("absent", 0).finish()
}

/// The digest of `dir/name` as it is now (`st`: its `lstat`); `open` opens a regular file
/// (granting access in an upper layer). A regular file is digested from the opened file and
/// its own `fstat`, so its mode and bytes are of one file.
pub(crate) fn entry(
    dir: BorrowedFd<'_>,
    name: &OsStr,
    st: &rustix::fs::Stat,
    open: fn(BorrowedFd<'_>, &OsStr) -> std::io::Result<std::fs::File>,
) -> std::io::Result<ContentDigest> {
    let mode = st.st_mode & 0o7777;
    Ok(match RawType::from_raw_mode(st.st_mode) {
        RawType::RegularFile => {
            let mut file = open(dir, name)?;
            let mode = rustix::fs::fstat(file.as_fd())?.st_mode & 0o7777;
            let mut h = EntryHasher::file(mode);
            let mut buf = vec![0u8; 64 * 1024];
            loop {
                let n = file.read(&mut buf)?;
                if n == 0 {
                    break;
                }
                h.update(&buf[..n]);
            }
            h.finish()
        }
        RawType::Directory => EntryHasher::new("dir", mode).finish(),
        RawType::Symlink => {
            let target = rustix::fs::readlinkat(dir, name, Vec::new())?;
            let mut h = EntryHasher::new("symlink", 0);
            h.update(target.as_bytes());
            h.finish()
        }
        _ => {
            let mut h = EntryHasher::new("special", st.st_mode);
            h.update(&st.st_rdev.to_be_bytes());
            h.finish()
        }
    })
}

/// One path a reviewer was shown, with the digest of what the branch had there.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct ReviewedPath {
    /// Relative to the workdir (in JSON: a string, or `{"bytes": base64}`).
    #[serde(with = "lockbox_policy::name::json")]
    #[cfg_attr(feature = "openapi", schema(value_type = lockbox_policy::name::Decoded))]
    pub path: PathBuf,
    /// Its digest as the review showed it.
    #[cfg_attr(feature = "openapi", schema(inline))]
    pub digest: ContentDigest,
}

/// A change listing as a reviewer saw it: each change's path and digest, in path order.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Review {
    paths: Vec<ReviewedPath>,
}

impl Review {
    /// The review of `paths` (any order; a path given twice keeps its last digest).
    pub fn new(paths: Vec<ReviewedPath>) -> Review {
        let mut paths = paths;
        paths.reverse();
        paths.sort_by(|a, b| a.path.cmp(&b.path));
        paths.dedup_by(|a, b| a.path == b.path);
        Review { paths }
    }

    /// The paths, in path order.
    pub fn paths(&self) -> &[ReviewedPath] {
        &self.paths
    }

    /// The digest `path` was shown with, if it was shown.
    pub fn digest(&self, path: &Path) -> Option<ContentDigest> {
        self.paths
            .binary_search_by(|r| r.path.as_path().cmp(path))
            .ok()
            .map(|i| self.paths[i].digest)
    }

    /// The digest of the whole listing (every path and its digest): what
    /// [`Reviewed::Token`] names.
    pub fn token(&self) -> ContentDigest {
        let mut h = EntryHasher::new("listing", 0);
        for r in &self.paths {
            let path = r.path.as_os_str().as_bytes();
            h.update(&(path.len() as u64).to_be_bytes());
            h.update(path);
            h.update(&r.digest.0);
        }
        h.finish()
    }
}

/// A change and the digest of what the branch has at its path: one row of a review.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ReviewedChange {
    /// The change.
    pub change: Change,
    /// What the branch has at its path ([`ContentDigest`]).
    pub digest: ContentDigest,
}

/// The review a commit follows (see the module doc).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Reviewed {
    /// The paths shown, each with its digest: the commit may write only these, as shown.
    Paths(Review),
    /// The token of a whole listing ([`Review::token`]): the branch's changes, all of them,
    /// must still be what that listing showed.
    Token(ContentDigest),
}

impl Reviewed {
    /// The paths of `paths` (which a commit writes) that the review did not show as
    /// `current` says they are now. A token was checked as a whole listing: none.
    pub(crate) fn stale(
        &self,
        paths: &[PathBuf],
        current: impl Fn(&Path) -> Result<ContentDigest, crate::CowError>,
    ) -> Result<Vec<PathBuf>, crate::CowError> {
        let Reviewed::Paths(review) = self else {
            return Ok(Vec::new());
        };
        let mut stale = Vec::new();
        for path in paths {
            if review.digest(path) != Some(current(path)?) {
                stale.push(path.clone());
            }
        }
        Ok(stale)
    }
}

/// The review of `changes` of `upper` over `workdir`: each change with the digest of what
/// `upper` has at its path.
pub(crate) fn review_changes(
    upper: &Path,
    workdir: &Path,
    changes: Vec<Change>,
) -> Result<Vec<ReviewedChange>, crate::CowError> {
    changes
        .into_iter()
        .map(|change| {
            let digest = crate::diff::new_side_digest(upper, workdir, &change.path)?;
            Ok(ReviewedChange { change, digest })
        })
        .collect()
}

impl Review {
    /// The review a listing of [`ReviewedChange`]s is.
    pub fn of(changes: &[ReviewedChange]) -> Review {
        Review::new(
            changes
                .iter()
                .map(|c| ReviewedPath {
                    path: c.change.path.clone(),
                    digest: c.digest,
                })
                .collect(),
        )
    }
}

impl crate::Branch {
    /// The change set, each change with the digest of what the branch has at its path: what
    /// a reviewer is shown and a commit then names ([`Reviewed`]).
    pub fn review(&self) -> Result<Vec<ReviewedChange>, crate::CowError> {
        let view = self.view()?;
        let changes = crate::ChangeSet::compute(view.path(), self.workdir())?;
        review_changes(view.path(), self.workdir(), changes.into_iter().collect())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn digests_round_trip_and_reject_other_forms() {
        let d = absent();
        let text = d.to_string();
        assert!(text.starts_with("sha256:") && text.len() == 71);
        assert_eq!(text.parse::<ContentDigest>(), Ok(d));
        for bad in ["", "sha256:", &text[7..], &text.to_uppercase(), &text[..70]] {
            assert!(bad.parse::<ContentDigest>().is_err(), "{bad}");
        }
    }

    #[test]
    fn a_listing_token_covers_paths_and_digests() {
        let d = absent();
        let e = EntryHasher::file(0o644).finish();
        let r = |p: &str, digest| ReviewedPath {
            path: p.into(),
            digest,
        };
        let one = Review::new(vec![r("a", d), r("b", e)]);
        assert_eq!(one.token(), Review::new(vec![r("b", e), r("a", d)]).token());
        assert_ne!(one.token(), Review::new(vec![r("a", e), r("b", e)]).token());
        assert_ne!(one.token(), Review::new(vec![r("a", d)]).token());
        assert_ne!(one.token(), Review::new(vec![r("ab", d), r("", e)]).token());
        assert_eq!(one.digest(Path::new("b")), Some(e));
        assert_eq!(one.digest(Path::new("c")), None);
    }
}
