//! Turns a [`Policy`]'s paths into facts about this host: canonical paths, their kinds,
//! which `/etc` secrets exist. The only part of planning that reads the filesystem.

use crate::error::SetupError;
use lockbox_policy::{
    ListKind, Net, NetHost, NetRule, NetSpec, Policy, DEFAULT_READS, ETC_SECRETS,
};
use std::ffi::OsString;
use std::net::{IpAddr, ToSocketAddrs};
use std::os::fd::RawFd;
use std::os::unix::fs::{FileTypeExt, MetadataExt};
use std::path::{Path, PathBuf};

/// Read-only or read-write.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, serde::Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Access {
    /// Read and execute.
    ReadOnly,
    /// Everything.
    ReadWrite,
}

/// A host path made visible at the same path inside the sandbox.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Grant {
    /// Canonical host path (also the path inside).
    pub path: PathBuf,
    /// Directory or not.
    pub is_dir: bool,
    /// How it is visible.
    pub access: Access,
}

/// The host facts a plan is built from.
#[derive(Debug, Clone, Default)]
pub struct Resolved {
    /// Bind grants, deduplicated (read-write wins), in no particular order.
    pub grants: Vec<Grant>,
    /// Symlinks to recreate inside (e.g. `/bin -> usr/bin` on merged-/usr systems).
    pub symlinks: Vec<(PathBuf, OsString)>,
    /// `/etc` shown through an overlay that hides these entries (relative to /etc).
    pub etc_hidden: Option<Vec<PathBuf>>,
    /// Extra files to show in the overlaid `/etc` (name, contents).
    pub etc_files: Vec<(String, Vec<u8>)>,
    /// Devices of the host bound into the minimal /dev.
    pub devices: Vec<&'static str>,
    /// Copy-on-write views, with canonical layer paths.
    pub overlays: Vec<ResolvedOverlay>,
    /// Working directory inside.
    pub cwd: PathBuf,
    /// Size bound of the sandbox's own tmpfs mounts (`/tmp`, `/dev/shm`): `--max-memory`,
    /// since their files are memory that `RLIMIT_AS` does not count.
    pub scratch_size: Option<u64>,
    /// Inode bound of the same mounts (`nr_inodes`): [`lockbox_policy::Limits::tmpfs_inodes`].
    /// Without it every empty file, directory or symlink would pin unreclaimable kernel
    /// memory that nothing else counts.
    pub scratch_inodes: u64,
    /// Most pseudo-terminals the sandbox's devpts instance may hold (its `max=`), see
    /// `pty_share`.
    pub ptys: u64,
    /// Hostnames of a deny-list, resolved once and pinned (shown in `/etc/hosts`).
    pub net_pins: Vec<(String, Vec<IpAddr>)>,
    /// The specs of an allow-list that name hosts (`example.org:443`, `*.example.org:*`):
    /// resolved by lockbox's resolver when the sandbox asks, see [`lockbox_netsup::DNS_ADDR`].
    pub net_names: Vec<NetSpec>,
    /// A hosts(5) file lockbox's resolver reads before the host's resolver, named by the
    /// environment variable `LOCKBOX_NET_HOSTS_FILE` (a hook for tests).
    pub net_hosts_file: Option<PathBuf>,
    /// The network list with hosts resolved, for `--net-allow` / `--net-deny`.
    pub net_rules: Option<(ListKind, Vec<NetRule>)>,
    /// A host executable bound at [`crate::AGENT_PATH`] (the runtime's agent).
    pub helper: Option<PathBuf>,
    /// The helper's loader and libraries, bound beside it (an image root's agent, see
    /// `crate::loader`).
    pub helper_loader: Option<crate::loader::AgentLoader>,
    /// The host path of the terminal on the sandbox's stdio, if any: bound at
    /// `TERMINAL_PATH`, see `terminal`.
    pub terminal: Option<PathBuf>,
    /// The root is an image's layers ([`crate::Spawn::image_root`]).
    pub image: Option<ResolvedImage>,
}

/// An [`ImageRoot`] checked against the host.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ResolvedImage {
    /// Canonical layer directories, top first.
    pub layers: Vec<PathBuf>,
    /// Where the root's writes go on the host ([`ImageRoot::upper`]); `None`: a tmpfs of
    /// the sandbox's own.
    pub upper: Option<ResolvedUpper>,
}

/// The root of an image sandbox: the image's unpacked layer directories, in overlayfs
/// format (whiteouts are 0/0 character devices, opaque directories carry
/// `user.overlay.opaque=y`), top first, as absolute host paths. They are read-only lowers
/// of the sandbox's `/`: mounted, never copied or changed. See [`crate::Spawn::image_root`].
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct ImageRoot {
    /// Layer directories, top first.
    pub layers: Vec<PathBuf>,
    /// The uid and gid the caller is inside: its user namespace maps the caller's own ids
    /// (and no other) to these, so they are the only ids that exist inside and every file
    /// of the image (the caller's on the host) is theirs. 0 and 0 (root), unless the
    /// image's `User` names someone else: such a user is *presented* (`id`, `whoami`,
    /// programs that refuse to run as root), not enforced (the sandbox's files are all
    /// that user's, root's among them). See docs/security.md, "Image roots".
    pub ids: (u32, u32),
    /// Where the root's writes go. `None` (the default): a tmpfs of the sandbox's own,
    /// bounded like `/tmp`; they vanish with the sandbox. `Some`: these two empty
    /// directories on one host filesystem, which then hold them in the layers' own format
    /// (whiteouts, `user.overlay.opaque` directories): the next layer of an image build's
    /// `RUN`, or of a commit. Mounted `volatile`, as views are: the caller makes the layer
    /// durable (`syncfs`) before it keeps it.
    pub upper: Option<RootUpper>,
}

/// The writable layer of an [`ImageRoot`] kept on the host ([`ImageRoot::upper`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RootUpper {
    /// Receives every write.
    pub upper: PathBuf,
    /// overlayfs's scratch directory, a sibling of `upper`.
    pub work: PathBuf,
}

impl ImageRoot {
    /// A root of `layers` (top first) in which the caller is root and whose writes vanish
    /// with the sandbox.
    pub fn new(layers: Vec<PathBuf>) -> ImageRoot {
        ImageRoot {
            layers,
            ids: (0, 0),
            upper: None,
        }
    }
}

/// The most layers an image root may have. overlayfs takes up to 500 lower layers, but its
/// mount options must fit in one page (4096 bytes), which lockbox's short layer paths keep
/// to about 800; Docker's overlay2 driver stops at 128 too.
pub const MAX_IMAGE_LAYERS: usize = 128;

/// The image root's layers, canonical and checked to be directories, or the first bad one
/// named.
fn resolve_image(image: &ImageRoot) -> Result<ResolvedImage, SetupError> {
    if image.ids.0 == u32::MAX || image.ids.1 == u32::MAX {
        return Err(SetupError::Policy(lockbox_policy::PolicyError::Invalid {
            field: "image user",
            reason: "4294967295 is no uid or gid (it means \"none\" to the kernel)".into(),
        }));
    }
    if image.layers.is_empty() || image.layers.len() > MAX_IMAGE_LAYERS {
        return Err(SetupError::Policy(lockbox_policy::PolicyError::Invalid {
            field: "image layers",
            reason: format!(
                "an image root takes 1 to {MAX_IMAGE_LAYERS} layers (overlayfs's bound on a mount's options); this one has {}",
                image.layers.len()
            ),
        }));
    }
    let dir = |path: &Path, what| {
        let canonical = std::fs::canonicalize(path).map_err(|source| SetupError::Path {
            path: path.to_owned(),
            what,
            source,
        })?;
        if !canonical.is_dir() {
            return Err(SetupError::Path {
                path: path.to_owned(),
                what,
                source: std::io::Error::from_raw_os_error(libc::ENOTDIR),
            });
        }
        Ok(canonical)
    };
    let layers = image
        .layers
        .iter()
        .map(|layer| dir(layer, "using as an image layer"))
        .collect::<Result<_, _>>()?;
    let upper = match &image.upper {
        None => None,
        Some(u) => Some(resolve_upper(
            &dir(&u.upper, "using as the image root's upper layer")?,
            &dir(&u.work, "using as the image root's work directory")?,
        )?),
    };
    Ok(ResolvedImage { layers, upper })
}

/// The environment variable naming a hosts(5) file that lockbox's resolver consults before
/// the host's resolver (which has the host's `/etc/hosts` too): names made resolvable for
/// one run without touching the host's configuration. Read afresh for every query.
pub const HOSTS_FILE_VAR: &str = "LOCKBOX_NET_HOSTS_FILE";

/// Where the caller's terminal appears inside (runc and Docker use the same name).
pub const TERMINAL_PATH: &str = "/dev/console";

/// The host path of the first terminal among the sandbox's stdio (`-1`: the caller's own
/// descriptor of that number), checked as glibc's `ttyname(3)` does: the path's inode is the
/// descriptor's. The sandbox's private devpts has no name for a host pseudo-terminal, so
/// without a bind of it `tty` says "not a tty" and `ttyname()` fails with `ENODEV`. The
/// name grants nothing the descriptor does not: it is the same terminal, already open.
pub fn terminal(stdio: &[RawFd; 3]) -> Option<PathBuf> {
    stdio.iter().enumerate().find_map(|(i, &fd)| {
        let fd = if fd >= 0 { fd } else { i as RawFd };
        if !crate::sys::is_terminal(fd) {
            return None;
        }
        let link = format!("/proc/self/fd/{fd}");
        let open = std::fs::metadata(&link).ok()?;
        let path = std::fs::read_link(&link).ok()?;
        let named = std::fs::metadata(&path).ok()?;
        (path.is_absolute()
            && named.file_type().is_char_device()
            && named.dev() == open.dev()
            && named.ino() == open.ino())
        .then_some(path)
    })
}

/// An overlay of [`lockbox_policy::Overlay`] with canonical paths.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ResolvedOverlay {
    /// Path inside the sandbox.
    pub target: PathBuf,
    /// Lower layers, top first.
    pub lowers: Vec<PathBuf>,
    /// The writable layer, if any.
    pub upper: Option<ResolvedUpper>,
    /// `None`: the whole view is writable (with an upper). `Some`: only at or below these
    /// paths (inside `target`), see [`lockbox_policy::Overlay::writable`].
    pub writable: Option<Vec<PathBuf>>,
    /// Directories among (or above) `writable` that the view lacks, parents first: created
    /// in the upper layer before the Landlock rules are added.
    pub create: Vec<PathBuf>,
}

/// The upper and work directories of an overlay: siblings under `parent` (overlayfs needs
/// both on one mount, and lockbox attaches their parent).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ResolvedUpper {
    /// Canonical common parent.
    pub parent: PathBuf,
    /// File name of the upper directory.
    pub upper_name: String,
    /// File name of the work directory.
    pub work_name: String,
    /// A bounded upper: a tmpfs of this size, see `OverlayUpper::max_size`.
    pub bound: Option<TmpfsBound>,
    /// Permission bits of the upper directory (the overlay's root takes them).
    pub mode: u32,
}

/// The size of a bounded (tmpfs) upper layer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TmpfsBound {
    /// Bytes of data (`size`): `OverlayUpper::max_size`.
    pub bytes: u64,
    /// Inodes (`nr_inodes`): [`lockbox_policy::Limits::upper_inodes`] of `bytes`.
    pub inodes: u64,
}

/// Device nodes bound from the host into the sandbox's `/dev` (those that exist).
pub const DEVICES: [&str; 6] = ["null", "zero", "full", "random", "urandom", "tty"];

/// Resolves `policy` against the host. `caller_cwd` is the default working directory when
/// it is visible inside.
pub fn resolve(policy: &Policy, caller_cwd: Option<&Path>) -> Result<Resolved, SetupError> {
    resolve_with(policy, None, caller_cwd)
}

/// [`resolve`], for a root of `image`'s layers when given: then the default reads (the
/// host's userland) are left out, and the caller's directory is the working directory only
/// when a grant or view shows it.
pub fn resolve_with(
    policy: &Policy,
    image: Option<&ImageRoot>,
    caller_cwd: Option<&Path>,
) -> Result<Resolved, SetupError> {
    let mut out = Resolved::default();
    match image {
        Some(image) => out.image = Some(resolve_image(image)?),
        None if policy.image.is_some() => {
            return Err(SetupError::Policy(lockbox_policy::PolicyError::Invalid {
                field: "image",
                reason: "the image is not resolved to its layers (lockbox-confine takes them from Spawn::image_root)".into(),
            }))
        }
        None => {}
    }
    let mut add = |grant: Grant| {
        if let Some(existing) = out.grants.iter_mut().find(|g| g.path == grant.path) {
            existing.access = existing.access.max(grant.access);
        } else {
            out.grants.push(grant);
        }
    };
    let explicit_etc = policy
        .fs
        .read
        .iter()
        .chain(&policy.fs.write)
        .any(|p| p == Path::new("/etc"));
    if policy.fs.default_reads && out.image.is_none() {
        for path in DEFAULT_READS {
            let path = Path::new(path);
            let Ok(meta) = std::fs::symlink_metadata(path) else {
                continue; // e.g. no /lib64 on this architecture
            };
            if meta.file_type().is_symlink() {
                let target = std::fs::read_link(path).map_err(|e| SetupError::Path {
                    path: path.to_owned(),
                    what: "reading symlink",
                    source: e,
                })?;
                out.symlinks
                    .push((path.to_owned(), target.into_os_string()));
                if let Ok(canonical) = std::fs::canonicalize(path) {
                    add(Grant {
                        path: canonical,
                        is_dir: true,
                        access: Access::ReadOnly,
                    });
                }
            } else if path == Path::new("/etc") && !explicit_etc {
                out.etc_hidden = Some(etc_secrets_present(path));
            } else {
                add(Grant {
                    path: path.to_owned(),
                    is_dir: meta.is_dir(),
                    access: Access::ReadOnly,
                });
            }
        }
    }
    for (paths, access) in [
        (&policy.fs.read, Access::ReadOnly),
        (&policy.fs.write, Access::ReadWrite),
    ] {
        for path in paths {
            add(resolve_grant(path, access, &mut out.symlinks)?);
        }
    }
    out.overlays = resolve_overlays(&policy.fs.overlays, &policy.limits)?;
    out.devices = DEVICES
        .into_iter()
        .filter(|d| Path::new("/dev").join(d).exists())
        .collect();
    out.scratch_size = policy.limits.memory.map(|m| m.bytes());
    out.scratch_inodes = policy.limits.tmpfs_inodes();
    out.ptys = pty_share(Path::new("/proc/sys/kernel/pty"));
    out.net_pins = pin_names(&policy.net)?;
    out.net_rules = match &policy.net {
        Net::Allow(specs) => Some((ListKind::Allow, list_rules(ListKind::Allow, specs, &[]))),
        Net::Deny(specs) => Some((
            ListKind::Deny,
            list_rules(ListKind::Deny, specs, &out.net_pins),
        )),
        Net::None | Net::Host => None,
    };
    if let Net::Allow(specs) = &policy.net {
        out.net_names = specs
            .iter()
            .filter(|s| !matches!(s.host, NetHost::Block(_)))
            .cloned()
            .collect();
        out.net_hosts_file = std::env::var_os(HOSTS_FILE_VAR)
            .filter(|v| !v.is_empty())
            .map(PathBuf::from);
    }
    out.etc_files = etc_files(policy, &out.net_pins);
    if let Some(image) = &out.image {
        if image_has_dir(&image.layers, Path::new(APT_CONF_D)) {
            out.etc_files
                .push((APT_SANDBOX_FILE.to_owned(), APT_SANDBOX_CONF.to_vec()));
        }
    }
    out.cwd = match &policy.cwd {
        Some(cwd) => cwd.clone(),
        None => caller_cwd
            .filter(|cwd| visible_inside(&out, cwd))
            .map_or_else(|| PathBuf::from("/"), Path::to_owned),
    };
    // A working directory given through a symlink (`--workdir /tmp/link/w` with
    // `/tmp/link -> /data`) keeps that name inside. (In an image root, a directory of the
    // image is no host path.)
    let from_host = out.grants.iter().any(|g| out.cwd.starts_with(&g.path))
        || out.overlays.iter().any(|o| out.cwd.starts_with(&o.target));
    if out.image.is_none() || from_host {
        let cwd_links = links_on_the_way(&out.cwd);
        out.symlinks.extend(cwd_links);
    }
    keep_links_outside_views(&mut out);
    Ok(out)
}

/// Drops recreated symlinks that lie in something shown whole from the host (a grant, a
/// view, `/etc`, `/dev`, `/proc`): they are there already, and nothing may be created in
/// a host directory.
fn keep_links_outside_views(out: &mut Resolved) {
    let shown: Vec<PathBuf> = out
        .grants
        .iter()
        .map(|g| g.path.clone())
        .chain(out.overlays.iter().map(|o| o.target.clone()))
        .chain(["/etc", "/dev", "/proc"].map(PathBuf::from))
        .collect();
    out.symlinks
        .retain(|(link, _)| !shown.iter().any(|dir| link.starts_with(dir)));
    let mut seen = std::collections::HashSet::new();
    out.symlinks.retain(|(link, _)| seen.insert(link.clone()));
}

/// The sandbox's share of the pseudo-terminals every devpts instance but the host's
/// initial one draws from (`kernel.pty.max` minus `kernel.pty.reserve`, 4096 - 1024 by
/// default): a quarter ([`crate::SHARE_DIVISOR`]), so that one sandbox cannot leave the
/// others, or the host's containers, without any. Read from `dir` (`/proc/sys/kernel/pty`);
/// the kernel's defaults when it cannot be read.
pub fn pty_share(dir: &Path) -> u64 {
    let read = |name: &str, default: u64| {
        std::fs::read_to_string(dir.join(name))
            .ok()
            .and_then(|v| v.trim().parse().ok())
            .unwrap_or(default)
    };
    let shared = read("max", 4096).saturating_sub(read("reserve", 1024));
    (shared / crate::SHARE_DIVISOR).max(1)
}

/// Resolves copy-on-write views: canonical layers, checked to be directories, and their
/// writable paths (see [`ResolvedOverlay::writable`]).
fn resolve_overlays(
    overlays: &[lockbox_policy::Overlay],
    limits: &lockbox_policy::Limits,
) -> Result<Vec<ResolvedOverlay>, SetupError> {
    let mut out = Vec::with_capacity(overlays.len());
    for overlay in overlays {
        let dir = |p: &Path, what| {
            let canonical = std::fs::canonicalize(p).map_err(|e| SetupError::Path {
                path: p.to_owned(),
                what,
                source: e,
            })?;
            if !canonical.is_dir() {
                return Err(SetupError::Path {
                    path: p.to_owned(),
                    what,
                    source: std::io::Error::from_raw_os_error(libc::ENOTDIR),
                });
            }
            Ok(canonical)
        };
        let mut resolved = ResolvedOverlay {
            target: std::fs::canonicalize(&overlay.target)
                .unwrap_or_else(|_| overlay.target.clone()),
            lowers: overlay
                .lowers
                .iter()
                .map(|l| dir(l, "using as an overlay layer"))
                .collect::<Result<_, _>>()?,
            upper: match &overlay.upper {
                None => None,
                Some(u) => {
                    let mut upper = resolve_upper(
                        &dir(&u.upper, "using as an overlay upper layer")?,
                        &dir(&u.work, "using as an overlay work directory")?,
                    )?;
                    upper.bound = u.max_size.map(|m| TmpfsBound {
                        bytes: m.0,
                        inodes: limits.upper_inodes(m),
                    });
                    Some(upper)
                }
            },
            writable: None,
            create: Vec::new(),
        };
        if let Some(paths) = &overlay.writable {
            resolve_writable(&mut resolved, &overlay.target, paths)?;
        }
        out.push(resolved);
    }
    Ok(out)
}

/// What a path of an overlay view is, judged from its layers (top first).
#[derive(Debug, PartialEq, Eq)]
enum InView {
    Dir,
    Missing,
    NotDir,
}

/// Looks `rel` up through `layers`, top first, as overlayfs would: the first layer holding
/// it decides; a whiteout (a 0:0 character device) hides it. Opaque directories are not
/// considered: a path they hide counts as present, and the Landlock rule made for it then
/// fails to open it, naming it.
fn in_view(layers: &[PathBuf], rel: &Path) -> InView {
    use std::os::unix::fs::{FileTypeExt, MetadataExt};
    for layer in layers {
        match std::fs::symlink_metadata(layer.join(rel)) {
            Ok(m) if m.is_dir() => return InView::Dir,
            Ok(m) if m.file_type().is_char_device() && m.rdev() == 0 => return InView::Missing,
            Ok(_) => return InView::NotDir,
            Err(_) => continue,
        }
    }
    InView::Missing
}

/// Fills `overlay.writable` (paths inside the canonical target) and `overlay.create` (the
/// directories to make first). `target` is the policy's own spelling, which the paths were
/// validated against. A writable path must be a directory: a symlink could lead a write
/// rule out of the view.
fn resolve_writable(
    overlay: &mut ResolvedOverlay,
    target: &Path,
    paths: &[PathBuf],
) -> Result<(), SetupError> {
    let mut layers: Vec<PathBuf> = overlay
        .upper
        .iter()
        .filter(|u| u.bound.is_none())
        .map(|u| u.parent.join(&u.upper_name))
        .collect();
    layers.extend(overlay.lowers.iter().cloned());
    let mut writable = Vec::new();
    for path in paths {
        let rel = path.strip_prefix(target).unwrap_or(Path::new(""));
        let mut prefix = PathBuf::new();
        let mut missing = false;
        for component in rel.components() {
            prefix.push(component);
            let inside = overlay.target.join(&prefix);
            if !missing {
                match in_view(&layers, &prefix) {
                    InView::Dir => continue,
                    InView::Missing => missing = true,
                    InView::NotDir => {
                        return Err(SetupError::Path {
                            path: inside,
                            what: "making writable inside the copy-on-write view",
                            source: std::io::Error::other(
                                "not a directory (a writable path must be a directory of the view, not a file or symlink)",
                            ),
                        })
                    }
                }
            }
            if !overlay.create.contains(&inside) {
                overlay.create.push(inside);
            }
        }
        writable.push(overlay.target.join(rel));
    }
    overlay.writable = Some(writable);
    Ok(())
}

fn resolve_upper(upper: &Path, work: &Path) -> Result<ResolvedUpper, SetupError> {
    let bad = |why: &str| SetupError::Path {
        path: upper.to_owned(),
        what: "using as an overlay upper layer",
        source: std::io::Error::other(why.to_owned()),
    };
    let (Some(parent), Some(upper_name), Some(work_name)) =
        (upper.parent(), upper.file_name(), work.file_name())
    else {
        return Err(bad("the upper directory needs a parent"));
    };
    if work.parent() != Some(parent) {
        return Err(bad(
            "the work directory must be a sibling of the upper directory",
        ));
    }
    let plain = |n: &std::ffi::OsStr| {
        n.to_str()
            .filter(|n| {
                n.bytes()
                    .all(|b| b.is_ascii_alphanumeric() || b"._-".contains(&b))
            })
            .map(str::to_owned)
    };
    match (plain(upper_name), plain(work_name)) {
        (Some(upper_name), Some(work_name)) => Ok(ResolvedUpper {
            parent: parent.to_owned(),
            upper_name,
            work_name,
            bound: None,
            mode: std::fs::metadata(upper)
                .map(|m| std::os::unix::fs::PermissionsExt::mode(&m.permissions()) & 0o7777)
                .unwrap_or(0o755),
        }),
        _ => Err(bad(
            "upper and work directory names may only use letters, digits, '.', '_', '-'",
        )),
    }
}

fn resolve_grant(
    path: &Path,
    access: Access,
    symlinks: &mut Vec<(PathBuf, OsString)>,
) -> Result<Grant, SetupError> {
    let canonical = std::fs::canonicalize(path).map_err(|e| SetupError::Path {
        path: path.to_owned(),
        what: if access == Access::ReadOnly {
            "granting read access to"
        } else {
            "granting write access to"
        },
        source: e,
    })?;
    let meta = std::fs::metadata(&canonical).map_err(|e| SetupError::Path {
        path: canonical.clone(),
        what: "reading metadata of",
        source: e,
    })?;
    if canonical == Path::new("/") || canonical.starts_with("/proc") {
        return Err(SetupError::Path {
            path: path.to_owned(),
            what: "granting",
            source: std::io::Error::other(format!(
                "it resolves to {}, which cannot be granted",
                canonical.display()
            )),
        });
    }
    // The symlinks of a granted path (its own and its parents') are recreated too, so both
    // names work inside.
    if canonical != path {
        symlinks.extend(links_on_the_way(path));
    }
    Ok(Grant {
        path: canonical,
        is_dir: meta.is_dir(),
        access,
    })
}

/// Most symlinks one path resolution follows (the kernel's `MAXSYMLINKS`): beyond it the
/// kernel says `ELOOP`, and nothing more is recreated.
const MAX_SYMLINKS: usize = 40;

/// The symlinks the kernel follows resolving the absolute `path`, each at its place (its
/// parent resolved) with its target as written, so that recreated inside they lead `path`
/// where it leads on the host: `/tmp/link/w` with `/tmp/link -> real` gives
/// `(/tmp/link, real)`. A relative path, or a component that does not exist, ends the walk.
fn links_on_the_way(path: &Path) -> Vec<(PathBuf, OsString)> {
    use std::path::Component;
    let mut links = Vec::new();
    if !path.is_absolute() {
        return links;
    }
    let mut todo: Vec<OsString> = path
        .components()
        .rev()
        .map(|c| c.as_os_str().to_owned())
        .collect();
    let mut at = PathBuf::from("/");
    while let Some(part) = todo.pop() {
        match Path::new(&part).components().next() {
            Some(Component::RootDir) => at = PathBuf::from("/"),
            Some(Component::ParentDir) => {
                at.pop();
            }
            Some(Component::Normal(name)) => {
                let next = at.join(name);
                let Ok(meta) = std::fs::symlink_metadata(&next) else {
                    break;
                };
                if !meta.file_type().is_symlink() {
                    at = next;
                    continue;
                }
                if links.len() == MAX_SYMLINKS {
                    break;
                }
                let Ok(target) = std::fs::read_link(&next) else {
                    break;
                };
                todo.extend(target.components().rev().map(|c| c.as_os_str().to_owned()));
                links.push((next, target.into_os_string()));
            }
            _ => {}
        }
    }
    links
}

/// Entries of [`ETC_SECRETS`] that exist under `etc`, expanding `*` in the last component.
pub fn etc_secrets_present(etc: &Path) -> Vec<PathBuf> {
    let mut found = Vec::new();
    for pattern in ETC_SECRETS {
        let pattern = Path::new(pattern);
        let (dir, name) = match (pattern.parent(), pattern.file_name()) {
            (Some(dir), Some(name)) => (dir, name.to_string_lossy()),
            _ => continue,
        };
        if let Some((prefix, suffix)) = name.split_once('*') {
            let Ok(entries) = std::fs::read_dir(etc.join(dir)) else {
                continue;
            };
            for entry in entries.flatten() {
                let file_name = entry.file_name();
                let n = file_name.to_string_lossy();
                if n.len() >= prefix.len() + suffix.len()
                    && n.starts_with(prefix)
                    && n.ends_with(suffix)
                {
                    found.push(dir.join(&file_name));
                }
            }
        } else if std::fs::symlink_metadata(etc.join(pattern)).is_ok() {
            found.push(pattern.to_owned());
        }
    }
    found.sort();
    found
}

/// The rules of a list's `specs`: a deny-list's names by the addresses `pins` holds for them;
/// an allow-list's names none (lockbox's resolver allows them address by address, as it
/// answers them: netsup's `dns`).
fn list_rules(kind: ListKind, specs: &[NetSpec], pins: &[(String, Vec<IpAddr>)]) -> Vec<NetRule> {
    specs
        .iter()
        .flat_map(|spec| {
            let addrs = match &spec.host {
                NetHost::Name(_) if kind == ListKind::Allow => Vec::new(),
                NetHost::Name(n) => pins
                    .iter()
                    .find(|(name, _)| name == n)
                    .map(|(_, a)| a.clone())
                    .unwrap_or_default(),
                NetHost::Subdomains(_) | NetHost::Block(_) => Vec::new(),
            };
            spec.rules(&addrs)
        })
        .collect()
}

/// The list a running sandbox's supervisor takes for `net` (`Running::replace_net`),
/// resolved as at the start: a deny-list's names now, with the system resolver; an
/// allow-list's names by lockbox's resolver as the sandbox asks. `None` for no list (no
/// network, the host's). The specs naming hosts are the list's `names` for either kind: a
/// deny-list's are what lockbox's resolver refuses, in a sandbox that has it.
pub(crate) fn net_list(net: &Net) -> Result<Option<lockbox_netsup::NetList>, SetupError> {
    let (kind, specs) = match net {
        Net::Allow(specs) => (ListKind::Allow, specs),
        Net::Deny(specs) => (ListKind::Deny, specs),
        Net::None | Net::Host => return Ok(None),
    };
    let pins = pin_names(net)?;
    Ok(Some(lockbox_netsup::NetList {
        kind,
        rules: list_rules(kind, specs, &pins),
        names: specs
            .iter()
            .filter(|s| !matches!(s.host, NetHost::Block(_)))
            .cloned()
            .collect(),
    }))
}

/// Resolves the hostnames of a deny-list once (the system resolver, as the caller would),
/// so the sandbox's rules and `/etc/hosts` agree for its whole life. (An allow-list's are
/// resolved when the sandbox asks.)
fn pin_names(net: &Net) -> Result<Vec<(String, Vec<IpAddr>)>, SetupError> {
    let mut pins: Vec<(String, Vec<IpAddr>)> = Vec::new();
    let Net::Deny(specs) = net else {
        return Ok(pins);
    };
    for spec in specs {
        let NetHost::Name(name) = &spec.host else {
            continue;
        };
        if pins.iter().any(|(n, _)| n == name) {
            continue;
        }
        let mut addrs: Vec<IpAddr> = (name.as_str(), 0)
            .to_socket_addrs()
            .map_err(|source| SetupError::NetName {
                spec: spec.to_string(),
                source,
            })?
            .map(|a| a.ip())
            .collect();
        addrs.sort();
        addrs.dedup();
        pins.push((name.clone(), addrs));
    }
    Ok(pins)
}

fn etc_files(policy: &Policy, pins: &[(String, Vec<IpAddr>)]) -> Vec<(String, Vec<u8>)> {
    let name = &policy.hostname;
    let mut files = vec![("hostname".to_owned(), format!("{name}\n").into_bytes())];
    // `localhost` names 127.0.0.1 only (Ubuntu's default; ::1 keeps its ip6-* names). With
    // `::1 localhost` too, glibc sorts the answers by RFC 6724 whatever the file's order, and
    // ::1 (precedence 50) beats IPv4 (10): Node then binds `localhost` servers to ::1 and
    // clients of 127.0.0.1 are refused. The sandbox's loopback has ::1, many hosts' do not.
    let loopback =
        format!("127.0.0.1\tlocalhost\n127.0.1.1\t{name}\n::1\tip6-localhost ip6-loopback\n");
    let hosts = match &policy.net {
        // Without a network only loopback exists: say so, and resolve our own name.
        Net::None => loopback.into_bytes(),
        // An allow-list's resolver is lockbox (the network supervisor, at DNS_ADDR): it
        // answers the listed names and nothing else.
        Net::Allow(_) => {
            let [a, b, c, d] = crate::DNS_ADDR;
            files.push((
                "resolv.conf".to_owned(),
                format!(
                    "# lockbox's resolver: it answers the names of the network allow-list\n\
                     nameserver {a}.{b}.{c}.{d}\n"
                )
                .into_bytes(),
            ));
            loopback.into_bytes()
        }
        // A deny-list's names are pinned: the addresses the rules were made from come
        // first, so lookups inside agree with the rules.
        Net::Deny(_) => {
            let mut hosts = String::from("# names of the network policy, pinned by lockbox\n");
            for (host, addrs) in pins {
                for a in addrs {
                    hosts.push_str(&format!("{a}\t{host}\n"));
                }
            }
            hosts.push_str(&loopback);
            if let Ok(resolv) = std::fs::read("/etc/resolv.conf") {
                files.push(("resolv.conf".to_owned(), resolv));
            }
            hosts.into_bytes()
        }
        Net::Host => {
            let mut hosts = std::fs::read("/etc/hosts").unwrap_or_default();
            hosts.extend_from_slice(format!("127.0.1.1\t{name}\n").as_bytes());
            if let Ok(resolv) = std::fs::read("/etc/resolv.conf") {
                // The host's may be a bind mount the overlay cannot see through.
                files.push(("resolv.conf".to_owned(), resolv));
            }
            hosts
        }
    };
    files.push(("hosts".to_owned(), hosts));
    files
}

/// apt's drop-in directory, under `/etc`.
const APT_CONF_D: &str = "apt/apt.conf.d";

/// lockbox's file in [`APT_CONF_D`] of an image that has one (read-only, like `/etc/hosts`).
/// apt runs its download methods as `_apt` and then checks that `getuid()` and the groups
/// changed; in an image sandbox the `set*id` calls are no-ops (`seccomp::ID_NO_OPS`: the
/// user namespace has one uid), so the check fails ("Could not switch group") and
/// `apt-get update` stops. `root` turns the drop off (apt's `DropPrivileges`); Charliecloud's
/// `ch-image --force` writes the same line into a Debian image it builds
/// (`/etc/apt/apt.conf.d/no-sandbox`), lockbox binds it without changing the image. Nothing is lost:
/// `_apt` would be the caller too. The name sorts last, so the image's own files cannot
/// undo it.
const APT_SANDBOX_FILE: &str = "apt/apt.conf.d/99lockbox-sandbox-user";

/// The content of [`APT_SANDBOX_FILE`].
const APT_SANDBOX_CONF: &[u8] =
    b"// lockbox: every uid of this sandbox is the caller's; apt cannot drop to _apt.\n\
APT::Sandbox::User \"root\";\n";

/// True if the image's merged tree (`layers`, top first, overlayfs format) has the directory
/// `rel` (relative to `/etc`): a directory in some layer, neither hidden by a whiteout, a
/// file or an opaque directory above it, nor reached through a symlink (the image is
/// untrusted: nothing of it is followed on the host).
fn image_has_dir(layers: &[PathBuf], rel: &Path) -> bool {
    let rel = Path::new("etc").join(rel);
    for layer in layers {
        let mut at = layer.clone();
        let mut opaque_above = false;
        let mut whole = true;
        for part in rel.components() {
            at.push(part);
            match std::fs::symlink_metadata(&at) {
                Ok(m) if m.is_dir() => {
                    let mut flag = [0u8; 1];
                    opaque_above |= rustix::fs::lgetxattr(&at, "user.overlay.opaque", &mut flag)
                        .is_ok_and(|n| n == 1 && flag[0] == b'y');
                }
                // A file, a symlink or a whiteout (a 0/0 character device) hides the
                // lower layers' entry.
                Ok(_) => return false,
                Err(_) if opaque_above => return false,
                Err(_) => {
                    whole = false;
                    break;
                }
            }
        }
        if whole {
            return true;
        }
    }
    false
}

/// True if nothing the sandbox can write on the host is reachable by anyone but the caller:
/// no writable grant, no descriptor handed in, and every overlay's upper layer below a
/// directory of the caller's that only the caller may enter (lockbox's state directory
/// keeps branches and transaction layers in such directories). Then a set-group-id bit
/// (`chmod g+s`, the caller's own group) gives nobody anything, and the seccomp filter lets
/// it through ([`crate::seccomp::build`]).
pub fn private_writes(policy: &Policy) -> bool {
    let private = private_to_caller;
    policy.fs.write.is_empty()
        && policy.pass_fds.is_empty()
        && policy
            .fs
            .overlays
            .iter()
            .filter_map(|o| o.upper.as_ref())
            .all(|u| private(&u.upper))
}

/// True if `path` lies below a directory of the caller's that only the caller may enter.
pub fn private_to_caller(path: &Path) -> bool {
    let uid = rustix::process::getuid().as_raw();
    path.ancestors().any(|dir| {
        std::fs::symlink_metadata(dir).is_ok_and(|m| {
            use std::os::unix::fs::MetadataExt;
            m.is_dir() && m.uid() == uid && m.mode() & 0o077 == 0
        })
    })
}

/// True if `path` exists inside: at or below a grant or a view, or above one (the root
/// holds every parent of a grant as a directory, so `-w ./project` from the project's
/// parent starts there and `make -C project` works).
fn visible_inside(resolved: &Resolved, path: &Path) -> bool {
    let near = |p: &Path| path.starts_with(p) || p.starts_with(path);
    path == Path::new("/tmp")
        || resolved.grants.iter().any(|g| near(&g.path))
        || resolved.overlays.iter().any(|o| near(&o.target))
        || (resolved.etc_hidden.is_some() && path.starts_with("/etc"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_sandbox_gets_a_quarter_of_the_shared_ptys() {
        let dir = tempfile::tempdir().unwrap();
        assert_eq!(pty_share(dir.path()), 768);
        std::fs::write(dir.path().join("max"), "2048\n").unwrap();
        std::fs::write(dir.path().join("reserve"), "1024\n").unwrap();
        assert_eq!(pty_share(dir.path()), 256);
        std::fs::write(dir.path().join("max"), "1024\n").unwrap();
        assert_eq!(pty_share(dir.path()), 1);
    }

    fn restricted_view(work: &Path, writable: &[&str]) -> Policy {
        let upper = work.parent().unwrap().join("upper");
        let scratch = work.parent().unwrap().join("work-dir");
        std::fs::create_dir_all(&upper).unwrap();
        std::fs::create_dir_all(&scratch).unwrap();
        let mut policy = Policy::default();
        policy.fs.overlays.push(lockbox_policy::Overlay {
            target: work.to_owned(),
            lowers: vec![work.to_owned()],
            upper: Some(lockbox_policy::OverlayUpper {
                upper,
                work: scratch,
                max_size: None,
            }),
            writable: Some(writable.iter().map(|w| work.join(w)).collect()),
        });
        policy
    }

    #[test]
    fn missing_writable_directories_are_planned_parents_first_and_files_refused() {
        let dir = tempfile::tempdir().unwrap();
        let work = dir.path().join("w");
        std::fs::create_dir_all(work.join("web")).unwrap();
        std::fs::write(work.join("file"), "x").unwrap();
        let r = resolve(&restricted_view(&work, &["web", "out/dist"]), None).unwrap();
        let o = &r.overlays[0];
        let work = std::fs::canonicalize(&work).unwrap();
        assert_eq!(
            o.writable.as_deref().unwrap(),
            [work.join("web"), work.join("out/dist")]
        );
        assert_eq!(o.create, [work.join("out"), work.join("out/dist")]);

        std::os::unix::fs::symlink("/etc", work.join("link")).unwrap();
        for bad in ["file", "file/below", "link"] {
            let err = resolve(&restricted_view(&work, &[bad]), None)
                .unwrap_err()
                .to_string();
            assert!(
                err.contains(&*work.join(bad.split('/').next().unwrap()).to_string_lossy()),
                "{err}"
            );
            assert!(err.contains("not a directory"), "{err}");
        }
    }

    #[test]
    fn missing_grant_is_an_error_naming_the_path() {
        let mut policy = Policy::default();
        policy.fs.read.push("/definitely/not/here".into());
        let err = resolve(&policy, None).unwrap_err().to_string();
        assert!(err.contains("/definitely/not/here"), "{err}");
    }

    #[test]
    fn write_wins_over_read_for_the_same_path() {
        let dir = tempfile::tempdir().unwrap();
        let mut policy = Policy::default();
        policy.fs.default_reads = false;
        policy.fs.read.push(dir.path().into());
        policy.fs.write.push(dir.path().into());
        let r = resolve(&policy, None).unwrap();
        assert_eq!(r.grants.len(), 1);
        assert_eq!(r.grants[0].access, Access::ReadWrite);
    }

    #[test]
    fn secret_patterns_expand_against_a_fake_etc() {
        let etc = tempfile::tempdir().unwrap();
        std::fs::create_dir(etc.path().join("ssh")).unwrap();
        for f in [
            "shadow",
            "ssh/ssh_host_rsa_key",
            "ssh/ssh_host_rsa_key.pub",
            "passwd",
        ] {
            std::fs::write(etc.path().join(f), "x").unwrap();
        }
        let found = etc_secrets_present(etc.path());
        assert_eq!(
            found,
            vec![
                PathBuf::from("shadow"),
                PathBuf::from("ssh/ssh_host_rsa_key")
            ]
        );
    }

    #[test]
    fn cwd_defaults_to_caller_cwd_only_when_visible() {
        let dir = tempfile::tempdir_in("/var/tmp").unwrap();
        let mut policy = Policy::default();
        let r = resolve(&policy, Some(dir.path())).unwrap();
        assert_eq!(r.cwd, Path::new("/"));
        policy.fs.read.push(dir.path().into());
        let r = resolve(&policy, Some(dir.path())).unwrap();
        assert_eq!(r.cwd, std::fs::canonicalize(dir.path()).unwrap());
    }

    #[test]
    fn cwd_stays_the_callers_when_it_is_the_parent_of_a_grant() {
        // `lockbox run -w ./project -- make -C project`, from the project's parent.
        let dir = tempfile::tempdir_in("/var/tmp").unwrap();
        let parent = std::fs::canonicalize(dir.path()).unwrap();
        std::fs::create_dir(parent.join("project")).unwrap();
        let mut policy = Policy::default();
        policy.fs.write.push(parent.join("project"));
        let r = resolve(&policy, Some(&parent)).unwrap();
        assert_eq!(r.cwd, parent);
        // A sibling of the grant is not inside: the command starts in `/`.
        std::fs::create_dir(parent.join("other")).unwrap();
        let r = resolve(&policy, Some(&parent.join("other"))).unwrap();
        assert_eq!(r.cwd, Path::new("/"));
    }

    #[test]
    fn every_symlink_on_the_way_to_a_granted_path_is_recreated_where_it_is_met() {
        let dir = tempfile::tempdir_in("/var/tmp").unwrap();
        let root = std::fs::canonicalize(dir.path()).unwrap();
        std::fs::create_dir_all(root.join("real/sub/w")).unwrap();
        std::os::unix::fs::symlink("two/sub", root.join("one")).unwrap();
        std::os::unix::fs::symlink(root.join("real"), root.join("two")).unwrap();
        let given = root.join("one/w");
        assert_eq!(
            links_on_the_way(&given),
            vec![
                (root.join("one"), OsString::from("two/sub")),
                (root.join("two"), root.join("real").into_os_string()),
            ]
        );
        let mut policy = Policy::default();
        policy.fs.write.push(given.clone());
        policy.cwd = Some(given);
        let r = resolve(&policy, None).unwrap();
        assert_eq!(
            r.symlinks
                .iter()
                .filter(|(l, _)| l.starts_with(&root))
                .count(),
            2,
            "{:?}",
            r.symlinks
        );
    }

    #[test]
    fn apts_drop_in_directory_is_found_in_the_merged_image_and_never_through_a_symlink() {
        let dir = tempfile::tempdir().unwrap();
        let layer = |name: &str| {
            let path = dir.path().join(name);
            std::fs::create_dir_all(&path).unwrap();
            path
        };
        let (top, base) = (layer("top"), layer("base"));
        std::fs::create_dir_all(base.join("etc/apt/apt.conf.d")).unwrap();
        std::fs::create_dir_all(top.join("etc")).unwrap();
        let rel = Path::new(APT_CONF_D);
        assert!(image_has_dir(&[top.clone(), base.clone()], rel));
        assert!(!image_has_dir(std::slice::from_ref(&top), rel));
        // An opaque /etc above hides the base layer's.
        rustix::fs::setxattr(
            top.join("etc"),
            "user.overlay.opaque",
            b"y",
            rustix::fs::XattrFlags::empty(),
        )
        .unwrap();
        assert!(!image_has_dir(&[top.clone(), base.clone()], rel));
        // A symlink is not followed on the host, even to a directory that has it.
        let hostile = layer("hostile");
        std::os::unix::fs::symlink(base.join("etc"), hostile.join("etc")).unwrap();
        assert!(!image_has_dir(&[hostile, base], rel));
    }

    #[test]
    fn set_gid_is_allowed_only_when_every_host_write_is_private_to_the_caller() {
        use std::os::unix::fs::PermissionsExt;
        let dir = tempfile::tempdir_in("/var/tmp").unwrap();
        let root = std::fs::canonicalize(dir.path()).unwrap();
        assert!(private_writes(&Policy::default()));
        let mut granted = Policy::default();
        granted.fs.write.push(root.clone());
        assert!(!private_writes(&granted));
        let mut passed = Policy::default();
        passed.pass_fds.push(3);
        assert!(!private_writes(&passed));
        // An upper layer below a 0700 directory of the caller's (the state directory's
        // branches) is private; one in a directory others may enter is not.
        for (mode, private) in [(0o700, true), (0o755, false)] {
            std::fs::set_permissions(&root, std::fs::Permissions::from_mode(mode)).unwrap();
            let mut view = Policy::default();
            view.fs.overlays.push(lockbox_policy::Overlay {
                target: "/w".into(),
                lowers: vec!["/w".into()],
                upper: Some(lockbox_policy::OverlayUpper {
                    upper: root.join("upper"),
                    work: root.join("work"),
                    max_size: None,
                }),
                writable: None,
            });
            // /var/tmp itself is 1777: only `root` can make it private.
            assert_eq!(private_writes(&view), private, "mode {mode:o}");
        }
    }
}
