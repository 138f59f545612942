//! The operator's ceiling: the most a sandbox asked for by an agent may get (issue 32).
//!
//! An agent that reaches lockbox through MCP or a scoped token chooses its own policy; the
//! operator bounds it with a [`Ceiling`] (a TOML profile and flags of `lockbox mcp` /
//! `lockbox serve`). [`Ceiling::check`] is the one place a requested policy is compared with
//! it: a request beyond it is refused with a [`BeyondCeiling`] naming the field, what was
//! asked and what the ceiling allows, never silently narrowed. [`Ceiling::default`] grants no
//! host path beyond the default reads, no writable host path, no workdir and no network but
//! the sandbox's own loopback.
//!
//! Paths are compared in their canonical form (links and `..` resolved by the caller's
//! `resolve`, `std::fs::canonicalize` in the server), so a symlink inside an allowed root
//! that points out of it is out of it.

use crate::fs::{is_etc_secret, DEFAULT_READS, ETC_SECRETS};
use crate::net::Net;
use crate::units::opt_duration_serde;
use crate::{Limits, Policy, PolicyError};
use serde::{Deserialize, Serialize};
use std::fmt;
use std::path::{Component, Path, PathBuf};
use std::time::Duration;

/// A network form a ceiling may allow ([`Ceiling::net`]). `none` (the sandbox's own
/// loopback) is always allowed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum NetForm {
    /// Loopback only.
    None,
    /// An allow-list (`net: {"allow": [...]}`).
    Allow,
    /// A deny-list: the host's network but the listed destinations.
    Deny,
    /// The host's network, unchanged (its loopback included).
    Host,
}

impl NetForm {
    /// The form of a network policy.
    pub fn of(net: &Net) -> NetForm {
        match net {
            Net::None => NetForm::None,
            Net::Allow(_) => NetForm::Allow,
            Net::Deny(_) => NetForm::Deny,
            Net::Host => NetForm::Host,
        }
    }

    /// Its name as written in a profile and on the command line.
    pub fn as_str(self) -> &'static str {
        match self {
            NetForm::None => "none",
            NetForm::Allow => "allow",
            NetForm::Deny => "deny",
            NetForm::Host => "host",
        }
    }
}

impl std::str::FromStr for NetForm {
    type Err = String;
    fn from_str(s: &str) -> Result<NetForm, String> {
        match s {
            "none" => Ok(NetForm::None),
            "allow" => Ok(NetForm::Allow),
            "deny" => Ok(NetForm::Deny),
            "host" => Ok(NetForm::Host),
            other => Err(format!("{other:?} is not none, allow, deny or host")),
        }
    }
}

/// What an agent's request may get at most. Empty lists and `None` maxima are the default:
/// nothing beyond the default reads, no limit imposed.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct Ceiling {
    /// Host roots a request may make readable (`fs_readable`), at or below. Paths under
    /// `/usr`, `/bin`, `/sbin`, `/lib`, `/lib64`, and under `/etc` where no secret lies, are
    /// readable without being listed (the default reads show them anyway).
    #[serde(with = "crate::name::json::vec")]
    pub read: Vec<PathBuf>,
    /// Host roots a request may make writable (`fs_writable`), at or below; also readable.
    #[serde(with = "crate::name::json::vec")]
    pub write: Vec<PathBuf>,
    /// Host roots a request's `workdir` (a copy-on-write view, committed back on request)
    /// may lie at or below.
    #[serde(with = "crate::name::json::vec")]
    pub workdirs: Vec<PathBuf>,
    /// Network forms allowed besides `none`.
    pub net: Vec<NetForm>,
    /// Credentials (`lockbox serve --credential NAME=...`) a request's `http_auth` may name.
    pub credentials: Vec<String>,
    /// Maxima of the resource limits; a request that leaves a bounded one out gets the
    /// maximum ([`Ceiling::fill_limits`]).
    pub limits: Limits,
    /// The longest sandbox lifetime (`timeout_ms`); a request without one gets it.
    #[serde(with = "opt_duration_serde", skip_serializing_if = "Option::is_none")]
    pub timeout: Option<Duration>,
    /// Running sandboxes one agent may hold at once (its creations and forks); `None`: only
    /// the server's own `--max-sandboxes` bounds them.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub sandboxes: Option<usize>,
    /// Images a request may run on (`image`): each a reference as the image store names it
    /// (`docker.io/library/busybox:1.36`, `oci:/srv/images/app:v1`), or a prefix of one
    /// ending in `*` (`docker.io/library/*`, `oci:/srv/images/*`). Empty (the default): no
    /// image. The server compares the request's reference in its normalised form
    /// (`busybox` is `docker.io/library/busybox:latest`).
    pub images: Vec<String>,
}

/// A request beyond the ceiling: the field (as the policy names it), what was asked, and
/// what the ceiling allows.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{field}: {requested} is beyond the operator's ceiling ({ceiling})")]
pub struct BeyondCeiling {
    /// The policy field (`fs.read`, `net`, `limits.memory`, `workdir`, ...).
    pub field: &'static str,
    /// What the request asked for.
    pub requested: String,
    /// What the ceiling allows for that field.
    pub ceiling: String,
}

impl Ceiling {
    /// Parses a TOML ceiling profile (the fields of [`Ceiling`]).
    pub fn from_toml(text: &str) -> Result<Ceiling, PolicyError> {
        let ceiling: Ceiling = toml::from_str(text).map_err(|e| PolicyError::Profile {
            message: e.message().to_owned(),
            span: e.span().map(|s| (s.start, s.end)),
        })?;
        ceiling.validate()?;
        Ok(ceiling)
    }

    /// Checks the roots (absolute, not `/`) and the maxima.
    pub fn validate(&self) -> Result<(), PolicyError> {
        let lists = [
            ("ceiling.read", &self.read),
            ("ceiling.write", &self.write),
            ("ceiling.workdirs", &self.workdirs),
        ];
        for (field, roots) in lists {
            for root in roots {
                if !root.is_absolute() {
                    return Err(PolicyError::RelativePath {
                        field,
                        path: root.clone(),
                    });
                }
            }
        }
        self.limits.validate()?;
        if self.timeout == Some(Duration::ZERO) {
            return Err(PolicyError::Invalid {
                field: "ceiling.timeout",
                reason: "must be greater than zero".into(),
            });
        }
        Ok(())
    }

    /// Adds `other`'s roots, forms and credentials (flags on top of a profile); a maximum
    /// of `other` replaces this one's.
    pub fn widen(&mut self, other: Ceiling) {
        self.read.extend(other.read);
        self.write.extend(other.write);
        self.workdirs.extend(other.workdirs);
        self.net.extend(other.net);
        self.credentials.extend(other.credentials);
        self.images.extend(other.images);
        self.limits = other.limits.or(&self.limits);
        self.timeout = other.timeout.or(self.timeout);
        self.sandboxes = other.sandboxes.or(self.sandboxes);
    }

    /// Gives each limit the request left out the ceiling's maximum (a missing value means
    /// "the default", and under a ceiling the default is its bound).
    pub fn fill_limits(&self, policy: &mut Policy) {
        policy.limits = std::mem::take(&mut policy.limits).or(&self.limits);
        policy.timeout = policy.timeout.or(self.timeout);
    }

    /// Whether `policy` (with the copy-on-write view of `workdir`, if any) is within the
    /// ceiling; the first field beyond it otherwise. `resolve` gives a path's canonical form
    /// (`std::fs::canonicalize`); a requested path it cannot resolve is refused, since what
    /// it would name cannot be checked.
    pub fn check(
        &self,
        policy: &Policy,
        workdir: Option<&Path>,
        resolve: &dyn Fn(&Path) -> std::io::Result<PathBuf>,
    ) -> Result<(), BeyondCeiling> {
        let roots = |list: &[PathBuf]| -> Vec<PathBuf> {
            list.iter()
                .map(|r| resolve(r).unwrap_or_else(|_| r.clone()))
                .collect()
        };
        let readable: Vec<PathBuf> = roots(&self.read)
            .into_iter()
            .chain(roots(&self.write))
            .collect();
        let writable = roots(&self.write);
        let workdirs = roots(&self.workdirs);
        for path in &policy.fs.read {
            let real = resolved("fs.read", path, resolve)?;
            let system = || system_read(&real, resolve);
            if !within(&real, &readable) && !system() {
                return Err(beyond(
                    "fs.read",
                    path,
                    &real,
                    &self.read_roots(),
                    "readable roots",
                ));
            }
        }
        for path in &policy.fs.write {
            let real = resolved("fs.write", path, resolve)?;
            if !within(&real, &writable) {
                return Err(beyond(
                    "fs.write",
                    path,
                    &real,
                    &self.write,
                    "writable roots",
                ));
            }
        }
        if let Some(workdir) = workdir {
            let real = resolved("workdir", workdir, resolve)?;
            if !within(&real, &workdirs) {
                return Err(beyond(
                    "workdir",
                    workdir,
                    &real,
                    &self.workdirs,
                    "workdir roots",
                ));
            }
        }
        // Views of host directories other than the workdir's come from no front end an
        // agent reaches; one in a request is beyond any ceiling rather than checked loosely.
        if let Some(overlay) = policy.fs.overlays.first() {
            return Err(BeyondCeiling {
                field: "fs.overlays",
                requested: format!("a view of {}", overlay.target.display()),
                ceiling: "no copy-on-write views but the workdir's".into(),
            });
        }
        if !policy.pass_fds.is_empty() {
            return Err(BeyondCeiling {
                field: "pass_fds",
                requested: format!("{:?}", policy.pass_fds),
                ceiling: "no descriptors of the server".into(),
            });
        }
        if let Some(image) = &policy.image {
            self.check_image(image)?;
        }
        let form = NetForm::of(&policy.net);
        if form != NetForm::None && !self.net.contains(&form) {
            let mut allowed = vec!["none"];
            allowed.extend(self.net.iter().map(|f| f.as_str()));
            return Err(BeyondCeiling {
                field: "net",
                requested: form.as_str().to_owned(),
                ceiling: format!("network forms allowed: {}", allowed.join(", ")),
            });
        }
        self.check_limits(policy)
    }

    /// Whether a request may run on the image `reference` (normalised by the caller: the
    /// name the image store gives it).
    pub fn check_image(&self, reference: &str) -> Result<(), BeyondCeiling> {
        // A local source's path with `.` or `..` in it could leave an allowed directory
        // while its text starts with it: refused, whatever the patterns.
        let local = ["oci:", "oci-archive:", "docker-archive:"]
            .iter()
            .find_map(|p| reference.strip_prefix(p));
        let dotted = local.is_some_and(|path| {
            path.split(['/', ':'])
                .any(|part| part == ".." || part == ".")
        });
        let allowed = !dotted
            && self
                .images
                .iter()
                .any(|pattern| match pattern.strip_suffix('*') {
                    Some(prefix) => reference.starts_with(prefix),
                    None => reference == pattern,
                });
        if allowed {
            return Ok(());
        }
        Err(BeyondCeiling {
            field: "image",
            requested: format!("image {reference:?}"),
            ceiling: format!("images allowed: {}", list(&self.images)),
        })
    }

    /// Whether an agent holding `running` sandboxes may make `more`.
    pub fn check_sandboxes(&self, running: usize, more: usize) -> Result<(), BeyondCeiling> {
        match self.sandboxes {
            Some(max) if running.saturating_add(more) > max => Err(BeyondCeiling {
                field: "sandboxes",
                requested: format!("{more} more sandbox(es) with {running} running"),
                ceiling: format!("at most {max} running sandboxes"),
            }),
            _ => Ok(()),
        }
    }

    /// Whether the credential `name` may be named by a request's `http_auth`.
    pub fn check_credential(&self, name: &str) -> Result<(), BeyondCeiling> {
        if self.credentials.iter().any(|c| c == name) {
            return Ok(());
        }
        Err(BeyondCeiling {
            field: "http_auth",
            requested: format!("credential {name:?}"),
            ceiling: format!("credentials allowed: {}", list(&self.credentials)),
        })
    }

    fn read_roots(&self) -> Vec<PathBuf> {
        self.read.iter().chain(&self.write).cloned().collect()
    }

    fn check_limits(&self, policy: &Policy) -> Result<(), BeyondCeiling> {
        fn cap<T: PartialOrd + Copy>(
            field: &'static str,
            asked: Option<T>,
            max: Option<T>,
            show: impl Fn(T) -> String,
        ) -> Result<(), BeyondCeiling> {
            let Some(max) = max else { return Ok(()) };
            match asked {
                Some(asked) if asked <= max => Ok(()),
                asked => Err(BeyondCeiling {
                    field,
                    requested: asked.map_or_else(|| "no limit".into(), &show),
                    ceiling: format!("at most {}", show(max)),
                }),
            }
        }
        let (p, c) = (&policy.limits, &self.limits);
        let bytes = |b: crate::ByteSize| format!("{} bytes", b.bytes());
        let count = |n: u64| n.to_string();
        let time = |d: Duration| format!("{} ms", d.as_millis());
        cap("limits.memory", p.memory, c.memory, bytes)?;
        cap("limits.processes", p.processes, c.processes, count)?;
        cap("limits.cpu_time", p.cpu_time, c.cpu_time, time)?;
        cap("limits.open_files", p.open_files, c.open_files, count)?;
        cap("limits.file_size", p.file_size, c.file_size, bytes)?;
        cap("limits.inodes", p.inodes, c.inodes, count)?;
        cap("timeout", policy.timeout, self.timeout, time)
    }
}

/// `path` resolved, or the refusal that says it could not be.
fn resolved(
    field: &'static str,
    path: &Path,
    resolve: &dyn Fn(&Path) -> std::io::Result<PathBuf>,
) -> Result<PathBuf, BeyondCeiling> {
    resolve(path).map_err(|e| BeyondCeiling {
        field,
        requested: path.display().to_string(),
        ceiling: format!(
            "a path is checked in its resolved form, and this one cannot be resolved: {e}"
        ),
    })
}

/// Whether `real` lies at or below one of `roots` (all canonical), component-wise.
fn within(real: &Path, roots: &[PathBuf]) -> bool {
    let clean = !real.components().any(|c| matches!(c, Component::ParentDir));
    clean && roots.iter().any(|root| real.starts_with(root))
}

/// Whether `real` is something the default reads show anyway: under a system directory, or
/// under `/etc` with no secret at or below it.
fn system_read(real: &Path, resolve: &dyn Fn(&Path) -> std::io::Result<PathBuf>) -> bool {
    DEFAULT_READS.iter().any(|read| {
        let root = resolve(Path::new(read)).unwrap_or_else(|_| PathBuf::from(read));
        let Ok(rel) = real.strip_prefix(&root) else {
            return false;
        };
        *read != "/etc" || etc_subtree_has_no_secret(rel)
    })
}

/// Whether `rel` (relative to `/etc`) neither is a secret nor holds one below it.
fn etc_subtree_has_no_secret(rel: &Path) -> bool {
    if is_etc_secret(rel) {
        return false;
    }
    let parts: Vec<String> = rel
        .components()
        .map(|c| c.as_os_str().to_string_lossy().into_owned())
        .collect();
    !ETC_SECRETS.iter().any(|secret| {
        let pattern: Vec<&str> = secret.split('/').collect();
        // A secret lies below `rel` when `rel` is a proper prefix of its pattern.
        parts.len() < pattern.len() && parts.iter().zip(&pattern).all(|(got, want)| got == want)
    })
}

fn beyond(
    field: &'static str,
    asked: &Path,
    real: &Path,
    roots: &[PathBuf],
    what: &str,
) -> BeyondCeiling {
    let requested = if asked == real {
        asked.display().to_string()
    } else {
        format!("{} (resolved: {})", asked.display(), real.display())
    };
    let roots: Vec<String> = roots.iter().map(|r| r.display().to_string()).collect();
    BeyondCeiling {
        field,
        requested,
        ceiling: format!("{what}: {}", list(&roots)),
    }
}

fn list(items: &[String]) -> String {
    if items.is_empty() {
        "none".into()
    } else {
        items.join(", ")
    }
}

impl fmt::Display for Ceiling {
    /// One line for people: what the ceiling allows.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let paths = |l: &[PathBuf]| {
            list(
                &l.iter()
                    .map(|p| p.display().to_string())
                    .collect::<Vec<_>>(),
            )
        };
        let net: Vec<String> = self.net.iter().map(|n| n.as_str().to_owned()).collect();
        write!(
            f,
            "read: {}; write: {}; workdirs: {}; net: none{}{}{}",
            paths(&self.read),
            paths(&self.write),
            paths(&self.workdirs),
            if net.is_empty() { "" } else { ", " },
            net.join(", "),
            if self.images.is_empty() {
                String::new()
            } else {
                format!("; images: {}", self.images.join(", "))
            }
        )
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    #[test]
    fn images_are_refused_unless_the_ceiling_lists_them_or_a_prefix_of_them() {
        let none = super::Ceiling::default();
        let e = none
            .check_image("docker.io/library/busybox:latest")
            .unwrap_err();
        assert_eq!(e.field, "image");
        assert!(e.to_string().contains("images allowed: none"), "{e}");
        let c = super::Ceiling {
            images: vec![
                "docker.io/library/*".into(),
                "oci:/srv/images/*".into(),
                "ghcr.io/org/app:1".into(),
            ],
            ..super::Ceiling::default()
        };
        assert!(c.check_image("docker.io/library/busybox:1.36").is_ok());
        assert!(c.check_image("oci:/srv/images/app:v1").is_ok());
        assert!(c.check_image("ghcr.io/org/app:1").is_ok());
        assert!(c.check_image("ghcr.io/org/app:2").is_err());
        assert!(c.check_image("docker.io/someone/tool:v2").is_err());
        assert!(c
            .check_image("oci:/srv/images/../../home/me/lay:v1")
            .is_err());
        assert!(c.check_image("oci:/srv/other:v1").is_err());
        let p = crate::Policy {
            image: Some("docker.io/someone/tool:v2".into()),
            ..crate::Policy::default()
        };
        let e = c.check(&p, None, &|p| Ok(p.to_owned())).unwrap_err();
        assert_eq!(e.field, "image");
    }
    use super::*;
    use crate::ByteSize;

    /// Canonical form of a fake host: `/data/link` points at `/etc`, `/w/up` is `/w/..`.
    fn fake(path: &Path) -> std::io::Result<PathBuf> {
        let text = path.to_string_lossy();
        if text.contains("missing") {
            return Err(std::io::Error::from(std::io::ErrorKind::NotFound));
        }
        let text = text.replace("/data/link", "/etc").replace("/w/up", "/");
        let mut out = PathBuf::from("/");
        for c in Path::new(&text).components() {
            match c {
                Component::ParentDir => {
                    out.pop();
                }
                Component::Normal(n) => out.push(n),
                _ => {}
            }
        }
        Ok(out)
    }

    fn repro() -> Policy {
        let mut p = Policy::default();
        p.fs.default_reads = false;
        p.fs.read = ["/etc", "/usr", "/lib", "/lib64", "/bin", "/root"]
            .map(PathBuf::from)
            .to_vec();
        p.fs.write = vec!["/tmp/x/hostwrite".into()];
        p.net = Net::Host;
        p
    }

    #[test]
    fn issue_32_the_default_ceiling_refuses_the_reproduction_naming_each_field() {
        let c = Ceiling::default();
        let mut p = repro();
        let e = c.check(&p, None, &fake).unwrap_err();
        assert_eq!(e.field, "fs.read");
        assert!(e.to_string().contains("/etc"), "{e}");
        assert!(e.to_string().contains("readable roots: none"), "{e}");
        p.fs.read = vec!["/usr".into(), "/lib".into(), "/etc/ssl/certs".into()];
        let e = c.check(&p, None, &fake).unwrap_err();
        assert_eq!(e.field, "fs.write");
        p.fs.write.clear();
        let e = c.check(&p, None, &fake).unwrap_err();
        assert_eq!(e.field, "net");
        assert!(e.to_string().starts_with("net: host is beyond"), "{e}");
        assert!(e.to_string().contains("allowed: none"), "{e}");
        p.net = Net::None;
        c.check(&p, None, &fake).unwrap();
        let e = c
            .check(&p, Some(Path::new("/home/me/repo")), &fake)
            .unwrap_err();
        assert_eq!(e.field, "workdir");
    }

    #[test]
    fn paths_are_compared_resolved_so_links_and_dotdot_cannot_climb_out() {
        let c = Ceiling {
            read: vec!["/data".into()],
            write: vec!["/w".into()],
            workdirs: vec!["/w".into()],
            ..Ceiling::default()
        };
        let mut p = Policy::default();
        p.fs.read = vec!["/data/ok".into(), "/w/sub".into()];
        p.fs.write = vec!["/w/out".into()];
        c.check(&p, Some(Path::new("/w/repo")), &fake).unwrap();
        for bad in ["/data/link/shadow", "/data/../etc", "/datax"] {
            p.fs.read = vec![bad.into()];
            let e = c.check(&p, None, &fake).unwrap_err();
            assert_eq!(e.field, "fs.read", "{bad}");
        }
        p.fs.read.clear();
        let e = c
            .check(&p, Some(Path::new("/w/up/etc")), &fake)
            .unwrap_err();
        assert!(e.to_string().contains("resolved: /etc"), "{e}");
        let e = c
            .check(&p, Some(Path::new("/w/missing")), &fake)
            .unwrap_err();
        assert!(e.to_string().contains("cannot be resolved"), "{e}");
    }

    #[test]
    fn system_reads_pass_but_not_a_part_of_etc_holding_secrets() {
        let c = Ceiling::default();
        let mut p = Policy::default();
        for ok in ["/usr/share", "/etc/ssl/certs", "/etc/hosts", "/lib64"] {
            p.fs.read = vec![ok.into()];
            c.check(&p, None, &fake).unwrap();
        }
        for bad in [
            "/etc",
            "/etc/ssh",
            "/etc/ssl",
            "/etc/shadow",
            "/etc/ssl/private/k",
        ] {
            p.fs.read = vec![bad.into()];
            assert!(c.check(&p, None, &fake).is_err(), "{bad} accepted");
        }
    }

    #[test]
    fn limits_beyond_the_maxima_are_refused_and_missing_ones_get_them() {
        let c = Ceiling::from_toml(
            "net = [\"allow\"]\ntimeout = \"1h\"\n[limits]\nmemory = \"1G\"\nprocesses = 64\n",
        )
        .unwrap();
        let mut p = Policy::default();
        let e = c.check(&p, None, &fake).unwrap_err();
        assert_eq!(
            (e.field, e.requested.as_str()),
            ("limits.memory", "no limit")
        );
        c.fill_limits(&mut p);
        assert_eq!(p.limits.memory, Some(ByteSize(1 << 30)));
        assert_eq!(p.timeout, Some(Duration::from_secs(3600)));
        c.check(&p, None, &fake).unwrap();
        p.limits.processes = Some(65);
        let e = c.check(&p, None, &fake).unwrap_err();
        assert_eq!(e.field, "limits.processes");
        assert!(e.to_string().contains("at most 64"), "{e}");
        p.limits.processes = Some(10);
        p.net = Net::Allow(vec![]);
        c.check(&p, None, &fake).unwrap();
        p.net = Net::Deny(vec![]);
        assert_eq!(c.check(&p, None, &fake).unwrap_err().field, "net");
    }

    #[test]
    fn a_profile_names_unknown_fields_and_flags_widen_it() {
        let e = Ceiling::from_toml("reads = [\"/x\"]").unwrap_err();
        assert!(e.to_string().contains("reads"), "{e}");
        assert!(Ceiling::from_toml("read = [\"rel\"]").is_err());
        let mut c = Ceiling::from_toml("read = [\"/a\"]\n[limits]\nmemory = \"1G\"").unwrap();
        c.widen(Ceiling {
            read: vec!["/b".into()],
            net: vec![NetForm::Host],
            ..Ceiling::default()
        });
        assert_eq!(c.read, vec![PathBuf::from("/a"), PathBuf::from("/b")]);
        assert_eq!(c.limits.memory, Some(ByteSize(1 << 30)));
        assert_eq!(
            c.to_string(),
            "read: /a, /b; write: none; workdirs: none; net: none, host"
        );
        assert_eq!(c.check_credential("gh").unwrap_err().field, "http_auth");
        c.check_sandboxes(100, 5).unwrap();
        let c = Ceiling::from_toml("sandboxes = 2").unwrap();
        c.check_sandboxes(1, 1).unwrap();
        let e = c.check_sandboxes(1, 2).unwrap_err();
        assert_eq!(e.field, "sandboxes");
        assert!(e.to_string().contains("at most 2 running"), "{e}");
    }

    proptest::proptest! {
        /// Any path under an allowed root passes; any path with no allowed root above it
        /// (and not a system read) is refused, naming the field.
        #[test]
        fn within_passes_and_beyond_is_refused_naming_the_field(
            root in "/[a-z]{1,6}",
            rest in "(/[a-z]{1,6}){0,3}",
            other in "/[a-z]{1,6}(/[a-z]{1,6}){0,2}",
        ) {
            let reserved = |p: &str| DEFAULT_READS.iter().any(|r| Path::new(p).starts_with(r));
            proptest::prop_assume!(!reserved(&root) && !reserved(&other));
            proptest::prop_assume!(!Path::new(&other).starts_with(&root));
            // Not the paths `fake` resolves elsewhere (its stand-ins for symlinks: it
            // rewrites these strings wherever they are).
            let special = |p: &str| ["/w/up", "/data/link", "missing"].iter().any(|s| p.contains(s));
            proptest::prop_assume!(!special(&format!("{root}{rest}")) && !special(&other));
            let c = Ceiling { write: vec![root.clone().into()], ..Ceiling::default() };
            let mut p = Policy::default();
            p.fs.write = vec![format!("{root}{rest}").into()];
            p.fs.read = vec![format!("{root}{rest}").into()];
            proptest::prop_assert!(c.check(&p, None, &fake).is_ok());
            p.fs.write = vec![other.clone().into()];
            let e = c.check(&p, None, &fake).unwrap_err();
            proptest::prop_assert_eq!(e.field, "fs.write");
            p.fs.write.clear();
            p.fs.read = vec![other.into()];
            proptest::prop_assert_eq!(c.check(&p, None, &fake).unwrap_err().field, "fs.read");
        }
    }
}
