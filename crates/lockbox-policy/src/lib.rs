//! The plain data of a lockbox sandbox.
//!
//! A [`Policy`] says what a confined process may see and use: which host paths are readable
//! ([`FsPolicy`]), which network it reaches ([`Net`], [`NetSpec`]), its resource [`Limits`], its
//! environment ([`EnvPolicy`]), its timeout and its working directory. Every front end (CLI
//! flags, a TOML profile, HTTP JSON, Python keyword arguments) turns into the same `Policy`
//! through one conversion, and [`Policy::validate`] checks it.
//!
//! Units live in types: [`ByteSize`] and [`std::time::Duration`] (parsed by
//! [`parse_duration`]).
//!
//! File names are bytes: [`name`] gives their lossless JSON form (`#[serde(with =
//! "lockbox_policy::name::json")]`, used for every path lockbox serialises) and their
//! quoted form for people ([`name::quoted`]).
//!
//! Not here: anything that touches the kernel or the filesystem (canonicalising paths,
//! probing features, mounting). That is `lockbox-confine`.
//!
//! ```
//! use lockbox_policy::{Policy, ByteSize};
//! let mut policy = Policy::default();
//! policy.limits.memory = Some("64M".parse::<ByteSize>().unwrap());
//! policy.fs.write.push("/tmp/work".into());
//! policy.validate().unwrap();
//! ```
#![forbid(unsafe_code)]
#![deny(missing_docs)]

mod ceiling;
mod env;
mod error;
mod fs;
mod limits;
pub mod name;
mod net;
pub mod time;
mod units;

pub use crate::ceiling::{BeyondCeiling, Ceiling, NetForm};
pub use crate::env::{EnvPolicy, DEFAULT_PATH};
pub use crate::error::PolicyError;
pub use crate::fs::{
    is_etc_secret, FsPolicy, Grant, Overlay, OverlayUpper, DEFAULT_READS, ETC_SECRETS,
};
pub use crate::limits::{
    Limits, DEFAULT_TMPFS_INODES, MEMORY_PER_TMPFS_INODE, UPPER_BYTES_PER_INODE, UPPER_OWN_INODES,
};
pub use crate::net::{
    canonical, normalize_name, route, IpNet, ListKind, Net, NetHost, NetRule, NetSpec, Ports,
    Proto, Route,
};
pub use crate::units::{parse_duration, plural, ByteSize, HumanBytes, HumanDuration};
pub use lockbox_codes::{ErrorCode, Family};

use serde::{Deserialize, Serialize};
use std::path::PathBuf;
use std::time::Duration;

/// Default time between SIGTERM and SIGKILL when a sandbox is stopped.
pub const DEFAULT_KILL_GRACE: Duration = Duration::from_secs(2);

/// Default hostname inside a sandbox.
pub const DEFAULT_HOSTNAME: &str = "lockbox";

/// Everything that decides how a sandbox is confined.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct Policy {
    /// Filesystem grants.
    pub fs: FsPolicy,
    /// Network access.
    pub net: Net,
    /// Resource limits.
    pub limits: Limits,
    /// Environment of the command.
    pub env: EnvPolicy,
    /// Wall-clock limit; on expiry everything in the sandbox is stopped.
    #[serde(
        with = "units::opt_duration_serde",
        skip_serializing_if = "Option::is_none"
    )]
    pub timeout: Option<Duration>,
    /// Time between SIGTERM and SIGKILL when the sandbox is stopped.
    #[serde(with = "units::duration_serde")]
    pub kill_grace: Duration,
    /// Working directory of the command inside the sandbox.
    #[serde(
        skip_serializing_if = "Option::is_none",
        with = "crate::name::json::option"
    )]
    pub cwd: Option<PathBuf>,
    /// Hostname inside the sandbox.
    pub hostname: String,
    /// File descriptors of the caller handed to the command under the same number.
    pub pass_fds: Vec<i32>,
    /// An OCI image reference (`docker.io/library/debian:12`, `oci:DIR:TAG`, ...): the
    /// sandbox's root is that image's userland instead of the host's. The reference is what
    /// every front end carries (flags, profiles, the HTTP API); a front end resolves it to
    /// the image's unpacked layer directories, which it gives to `lockbox-confine`
    /// (`Spawn::image_root`). With an image, [`FsPolicy::default_reads`] is ignored (no
    /// host `/usr`, `/etc`, ... inside); grants and views are mounted into the image's root
    /// at their own paths.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub image: Option<String>,
}

impl Default for Policy {
    fn default() -> Self {
        Policy {
            fs: FsPolicy::default(),
            net: Net::default(),
            limits: Limits::default(),
            env: EnvPolicy::default(),
            timeout: None,
            kill_grace: DEFAULT_KILL_GRACE,
            cwd: None,
            hostname: DEFAULT_HOSTNAME.to_owned(),
            pass_fds: Vec::new(),
            image: None,
        }
    }
}

impl Policy {
    /// Parses a TOML profile (the same fields as the JSON form of a `Policy`).
    pub fn from_toml(text: &str) -> Result<Policy, PolicyError> {
        let policy: Policy = toml::from_str(text).map_err(|e| PolicyError::Profile {
            message: e.message().to_owned(),
            span: e.span().map(|s| (s.start, s.end)),
        })?;
        policy.validate()?;
        Ok(policy)
    }

    /// Shows `workdir` through a copy-on-write layer (`upper`, overlayfs scratch `work`, both
    /// empty directories on one filesystem) and makes it the working directory unless one is
    /// set: how `lockbox run --workdir` and long-lived sandboxes mount a branch. `layers`
    /// (top first: a snapshot's, for a fork) lie between the upper and the workdir.
    pub fn mount_copy_on_write(
        &mut self,
        workdir: &std::path::Path,
        layers: &[PathBuf],
        upper: PathBuf,
        work: PathBuf,
        max_size: Option<ByteSize>,
    ) {
        self.mount_copy_on_write_at(workdir, workdir, layers, upper, work, max_size);
    }

    /// [`Policy::mount_copy_on_write`], with the sandbox seeing the view at `at` (an
    /// absolute path inside the sandbox) instead of at the workdir's own path.
    pub fn mount_copy_on_write_at(
        &mut self,
        at: &std::path::Path,
        workdir: &std::path::Path,
        layers: &[PathBuf],
        upper: PathBuf,
        work: PathBuf,
        max_size: Option<ByteSize>,
    ) {
        let mut lowers = layers.to_vec();
        lowers.push(workdir.to_owned());
        self.fs.overlays.push(Overlay {
            target: at.to_owned(),
            lowers,
            upper: Some(OverlayUpper {
                upper,
                work,
                max_size,
            }),
            writable: None,
        });
        self.cwd.get_or_insert_with(|| at.to_owned());
    }

    /// Checks the policy for values no sandbox can honour. Pure: no filesystem access.
    pub fn validate(&self) -> Result<(), PolicyError> {
        self.fs.validate()?;
        self.limits.validate()?;
        self.env.validate()?;
        if let Some(cwd) = &self.cwd {
            if !cwd.is_absolute() {
                return Err(PolicyError::RelativePath {
                    field: "cwd",
                    path: cwd.clone(),
                });
            }
        }
        if self.timeout == Some(Duration::ZERO) {
            return Err(PolicyError::Invalid {
                field: "timeout",
                reason: "must be greater than zero".into(),
            });
        }
        validate_hostname(&self.hostname)?;
        if let Net::Deny(specs) = &self.net {
            if let Some(wild) = specs
                .iter()
                .find(|s| matches!(s.host, NetHost::Subdomains(_)))
            {
                return Err(PolicyError::BadNetSpec {
                    spec: wild.to_string(),
                    reason: "'*.' names are for --net-allow only: a deny-list resolves its names \
                             once at start, and a wildcard has no addresses to deny"
                        .into(),
                });
            }
        }
        if let Some(image) = &self.image {
            validate_image_reference(image)?;
        }
        for &fd in &self.pass_fds {
            if fd <= 2 {
                return Err(PolicyError::Invalid {
                    field: "pass_fds",
                    reason: format!("fd {fd} is stdio and is always passed; pass fds 3 and up"),
                });
            }
        }
        Ok(())
    }
}

/// The longest image reference accepted (Docker's own limit on a reference is 255 bytes
/// for the name; a local `oci:` path and a digest make it longer).
pub const MAX_IMAGE_REFERENCE: usize = 4096;

/// An image reference is resolved by the front end (lockbox-image): here only what no
/// reference can hold is refused, so that a bad one fails with its field named before any
/// lookup.
fn validate_image_reference(reference: &str) -> Result<(), PolicyError> {
    let reason = if reference.is_empty() {
        Some("is empty".to_owned())
    } else if reference.len() > MAX_IMAGE_REFERENCE {
        Some(format!("is longer than {MAX_IMAGE_REFERENCE} bytes"))
    } else if reference
        .chars()
        .any(|c| c.is_whitespace() || c.is_control())
    {
        Some(format!(
            "{reference:?} holds whitespace or a control character"
        ))
    } else {
        None
    };
    match reason {
        Some(reason) => Err(PolicyError::Invalid {
            field: "image",
            reason,
        }),
        None => Ok(()),
    }
}

fn validate_hostname(name: &str) -> Result<(), PolicyError> {
    // RFC 1123 labels; the kernel limit is 64 bytes (__NEW_UTS_LEN).
    let ok = !name.is_empty()
        && name.len() <= 64
        && name.split('.').all(|label| {
            !label.is_empty()
                && !label.starts_with('-')
                && !label.ends_with('-')
                && label
                    .bytes()
                    .all(|b| b.is_ascii_alphanumeric() || b == b'-')
        });
    if ok {
        Ok(())
    } else {
        Err(PolicyError::Invalid {
            field: "hostname",
            reason: format!(
                "{name:?} is not a valid hostname (letters, digits, '-', '.'; at most 64 bytes)"
            ),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_deny_list_refuses_wildcards_by_name() {
        let policy = Policy {
            net: Net::Deny(vec![NetSpec::parse("*.example.org:443").unwrap()]),
            ..Policy::default()
        };
        let err = policy.validate().unwrap_err();
        assert!(err.to_string().contains("*.example.org:443"), "{err}");
        assert!(err.to_string().contains("--net-allow only"), "{err}");
    }

    #[test]
    fn default_policy_is_valid_and_has_no_network() {
        let p = Policy::default();
        p.validate().unwrap();
        assert_eq!(p.net, Net::None);
        assert!(p.fs.default_reads);
    }

    #[test]
    fn a_profile_survives_its_own_serialisation() {
        // Found by fuzz/fuzz_targets/policy_toml.rs: a long duration read through f64 came
        // back different once the policy was written out and read again.
        let text = "timeout = \"30s\"\nkill_grace = \"00000002001229505426ms\"\nhostname = \"job\"\n[fs]\nread = [\"/_KEY\"]\n";
        let policy = Policy::from_toml(text).unwrap();
        let again = toml::to_string(&policy).unwrap();
        assert_eq!(Policy::from_toml(&again).unwrap(), policy, "{again}");
    }

    #[test]
    fn toml_profile_parses_all_sections() {
        let p = Policy::from_toml(
            r#"
            timeout = "10s"
            kill_grace = "500ms"
            hostname = "box"
            net = "host"
            [fs]
            read = ["/opt"]
            write = ["/tmp/x"]
            default_reads = false
            [limits]
            memory = "64M"
            processes = 32
            cpu_time = "3s"
            [env]
            set = { FOO = "bar" }
            pass = ["USER"]
            clean = true
            "#,
        )
        .unwrap();
        assert_eq!(p.timeout, Some(Duration::from_secs(10)));
        assert_eq!(p.kill_grace, Duration::from_millis(500));
        assert_eq!(p.limits.memory, Some(ByteSize(64 << 20)));
        assert_eq!(p.limits.cpu_time, Some(Duration::from_secs(3)));
        assert_eq!(p.fs.write, vec![PathBuf::from("/tmp/x")]);
        assert!(!p.fs.default_reads);
        assert_eq!(p.net, Net::Host);
        assert_eq!(p.env.set.get("FOO").map(String::as_str), Some("bar"));
    }

    #[test]
    fn toml_profile_rejects_unknown_field_and_names_it() {
        let err = Policy::from_toml("timout = \"1s\"").unwrap_err();
        assert!(err.to_string().contains("timout"), "{err}");
    }

    #[test]
    fn relative_grant_is_rejected_with_its_path() {
        let mut p = Policy::default();
        p.fs.read.push("relative/dir".into());
        let err = p.validate().unwrap_err();
        assert!(err.to_string().contains("relative/dir"), "{err}");
    }

    #[test]
    fn bad_hostnames_are_rejected() {
        for name in ["", "-x", "a..b", "has space", &"a".repeat(65)] {
            let p = Policy {
                hostname: name.to_owned(),
                ..Policy::default()
            };
            assert!(p.validate().is_err(), "{name:?} accepted");
        }
    }

    #[test]
    fn stdio_cannot_be_passed_explicitly() {
        let p = Policy {
            pass_fds: vec![1],
            ..Policy::default()
        };
        assert!(p.validate().is_err());
    }

    #[test]
    fn an_image_reference_survives_toml_and_json_and_bad_ones_name_the_field() {
        let p = Policy::from_toml("image = \"docker.io/library/debian:12\"\n").unwrap();
        assert_eq!(p.image.as_deref(), Some("docker.io/library/debian:12"));
        let again = toml::to_string(&p).unwrap();
        assert_eq!(Policy::from_toml(&again).unwrap(), p, "{again}");
        let json = serde_json::to_string(&p).unwrap();
        assert_eq!(serde_json::from_str::<Policy>(&json).unwrap(), p);
        // Left out of a policy without one, so older readers see no new field.
        assert!(!toml::to_string(&Policy::default())
            .unwrap()
            .contains("image"));
        for bad in ["", "debian 12", "a\nb"] {
            let p = Policy {
                image: Some(bad.to_owned()),
                ..Policy::default()
            };
            let err = p.validate().unwrap_err().to_string();
            assert!(err.contains("image"), "{bad:?}: {err}");
        }
    }

    proptest::proptest! {
        #[test]
        fn policy_round_trips_through_json_and_toml(
            mem in proptest::option::of(1u64..1 << 40),
            procs in proptest::option::of(1u64..100_000),
            timeout_ms in proptest::option::of(1u64..10_000_000),
            reads in proptest::collection::vec("/[a-z]{1,8}(/[a-z0-9]{1,8}){0,3}", 0..4),
        ) {
            let mut p = Policy::default();
            p.limits.memory = mem.map(ByteSize);
            p.limits.processes = procs;
            p.timeout = timeout_ms.map(Duration::from_millis);
            p.fs.read = reads.into_iter().map(PathBuf::from).collect();
            let json = serde_json::to_string(&p).unwrap();
            let back: Policy = serde_json::from_str(&json).unwrap();
            proptest::prop_assert_eq!(&back, &p);
            let toml_text = toml::to_string(&p).unwrap();
            let back = Policy::from_toml(&toml_text).unwrap();
            proptest::prop_assert_eq!(back, p);
        }
    }
}
