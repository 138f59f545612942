//! Filesystem grants: what host paths a sandbox sees, and how.

use crate::error::PolicyError;
use serde::{Deserialize, Serialize};
use std::path::{Path, PathBuf};

/// Host paths made readable by default: enough to run ordinary programs.
pub const DEFAULT_READS: [&str; 6] = ["/usr", "/bin", "/sbin", "/lib", "/lib64", "/etc"];

/// Entries of `/etc` hidden from the default read set, relative to `/etc`. A trailing `*`
/// matches any suffix and a leading `*` any prefix within the last component.
pub const ETC_SECRETS: [&str; 16] = [
    "shadow",
    "shadow-",
    "gshadow",
    "gshadow-",
    "sudoers",
    "sudoers.d",
    "ssh/*_key",
    "ssl/private",
    "krb5.keytab",
    "security/opasswd",
    "NetworkManager/system-connections",
    "wireguard",
    "ppp/chap-secrets",
    "ppp/pap-secrets",
    "libvirt/secrets",
    ".pwd.lock",
];

/// Paths that lockbox builds itself inside every sandbox.
const RESERVED: [(&str, &str); 2] = [
    (
        "/proc",
        "every sandbox gets its own /proc for its pid namespace",
    ),
    (
        "/dev",
        "every sandbox gets a minimal /dev; grant single devices instead",
    ),
];

/// Which host paths the sandbox sees.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct FsPolicy {
    /// Include [`DEFAULT_READS`] (with `/etc` minus [`ETC_SECRETS`]).
    pub default_reads: bool,
    /// Host paths visible read-only, at the same path.
    #[serde(with = "crate::name::json::vec")]
    pub read: Vec<PathBuf>,
    /// Host paths visible read-write, at the same path. Writes reach the host.
    #[serde(with = "crate::name::json::vec")]
    pub write: Vec<PathBuf>,
    /// Copy-on-write views: an overlay of host directories mounted at `target`.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub overlays: Vec<Overlay>,
}

/// A copy-on-write view inside the sandbox: `lowers` (top first) merged at `target`, with
/// every write landing in `upper`. Without `upper` the view is read-only.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Overlay {
    /// Where the view appears inside the sandbox (usually the first lower's own path).
    #[serde(with = "crate::name::json")]
    pub target: PathBuf,
    /// Read-only layers, top first; the last is usually the real directory.
    #[serde(with = "crate::name::json::vec")]
    pub lowers: Vec<PathBuf>,
    /// The writable layer, if any.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub upper: Option<OverlayUpper>,
    /// Where inside the view the sandbox may write (needs an `upper`). `None`: anywhere.
    /// `Some(paths)`: the view is readable, and writable only at or below these absolute
    /// paths inside `target` (missing directories among them are created, empty, in the
    /// upper layer before the command starts); `Some(vec![])`: a read-only view. Enforced
    /// by Landlock, so a sandbox with a restriction fails to start on a kernel without it.
    #[serde(
        default,
        skip_serializing_if = "Option::is_none",
        with = "crate::name::json::option_vec"
    )]
    pub writable: Option<Vec<PathBuf>>,
}

/// The writable layer of an [`Overlay`]: two empty directories on the same filesystem.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct OverlayUpper {
    /// Receives every write (files, whiteouts, opaque directories).
    #[serde(with = "crate::name::json")]
    pub upper: PathBuf,
    /// overlayfs's scratch directory.
    #[serde(with = "crate::name::json")]
    pub work: PathBuf,
    /// Bound the writable layer: writes land in a tmpfs of this size inside the sandbox
    /// (writing beyond it fails with ENOSPC) whose contents the caller copies into `upper`
    /// afterwards (see `lockbox_confine::Outcome::upper_mounts`). Uses memory, not disk.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_size: Option<crate::ByteSize>,
}

impl Default for FsPolicy {
    fn default() -> Self {
        FsPolicy {
            default_reads: true,
            read: Vec::new(),
            write: Vec::new(),
            overlays: Vec::new(),
        }
    }
}

/// A grant of an [`FsPolicy`] through which a sandbox sees a host path
/// ([`FsPolicy::grant_showing`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Grant {
    /// At or below a read-only grant (`fs.read`).
    Read(PathBuf),
    /// At or below a read-write grant (`fs.write`).
    Write(PathBuf),
    /// In a lower layer of a copy-on-write view (`fs.overlays`: a workdir, for one).
    Overlay(PathBuf),
    /// Under one of [`DEFAULT_READS`] and not among [`ETC_SECRETS`].
    DefaultRead(&'static str),
}

impl std::fmt::Display for Grant {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Grant::Read(p) => write!(f, "the read grant {}", p.display()),
            Grant::Write(p) => write!(f, "the write grant {}", p.display()),
            Grant::Overlay(p) => write!(f, "the copy-on-write view of {}", p.display()),
            Grant::DefaultRead(p) => write!(f, "the default read {p}"),
        }
    }
}

/// Whether `rel` (relative to `/etc`) is, or lies under, an entry of [`ETC_SECRETS`].
pub fn is_etc_secret(rel: &Path) -> bool {
    let parts: Vec<_> = rel.components().collect();
    ETC_SECRETS.iter().any(|pattern| {
        let pattern: Vec<&str> = pattern.split('/').collect();
        parts.len() >= pattern.len()
            && pattern.iter().zip(&parts).all(|(want, got)| {
                let got = got.as_os_str().to_string_lossy();
                match (want.strip_prefix('*'), want.strip_suffix('*')) {
                    (Some(suffix), _) => got.ends_with(suffix),
                    (None, Some(prefix)) => got.starts_with(prefix),
                    (None, None) => got == *want,
                }
            })
    })
}

impl FsPolicy {
    /// The grant through which a sandbox of this policy would see the host path `path`
    /// (give it canonical: grants are compared after resolving their own links), if any.
    /// Used to keep files a sandbox must never read, a credential's, out of its view.
    pub fn grant_showing(&self, path: &Path) -> Option<Grant> {
        let canonical = |p: &Path| std::fs::canonicalize(p).unwrap_or_else(|_| p.to_owned());
        let under = |grant: &Path| path.starts_with(canonical(grant));
        if let Some(p) = self.write.iter().find(|p| under(p)) {
            return Some(Grant::Write(p.clone()));
        }
        if let Some(p) = self.read.iter().find(|p| under(p)) {
            return Some(Grant::Read(p.clone()));
        }
        let lower = self
            .overlays
            .iter()
            .flat_map(|o| &o.lowers)
            .find(|p| under(p));
        if let Some(p) = lower {
            return Some(Grant::Overlay(p.clone()));
        }
        if !self.default_reads {
            return None;
        }
        DEFAULT_READS.into_iter().find_map(|read| {
            let rel = path.strip_prefix(canonical(Path::new(read))).ok()?;
            (read != "/etc" || !is_etc_secret(rel)).then_some(Grant::DefaultRead(read))
        })
    }

    pub(crate) fn validate(&self) -> Result<(), PolicyError> {
        for (field, paths) in [("fs.read", &self.read), ("fs.write", &self.write)] {
            for path in paths {
                check_grant(field, path)?;
            }
        }
        for overlay in &self.overlays {
            check_grant("fs.overlays.target", &overlay.target)?;
            if overlay.lowers.is_empty() {
                return Err(PolicyError::Invalid {
                    field: "fs.overlays.lowers",
                    reason: format!(
                        "the overlay at {} needs at least one lower layer",
                        overlay.target.display()
                    ),
                });
            }
            let upper = overlay.upper.iter().flat_map(|u| [&u.upper, &u.work]);
            for path in overlay.lowers.iter().chain(upper) {
                if !path.is_absolute() {
                    return Err(PolicyError::RelativePath {
                        field: "fs.overlays",
                        path: path.clone(),
                    });
                }
            }
            overlay.validate_writable()?;
            if overlay
                .upper
                .as_ref()
                .is_some_and(|u| u.max_size == Some(crate::ByteSize(0)))
            {
                return Err(PolicyError::Invalid {
                    field: "fs.overlays.upper.max_size",
                    reason: "must be greater than zero (0 would mean no bound to the kernel)"
                        .into(),
                });
            }
        }
        // Writing /sys reconfigures the host's kernel and devices.
        if let Some(path) = self.write.iter().find(|p| p.starts_with("/sys")) {
            return Err(PolicyError::Invalid {
                field: "fs.write",
                reason: format!(
                    "{} is under /sys, which can only be granted read-only",
                    path.display()
                ),
            });
        }
        Ok(())
    }
}

impl Overlay {
    fn validate_writable(&self) -> Result<(), PolicyError> {
        const FIELD: &str = "fs.overlays.writable";
        let Some(paths) = &self.writable else {
            return Ok(());
        };
        if self.upper.is_none() {
            return Err(PolicyError::Invalid {
                field: FIELD,
                reason: format!(
                    "the overlay at {} has no upper layer, so it is read-only already",
                    self.target.display()
                ),
            });
        }
        for path in paths {
            if !path.is_absolute() {
                return Err(PolicyError::RelativePath {
                    field: FIELD,
                    path: path.clone(),
                });
            }
            // Lexical check: `..` could climb out of the view after `starts_with` said yes.
            let climbs = path
                .components()
                .any(|c| matches!(c, std::path::Component::ParentDir));
            if climbs || !path.starts_with(&self.target) {
                return Err(PolicyError::Invalid {
                    field: FIELD,
                    reason: format!(
                        "{} is not inside the view {}",
                        path.display(),
                        self.target.display()
                    ),
                });
            }
        }
        Ok(())
    }
}

fn check_grant(field: &'static str, path: &Path) -> Result<(), PolicyError> {
    if !path.is_absolute() {
        return Err(PolicyError::RelativePath {
            field,
            path: path.to_owned(),
        });
    }
    if path == Path::new("/") {
        return Err(PolicyError::Invalid {
            field,
            reason: "granting / would expose the whole host; grant the directories you need".into(),
        });
    }
    for (reserved, why) in RESERVED {
        if path == Path::new(reserved) {
            return Err(PolicyError::ReservedPath {
                field,
                path: path.to_owned(),
                why,
            });
        }
    }
    if path.starts_with("/proc") {
        return Err(PolicyError::ReservedPath {
            field,
            path: path.to_owned(),
            why: RESERVED[0].1,
        });
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    #[test]
    fn grant_showing_names_the_grant_a_host_path_is_seen_through() {
        let mut fs = FsPolicy::default();
        assert_eq!(
            fs.grant_showing(Path::new("/etc/app/token")),
            Some(Grant::DefaultRead("/etc"))
        );
        // /etc's secrets are hidden from every sandbox, and what lies under them.
        assert_eq!(fs.grant_showing(Path::new("/etc/shadow")), None);
        assert_eq!(fs.grant_showing(Path::new("/etc/ssl/private/k.pem")), None);
        assert_eq!(
            fs.grant_showing(Path::new("/etc/ssh/ssh_host_ed25519_key")),
            None
        );
        assert_eq!(
            fs.grant_showing(Path::new("/etc/ssh/ssh_config")),
            Some(Grant::DefaultRead("/etc"))
        );
        assert_eq!(fs.grant_showing(Path::new("/srv/token")), None);
        fs.read.push("/srv".into());
        assert_eq!(
            fs.grant_showing(Path::new("/srv/token")),
            Some(Grant::Read("/srv".into()))
        );
        fs.write.push("/srv/rw".into());
        assert_eq!(
            fs.grant_showing(Path::new("/srv/rw/token")),
            Some(Grant::Write("/srv/rw".into()))
        );
        fs.overlays.push(Overlay {
            target: "/work".into(),
            lowers: vec!["/work".into()],
            upper: None,
            writable: None,
        });
        assert_eq!(
            fs.grant_showing(Path::new("/work/.env")),
            Some(Grant::Overlay("/work".into()))
        );
        fs.default_reads = false;
        assert_eq!(fs.grant_showing(Path::new("/etc/app/token")), None);
        // A grant's own links are resolved; a sibling with a common prefix is not under it.
        assert_eq!(fs.grant_showing(Path::new("/srvx/token")), None);
    }

    use super::*;

    fn view(writable: Option<Vec<PathBuf>>, with_upper: bool) -> FsPolicy {
        FsPolicy {
            overlays: vec![Overlay {
                target: "/w".into(),
                lowers: vec!["/w".into()],
                upper: with_upper.then(|| OverlayUpper {
                    upper: "/s/upper".into(),
                    work: "/s/work".into(),
                    max_size: None,
                }),
                writable,
            }],
            ..FsPolicy::default()
        }
    }

    #[test]
    fn writable_paths_must_lie_inside_the_view_and_are_named_when_not() {
        view(None, true).validate().unwrap();
        view(Some(vec![]), true).validate().unwrap();
        view(Some(vec!["/w/web".into(), "/w".into()]), true)
            .validate()
            .unwrap();
        for bad in ["/web", "/w/../etc", "/wx", "w/web"] {
            let err = view(Some(vec![bad.into()]), true).validate().unwrap_err();
            let text = err.to_string();
            assert!(text.contains("fs.overlays.writable"), "{text}");
            assert!(text.contains(bad), "{text}");
        }
        let err = view(Some(vec!["/w/web".into()]), false)
            .validate()
            .unwrap_err();
        assert!(err.to_string().contains("no upper layer"), "{err}");
    }

    #[test]
    fn a_zero_sized_upper_is_refused_rather_than_unbounded() {
        let mut fs = view(None, true);
        if let Some(upper) = fs.overlays[0].upper.as_mut() {
            upper.max_size = Some(crate::ByteSize(0));
        }
        let err = fs.validate().unwrap_err();
        assert!(err.to_string().contains("max_size"), "{err}");
    }

    #[test]
    fn reserved_and_root_paths_are_refused_with_reason() {
        for p in ["/", "/proc", "/proc/1/root", "/dev"] {
            let fs = FsPolicy {
                read: vec![p.into()],
                ..FsPolicy::default()
            };
            assert!(fs.validate().is_err(), "{p} accepted");
        }
        let fs = FsPolicy {
            write: vec!["/sys/class".into()],
            ..FsPolicy::default()
        };
        assert!(fs.validate().is_err(), "writable /sys accepted");
        let fs = FsPolicy {
            write: vec!["/dev/kvm".into()],
            ..FsPolicy::default()
        };
        fs.validate().unwrap();
    }
}
