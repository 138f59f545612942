//! Per-user kernel quotas: the share of the caller's that one sandbox may take.
//!
//! The sandbox's processes run as the caller's uid, and the kernel counts some objects per
//! user ("ucounts"), charging each one to the user in every user namespace up the tree: what
//! the sandbox holds also counts against the caller's own limit. Unbounded, a sandbox could
//! take all of it, and the caller's next `inotify_init1`, `mq_open` or `timer_create` (for
//! a root caller: every root daemon's) would fail while it runs. So each sandbox gets
//! [`SHARE_DIVISOR`]⁻¹ of the caller's limit of each, read at start:
//!
//! - **rlimit-style counts** (`RLIMIT_NPROC`, `RLIMIT_SIGPENDING`, `RLIMIT_MSGQUEUE`,
//!   `RLIMIT_MEMLOCK` for SysV `SHM_LOCK`): the command's rlimits. The kernel checks the
//!   sandbox namespace's count against them, and the caller's count (the sandbox's
//!   included) against the caller's, so the rest stays the caller's. Any caller can.
//! - **the user namespace's own limits** (`/proc/sys/user/max_inotify_instances` and
//!   `max_inotify_watches`): written by the init's helper into the sandbox's user namespace
//!   (step 2 of `child`), while it still holds its capabilities there. The kernel shows each
//!   user namespace its own copy of these files and lets whoever has `CAP_SYS_RESOURCE` in
//!   that namespace write them (`set_permissions` in `kernel/ucount.c`), whatever uid owns
//!   them — so any caller can, root or not. Issue 32: an unprivileged caller's sandboxes used
//!   to be left without this bound (on the belief that only a namespace mapping the host's
//!   uid 0 could write them) and a sandbox of uid 65534 took all 128 of its inotify
//!   instances.
//!
//! Not here: the namespace counts (`max_*_namespaces`: the command cannot create
//! namespaces, having no capability and seccomp refusing new user namespaces), fanotify
//! (`fanotify_init` is refused by seccomp), and pipe buffers (`fs.pipe-user-pages-soft`
//! counts per user with no per-namespace limit and no rlimit: `docs/security.md`).

use serde::Serialize;
use std::ffi::CString;
use std::path::Path;

/// Each sandbox may hold at most a quarter of the caller's limit of each per-user quota.
pub const SHARE_DIVISOR: u64 = 4;

/// The per-user quotas of one sandbox: the most it may hold of each. `None`: it shares the
/// caller's quota (the caller's limit is infinite, or nothing lower could be set).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct UserQuotas {
    /// inotify instances (`max_inotify_instances`).
    pub inotify_instances: Option<u64>,
    /// inotify watches (`max_inotify_watches`).
    pub inotify_watches: Option<u64>,
    /// Processes and threads (`RLIMIT_NPROC`; uid 0 is exempt from it).
    pub processes: Option<u64>,
    /// Queued signals (`RLIMIT_SIGPENDING`), also what `timer_create` reserves.
    pub pending_signals: Option<u64>,
    /// Bytes of POSIX message queues (`RLIMIT_MSGQUEUE`).
    pub message_queue_bytes: Option<u64>,
    /// Bytes of locked memory (`RLIMIT_MEMLOCK`; per user for SysV `SHM_LOCK`).
    pub locked_memory_bytes: Option<u64>,
}

/// What the caller's own quotas are, read at start.
#[derive(Debug, Clone, Default)]
pub(crate) struct HostQuotas {
    /// Soft rlimits (`None`: infinite) of `RLIMITS`, in that order.
    rlimits: [Option<u64>; 4],
    /// Values of `SYSCTLS`, in that order (`None`: absent on this kernel).
    sysctls: [Option<u64>; 2],
}

const RLIMITS: [libc::__rlimit_resource_t; 4] = [
    libc::RLIMIT_NPROC,
    libc::RLIMIT_SIGPENDING,
    libc::RLIMIT_MSGQUEUE,
    libc::RLIMIT_MEMLOCK,
];

const SYSCTLS: [&str; 2] = ["max_inotify_instances", "max_inotify_watches"];

/// Where the init writes the user namespace's limits (the host's `/proc`, still mounted at
/// step 2; the kernel picks the writer's user namespace).
const SYSCTL_DIR: &str = "/proc/sys/user";

impl HostQuotas {
    /// Reads the caller's limits: rlimits of this process and `/proc/sys/user` (the caller's
    /// user namespace's, which bound the sandbox's too). The two sysctl files are opened once
    /// per process and read again at each call: a path lookup under `/proc/sys/user` walks
    /// one entry per user namespace on the host, and every live sandbox has one, so under
    /// `lockbox serve` each create got slower the more sandboxes the server held (issue 34).
    pub(crate) fn read() -> HostQuotas {
        static FILES: std::sync::OnceLock<[Option<std::fs::File>; 2]> = std::sync::OnceLock::new();
        let files = FILES.get_or_init(|| {
            SYSCTLS.map(|name| std::fs::File::open(Path::new(SYSCTL_DIR).join(name)).ok())
        });
        let mut host = HostQuotas::default();
        for (slot, resource) in host.rlimits.iter_mut().zip(RLIMITS) {
            *slot = soft_rlimit(resource);
        }
        for (slot, file) in host.sysctls.iter_mut().zip(files) {
            *slot = file.as_ref().and_then(read_number);
        }
        host
    }
}

/// The number a sysctl file holds now (read from its start, whatever was read before).
fn read_number(file: &std::fs::File) -> Option<u64> {
    use std::os::unix::fs::FileExt;
    let mut buf = [0u8; 32];
    let n = file.read_at(&mut buf, 0).ok()?;
    std::str::from_utf8(buf.get(..n)?).ok()?.trim().parse().ok()
}

fn soft_rlimit(resource: libc::__rlimit_resource_t) -> Option<u64> {
    let (soft, _) = crate::sys::get_rlimit(resource).ok()?;
    (soft != libc::RLIM_INFINITY).then_some(soft)
}

/// The sandbox's share of the caller's quotas: rlimits for the command, values for the init
/// to write, and the report.
#[derive(Debug, Clone, Default)]
pub(crate) struct QuotaPlan {
    /// (resource, soft, hard) for the command.
    pub(crate) rlimits: Vec<(libc::__rlimit_resource_t, u64, u64)>,
    /// (path, value) the init writes into its user namespace's `/proc/sys/user`.
    pub(crate) sysctls: Vec<(CString, Vec<u8>)>,
    /// What the sandbox may hold.
    pub(crate) report: UserQuotas,
}

/// Decides the sandbox's share. `explicit_processes`: the policy bounds processes itself
/// (`--max-processes`), which then replaces the default share. `uid` 0 is exempt from
/// `RLIMIT_NPROC`, so no share of it is set (or reported) for root.
pub(crate) fn prepare(host: &HostQuotas, uid: u32, explicit_processes: bool) -> QuotaPlan {
    let mut plan = QuotaPlan::default();
    let share = |limit: u64| limit / SHARE_DIVISOR;
    for (resource, limit) in RLIMITS.into_iter().zip(host.rlimits) {
        if resource == libc::RLIMIT_NPROC && (uid == 0 || explicit_processes) {
            continue;
        }
        let Some(limit) = limit else { continue };
        let value = share(limit);
        plan.rlimits.push((resource, value, value));
        let slot = match resource {
            libc::RLIMIT_NPROC => &mut plan.report.processes,
            libc::RLIMIT_SIGPENDING => &mut plan.report.pending_signals,
            libc::RLIMIT_MSGQUEUE => &mut plan.report.message_queue_bytes,
            _ => &mut plan.report.locked_memory_bytes,
        };
        *slot = Some(value);
    }
    for (name, limit) in SYSCTLS.into_iter().zip(host.sysctls) {
        let Some(limit) = limit else { continue };
        let value = share(limit);
        plan.sysctls.push((
            crate::plan::cstring(format!("{SYSCTL_DIR}/{name}").as_bytes()),
            value.to_string().into_bytes(),
        ));
        match name {
            "max_inotify_instances" => plan.report.inotify_instances = Some(value),
            _ => plan.report.inotify_watches = Some(value),
        }
    }
    plan
}

#[cfg(test)]
mod tests {
    use super::*;

    fn host() -> HostQuotas {
        HostQuotas {
            rlimits: [Some(96_365), Some(96_365), Some(819_200), None],
            sysctls: [Some(128), Some(192_536)],
        }
    }

    #[test]
    fn host_quotas_are_the_sysctls_now_however_often_they_are_read() {
        let now = |name: &str| {
            std::fs::read_to_string(Path::new(SYSCTL_DIR).join(name))
                .ok()
                .and_then(|v| v.trim().parse::<u64>().ok())
        };
        let expected = SYSCTLS.map(now);
        assert!(expected.iter().all(Option::is_some), "{expected:?}");
        // The second read goes through the files the first one opened.
        for _ in 0..2 {
            assert_eq!(HostQuotas::read().sysctls, expected);
        }
    }

    #[test]
    fn a_sandbox_gets_a_quarter_of_each_finite_quota_of_the_caller() {
        let plan = prepare(&host(), 0, false);
        assert_eq!(
            plan.report,
            UserQuotas {
                inotify_instances: Some(32),
                inotify_watches: Some(48_134),
                processes: None,
                pending_signals: Some(24_091),
                message_queue_bytes: Some(204_800),
                locked_memory_bytes: None,
            }
        );
        assert!(plan
            .rlimits
            .contains(&(libc::RLIMIT_MSGQUEUE, 204_800, 204_800)));
        let written: Vec<(String, String)> = plan
            .sysctls
            .iter()
            .map(|(p, v)| {
                (
                    p.to_string_lossy().into_owned(),
                    String::from_utf8_lossy(v).into_owned(),
                )
            })
            .collect();
        assert_eq!(
            written,
            [
                ("/proc/sys/user/max_inotify_instances".into(), "32".into()),
                ("/proc/sys/user/max_inotify_watches".into(), "48134".into()),
            ]
        );
    }

    #[test]
    fn an_unprivileged_caller_gets_a_share_of_inotify_and_of_processes() {
        let plan = prepare(&host(), 65534, false);
        assert_eq!(plan.sysctls.len(), 2);
        assert_eq!(plan.report.inotify_instances, Some(32));
        assert_eq!(plan.report.processes, Some(24_091));
        let explicit = prepare(&host(), 65534, true);
        assert_eq!(explicit.report.processes, None);
        assert!(!explicit
            .rlimits
            .iter()
            .any(|(r, _, _)| *r == libc::RLIMIT_NPROC));
    }
}
