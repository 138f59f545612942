//! What this kernel supports, and what lockbox will use: `lockbox check`.

use crate::landlock;
use crate::sys;
use serde::Serialize;
use std::fs;
use std::path::Path;

/// One kernel feature.
#[derive(Debug, Clone, Serialize)]
pub struct Feature {
    /// Short name.
    pub name: &'static str,
    /// Usable by this caller.
    pub available: bool,
    /// What was found (version, sysctl, reason).
    pub detail: String,
    /// What lockbox uses it for, or does without it.
    pub used_for: &'static str,
}

/// The probe result.
#[derive(Debug, Clone, Serialize)]
pub struct KernelSupport {
    /// `uname -r`.
    pub kernel: String,
    /// Caller's uid.
    pub uid: u32,
    /// Every probed feature.
    pub features: Vec<Feature>,
}

/// Probes the kernel without starting a sandbox.
pub fn probe() -> KernelSupport {
    let read = |p: &str| fs::read_to_string(p).map(|s| s.trim().to_owned()).ok();
    let mut features = Vec::new();
    let max_userns = read("/proc/sys/user/max_user_namespaces");
    let restricted = read("/proc/sys/kernel/apparmor_restrict_unprivileged_userns").as_deref()
        == Some("1")
        || read("/proc/sys/kernel/unprivileged_userns_clone").as_deref() == Some("0");
    features.push(Feature {
        name: "user namespaces",
        available: Path::new("/proc/self/ns/user").exists()
            && max_userns.as_deref() != Some("0")
            && !restricted,
        detail: format!(
            "user.max_user_namespaces={}{}",
            max_userns.as_deref().unwrap_or("?"),
            if restricted {
                ", restricted for unprivileged users"
            } else {
                ""
            }
        ),
        used_for: "required: every sandbox (no root needed)",
    });
    let abi = landlock::abi_version();
    features.push(Feature {
        name: "landlock",
        available: abi.is_some(),
        detail: abi.map_or_else(
            || "not available (kernel < 5.13 or not in lsm=)".to_owned(),
            |v| {
                let scopes = if v >= 6 {
                    ", signal and abstract-socket scoping"
                } else {
                    ""
                };
                format!("ABI {v}{scopes}")
            },
        ),
        used_for: "second wall on file access (best effort: skipped when absent)",
    });
    features.push(Feature {
        name: "seccomp filter",
        available: sys::seccomp_action_available(0x0005_0000),
        detail: String::new(),
        used_for: "required: denies dangerous syscalls",
    });
    let net = lockbox_netsup::probe();
    features.push(Feature {
        name: "seccomp user notification",
        available: net.is_ok(),
        detail: match &net {
            Ok(_) => "with ADDFD, pidfd_getfd and SO_NETNS_COOKIE".to_owned(),
            Err(e) => e.to_string(),
        },
        used_for: "required for --net-allow/--net-deny (the network supervisor)",
    });
    features.push(cgroup_v1(
        "memory",
        "--max-memory for the whole sandbox, with OOM kill",
    ));
    features.push(cgroup_v1("pids", "--max-processes for the whole sandbox"));
    features.push(cgroup_v2());
    KernelSupport {
        kernel: read("/proc/sys/kernel/osrelease").unwrap_or_default(),
        uid: sys::ids().0,
        features,
    }
}

fn cgroup_v1(controller: &'static str, used_for: &'static str) -> Feature {
    let name = if controller == "memory" {
        "cgroup v1 memory"
    } else {
        "cgroup v1 pids"
    };
    let own = fs::read_to_string("/proc/self/cgroup").unwrap_or_default();
    let rel = own.lines().find_map(|l| {
        let mut parts = l.splitn(3, ':');
        let (_, c, p) = (parts.next()?, parts.next()?, parts.next()?);
        c.split(',')
            .any(|x| x == controller)
            .then(|| p.trim_start_matches('/').to_owned())
    });
    let Some(rel) = rel else {
        return Feature {
            name,
            available: false,
            detail: "not mounted".into(),
            used_for: "otherwise an rlimit applies per process",
        };
    };
    let dir = Path::new("/sys/fs/cgroup").join(controller).join(rel);
    let test = dir.join(format!("lockbox-check-{}", std::process::id()));
    let writable = fs::create_dir(&test).is_ok();
    let _ = fs::remove_dir(&test);
    Feature {
        name,
        available: writable,
        detail: if writable {
            format!("{} is writable", dir.display())
        } else {
            format!(
                "{} is not writable by this user (rlimit fallback)",
                dir.display()
            )
        },
        used_for,
    }
}

fn cgroup_v2() -> Feature {
    let unified = ["/sys/fs/cgroup/unified", "/sys/fs/cgroup"]
        .into_iter()
        .map(Path::new)
        .find(|p| p.join("cgroup.controllers").exists());
    let detail = match unified {
        None => "not mounted".to_owned(),
        Some(root) => {
            let own = fs::read_to_string("/proc/self/cgroup").unwrap_or_default();
            let rel = own
                .lines()
                .find_map(|l| l.strip_prefix("0::"))
                .unwrap_or("/");
            let controllers = fs::read_to_string(
                root.join(rel.trim_start_matches('/'))
                    .join("cgroup.controllers"),
            )
            .unwrap_or_default();
            if controllers.trim().is_empty() {
                "mounted, no controllers delegated to this cgroup".to_owned()
            } else {
                format!("controllers here: {} (not used yet)", controllers.trim())
            }
        }
    };
    Feature {
        name: "cgroup v2 delegation",
        available: false,
        detail,
        used_for: "not used yet; cgroup v1 or rlimits apply",
    }
}
