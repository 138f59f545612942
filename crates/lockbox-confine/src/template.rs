//! Root templates: a plain sandbox root built once per plan in a long-lived process (the
//! server, [`crate::Spawn::root_template`]) and copied for each sandbox.
//!
//! A sandbox's root is built in a mount namespace copied from the host's, then made `/` by
//! `pivot_root`, whose `chroot_fs_refs` visits every task of the host: with 10,000
//! sandboxes live, 30,000 tasks for each new one, a quarter of all CPU time of a create
//! (docs/benchmarks.md). A template is a root built so once, `/` read-only, held by its
//! user and mount namespaces' descriptors. A sandbox is then cloned by a go-between
//! (`child::go_between`) that has joined them: its user namespace is a child of the
//! template's, its mount namespace a copy of the template's, whose root it already has, so
//! nothing visits the host's tasks and the ~20 mounts of a root are copied, not made. It
//! mounts only what must be its own (`plan::TemplateSplit`): `/proc`, its scratch tmpfs
//! mounts and its terminals.
//!
//! The template's own mounts of those lie under the sandbox's, out of its reach: every
//! mount of a copy made for a less privileged user namespace is locked, and the sandbox
//! holds no capability to unmount anyway. The template's user namespace has no process
//! (its first one is killed once the root is built) and its per-user limits are the host's:
//! each sandbox still limits its own (`Op::LimitUserQuotas`), and counts there are also
//! charged to every parent.
//!
//! `LOCKBOX_ROOT_TEMPLATES=0` (or `off`, `false`, `no`) in the environment turns templates
//! off (every sandbox builds its root as before); a template that cannot be built is logged
//! once and its plan's sandboxes build their own.

use crate::child::{self, TemplateBuild, TemplateStart};
use crate::plan::{SetupPlan, TemplateSplit};
use crate::report::{Record, RECORD_LEN};
use crate::sys;
use std::collections::HashMap;
use std::io::Read;
use std::os::fd::{AsFd, AsRawFd, OwnedFd, RawFd};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, OnceLock};

/// Templates kept per process; past this, a new plan's sandboxes build their own root.
const MAX_TEMPLATES: usize = 16;

/// Stack of a template's first process (as a sandbox init's).
const STACK: usize = 1024 * 1024;

/// A built root, held by its namespaces.
#[derive(Debug)]
pub(crate) struct Template {
    user_ns: OwnedFd,
    mount_ns: OwnedFd,
    /// What each sandbox mounts in its copy (indices into the whole plan's ops).
    pub(crate) instance: Vec<usize>,
}

impl Template {
    pub(crate) fn user_ns(&self) -> RawFd {
        self.user_ns.as_raw_fd()
    }

    pub(crate) fn mount_ns(&self) -> RawFd {
        self.mount_ns.as_raw_fd()
    }
}

type Cache = Mutex<HashMap<String, Option<Arc<Template>>>>;

fn cache() -> &'static Cache {
    static CACHE: OnceLock<Cache> = OnceLock::new();
    CACHE.get_or_init(Cache::default)
}

/// Set once a go-between failed to join a template (a container's seccomp profile
/// denying `setns`, say): from then on, this process builds every root.
static GIVEN_UP: AtomicBool = AtomicBool::new(false);

/// Whether templates are on: `LOCKBOX_ROOT_TEMPLATES` is unset or anything but `0`,
/// `off`, `false` or `no`, and no go-between has failed ([`give_up`]).
pub(crate) fn enabled() -> bool {
    !GIVEN_UP.load(Ordering::Relaxed)
        && switched_on(std::env::var("LOCKBOX_ROOT_TEMPLATES").ok().as_deref())
}

/// What a value of `LOCKBOX_ROOT_TEMPLATES` says (unset: on).
fn switched_on(value: Option<&str>) -> bool {
    !matches!(value.map(str::trim), Some("0" | "off" | "false" | "no"))
}

/// Turns templates off for this process's life (see [`GIVEN_UP`]).
pub(crate) fn give_up() {
    GIVEN_UP.store(true, Ordering::Relaxed);
}

/// The template of `plan` for ids mapped by `uid_map`/`gid_map` (the sandbox's own, to the
/// host's), built on first use; `None` where the plan has none (`SetupPlan::template_split`)
/// or it could not be built.
pub(crate) fn for_plan(plan: &SetupPlan, uid_map: &[u8], gid_map: &[u8]) -> Option<Arc<Template>> {
    let split = plan.template_split()?;
    let key = format!(
        "{:?}\n{}\n{}",
        split.shared,
        String::from_utf8_lossy(uid_map),
        String::from_utf8_lossy(gid_map)
    );
    let mut templates = cache()
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner());
    if let Some(known) = templates.get(&key) {
        return known.clone();
    }
    if templates.len() >= MAX_TEMPLATES {
        // A template used once costs more than the root it saves.
        return None;
    }
    let built = match build(split, uid_map, gid_map) {
        Ok(t) => Some(Arc::new(t)),
        Err(why) => {
            tracing::warn!("a root template could not be built ({why}); sandboxes of this policy build their own root");
            None
        }
    };
    templates.insert(key, built.clone());
    built
}

/// Clones the template's first process into new user, mount and pid namespaces (a procfs
/// may be mounted only by a process of its pid namespace's owner), sharing our memory (a
/// fork would write-protect all of a server's memory for one root), waits for its report,
/// keeps its namespaces and kills it.
fn build(split: TemplateSplit, uid_map: &[u8], gid_map: &[u8]) -> Result<Template, String> {
    let (report, report_wr) =
        sys::seqpacket_pair().map_err(|e| format!("creating its report socket: {e}"))?;
    let mut first = TemplateBuild {
        source_fds: vec![-1; split.shared.sources.len()],
        plan: split.shared,
        uid_map: uid_map.to_vec(),
        gid_map: gid_map.to_vec(),
        report_fd: report_wr.as_raw_fd(),
    };
    let start = TemplateStart {
        build: &mut first as *mut TemplateBuild,
    };
    let mut stack = vec![0u8; STACK];
    let flags = libc::CLONE_NEWUSER | libc::CLONE_NEWNS | libc::CLONE_NEWPID;
    let saved = sys::sigprocmask(libc::SIG_SETMASK, &sys::SigSet::full())
        .map_err(|e| format!("blocking signals: {e}"))?;
    // SAFETY: the child runs `child::template_main` on `stack`: only async-signal-safe
    // calls, no allocation, every signal blocked for good; it writes only its stack and
    // `first` (through `start`), which we leave alone, with `stack`, until it is reaped
    // below; it closes only its own copies of descriptors.
    let cloned =
        unsafe { sys::spawn_sharing_memory_into(&mut stack, child::template_main, &start, flags) };
    let _ = sys::sigprocmask(libc::SIG_SETMASK, &saved);
    let (pid, pidfd) = cloned.map_err(|e| format!("clone: {e}"))?;
    drop(report_wr);
    let mut record = [0u8; RECORD_LEN];
    let heard = std::fs::File::from(report).read(&mut record);
    let result = match heard.map(|n| (n == RECORD_LEN).then(|| Record::decode(&record))) {
        Ok(Some(Some(Record::Exited(0)))) => {
            let ns = |kind: &str| {
                std::fs::File::open(format!("/proc/{pid}/ns/{kind}"))
                    .map(OwnedFd::from)
                    .map_err(|e| format!("opening its {kind} namespace: {e}"))
            };
            ns("user").and_then(|user_ns| {
                Ok(Template {
                    user_ns,
                    mount_ns: ns("mnt")?,
                    instance: split.instance,
                })
            })
        }
        Ok(Some(Some(Record::Failed { step, errno, index }))) => Err(format!(
            "{} (op {index}): {}",
            step.describe(),
            std::io::Error::from_raw_os_error(errno)
        )),
        Ok(_) => Err("its first process ended without a word".into()),
        Err(e) => Err(format!("reading its report: {e}")),
    };
    let _ = sys::pidfd_send_signal(pidfd.as_fd(), libc::SIGKILL);
    // Reaped before `stack` and `first` go.
    let _ = sys::wait4(pid);
    drop((stack, first));
    result
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn templates_are_on_unless_switched_off() {
        for on in [None, Some("1"), Some("on"), Some("yes"), Some("")] {
            assert!(switched_on(on), "{on:?}");
        }
        for off in ["0", "off", "false", "no", " 0\n"] {
            assert!(!switched_on(Some(off)), "{off:?}");
        }
    }
}
