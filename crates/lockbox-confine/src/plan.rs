//! [`SetupPlan`]: every mount and file the sandbox root is built from, as plain data.
//!
//! `build` makes no syscalls; `child` only carries the plan out. The root is built on a
//! tmpfs (the *stage*, mounted over `/tmp` in the sandbox's private mount namespace) with
//! paths relative to it, then becomes `/` by `pivot_root`. Host trees are captured with
//! `open_tree(OPEN_TREE_CLONE)` *before* the stage hides `/tmp`, so a grant under `/tmp`
//! works, then attached in path order so that a parent is always mounted before anything
//! inside it.
//!
//! An image root (`Resolved::image`) is the exception to "the stage becomes `/`": the
//! stage holds the image's overlay, and `pivot_root` goes into that (see `image_stage`).

use crate::landlock::RuleAccess;
use crate::resolve::{Access, Resolved};
use std::ffi::CString;
use std::fmt;
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};

/// A host tree captured before the stage is mounted, or (`staged`) a mount lockbox built on
/// the stage, kept by an [`Op::Capture`] for an image root.
#[derive(Debug, Clone)]
pub struct Source {
    /// Absolute host path (a path on the stage when `staged`).
    pub host: CString,
    /// Made read-only (recursively) while still detached.
    pub readonly: bool,
    /// Captured by an [`Op::Capture`] from the stage, not from the host before it.
    pub staged: bool,
}

/// One primitive step of building the root. Paths are relative to the stage.
#[derive(Debug, Clone)]
#[allow(missing_docs)]
pub enum Op {
    /// `mkdir`, then `chmod` (existing directories are left alone).
    Mkdir {
        path: CString,
        mode: u32,
    },
    /// An empty file to mount a file over.
    Touch {
        path: CString,
    },
    Symlink {
        target: CString,
        path: CString,
    },
    WriteFile {
        path: CString,
        data: Vec<u8>,
    },
    /// An overlayfs whiteout: hides the entry of the same name in lower layers.
    Whiteout {
        path: CString,
    },
    /// Attach captured source number `source` at `target`.
    Attach {
        source: usize,
        target: CString,
    },
    Mount {
        source: CString,
        target: CString,
        fstype: CString,
        flags: libc::c_ulong,
        data: CString,
    },
    /// Bind `path` over itself read-only (`optional`: skip if it does not exist).
    CoverReadonly {
        path: CString,
        optional: bool,
    },
    /// Hand a detached copy of the mount at `path` (a bounded upper tmpfs) to the
    /// supervisor, for overlay number `overlay`.
    HandOver {
        path: CString,
        overlay: usize,
    },
    /// Bind the file `with` over `path` (masking it), if `path` exists.
    CoverWith {
        with: CString,
        path: CString,
    },
    /// Make the mount at `path` read-only (not its submounts).
    SetReadonly {
        path: CString,
    },
    /// Unmount lazily (`MNT_DETACH`).
    Umount {
        path: CString,
    },
    /// Unless the tmpfs at `target` is still as new (empty, with permission bits `mode`),
    /// unmount it and carry out `mount` (an [`Op::Mount`] of a new one).
    Renew {
        target: CString,
        mode: u32,
        mount: Box<Op>,
    },
    Rmdir {
        path: CString,
    },
    /// Give the sandbox a boot id of its own: a fresh random one (a version 4 UUID, as the
    /// kernel's) written to `scratch`, bound over `path` (`/proc`'s
    /// `sys/kernel/random/boot_id`, if it exists), and `scratch` removed. Every sandbox start
    /// is a boot for what runs inside (an E2B resume starts its processes afresh: E2B's
    /// tests compare boot ids across a pause), and the host's boot id, the same for every
    /// sandbox on it, stays the host's.
    OwnBootId {
        scratch: CString,
        path: CString,
    },
    /// Write the user namespace's own limits of per-user quotas (see `quotas`) through the
    /// procfs just mounted at `proc`. A fresh procfs holds only this namespace's entries;
    /// the host's `/proc` holds one per live user namespace, and a lookup there walks them
    /// all, so each create got slower the more sandboxes lived (issue 34).
    LimitUserQuotas {
        proc: CString,
    },
    /// Wait for the supervisor's go (and the stdin it may carry) before going on: see
    /// [`crate::Spawn::gated`].
    Gate,
    /// Keep a detached copy of the mount tree at `path` (on the stage) as source number
    /// `source`, to attach after `pivot_root` (an image root's `/dev`, `/proc`).
    Capture {
        path: CString,
        source: usize,
    },
    /// Make `path` (an image root's mount on the stage) the directory `pivot_root` makes
    /// the root.
    ChangeDir {
        path: CString,
    },
    /// `pivot_root` into the stage, once the set-up helper is done (see `child`): the ops
    /// before it build the root on the stage, those after it run inside. Unmounts come after
    /// it: each waits for an RCU grace period, which lasts as long as the helper's network
    /// namespace set-up on the other CPU.
    EnterRoot,
}

/// A Landlock rule, applied after `pivot_root` (paths are absolute inside the sandbox).
#[derive(Debug, Clone)]
pub struct Rule {
    /// Absolute path inside the sandbox.
    pub path: CString,
    /// What is allowed beneath it.
    pub access: RuleAccess,
}

/// Everything the sandbox init needs to build the root, computed before the clone.
#[derive(Debug, Clone, Default)]
pub struct SetupPlan {
    /// Host trees, captured first.
    pub sources: Vec<Source>,
    /// Root-building steps, in order.
    pub ops: Vec<Op>,
    /// Landlock rules.
    pub rules: Vec<Rule>,
    /// Working directory of the command (absolute, inside).
    pub cwd: CString,
    /// Copy-on-write views (mounted by an [`Op::Mount`] of type `overlay`).
    pub overlays: Vec<crate::resolve::ResolvedOverlay>,
    /// How the network list is enforced, one line each (empty without a list).
    pub net: Vec<String>,
    /// Index of the first op of the copy-on-write views and what lies inside them (the
    /// last ops), if there are views.
    pub views_from: Option<usize>,
    /// The later commands of a sequence sandbox ([`crate::Spawn::sequence`]); empty otherwise.
    pub steps: Vec<StepPlan>,
    /// The root stays writable: an image root, whose writes go to the sandbox's own upper
    /// layer (a plain root is made read-only once built).
    pub root_writable: bool,
    /// The mounts of the sandbox's own scratch tmpfs (`/tmp` unless granted, `/dev/shm`).
    scratch: Vec<Op>,
}

/// What a sandbox of several commands ([`crate::Spawn::sequence`]) does before one of its
/// later commands, once everything of the previous one has ended: fresh scratch. (The
/// views stay; the init enters the fresh IPC namespace of the next command while the
/// previous one runs, and the command waits for the go itself.)
#[derive(Debug, Clone, Default)]
pub struct StepPlan {
    /// Carried out in order.
    pub ops: Vec<Op>,
}

const NOSUID_NODEV: libc::c_ulong = libc::MS_NOSUID | libc::MS_NODEV;

/// Entries of `/proc` that stay visible but read-only: writing them reconfigures the whole
/// machine, and the uid-0 caller's sandbox runs as the host's uid 0 (bubblewrap and Docker
/// cover the same list).
const PROC_READONLY: [&str; 5] = ["sys", "sysrq-trigger", "irq", "bus", "fs"];
/// Entries of `/proc` replaced by an empty file: host-wide kernel state (Docker masks them).
const PROC_MASKED: [&str; 4] = ["kcore", "timer_list", "sched_debug", "latency_stats"];

/// What goes at one path of the root, before it is turned into ops.
#[derive(Debug)]
enum Node {
    Bind {
        is_dir: bool,
        access: Access,
    },
    Tmpfs,
    Dev,
    Proc,
    Etc,
    Symlink(std::ffi::OsString),
    Overlay(usize),
    /// A mount built on the stage and captured (source number): an image root's `/dev`
    /// and `/proc`.
    Staged(usize),
    /// lockbox's files of `/etc` (hostname, hosts, ...) bound over an image's, from the
    /// captured source.
    EtcFiles(usize),
}

/// The network lines of `lockbox check --explain`: mechanism, pinned names, rules.
fn net_lines(resolved: &Resolved) -> Vec<String> {
    let Some((kind, rules)) = &resolved.net_rules else {
        return Vec::new();
    };
    let mut lines = vec![
        match kind {
            lockbox_policy::ListKind::Allow => "allow-list: own namespace (loopback); listed destinations through the host",
            lockbox_policy::ListKind::Deny => "deny-list: own namespace (loopback); every other destination through the host",
        }
        .to_owned(),
        "enforced by: seccomp user notification of connect/sendto/sendmsg/sendmmsg; the supervisor decides on its own copies and installs host sockets (SECCOMP_IOCTL_NOTIF_ADDFD)".to_owned(),
    ];
    if !resolved.net_names.is_empty() {
        let [a, b, c, d] = crate::DNS_ADDR;
        lines.push(format!(
            "resolver: lockbox at {a}.{b}.{c}.{d}:53 (udp+tcp); listed names resolved on the host when asked, every other name NXDOMAIN"
        ));
    }
    for spec in &resolved.net_names {
        lines.push(format!(
            "{} (the addresses this sandbox's answers gave)",
            spec_line(spec)
        ));
    }
    for (name, addrs) in &resolved.net_pins {
        let addrs: Vec<String> = addrs.iter().map(ToString::to_string).collect();
        lines.push(format!("pinned {name} = {}", addrs.join(", ")));
    }
    let verb = match kind {
        lockbox_policy::ListKind::Allow => "allow",
        lockbox_policy::ListKind::Deny => "deny",
    };
    lines.extend(rules.iter().map(|r| format!("{verb} {r}")));
    lines
}

fn spec_line(spec: &lockbox_policy::NetSpec) -> String {
    let proto = spec.proto.map_or("tcp+udp".to_owned(), |p| p.to_string());
    let host = match &spec.host {
        lockbox_policy::NetHost::Name(n) => n.clone(),
        lockbox_policy::NetHost::Subdomains(d) => format!("*.{d}"),
        lockbox_policy::NetHost::Block(b) => b.to_string(),
    };
    format!("allow {proto} {host}:{}", spec.ports)
}

/// Builds the plan. Pure: no syscalls.
pub fn build(resolved: &Resolved) -> SetupPlan {
    let mut plan = SetupPlan {
        cwd: cstring(resolved.cwd.as_os_str().as_bytes()),
        overlays: resolved.overlays.clone(),
        net: net_lines(resolved),
        ..SetupPlan::default()
    };
    let staged = resolved
        .image
        .as_ref()
        .map(|image| image_stage(&mut plan, resolved, image));
    let mut nodes: Vec<(PathBuf, Node)> = needed_grants(&resolved.grants)
        .into_iter()
        .map(|g| {
            (
                g.path.clone(),
                Node::Bind {
                    is_dir: g.is_dir,
                    access: g.access,
                },
            )
        })
        .collect();
    let granted = |p: &str| nodes.iter().any(|(path, _)| path == Path::new(p));
    let etc_granted = granted("/etc");
    if !granted("/tmp") {
        nodes.push(("/tmp".into(), Node::Tmpfs));
    }
    match &staged {
        None => {
            nodes.push(("/dev".into(), Node::Dev));
            nodes.push(("/proc".into(), Node::Proc));
        }
        Some(staged) => {
            nodes.push(("/dev".into(), Node::Staged(staged.dev)));
            nodes.push(("/proc".into(), Node::Staged(staged.proc)));
            if !etc_granted {
                nodes.push(("/etc".into(), Node::EtcFiles(staged.etc)));
            }
        }
    }
    if resolved.etc_hidden.is_some() {
        nodes.push(("/etc".into(), Node::Etc));
    }
    for (i, overlay) in resolved.overlays.iter().enumerate() {
        nodes.retain(|(p, _)| p != &overlay.target);
        nodes.push((overlay.target.clone(), Node::Overlay(i)));
    }
    for (link, target) in &resolved.symlinks {
        if !nodes.iter().any(|(p, _)| p == link) {
            nodes.push((link.clone(), Node::Symlink(target.clone())));
        }
    }
    // Path order puts every parent before its children; the views and what lies inside
    // them go last (a stable sort keeps their order), so that a gated sandbox can build
    // everything else before its gate (see [`SetupPlan::insert_gate`]).
    nodes.sort_by(|a, b| a.0.cmp(&b.0));
    let in_view = |p: &Path| resolved.overlays.iter().any(|o| p.starts_with(&o.target));
    nodes.sort_by_key(|(p, _)| in_view(p));

    plan.rules.push(Rule {
        path: cstring(b"/"),
        access: if staged.is_some() {
            RuleAccess::ImageRoot
        } else {
            RuleAccess::ListDir
        },
    });
    let mut made_dirs: Vec<PathBuf> = Vec::new();
    let mut inside = Vec::new();
    // An image root is entered before anything is mounted in it (see `image_stage`).
    let mut entered = staged.is_some();
    for (path, node) in &nodes {
        if !entered && in_view(path) {
            enter_root(&mut plan, &mut inside);
            entered = true;
        }
        if plan.views_from.is_none() && in_view(path) {
            plan.views_from = Some(plan.ops.len());
        }
        ensure_parents(&mut plan, &mut made_dirs, path);
        let rel = relative(path);
        match node {
            Node::Bind { is_dir, access } => {
                plan.sources.push(Source {
                    host: cstring(path.as_os_str().as_bytes()),
                    readonly: *access == Access::ReadOnly,
                    staged: false,
                });
                plan.ops.push(if *is_dir {
                    Op::Mkdir {
                        path: rel.clone(),
                        mode: 0o755,
                    }
                } else {
                    Op::Touch { path: rel.clone() }
                });
                plan.ops.push(Op::Attach {
                    source: plan.sources.len() - 1,
                    target: rel,
                });
                plan.rules.push(Rule {
                    path: cstring(path.as_os_str().as_bytes()),
                    access: match (access, is_dir) {
                        (Access::ReadOnly, true) => RuleAccess::Read,
                        (Access::ReadOnly, false) => RuleAccess::ReadFile,
                        (Access::ReadWrite, true) => RuleAccess::Full,
                        (Access::ReadWrite, false) => RuleAccess::ReadWriteFile,
                    },
                });
            }
            Node::Tmpfs => {
                tmpfs(&mut plan, "tmp", &scratch_options(resolved));
                plan.scratch.extend(plan.ops.last().cloned());
                plan.rules.push(Rule {
                    path: cstring(b"/tmp"),
                    access: RuleAccess::Full,
                });
            }
            Node::Dev => dev(&mut plan, resolved),
            Node::Proc => proc(&mut plan),
            Node::Etc => etc(&mut plan, resolved, &mut inside),
            Node::Overlay(i) => overlay(&mut plan, &resolved.overlays[*i], *i, rel),
            Node::Symlink(target) => plan.ops.push(Op::Symlink {
                target: cstring(target.as_bytes()),
                path: rel,
            }),
            Node::Staged(source) => {
                plan.ops.push(Op::Mkdir {
                    path: rel.clone(),
                    mode: 0o755,
                });
                plan.ops.push(Op::Attach {
                    source: *source,
                    target: rel,
                });
            }
            Node::EtcFiles(source) => etc_files(&mut plan, resolved, *source),
        }
    }
    if !entered {
        enter_root(&mut plan, &mut inside);
    }
    plan
}

/// Where an image root is put together on the stage: its layers (attached as the views'
/// are, see [`overlay`]), its upper tmpfs, the overlay itself, and lockbox's `/etc` files.
const IMAGE_LAYERS: &str = ".i";
const IMAGE_UPPER: &str = ".lockbox-root-upper";
const IMAGE_ROOT: &str = ".lockbox-root";
const IMAGE_ETC: &str = ".lockbox-etc";

/// The sources [`image_stage`] captured.
struct Staged {
    dev: usize,
    proc: usize,
    etc: usize,
}

/// Attaches an image's layers under [`IMAGE_LAYERS`] for the overlay; their paths there, in
/// order. Each attachment is an `open_tree` and a `move_mount` in the sandbox's set-up (about
/// 50 µs), which made 30 layers 1.5 ms of a start: layers that share a grandparent (an image
/// store's `layers/<hex>/root`) are reached through one attachment of it instead, when that
/// keeps the overlay's options within [`SHARED_LOWERS_MAX`]. Either way only the stage sees
/// what is attached, and the stage is gone before the command runs.
fn attach_layers(plan: &mut SetupPlan, layers: &[PathBuf]) -> Vec<String> {
    if let Some((parent, lowers)) = shared_lowers(layers) {
        attach_host(plan, parent, true, IMAGE_LAYERS_SHARED);
        return lowers;
    }
    let mut lowers = Vec::with_capacity(layers.len());
    for (i, layer) in layers.iter().enumerate() {
        let at = format!("{IMAGE_LAYERS}/{i}");
        attach_host(plan, layer, true, &at);
        lowers.push(at);
    }
    lowers
}

/// Captures the host's `host` (read-only if asked) and attaches it at `at`, a new directory
/// of the stage.
fn attach_host(plan: &mut SetupPlan, host: &Path, readonly: bool, at: &str) {
    plan.sources.push(Source {
        host: cstring(host.as_os_str().as_bytes()),
        readonly,
        staged: false,
    });
    plan.ops.push(Op::Mkdir {
        path: cstring(at.as_bytes()),
        mode: 0o700,
    });
    plan.ops.push(Op::Attach {
        source: plan.sources.len() - 1,
        target: cstring(at.as_bytes()),
    });
}

/// Where the layers' shared attachment goes.
const IMAGE_LAYERS_SHARED: &str = ".i/s";

/// The overlay's lower paths through one shared attachment stay under this many bytes (the
/// kernel takes a page of mount options, which the upper, work and flags share).
const SHARED_LOWERS_MAX: usize = 3072;

/// The layers' common grandparent (not `/` or a top-level directory) and each layer's path
/// under [`IMAGE_LAYERS_SHARED`], when every layer has it and the paths are ones overlayfs's
/// option syntax takes as they are (no `:`, `,` or `\\`) and short enough.
fn shared_lowers(layers: &[PathBuf]) -> Option<(&Path, Vec<String>)> {
    let grandparent = layers.first()?.parent()?.parent()?;
    if grandparent.components().count() < 3 {
        return None;
    }
    let mut lowers = Vec::with_capacity(layers.len());
    let mut length = 0;
    for layer in layers {
        if layer.parent()?.parent()? != grandparent {
            return None;
        }
        let rel = layer.strip_prefix(grandparent).ok()?.to_str()?;
        if rel.contains([':', ',', '\\']) || rel.split('/').any(|c| c == ".." || c == ".") {
            return None;
        }
        let at = format!("{IMAGE_LAYERS_SHARED}/{rel}");
        length += at.len() + 1;
        lowers.push(at);
    }
    (length <= SHARED_LOWERS_MAX).then_some((grandparent, lowers))
}

/// An image root (issue 29): the sandbox's `/` is an overlay of the image's layers
/// (read-only lowers, attached like a view's, never copied) with an upper layer on a
/// tmpfs of its own, bounded like `/tmp` ([`scratch_options`]: `--max-memory`, else half
/// of RAM, and the inode bound), so its writes cost memory the sandbox is allowed and
/// vanish with it.
///
/// The image is untrusted: its symlinks (`/etc/resolv.conf -> ../run/...`, or a hostile
/// `/home -> ../../..`) must never be followed while the host's tree is reachable. So the
/// overlay is mounted on the stage (paths of lockbox's own), `pivot_root` goes straight
/// into it, and the old root is detached before any path inside the image is used: every
/// mount into the image root is made from there on, by descriptor or by a path that can
/// only resolve within the image. `/proc` cannot be mounted once the host's `/proc` is
/// gone (the kernel wants a fully visible instance in the mount namespace), so it and
/// `/dev` (which needs `/dev/null` for the masks of `/proc`) are built on the stage and
/// captured ([`Op::Capture`]), as are lockbox's `/etc` files (read-only, bound over the
/// image's: writes to them fail; a kept upper still gets the empty files mounted over,
/// which its caller removes before it keeps the layer).
fn image_stage(
    plan: &mut SetupPlan,
    resolved: &Resolved,
    image: &crate::resolve::ResolvedImage,
) -> Staged {
    let layers = &image.layers;
    plan.root_writable = true;
    tmpfs(plan, IMAGE_LAYERS, "mode=0700,size=4k");
    let lowers = attach_layers(plan, layers);
    let writes = match &image.upper {
        None => {
            let inodes = resolved.scratch_inodes.max(1);
            let upper_options = match resolved.scratch_size {
                Some(bytes) => format!("mode=0700,size={bytes},nr_inodes={inodes}"),
                None => format!("mode=0700,nr_inodes={inodes}"),
            };
            tmpfs(plan, IMAGE_UPPER, &upper_options);
            plan.ops.push(Op::Mkdir {
                path: cstring(format!("{IMAGE_UPPER}/upper").as_bytes()),
                mode: 0o755,
            });
            plan.ops.push(Op::Mkdir {
                path: cstring(format!("{IMAGE_UPPER}/work").as_bytes()),
                mode: 0o700,
            });
            format!("upperdir={IMAGE_UPPER}/upper,workdir={IMAGE_UPPER}/work")
        }
        Some(upper) => {
            // On the host (an image build's next layer): their common parent is attached,
            // as a view's upper is, and the mount is `volatile` as a view's (see `overlay`).
            attach_host(plan, &upper.parent, false, IMAGE_UPPER);
            format!(
                "upperdir={IMAGE_UPPER}/{},workdir={IMAGE_UPPER}/{},volatile",
                upper.upper_name, upper.work_name
            )
        }
    };
    plan.ops.push(Op::Mkdir {
        path: cstring(IMAGE_ROOT.as_bytes()),
        mode: 0o755,
    });
    // `userxattr`: the layers' opaque markers are `user.overlay.opaque` (the only kind an
    // unprivileged unpacker can write), and an unprivileged mount takes no other.
    plan.ops.push(Op::Mount {
        source: cstring(b"overlay"),
        target: cstring(IMAGE_ROOT.as_bytes()),
        fstype: cstring(b"overlay"),
        flags: NOSUID_NODEV,
        data: cstring(format!("lowerdir={},{writes},userxattr", lowers.join(":")).as_bytes()),
    });
    let capture = |plan: &mut SetupPlan, path: &str| {
        plan.sources.push(Source {
            host: cstring(path.as_bytes()),
            readonly: false,
            staged: true,
        });
        let source = plan.sources.len() - 1;
        plan.ops.push(Op::Capture {
            path: cstring(path.as_bytes()),
            source,
        });
        source
    };
    dev(plan, resolved);
    let dev = capture(plan, "dev");
    proc(plan);
    // Landlock's rule for the whole root reaches into /proc (see `RuleAccess::ImageRoot`),
    // so the mount itself says what Landlock says of a plain sandbox's /proc: read only.
    // (Writes through /proc/self/fd/N are the target's, on its own mount.)
    plan.ops.push(Op::SetReadonly {
        path: cstring(b"proc"),
    });
    let proc = capture(plan, "proc");
    tmpfs(plan, IMAGE_ETC, "mode=0755,size=64k");
    let mut dirs: Vec<&Path> = resolved
        .etc_files
        .iter()
        .flat_map(|(name, _)| Path::new(name).ancestors().skip(1))
        .filter(|p| !p.as_os_str().is_empty())
        .collect();
    dirs.sort();
    dirs.dedup();
    for dir in dirs {
        plan.ops.push(Op::Mkdir {
            path: cstring(Path::new(IMAGE_ETC).join(dir).as_os_str().as_bytes()),
            mode: 0o755,
        });
    }
    for (name, data) in &resolved.etc_files {
        plan.ops.push(Op::WriteFile {
            path: cstring(format!("{IMAGE_ETC}/{name}").as_bytes()),
            data: data.clone(),
        });
    }
    plan.ops.push(Op::SetReadonly {
        path: cstring(IMAGE_ETC.as_bytes()),
    });
    let etc = capture(plan, IMAGE_ETC);
    plan.ops.push(Op::ChangeDir {
        path: cstring(IMAGE_ROOT.as_bytes()),
    });
    plan.ops.push(Op::EnterRoot);
    Staged { dev, proc, etc }
}

/// lockbox's `/etc` files in an image root: each bound (read-only) over the image's file
/// of that name, which is created first if the image lacks it, from the captured tmpfs
/// `source` (attached for the while at [`IMAGE_ETC`] in the image root).
fn etc_files(plan: &mut SetupPlan, resolved: &Resolved, source: usize) {
    plan.ops.push(Op::Mkdir {
        path: cstring(b"etc"),
        mode: 0o755,
    });
    plan.ops.push(Op::Mkdir {
        path: cstring(IMAGE_ETC.as_bytes()),
        mode: 0o700,
    });
    plan.ops.push(Op::Attach {
        source,
        target: cstring(IMAGE_ETC.as_bytes()),
    });
    let mut made: Vec<&Path> = Vec::new();
    for (name, _) in &resolved.etc_files {
        let mut parents: Vec<&Path> = Path::new(name)
            .ancestors()
            .skip(1)
            .filter(|p| !p.as_os_str().is_empty())
            .collect();
        parents.reverse();
        for dir in parents {
            if !made.contains(&dir) {
                made.push(dir);
                plan.ops.push(Op::Mkdir {
                    path: cstring(Path::new("etc").join(dir).as_os_str().as_bytes()),
                    mode: 0o755,
                });
            }
        }
        let path = cstring(format!("etc/{name}").as_bytes());
        plan.ops.push(Op::Touch { path: path.clone() });
        plan.ops.push(Op::CoverWith {
            with: cstring(format!("{IMAGE_ETC}/{name}").as_bytes()),
            path,
        });
    }
    plan.ops.push(Op::Umount {
        path: cstring(IMAGE_ETC.as_bytes()),
    });
    plan.ops.push(Op::Rmdir {
        path: cstring(IMAGE_ETC.as_bytes()),
    });
}

/// Ends the root's construction on the stage: [`Op::EnterRoot`], then the clean-up that
/// waits until inside (`inside`: unmounting lockbox's own scaffolding).
fn enter_root(plan: &mut SetupPlan, inside: &mut Vec<Op>) {
    plan.ops.push(Op::EnterRoot);
    plan.ops.append(inside);
}

/// Builds the plan of a sandbox that runs `later` more commands after its first, one after
/// another, on the same views ([`crate::Spawn::sequence`]): the plan of a gated sandbox,
/// and for each later command a [`StepPlan`] that renews the scratch tmpfs mounts. Pure:
/// no syscalls.
pub fn build_sequence(resolved: &Resolved, later: usize) -> SetupPlan {
    let mut plan = build(resolved);
    plan.insert_gate();
    if later > 0 {
        let ops = plan.scratch_resets();
        plan.steps = vec![StepPlan { ops }; later];
    }
    plan
}

/// A plan split for a root template (`crate::template`): what is built once and then
/// shared, read-only, by every sandbox whose mount namespace is a copy of the template's,
/// and what each sandbox mounts afresh in its copy. Copying a namespace shares the
/// filesystems mounted in it, so everything a sandbox may write, or that shows its own
/// processes, is its own: `/proc`, the scratch tmpfs mounts (`/tmp` unless granted,
/// `/dev/shm`) and the terminals' `devpts`, with what lies inside them.
#[derive(Debug, Clone)]
pub struct TemplateSplit {
    /// Built once: the plan less the sandbox's own mounts, with a bare `/proc` kept (a
    /// user namespace may mount a procfs only where one is already fully visible).
    pub shared: SetupPlan,
    /// Indices into the whole plan's ops of what each sandbox carries out in its copy, in
    /// order, from `/` (the paths are the stage's, which are the root's).
    pub instance: Vec<usize>,
}

/// The stage-relative path an op works on (creates, writes, mounts at, enters), if any.
fn op_path(op: &Op) -> Option<&CString> {
    match op {
        Op::Mkdir { path, .. }
        | Op::Touch { path }
        | Op::Symlink { path, .. }
        | Op::WriteFile { path, .. }
        | Op::Whiteout { path }
        | Op::SetReadonly { path }
        | Op::Umount { path }
        | Op::Rmdir { path }
        | Op::Capture { path, .. }
        | Op::ChangeDir { path }
        | Op::OwnBootId { path, .. } => Some(path),
        Op::LimitUserQuotas { proc } => Some(proc),
        op => mount_target(op),
    }
}

impl SetupPlan {
    /// Where [`Op::EnterRoot`] is: the ops before it build the root on the stage, those
    /// after it run inside.
    pub(crate) fn enter_root_at(&self) -> Option<usize> {
        self.ops.iter().position(|op| matches!(op, Op::EnterRoot))
    }

    /// Splits the plan for a root template, or `None` where a template cannot serve it:
    /// an image root (writable), copy-on-write views (an upper directory per run), gates
    /// and sequences, or a mount of a kind not known to be safe to share.
    pub fn template_split(&self) -> Option<TemplateSplit> {
        if self.root_writable
            || !self.overlays.is_empty()
            || self.views_from.is_some()
            || !self.steps.is_empty()
        {
            return None;
        }
        let root_at = self.enter_root_at()?;
        let own: Vec<&CString> = self
            .ops
            .iter()
            .filter_map(|op| match op {
                Op::Mount { target, fstype, .. }
                    if matches!(fstype.as_bytes(), b"proc" | b"devpts") =>
                {
                    Some(target)
                }
                _ => None,
            })
            .chain(self.scratch.iter().filter_map(mount_target))
            .collect();
        let mut shared = Vec::with_capacity(self.ops.len());
        let mut instance = Vec::new();
        for (i, op) in self.ops.iter().enumerate() {
            match op {
                Op::Gate
                | Op::HandOver { .. }
                | Op::Renew { .. }
                | Op::Capture { .. }
                | Op::ChangeDir { .. } => return None,
                Op::Mount { fstype, flags, .. } => match fstype.as_bytes() {
                    b"tmpfs" | b"proc" | b"devpts" => {}
                    b"overlay" if flags & libc::MS_RDONLY != 0 => {}
                    _ => return None,
                },
                _ => {}
            }
            if i > root_at && !matches!(op, Op::Umount { .. } | Op::Rmdir { .. }) {
                return None;
            }
            let Some(path) = op_path(op) else {
                shared.push(op.clone());
                continue;
            };
            let is_own_mount = own.contains(&path) && mount_target(op) == Some(path);
            let below_own = own.iter().any(|dir| at_or_below(path, dir) && path != *dir);
            if is_own_mount {
                instance.push(i);
                if matches!(op, Op::Mount { fstype, .. } if fstype.as_bytes() == b"proc") {
                    shared.push(op.clone());
                }
            } else if below_own || matches!(op, Op::LimitUserQuotas { .. }) {
                if matches!(op, Op::Attach { .. }) || i > root_at {
                    // A host tree inside a sandbox's own mount: it cannot be captured from
                    // the template's copy, which no longer sees the host.
                    return None;
                }
                instance.push(i);
            } else if own.contains(&path) && !matches!(op, Op::Mkdir { .. }) {
                return None;
            } else {
                shared.push(op.clone());
            }
        }
        Some(TemplateSplit {
            shared: SetupPlan {
                ops: shared,
                ..self.clone()
            },
            instance,
        })
    }
}

/// Where an op mounts something, if it does.
fn mount_target(op: &Op) -> Option<&CString> {
    match op {
        Op::Mount { target, .. } | Op::Attach { target, .. } => Some(target),
        Op::CoverWith { path, .. } | Op::CoverReadonly { path, .. } => Some(path),
        _ => None,
    }
}

/// Whether stage-relative `path` is `dir` or lies below it.
fn at_or_below(path: &CString, dir: &CString) -> bool {
    let (path, dir) = (path.as_bytes(), dir.as_bytes());
    path.strip_prefix(dir)
        .is_some_and(|rest| rest.is_empty() || rest.starts_with(b"/"))
}

impl SetupPlan {
    /// Ops that give a later command of a sequence fresh scratch tmpfs mounts, unless
    /// something else of the root (a grant, a view) lies inside one.
    fn scratch_resets(&self) -> Vec<Op> {
        let path_of = |op: &Op| match op {
            Op::Mkdir { path, .. }
            | Op::Touch { path }
            | Op::Symlink { path, .. }
            | Op::WriteFile { path, .. }
            | Op::Whiteout { path } => Some(path.clone()),
            op => mount_target(op).cloned(),
        };
        self.scratch
            .iter()
            .filter_map(|mount| {
                let target = mount_target(mount)?;
                let holds_more = self
                    .ops
                    .iter()
                    .filter_map(path_of)
                    .any(|p| p != *target && at_or_below(&p, target));
                (!holds_more).then(|| Op::Renew {
                    target: target.clone(),
                    mode: SCRATCH_MODE,
                    mount: Box::new(mount.clone()),
                })
            })
            .collect()
    }

    /// Inserts an [`Op::Gate`] right before the first copy-on-write view is mounted (its
    /// layers may still change until the go; attaching them before is fine), else after
    /// the last op. Everything before it is done ahead; the ops after it run after
    /// `pivot_root` (see `child`), which they can: they are the views' (`views_from`), which
    /// only use layers captured before and paths relative to the root.
    pub(crate) fn insert_gate(&mut self) {
        let at = match self.views_from {
            Some(from) => self.ops[from..]
                .iter()
                .position(
                    |op| matches!(op, Op::Mount { fstype, .. } if fstype.as_bytes() == b"overlay"),
                )
                .map_or(from, |i| from + i),
            None => self.ops.len(),
        };
        self.ops.insert(at, Op::Gate);
    }
}

/// Where [`add_helper`] binds a host executable: in lockbox's own `/dev` tmpfs, which no
/// policy can grant from the host, so the bind never lands on a host directory.
pub const HELPER_PATH: &str = "/dev/.lockbox-agent";

/// Binds the host file `host` read-only at [`HELPER_PATH`], readable and executable under
/// Landlock (the long-lived sandbox's agent), while `/dev` is still writable.
fn add_helper(plan: &mut SetupPlan, host: &Path) {
    bind_file(plan, host, HELPER_PATH, true, RuleAccess::ReadFile);
}

/// Binds the host file `host` at `inside` (an absolute path in lockbox's own `/dev`
/// tmpfs, while it is still writable), with a Landlock rule of `access` for it.
fn bind_file(plan: &mut SetupPlan, host: &Path, inside: &str, readonly: bool, access: RuleAccess) {
    let rel = inside.trim_start_matches('/');
    plan.sources.push(Source {
        host: cstring(host.as_os_str().as_bytes()),
        readonly,
        staged: false,
    });
    plan.ops.push(Op::Touch {
        path: cstring(rel.as_bytes()),
    });
    plan.ops.push(Op::Attach {
        source: plan.sources.len() - 1,
        target: cstring(rel.as_bytes()),
    });
    plan.rules.push(Rule {
        path: cstring(inside.as_bytes()),
        access,
    });
}

/// Where overlay layers are attached while the overlay is mounted (relative to the stage).
const LAYERS: &str = ".lockbox-layers";

/// A copy-on-write view. Each layer is captured like a bind source and attached under
/// [`LAYERS`], because overlayfs only takes layers from the mount namespace that mounts it;
/// once the overlay is mounted (it keeps private clones of its layers) they are detached.
/// overlayfs needs two lower layers when it has no upper one, so a read-only view of a
/// single directory is a read-only bind instead.
fn overlay(plan: &mut SetupPlan, o: &crate::resolve::ResolvedOverlay, index: usize, rel: CString) {
    plan.ops.push(Op::Mkdir {
        path: rel.clone(),
        mode: 0o755,
    });
    // A restricted view is read-only under Landlock except below its writable paths (rules
    // add up along the path, so Full on `web/` under Read on the view writes only there).
    let whole_view_writable = o.upper.is_some() && o.writable.is_none();
    plan.rules.push(Rule {
        path: cstring(o.target.as_os_str().as_bytes()),
        access: if whole_view_writable {
            RuleAccess::Full
        } else {
            RuleAccess::Read
        },
    });
    for path in o.writable.iter().flatten() {
        plan.rules.push(Rule {
            path: cstring(path.as_os_str().as_bytes()),
            access: RuleAccess::Full,
        });
    }
    if o.upper.is_none() && o.lowers.len() == 1 {
        plan.sources.push(Source {
            host: cstring(o.lowers[0].as_os_str().as_bytes()),
            readonly: true,
            staged: false,
        });
        plan.ops.push(Op::Attach {
            source: plan.sources.len() - 1,
            target: rel,
        });
        return;
    }
    // The layers are attached inside a tmpfs of their own, so that one (lazy) unmount of it
    // detaches them all: each unmount waits for an RCU grace period.
    tmpfs(plan, LAYERS, "mode=0700,size=4k");
    let attach = |plan: &mut SetupPlan, host: &Path, readonly: bool| -> String {
        plan.sources.push(Source {
            host: cstring(host.as_os_str().as_bytes()),
            readonly,
            staged: false,
        });
        let at = format!("{LAYERS}/{}", plan.sources.len() - 1);
        plan.ops.push(Op::Mkdir {
            path: cstring(at.as_bytes()),
            mode: 0o700,
        });
        plan.ops.push(Op::Attach {
            source: plan.sources.len() - 1,
            target: cstring(at.as_bytes()),
        });
        at
    };
    let lowers: Vec<String> = o.lowers.iter().map(|l| attach(plan, l, true)).collect();
    let mut data = format!("lowerdir={}", lowers.join(":"));
    let mut bounded = None;
    if let Some((upper, bound)) = o.upper.as_ref().and_then(|u| Some((u, u.bound?))) {
        // A tmpfs of the given size holds upper and work; handed to lockbox afterwards. Its
        // inode bound counts what `size` does not (directories, empty files, short
        // symlinks, hard links), all of which lockbox later stores on the host's disk.
        let at = format!(".lockbox-upper-{index}");
        tmpfs(
            plan,
            &at,
            &format!("size={},nr_inodes={},mode=0700", bound.bytes, bound.inodes),
        );
        plan.ops.push(Op::Mkdir {
            path: cstring(format!("{at}/upper").as_bytes()),
            mode: upper.mode,
        });
        plan.ops.push(Op::Mkdir {
            path: cstring(format!("{at}/work").as_bytes()),
            mode: 0o700,
        });
        data.push_str(&format!(",upperdir={at}/upper,workdir={at}/work"));
        bounded = Some(at);
    } else if let Some(upper) = &o.upper {
        // upper and work must be on one mount: attach their common parent.
        let at = attach(plan, &upper.parent, false);
        data.push_str(&format!(
            ",upperdir={at}/{},workdir={at}/{}",
            upper.upper_name, upper.work_name
        ));
    }
    // Unprivileged overlays keep their metadata in user.* xattrs (Linux >= 5.11).
    data.push_str(",userxattr");
    // An upper layer is lockbox's to make durable (a kept branch is synced, a commit fsyncs
    // what it stages): without `volatile`, unmounting the view (the sandbox's end) syncs the
    // whole host filesystem of the upper, and a sandboxed fsync() does the same.
    if o.upper.as_ref().is_some_and(|u| u.bound.is_none()) {
        data.push_str(",volatile");
    }
    plan.ops.push(Op::Mount {
        source: cstring(b"overlay"),
        target: rel.clone(),
        fstype: cstring(b"overlay"),
        flags: NOSUID_NODEV,
        data: cstring(data.as_bytes()),
    });
    // Writable directories the view lacks: made now, through the overlay, so they land in
    // the upper layer and the Landlock rules below them have something to hold on to.
    for dir in &o.create {
        plan.ops.push(Op::Mkdir {
            path: relative(dir),
            mode: 0o755,
        });
    }
    // The restriction itself: each writable directory becomes a bind mount of itself, then
    // the view's own mount is made read-only (not recursively, so the binds stay writable).
    // Writes elsewhere, chmod and utimes included, fail with EROFS — whatever Landlock
    // allows above the view (the private /tmp, a -w grant), and on kernels without Landlock.
    if let Some(writable) = &o.writable {
        for path in writable {
            plan.ops.push(Op::CoverWith {
                with: relative(path),
                path: relative(path),
            });
        }
        plan.ops.push(Op::SetReadonly { path: rel.clone() });
    }
    let mut detach = vec![LAYERS.to_owned()];
    if let Some(at) = bounded {
        plan.ops.push(Op::HandOver {
            path: cstring(at.as_bytes()),
            overlay: index,
        });
        detach.push(at);
    }
    for at in detach {
        plan.ops.push(Op::Umount {
            path: cstring(at.as_bytes()),
        });
        plan.ops.push(Op::Rmdir {
            path: cstring(at.as_bytes()),
        });
    }
}

/// The grants that need a mount of their own: a grant inside another with the same access
/// is already visible through it (binds are recursive), e.g. `/usr/bin` (the target of the
/// `/bin` symlink on merged-/usr systems) inside `/usr`. A grant inside one with different
/// access (a read-only directory inside a writable one) keeps its own mount.
fn needed_grants(grants: &[crate::resolve::Grant]) -> Vec<&crate::resolve::Grant> {
    let mut sorted: Vec<&crate::resolve::Grant> = grants.iter().collect();
    sorted.sort_by(|a, b| a.path.cmp(&b.path));
    let mut kept: Vec<&crate::resolve::Grant> = Vec::new();
    for grant in sorted {
        // Sorted by path, so the nearest enclosing grant is the last kept ancestor.
        let nearest = kept.iter().rev().find(|k| grant.path.starts_with(&k.path));
        if nearest.is_none_or(|k| k.access != grant.access) {
            kept.push(grant);
        }
    }
    kept
}

fn ensure_parents(plan: &mut SetupPlan, made: &mut Vec<PathBuf>, path: &Path) {
    let mut ancestors: Vec<&Path> = path
        .ancestors()
        .skip(1)
        .filter(|a| *a != Path::new("/"))
        .collect();
    ancestors.reverse();
    for dir in ancestors {
        if !made.iter().any(|m| m == dir) {
            made.push(dir.to_owned());
            plan.ops.push(Op::Mkdir {
                path: relative(dir),
                mode: 0o755,
            });
        }
    }
    made.push(path.to_owned());
}

fn tmpfs(plan: &mut SetupPlan, rel: &str, data: &str) {
    plan.ops.push(Op::Mkdir {
        path: cstring(rel.as_bytes()),
        mode: 0o755,
    });
    plan.ops.push(Op::Mount {
        source: cstring(b"tmpfs"),
        target: cstring(rel.as_bytes()),
        fstype: cstring(b"tmpfs"),
        flags: NOSUID_NODEV,
        data: cstring(data.as_bytes()),
    });
}

/// Mount options of the sandbox's own writable tmpfs mounts: bounded by `--max-memory` when
/// set (otherwise the kernel's default, half of RAM). Without a memory cgroup, `RLIMIT_AS`
/// does not count tmpfs files, so this bound is what keeps `/tmp` from taking host memory.
///
/// `size` does not count directories, empty files, short symlinks or hard links, each of
/// which pins about 1 KiB of kernel memory: `nr_inodes` bounds them (0 would mean no bound
/// to the kernel, so it is never written).
fn scratch_options(resolved: &Resolved) -> String {
    let inodes = resolved.scratch_inodes.max(1);
    match resolved.scratch_size {
        Some(bytes) => format!("mode={SCRATCH_MODE:o},size={bytes},nr_inodes={inodes}"),
        None => format!("mode={SCRATCH_MODE:o},nr_inodes={inodes}"),
    }
}

/// The permission bits of the sandbox's own scratch tmpfs mounts.
const SCRATCH_MODE: u32 = 0o1777;

/// A minimal /dev: a tmpfs with the host's harmless character devices bound in, a private
/// devpts instance (so the sandbox cannot reach the host's terminals by name), /dev/shm.
fn dev(plan: &mut SetupPlan, resolved: &Resolved) {
    tmpfs(plan, "dev", "mode=0755,size=64k");
    plan.rules.push(Rule {
        path: cstring(b"/dev"),
        access: RuleAccess::ListDir,
    });
    for name in &resolved.devices {
        let rel = format!("dev/{name}");
        plan.sources.push(Source {
            host: cstring(format!("/dev/{name}").as_bytes()),
            readonly: false,
            staged: false,
        });
        plan.ops.push(Op::Touch {
            path: cstring(rel.as_bytes()),
        });
        plan.ops.push(Op::Attach {
            source: plan.sources.len() - 1,
            target: cstring(rel.as_bytes()),
        });
        plan.rules.push(Rule {
            path: cstring(format!("/{rel}").as_bytes()),
            access: RuleAccess::Device,
        });
    }
    if let Some(host) = &resolved.terminal {
        // The caller's terminal, already open on the sandbox's stdio, gets a name for
        // `ttyname()` (see `resolve::terminal`).
        let inside = crate::resolve::TERMINAL_PATH;
        bind_file(plan, host, inside, false, RuleAccess::Device);
    }
    if let Some(host) = &resolved.helper {
        add_helper(plan, host);
    }
    if let Some(loader) = &resolved.helper_loader {
        use crate::loader::{LIB_DIR, LOADER_PATH};
        bind_file(
            plan,
            &loader.loader,
            LOADER_PATH,
            true,
            RuleAccess::ReadFile,
        );
        plan.ops.push(Op::Mkdir {
            path: cstring(LIB_DIR.trim_start_matches('/').as_bytes()),
            mode: 0o755,
        });
        for (name, host) in &loader.libs {
            bind_file(
                plan,
                host,
                &format!("{LIB_DIR}/{name}"),
                true,
                RuleAccess::ReadFile,
            );
        }
    }
    plan.ops.push(Op::Mkdir {
        path: cstring(b"dev/pts"),
        mode: 0o755,
    });
    plan.ops.push(Op::Mount {
        source: cstring(b"devpts"),
        target: cstring(b"dev/pts"),
        fstype: cstring(b"devpts"),
        flags: libc::MS_NOSUID | libc::MS_NOEXEC,
        // `max`: the sandbox's share of the pseudo-terminals all instances draw from.
        data: cstring(
            format!(
                "newinstance,ptmxmode=0666,mode=620,max={}",
                resolved.ptys.max(1)
            )
            .as_bytes(),
        ),
    });
    plan.rules.push(Rule {
        path: cstring(b"/dev/pts"),
        access: RuleAccess::DeviceDir,
    });
    tmpfs(plan, "dev/shm", &scratch_options(resolved));
    plan.scratch.extend(plan.ops.last().cloned());
    plan.rules.push(Rule {
        path: cstring(b"/dev/shm"),
        access: RuleAccess::Full,
    });
    for (target, link) in [
        ("pts/ptmx", "dev/ptmx"),
        ("/proc/self/fd", "dev/fd"),
        ("/proc/self/fd/0", "dev/stdin"),
        ("/proc/self/fd/1", "dev/stdout"),
        ("/proc/self/fd/2", "dev/stderr"),
    ] {
        plan.ops.push(Op::Symlink {
            target: cstring(target.as_bytes()),
            path: cstring(link.as_bytes()),
        });
    }
    plan.ops.push(Op::SetReadonly {
        path: cstring(b"dev"),
    });
}

/// A fresh /proc for the sandbox's pid namespace, with host-wide knobs read-only or masked.
fn proc(plan: &mut SetupPlan) {
    plan.ops.push(Op::Mkdir {
        path: cstring(b"proc"),
        mode: 0o555,
    });
    plan.ops.push(Op::Mount {
        source: cstring(b"proc"),
        target: cstring(b"proc"),
        fstype: cstring(b"proc"),
        flags: NOSUID_NODEV | libc::MS_NOEXEC,
        data: cstring(b""),
    });
    // Before `sys` is made read-only below.
    plan.ops.push(Op::LimitUserQuotas {
        proc: cstring(b"proc"),
    });
    for name in PROC_READONLY {
        plan.ops.push(Op::CoverReadonly {
            path: cstring(format!("proc/{name}").as_bytes()),
            optional: true,
        });
    }
    for name in PROC_MASKED {
        plan.ops.push(Op::CoverWith {
            with: cstring(b"dev/null"),
            path: cstring(format!("proc/{name}").as_bytes()),
        });
    }
    // `/dev/shm` (a fresh tmpfs, built before `/proc`; `/dev` itself is read-only by now)
    // holds the file for a moment.
    plan.ops.push(Op::OwnBootId {
        scratch: cstring(b"dev/shm/.lockbox-boot_id"),
        path: cstring(b"proc/sys/kernel/random/boot_id"),
    });
    plan.rules.push(Rule {
        path: cstring(b"/proc"),
        access: RuleAccess::Read,
    });
}

/// The host's /etc through a read-only overlay whose top layer (a small tmpfs) holds
/// whiteouts for the secrets, so they do not exist inside, plus lockbox's own files
/// (hostname, hosts). The top layer's mount goes once inside (`inside`; the overlay keeps it).
fn etc(plan: &mut SetupPlan, resolved: &Resolved, inside: &mut Vec<Op>) {
    const TOP: &str = ".lockbox-etc";
    tmpfs(plan, TOP, "mode=0755");
    let hidden = resolved.etc_hidden.as_deref().unwrap_or_default();
    // Every directory above a hidden entry or a written file (`ssl/certs/...`); the sort
    // puts parents first (`ssl` before `ssl/certs`).
    let entries: Vec<&Path> = hidden
        .iter()
        .map(PathBuf::as_path)
        .chain(resolved.etc_files.iter().map(|(name, _)| Path::new(name)))
        .collect();
    let mut dirs: Vec<&Path> = entries
        .iter()
        .flat_map(|e| e.ancestors().skip(1))
        .filter(|p| !p.as_os_str().is_empty())
        .collect();
    dirs.sort();
    dirs.dedup();
    for dir in dirs {
        plan.ops.push(Op::Mkdir {
            path: cstring(Path::new(TOP).join(dir).as_os_str().as_bytes()),
            mode: 0o755,
        });
    }
    for entry in hidden {
        plan.ops.push(Op::Whiteout {
            path: cstring(Path::new(TOP).join(entry).as_os_str().as_bytes()),
        });
    }
    for (name, data) in &resolved.etc_files {
        plan.ops.push(Op::WriteFile {
            path: cstring(format!("{TOP}/{name}").as_bytes()),
            data: data.clone(),
        });
    }
    plan.ops.push(Op::Mkdir {
        path: cstring(b"etc"),
        mode: 0o755,
    });
    plan.ops.push(Op::Mount {
        source: cstring(b"overlay"),
        target: cstring(b"etc"),
        fstype: cstring(b"overlay"),
        flags: NOSUID_NODEV | libc::MS_RDONLY,
        data: cstring(format!("lowerdir={TOP}:/etc,userxattr").as_bytes()),
    });
    inside.push(Op::Umount {
        path: cstring(TOP.as_bytes()),
    });
    inside.push(Op::Rmdir {
        path: cstring(TOP.as_bytes()),
    });
    plan.rules.push(Rule {
        path: cstring(b"/etc"),
        access: RuleAccess::Read,
    });
}

fn relative(path: &Path) -> CString {
    let bytes = path.as_os_str().as_bytes();
    cstring(bytes.strip_prefix(b"/").unwrap_or(bytes))
}

/// Paths come from `Path`s and literals, which hold no NUL bytes except by a bug upstream;
/// such a byte is dropped rather than panicking.
pub(crate) fn cstring(bytes: &[u8]) -> CString {
    CString::new(
        bytes
            .iter()
            .copied()
            .filter(|b| *b != 0)
            .collect::<Vec<u8>>(),
    )
    .unwrap_or_default()
}

impl fmt::Display for Op {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let p = |c: &CString| format!("/{}", c.to_string_lossy());
        match self {
            Op::Mkdir { path, mode } => write!(f, "mkdir {} (mode {mode:o})", p(path)),
            Op::Touch { path } => write!(f, "create mount point {}", p(path)),
            Op::Symlink { target, path } => {
                write!(f, "symlink {} -> {}", p(path), target.to_string_lossy())
            }
            Op::WriteFile { path, data } => write!(f, "write {} ({} bytes)", p(path), data.len()),
            Op::Whiteout { path } => write!(f, "hide {}", p(path)),
            Op::Attach { source, target } => write!(f, "bind source #{source} at {}", p(target)),
            Op::Mount {
                fstype,
                target,
                data,
                flags,
                ..
            } => {
                let ro = if flags & libc::MS_RDONLY != 0 {
                    " read-only"
                } else {
                    ""
                };
                write!(
                    f,
                    "mount {}{ro} on {} ({})",
                    fstype.to_string_lossy(),
                    p(target),
                    data.to_string_lossy()
                )
            }
            Op::HandOver { path, overlay } => {
                write!(
                    f,
                    "hand {} (overlay #{overlay}'s upper) to lockbox",
                    p(path)
                )
            }
            Op::CoverReadonly { path, .. } => write!(f, "make {} read-only", p(path)),
            Op::CoverWith { with, path } => write!(f, "mask {} with {}", p(path), p(with)),
            Op::SetReadonly { path } => write!(f, "make mount {} read-only", p(path)),
            Op::Umount { path } => write!(f, "unmount {}", p(path)),
            Op::Renew { target, mount, .. } => {
                write!(
                    f,
                    "unless untouched, replace {} by a new {mount}",
                    p(target)
                )
            }
            Op::Rmdir { path } => write!(f, "remove {}", p(path)),
            Op::LimitUserQuotas { proc } => write!(
                f,
                "limit the sandbox's per-user quotas through {}/sys/user",
                p(proc)
            ),
            Op::OwnBootId { path, .. } => {
                write!(f, "give the sandbox a fresh boot id at {}", p(path))
            }
            Op::Gate => write!(f, "wait for the go of lockbox"),
            Op::Capture { path, source } => write!(
                f,
                "keep a copy of the mounts at {} as source #{source}",
                p(path)
            ),
            Op::ChangeDir { path } => write!(
                f,
                "enter the image root at {} (pivot_root makes it /; nothing of the image is used before the host's tree is detached)",
                p(path)
            ),
            Op::EnterRoot => write!(f, "pivot_root into the new root"),
        }
    }
}

impl fmt::Display for SetupPlan {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (i, s) in self.sources.iter().enumerate() {
            let mode = if s.readonly {
                "read-only"
            } else {
                "read-write"
            };
            if s.staged {
                writeln!(
                    f,
                    "source #{i}: lockbox's /{} on the stage (captured before pivot_root)",
                    s.host.to_string_lossy()
                )?;
                continue;
            }
            writeln!(f, "source #{i}: {} ({mode})", s.host.to_string_lossy())?;
        }
        for op in &self.ops {
            writeln!(f, "{op}")?;
        }
        for rule in &self.rules {
            writeln!(
                f,
                "landlock: {:?} beneath {}",
                rule.access,
                rule.path.to_string_lossy()
            )?;
        }
        for (i, o) in self.overlays.iter().enumerate() {
            let lowers: Vec<_> = o.lowers.iter().map(|l| l.display().to_string()).collect();
            write!(f, "overlay #{i}: lower {}", lowers.join(":"))?;
            match &o.upper {
                Some(u) => write!(f, ", upper {}", u.parent.join(&u.upper_name).display())?,
                None => write!(f, ", read-only")?,
            }
            match &o.writable {
                Some(w) if w.is_empty() => writeln!(f, ", nothing writable")?,
                Some(w) => {
                    let w: Vec<_> = w.iter().map(|p| p.display().to_string()).collect();
                    writeln!(f, ", writable only below {}", w.join(", "))?
                }
                None => writeln!(f)?,
            }
        }
        for line in &self.net {
            writeln!(f, "network: {line}")?;
        }
        write!(f, "cwd: {}", self.cwd.to_string_lossy())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::resolve::Grant;

    fn grant(path: &str, access: Access) -> Grant {
        Grant {
            path: path.into(),
            is_dir: true,
            access,
        }
    }

    fn resolved(grants: Vec<Grant>) -> Resolved {
        Resolved {
            grants,
            devices: vec!["null"],
            cwd: "/".into(),
            scratch_inodes: lockbox_policy::DEFAULT_TMPFS_INODES,
            ptys: 768,
            ..Resolved::default()
        }
    }

    #[test]
    fn the_helper_is_bound_read_only_and_executable_in_dev() {
        let mut r = resolved(vec![]);
        r.helper = Some("/opt/lockbox/bin/lockbox".into());
        let plan = build(&r);
        assert!(attach_targets(&plan).contains(&"dev/.lockbox-agent".to_owned()));
        let src = plan
            .sources
            .iter()
            .find(|s| s.host.as_bytes() == b"/opt/lockbox/bin/lockbox");
        assert!(src.is_some_and(|s| s.readonly));
        assert!(plan.rules.iter().any(
            |r| r.path.as_bytes() == HELPER_PATH.as_bytes() && r.access == RuleAccess::ReadFile
        ));
    }

    #[test]
    fn an_image_roots_agent_gets_the_hosts_loader_and_libraries_read_only_in_dev() {
        let mut r = resolved(vec![]);
        r.helper = Some("/opt/lockbox/bin/lockbox".into());
        r.helper_loader = Some(crate::loader::AgentLoader {
            loader: "/lib64/ld-linux-x86-64.so.2".into(),
            libs: vec![("libc.so.6".into(), "/lib/x86_64-linux-gnu/libc.so.6".into())],
        });
        let plan = build(&r);
        let targets = attach_targets(&plan);
        assert!(
            targets.contains(&"dev/.lockbox-ld.so".to_owned()),
            "{targets:?}"
        );
        assert!(
            targets.contains(&"dev/.lockbox-lib/libc.so.6".to_owned()),
            "{targets:?}"
        );
        for host in [
            &b"/lib64/ld-linux-x86-64.so.2"[..],
            b"/lib/x86_64-linux-gnu/libc.so.6",
        ] {
            let src = plan.sources.iter().find(|s| s.host.as_bytes() == host);
            assert!(src.is_some_and(|s| s.readonly));
        }
    }

    #[test]
    fn files_written_deep_in_etc_get_their_directories_first() {
        let mut r = resolved(vec![]);
        r.etc_hidden = Some(vec!["ssl/private".into()]);
        r.etc_files = vec![("ssl/certs/ca-certificates.crt".into(), b"CA".to_vec())];
        let plan = build(&r);
        let at = |want: &str| {
            plan.ops.iter().position(|op| match op {
                Op::Mkdir { path, .. } | Op::WriteFile { path, .. } | Op::Whiteout { path } => {
                    path.as_bytes() == want.as_bytes()
                }
                _ => false,
            })
        };
        let ssl = at(".lockbox-etc/ssl").unwrap();
        let certs = at(".lockbox-etc/ssl/certs").unwrap();
        let file = at(".lockbox-etc/ssl/certs/ca-certificates.crt").unwrap();
        let hidden = at(".lockbox-etc/ssl/private").unwrap();
        assert!(ssl < certs && certs < file && ssl < hidden);
        // Neither the file nor the hidden entry is made a directory.
        let dirs = plan
            .ops
            .iter()
            .filter(|op| matches!(op, Op::Mkdir { path, .. } if path.as_bytes().ends_with(b".crt") || path.as_bytes().ends_with(b"private")))
            .count();
        assert_eq!(dirs, 0);
    }

    fn attach_targets(plan: &SetupPlan) -> Vec<String> {
        plan.ops
            .iter()
            .filter_map(|op| match op {
                Op::Attach { target, .. } => Some(target.to_string_lossy().into_owned()),
                _ => None,
            })
            .collect()
    }

    fn mount_data(plan: &SetupPlan, target: &str) -> Option<String> {
        plan.ops.iter().find_map(|op| match op {
            Op::Mount {
                target: t, data, ..
            } if t.to_bytes() == target.as_bytes() => Some(data.to_string_lossy().into_owned()),
            _ => None,
        })
    }

    #[test]
    fn tmp_and_dev_shm_are_bounded_in_inodes_and_by_max_memory_in_size() {
        let unbounded = build(&resolved(vec![]));
        for target in ["tmp", "dev/shm"] {
            assert_eq!(
                mount_data(&unbounded, target).as_deref(),
                Some("mode=1777,nr_inodes=262144"),
                "{target}"
            );
        }
        let bounded = build(&Resolved {
            scratch_size: Some(64 << 20),
            scratch_inodes: 65536,
            ..resolved(vec![])
        });
        for target in ["tmp", "dev/shm"] {
            assert_eq!(
                mount_data(&bounded, target).as_deref(),
                Some("mode=1777,size=67108864,nr_inodes=65536"),
                "{target}"
            );
        }
        let never_unlimited = build(&Resolved {
            scratch_inodes: 0,
            ..resolved(vec![])
        });
        assert_eq!(
            mount_data(&never_unlimited, "tmp").as_deref(),
            Some("mode=1777,nr_inodes=1")
        );
    }

    #[test]
    fn the_devpts_instance_holds_the_sandboxs_share_of_ptys() {
        let plan = build(&resolved(vec![]));
        assert_eq!(
            mount_data(&plan, "dev/pts").as_deref(),
            Some("newinstance,ptmxmode=0666,mode=620,max=768")
        );
    }

    #[test]
    fn a_bounded_upper_is_bounded_in_bytes_and_inodes() {
        let mut r = resolved(vec![]);
        let mut view = step_view(0, &["/w"]);
        if let Some(upper) = view.upper.as_mut() {
            upper.bound = Some(crate::resolve::TmpfsBound {
                bytes: 1 << 20,
                inodes: 264,
            });
        }
        r.overlays.push(view);
        let plan = build(&r);
        assert_eq!(
            mount_data(&plan, ".lockbox-upper-0").as_deref(),
            Some("size=1048576,nr_inodes=264,mode=0700"),
            "{plan}"
        );
    }

    #[test]
    fn parents_are_mounted_before_children() {
        let plan = build(&resolved(vec![
            grant("/work/a/b", Access::ReadWrite),
            grant("/work", Access::ReadOnly),
            grant("/usr", Access::ReadOnly),
        ]));
        assert_eq!(
            attach_targets(&plan),
            ["dev/null", "usr", "work", "work/a/b"]
        );
    }

    #[test]
    fn nested_grants_with_the_same_access_share_the_outer_mount() {
        let plan = build(&resolved(vec![
            grant("/usr", Access::ReadOnly),
            grant("/usr/bin", Access::ReadOnly),
            grant("/w", Access::ReadWrite),
            grant("/w/ro", Access::ReadOnly),
            grant("/w/ro/rw", Access::ReadWrite),
            grant("/w/ro/rw/more", Access::ReadWrite),
        ]));
        assert_eq!(
            attach_targets(&plan),
            ["dev/null", "usr", "w", "w/ro", "w/ro/rw"]
        );
    }

    #[test]
    fn grant_under_tmp_is_attached_after_the_private_tmp() {
        let plan = build(&resolved(vec![grant("/tmp/job", Access::ReadWrite)]));
        let tmp_mount = plan
            .ops
            .iter()
            .position(|op| matches!(op, Op::Mount { target, .. } if target.as_bytes() == b"tmp"))
            .unwrap();
        let attach = plan
            .ops
            .iter()
            .position(
                |op| matches!(op, Op::Attach { target, .. } if target.as_bytes() == b"tmp/job"),
            )
            .unwrap();
        assert!(tmp_mount < attach);
    }

    #[test]
    fn granting_tmp_replaces_the_private_tmpfs() {
        let plan = build(&resolved(vec![grant("/tmp", Access::ReadWrite)]));
        assert!(!plan
            .ops
            .iter()
            .any(|op| matches!(op, Op::Mount { target, .. } if target.as_bytes() == b"tmp")));
        assert!(attach_targets(&plan).contains(&"tmp".to_owned()));
    }

    #[test]
    fn read_grants_are_readonly_sources_and_rules() {
        let plan = build(&resolved(vec![
            grant("/usr", Access::ReadOnly),
            grant("/data", Access::ReadWrite),
        ]));
        let usr = plan
            .sources
            .iter()
            .find(|s| s.host.as_bytes() == b"/usr")
            .unwrap();
        assert!(usr.readonly);
        let data = plan
            .sources
            .iter()
            .find(|s| s.host.as_bytes() == b"/data")
            .unwrap();
        assert!(!data.readonly);
        let rule = |p: &[u8]| {
            plan.rules
                .iter()
                .find(|r| r.path.as_bytes() == p)
                .unwrap()
                .access
        };
        assert_eq!(rule(b"/usr"), RuleAccess::Read);
        assert_eq!(rule(b"/data"), RuleAccess::Full);
    }

    fn restricted(target: &str, writable: &[&str], create: &[&str]) -> Resolved {
        let mut r = resolved(vec![]);
        r.overlays.push(crate::resolve::ResolvedOverlay {
            target: target.into(),
            lowers: vec![target.into()],
            upper: Some(crate::resolve::ResolvedUpper {
                parent: "/var/lib/b".into(),
                upper_name: "upper".into(),
                work_name: "work".into(),
                bound: None,
                mode: 0o755,
            }),
            writable: Some(writable.iter().map(PathBuf::from).collect()),
            create: create.iter().map(PathBuf::from).collect(),
        });
        r
    }

    #[test]
    fn a_restricted_view_is_read_only_but_below_its_writable_paths() {
        let plan = build(&restricted("/w", &["/w/web", "/w/out"], &["/w/out"]));
        let rules: Vec<(String, RuleAccess)> = plan
            .rules
            .iter()
            .filter(|r| r.path.as_bytes().starts_with(b"/w"))
            .map(|r| (r.path.to_string_lossy().into_owned(), r.access))
            .collect();
        assert_eq!(
            rules,
            [
                ("/w".to_owned(), RuleAccess::Read),
                ("/w/web".to_owned(), RuleAccess::Full),
                ("/w/out".to_owned(), RuleAccess::Full),
            ]
        );
        // The missing directory is made through the mounted overlay, not before it.
        let mount = plan
            .ops
            .iter()
            .position(|op| matches!(op, Op::Mount { target, .. } if target.as_bytes() == b"w"));
        let mkdir = plan
            .ops
            .iter()
            .position(|op| matches!(op, Op::Mkdir { path, .. } if path.as_bytes() == b"w/out"));
        assert!(mount.is_some() && mkdir > mount, "{plan}");
        assert!(plan
            .to_string()
            .contains("writable only below /w/web, /w/out"));

        let read_only = build(&restricted("/w", &[], &[]));
        assert!(read_only
            .rules
            .iter()
            .filter(|r| r.path.as_bytes().starts_with(b"/w"))
            .all(|r| r.access == RuleAccess::Read));
    }

    #[test]
    fn a_restricted_view_is_a_read_only_mount_with_writable_binds() {
        let plan = build(&restricted("/tmp/job/w", &["/tmp/job/w/web"], &[]));
        let at = |want: &dyn Fn(&Op) -> bool| plan.ops.iter().position(want);
        let mount =
            at(&|op| matches!(op, Op::Mount { target, .. } if target.as_bytes() == b"tmp/job/w"));
        let bind = at(
            &|op| matches!(op, Op::CoverWith { path, with } if path.as_bytes() == b"tmp/job/w/web" && with == path),
        );
        let readonly =
            at(&|op| matches!(op, Op::SetReadonly { path } if path.as_bytes() == b"tmp/job/w"));
        assert!(mount.is_some() && bind > mount && readonly > bind, "{plan}");
        let read_only = build(&restricted("/w", &[], &[]));
        assert!(read_only
            .ops
            .iter()
            .any(|op| matches!(op, Op::SetReadonly { path } if path.as_bytes() == b"w")));
    }

    /// A view of `/w` over `lowers` with its upper in `/s/<n>`.
    fn step_view(n: usize, lowers: &[&str]) -> crate::resolve::ResolvedOverlay {
        crate::resolve::ResolvedOverlay {
            target: "/w".into(),
            lowers: lowers.iter().map(PathBuf::from).collect(),
            upper: Some(crate::resolve::ResolvedUpper {
                parent: format!("/s/{n}").into(),
                upper_name: "upper".into(),
                work_name: "work".into(),
                bound: None,
                mode: 0o755,
            }),
            writable: None,
            create: Vec::new(),
        }
    }

    #[test]
    fn a_later_command_of_a_sequence_keeps_the_views_and_gets_fresh_scratch() {
        let mut r = resolved(vec![grant("/usr", Access::ReadOnly)]);
        r.overlays.push(step_view(0, &["/w"]));
        let plan = build_sequence(&r, 2);
        assert!(plan.ops.iter().any(|op| matches!(op, Op::Gate)));
        assert_eq!(plan.steps.len(), 2);
        let text: Vec<String> = plan.steps[1].ops.iter().map(ToString::to_string).collect();
        let renews = |t: &str| {
            text.iter()
                .any(|o| o.starts_with("unless untouched, replace") && o.contains(t))
        };
        assert!(renews("/tmp") && renews("/dev/shm"), "{text:#?}");
        assert!(
            !plan.steps[1].ops.iter().any(|op| matches!(
                op,
                Op::Gate | Op::Rmdir { .. } | Op::Umount { .. } | Op::Attach { .. }
            ) || matches!(op, Op::Mount { fstype, .. } if fstype.as_bytes() == b"overlay")),
            "the views stay: {text:#?}"
        );
    }

    #[test]
    fn a_scratch_tmpfs_holding_a_grant_or_a_view_is_not_renewed_between_commands() {
        let mut r = resolved(vec![grant("/tmp/job", Access::ReadWrite)]);
        r.overlays.push(step_view(0, &["/w"]));
        let plan = build_sequence(&r, 1);
        let text: Vec<String> = plan.steps[0].ops.iter().map(ToString::to_string).collect();
        assert!(
            !text.iter().any(|o| o.contains("replace /tmp ")),
            "the grant below /tmp would be lost: {text:#?}"
        );
        assert!(
            text.iter().any(|o| o.contains("replace /dev/shm ")),
            "{text:#?}"
        );
        let mut r = resolved(vec![]);
        let mut view = step_view(0, &["/tmp/w"]);
        view.target = "/tmp/w".into();
        r.overlays.push(view);
        let plan = build_sequence(&r, 1);
        let text: Vec<String> = plan.steps[0].ops.iter().map(ToString::to_string).collect();
        assert!(
            !text.iter().any(|o| o.contains("replace /tmp ")),
            "the view below /tmp would be lost: {text:#?}"
        );
    }

    fn image(grants: Vec<Grant>) -> Resolved {
        let mut r = resolved(grants);
        r.image = Some(crate::resolve::ResolvedImage {
            layers: vec!["/store/top".into(), "/store/base".into()],
            upper: None,
        });
        r.etc_files = vec![
            ("hostname".into(), b"lockbox\n".to_vec()),
            ("hosts".into(), b"127.0.0.1 localhost\n".to_vec()),
        ];
        r
    }

    /// An image root whose layers are `layers`.
    fn image_of(layers: &[&str]) -> Resolved {
        let mut r = image(vec![]);
        if let Some(image) = r.image.as_mut() {
            image.layers = layers.iter().map(PathBuf::from).collect();
        }
        r
    }

    #[test]
    fn a_stores_layers_are_attached_once_through_their_shared_directory() {
        let plan = build(&image_of(&[
            "/state/images/layers/aa/root",
            "/state/images/layers/bb/root",
            "/state/images/layers/cc/root",
        ]));
        let layer_sources: Vec<_> = plan
            .sources
            .iter()
            .filter(|s| s.readonly && !s.staged)
            .map(|s| s.host.to_string_lossy().into_owned())
            .collect();
        assert_eq!(layer_sources, ["/state/images/layers"]);
        let text = plan.to_string();
        assert!(
            text.contains("lowerdir=.i/s/aa/root:.i/s/bb/root:.i/s/cc/root,"),
            "{text}"
        );
    }

    #[test]
    fn layers_without_a_shared_directory_or_with_option_syntax_are_attached_one_by_one() {
        for layers in [
            // Different grandparents.
            vec!["/state/images/layers/aa/root", "/build/tmp/up/root"],
            // A grandparent at the top: never the host's whole tree, nor a top directory.
            vec!["/store/top", "/store/base"],
            // Names overlayfs's options would split.
            vec![
                "/state/images/layers/a:b/root",
                "/state/images/layers/cc/root",
            ],
        ] {
            let plan = build(&image_of(&layers));
            let text = plan.to_string();
            assert!(text.contains("lowerdir=.i/0:.i/1,"), "{layers:?}: {text}");
        }
        // More layers than the options' room through a shared attachment.
        let long: Vec<String> = (0..64)
            .map(|i| format!("/state/images/layers/{i:064}/root"))
            .collect();
        let long: Vec<&str> = long.iter().map(String::as_str).collect();
        let text = build(&image_of(&long)).to_string();
        assert!(text.contains("lowerdir=.i/0:.i/1:"), "{text}");
    }

    #[test]
    fn an_image_root_is_not_entered_by_path_until_the_hosts_tree_is_gone() {
        let plan = build(&image(vec![grant("/work/data", Access::ReadOnly)]));
        let enter = plan
            .ops
            .iter()
            .position(|op| matches!(op, Op::EnterRoot))
            .unwrap();
        // Before pivot_root, nothing below the image's mount point is used: its symlinks
        // would resolve against the host's tree.
        for op in &plan.ops[..enter] {
            if let Some(path) = op_path(op) {
                assert!(
                    !path
                        .as_bytes()
                        .starts_with(format!("{IMAGE_ROOT}/").as_bytes()),
                    "{op}"
                );
            }
        }
        let text = plan.to_string();
        assert!(
            text.contains("mount overlay on /.lockbox-root (lowerdir=.i/0:.i/1,upperdir=.lockbox-root-upper/upper,workdir=.lockbox-root-upper/work,userxattr)"),
            "{text}"
        );
        assert!(
            matches!(&plan.ops[enter - 1], Op::ChangeDir { path } if path.as_bytes() == IMAGE_ROOT.as_bytes())
        );
        // Layers read-only; lockbox's /dev, /proc and /etc files built on the stage and
        // attached inside, with the grant, after it.
        assert!(plan.sources[..2].iter().all(|s| s.readonly && !s.staged));
        let attached: Vec<String> = plan.ops[enter..]
            .iter()
            .filter_map(|op| match op {
                Op::Attach { target, .. } => Some(target.to_string_lossy().into_owned()),
                _ => None,
            })
            .collect();
        assert_eq!(attached, ["dev", ".lockbox-etc", "proc", "work/data"]);
        assert!(
            text.contains("mask /etc/hostname with /.lockbox-etc/hostname"),
            "{text}"
        );
        // Writable under Landlock and by mount (writes go to the sandbox's own upper).
        let root_rule = plan.rules.iter().find(|r| r.path.as_bytes() == b"/");
        assert_eq!(root_rule.map(|r| r.access), Some(RuleAccess::ImageRoot));
        assert!(plan.root_writable);
        // No host userland: no default read, no host /etc.
        assert!(!text.contains("/usr"), "{text}");
        assert!(!text.contains(":/etc"), "{text}");
    }

    #[test]
    fn a_plain_root_has_no_image_ops_and_is_made_read_only() {
        let plan = build(&resolved(vec![grant("/usr", Access::ReadOnly)]));
        assert!(!plan.root_writable);
        assert_eq!(plan.rules[0].access, RuleAccess::ListDir);
        assert!(!plan
            .ops
            .iter()
            .any(|op| matches!(op, Op::Capture { .. } | Op::ChangeDir { .. })));
        assert!(plan.sources.iter().all(|s| !s.staged));
    }

    #[test]
    fn etc_overlay_hides_secrets_with_whiteouts() {
        let mut r = resolved(vec![]);
        r.etc_hidden = Some(vec!["shadow".into(), "ssh/ssh_host_rsa_key".into()]);
        let plan = build(&r);
        let whiteouts: Vec<_> = plan
            .ops
            .iter()
            .filter_map(|op| match op {
                Op::Whiteout { path } => Some(path.to_string_lossy().into_owned()),
                _ => None,
            })
            .collect();
        assert_eq!(
            whiteouts,
            [".lockbox-etc/shadow", ".lockbox-etc/ssh/ssh_host_rsa_key"]
        );
        let text = plan.to_string();
        assert!(text.contains("mount overlay read-only on /etc"), "{text}");
    }

    fn mounts_of(ops: &[&Op], fstype: &[u8], target: &[u8]) -> usize {
        ops.iter()
            .filter(|op| matches!(op, Op::Mount { fstype: f, target: t, .. } if f.as_bytes() == fstype && t.as_bytes() == target))
            .count()
    }

    #[test]
    fn a_template_shares_the_read_only_root_and_leaves_each_sandbox_its_own_mounts() {
        let mut r = resolved(vec![grant("/usr", Access::ReadOnly)]);
        r.etc_hidden = Some(vec!["shadow".into()]);
        let plan = build(&r);
        let split = plan.template_split().expect("a plain root has a template");
        let instance: Vec<&Op> = split.instance.iter().map(|&i| &plan.ops[i]).collect();
        let shared: Vec<&Op> = split.shared.ops.iter().collect();
        // Each sandbox's own: /proc and all within it, scratch, terminals.
        for (fstype, target) in [
            (&b"proc"[..], &b"proc"[..]),
            (b"tmpfs", b"tmp"),
            (b"tmpfs", b"dev/shm"),
            (b"devpts", b"dev/pts"),
        ] {
            assert_eq!(mounts_of(&instance, fstype, target), 1, "{instance:#?}");
        }
        assert!(instance
            .iter()
            .any(|op| matches!(op, Op::LimitUserQuotas { .. })));
        assert!(instance.iter().any(|op| matches!(op, Op::OwnBootId { .. })));
        assert!(instance.iter().any(
            |op| matches!(op, Op::CoverWith { path, .. } if path.as_bytes() == b"proc/kcore")
        ));
        // The template: a bare /proc (so that a sandbox may mount its own), nothing
        // written through it, no scratch, no terminals; the rest of the root.
        assert_eq!(mounts_of(&shared, b"proc", b"proc"), 1);
        assert_eq!(mounts_of(&shared, b"tmpfs", b"tmp"), 0);
        assert_eq!(mounts_of(&shared, b"tmpfs", b"dev/shm"), 0);
        assert_eq!(mounts_of(&shared, b"devpts", b"dev/pts"), 0);
        assert!(!shared.iter().any(|op| matches!(
            op,
            Op::LimitUserQuotas { .. } | Op::OwnBootId { .. } | Op::CoverWith { .. }
        ) || op_path(op)
            .is_some_and(|p| p.as_bytes().starts_with(b"proc/"))));
        assert!(shared.iter().any(|op| matches!(op, Op::EnterRoot)));
        assert_eq!(mounts_of(&shared, b"tmpfs", b"dev"), 1);
        assert!(attach_targets(&split.shared).contains(&"usr".to_owned()));
        // Nothing of the sandbox's own comes after the root is entered.
        let root_at = plan.ops.iter().position(|op| matches!(op, Op::EnterRoot));
        assert!(split.instance.iter().all(|&i| Some(i) < root_at));
    }

    #[test]
    fn views_images_and_sequences_get_no_template() {
        let mut r = resolved(vec![grant("/usr", Access::ReadOnly)]);
        r.overlays.push(step_view(0, &["/w"]));
        assert!(build(&r).template_split().is_none());
        let r = resolved(vec![grant("/usr", Access::ReadOnly)]);
        assert!(build_sequence(&r, 1).template_split().is_none());
        let mut gated = build(&r);
        gated.insert_gate();
        assert!(gated.template_split().is_none());
        let mut writable = build(&r);
        writable.root_writable = true;
        assert!(writable.template_split().is_none());
    }

    #[test]
    fn a_host_tree_granted_inside_scratch_gets_no_template() {
        let r = resolved(vec![
            grant("/usr", Access::ReadOnly),
            grant("/tmp/x", Access::ReadWrite),
        ]);
        let plan = build(&r);
        assert!(
            attach_targets(&plan).contains(&"tmp/x".to_owned()),
            "{plan}"
        );
        assert!(plan.template_split().is_none());
    }
}
