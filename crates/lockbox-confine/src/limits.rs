//! Resource limits: which mechanism enforces each one, and the cgroup (v1) that does when
//! the caller may create one.
//!
//! A cgroup limits the sandbox as a whole and its memory limit kills (the OOM killer), so it
//! is used when possible: cgroup v1 controllers writable by the caller (typically root).
//! Otherwise the closest rlimit applies per process: `RLIMIT_AS` for memory (allocation
//! fails instead of a kill) and `RLIMIT_NPROC` for processes (counted per user namespace
//! since Linux 5.14, so it counts only the sandbox's processes). A delegated cgroup v2 is
//! detected by `lockbox check` but not used yet.

use crate::error::SetupError;
use crate::quotas::{self, UserQuotas};
use lockbox_policy::Limits;
use serde::Serialize;
use std::fs;
use std::io::Write;
use std::os::fd::{AsRawFd, OwnedFd};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};

/// How a limit is enforced.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Mechanism {
    /// A cgroup v1 controller limits the whole sandbox.
    CgroupV1,
    /// A per-process rlimit.
    Rlimit,
}

/// Which mechanism enforces each requested limit (absent = not requested).
#[derive(Debug, Clone, Default, Serialize)]
pub struct LimitMechanisms {
    /// Memory.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub memory: Option<Mechanism>,
    /// Process count.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub processes: Option<Mechanism>,
    /// CPU time (always an rlimit, per process).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub cpu_time: Option<Mechanism>,
    /// Open files (rlimit).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub open_files: Option<Mechanism>,
    /// File size (rlimit).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub file_size: Option<Mechanism>,
}

/// The cgroups of one sandbox; removed by [`Cgroups::remove`].
#[derive(Debug)]
pub struct Cgroups {
    dirs: Vec<PathBuf>,
    memory: Option<PathBuf>,
    procs: Vec<OwnedFd>,
}

/// The decided limits: rlimits for the command, cgroups to join, the sandbox's share of
/// the caller's per-user quotas, and the report.
#[derive(Debug)]
pub struct LimitPlan {
    /// (resource, soft, hard) for `setrlimit` in the command child.
    pub rlimits: Vec<(libc::__rlimit_resource_t, u64, u64)>,
    /// Cgroups the init joins, if any.
    pub cgroups: Option<Cgroups>,
    /// What enforces what.
    pub mechanisms: LimitMechanisms,
    /// (path, value) of the user namespace's own limits the init writes (see `quotas`).
    pub user_sysctls: Vec<(std::ffi::CString, Vec<u8>)>,
    /// What the sandbox may hold of the caller's per-user quotas.
    pub user_quotas: UserQuotas,
}

/// Decides how to enforce `limits` and creates the cgroups. `cgroup_root` is normally
/// `/sys/fs/cgroup` (a parameter so tests can point it elsewhere).
pub fn prepare(limits: &Limits, cgroup_root: &Path) -> Result<LimitPlan, SetupError> {
    let mut plan = LimitPlan {
        rlimits: Vec::new(),
        cgroups: None,
        mechanisms: LimitMechanisms::default(),
        user_sysctls: Vec::new(),
        user_quotas: UserQuotas::default(),
    };
    if limits.memory.is_some() || limits.processes.is_some() {
        plan.cgroups = Cgroups::create_v1(limits, cgroup_root)?;
    }
    let in_cgroup = |controller: &str| {
        plan.cgroups.as_ref().is_some_and(|c| {
            c.dirs
                .iter()
                .any(|d| d.starts_with(cgroup_root.join(controller)))
        })
    };
    if let Some(memory) = limits.memory {
        if in_cgroup("memory") {
            plan.mechanisms.memory = Some(Mechanism::CgroupV1);
        } else {
            plan.rlimits.push((libc::RLIMIT_AS, memory.0, memory.0));
            plan.mechanisms.memory = Some(Mechanism::Rlimit);
        }
    }
    if let Some(n) = limits.processes {
        if in_cgroup("pids") {
            plan.mechanisms.processes = Some(Mechanism::CgroupV1);
        } else {
            if crate::sys::ids().0 == 0 {
                return Err(SetupError::FeatureMissing {
                    feature: "the pids cgroup",
                    problem: "is not writable, and uid 0 is exempt from RLIMIT_NPROC".into(),
                    needed_for: "--max-processes",
                });
            }
            // +1: the sandbox's init counts against the same per-namespace limit.
            plan.rlimits.push((libc::RLIMIT_NPROC, n + 1, n + 1));
            plan.mechanisms.processes = Some(Mechanism::Rlimit);
        }
    }
    if let Some(cpu) = limits.cpu_time {
        // SIGXCPU at the soft limit, SIGKILL a second later (setrlimit(2)).
        let secs = cpu.as_secs().max(1);
        plan.rlimits.push((libc::RLIMIT_CPU, secs, secs + 1));
        plan.mechanisms.cpu_time = Some(Mechanism::Rlimit);
    }
    if let Some(n) = limits.open_files {
        plan.rlimits.push((libc::RLIMIT_NOFILE, n, n));
        plan.mechanisms.open_files = Some(Mechanism::Rlimit);
    }
    if let Some(size) = limits.file_size {
        plan.rlimits.push((libc::RLIMIT_FSIZE, size.0, size.0));
        plan.mechanisms.file_size = Some(Mechanism::Rlimit);
    }
    let uid = crate::sys::ids().0;
    let host = quotas::HostQuotas::read();
    let share = quotas::prepare(&host, uid, limits.processes.is_some());
    plan.rlimits.extend(share.rlimits);
    plan.user_sysctls = share.sysctls;
    plan.user_quotas = share.report;
    Ok(plan)
}

static SEQUENCE: AtomicU64 = AtomicU64::new(0);

impl Cgroups {
    /// Creates `lockbox-<pid>-<n>` under the caller's own cgroup in the memory and pids v1
    /// hierarchies. `Ok(None)` when the caller may not (no v1, or no permission).
    fn create_v1(limits: &Limits, root: &Path) -> Result<Option<Cgroups>, SetupError> {
        let own = fs::read_to_string("/proc/self/cgroup").unwrap_or_default();
        let name = format!(
            "lockbox-{}-{}",
            std::process::id(),
            SEQUENCE.fetch_add(1, Ordering::Relaxed)
        );
        let mut cgroups = Cgroups {
            dirs: Vec::new(),
            memory: None,
            procs: Vec::new(),
        };
        let wanted = [
            ("memory", limits.memory.is_some()),
            ("pids", limits.processes.is_some()),
        ];
        for (controller, wanted) in wanted {
            if !wanted {
                continue;
            }
            let Some(parent) =
                own_cgroup(&own, controller).map(|rel| root.join(controller).join(rel))
            else {
                continue;
            };
            sweep_orphans(&parent);
            let dir = parent.join(&name);
            match fs::create_dir(&dir) {
                Ok(()) => {}
                Err(e)
                    if matches!(
                        e.raw_os_error(),
                        Some(libc::EACCES | libc::EPERM | libc::EROFS | libc::ENOENT)
                    ) =>
                {
                    continue
                }
                Err(e) => {
                    cgroups.remove();
                    return Err(SetupError::Cgroup {
                        path: dir,
                        what: "creating",
                        source: e,
                    });
                }
            }
            cgroups.dirs.push(dir.clone());
            let written = match controller {
                "memory" => write_memory_limit(&dir, limits),
                _ => write(
                    &dir.join("pids.max"),
                    &limits.processes.unwrap_or(0).to_string(),
                ),
            };
            let opened = written.and_then(|()| {
                fs::OpenOptions::new()
                    .write(true)
                    .open(dir.join("cgroup.procs"))
                    .map_err(|e| (dir.join("cgroup.procs"), e))
            });
            match opened {
                Ok(file) => cgroups.procs.push(file.into()),
                Err((path, source)) => {
                    cgroups.remove();
                    return Err(SetupError::Cgroup {
                        path,
                        what: "writing",
                        source,
                    });
                }
            }
            if controller == "memory" {
                cgroups.memory = Some(dir);
            }
        }
        Ok((!cgroups.dirs.is_empty()).then_some(cgroups))
    }

    /// Descriptors of the `cgroup.procs` files the init writes itself into.
    pub(crate) fn procs_fds(&self) -> Vec<i32> {
        self.procs.iter().map(AsRawFd::as_raw_fd).collect()
    }

    /// Closes the `cgroup.procs` descriptors (the parent's copies, once the init is cloned).
    pub(crate) fn release_fds(&mut self) {
        self.procs.clear();
    }

    /// How many processes of the sandbox the OOM killer has killed.
    pub fn oom_kills(&self) -> u64 {
        let Some(dir) = &self.memory else {
            return 0;
        };
        fs::read_to_string(dir.join("memory.oom_control"))
            .ok()
            .and_then(|text| {
                text.lines()
                    .find_map(|l| l.strip_prefix("oom_kill "))
                    .and_then(|n| n.trim().parse::<u64>().ok())
            })
            .unwrap_or(0)
    }

    /// Peak memory of the whole sandbox.
    pub fn peak_memory(&self) -> Option<u64> {
        let dir = self.memory.as_ref()?;
        fs::read_to_string(dir.join("memory.max_usage_in_bytes"))
            .ok()?
            .trim()
            .parse()
            .ok()
    }

    /// Removes the cgroups (they are empty once the sandbox's init has been reaped).
    pub fn remove(&mut self) {
        self.procs.clear();
        for dir in self.dirs.drain(..) {
            // The kernel may take a moment to release an emptied cgroup.
            for _ in 0..50 {
                match fs::remove_dir(&dir) {
                    Err(e) if e.raw_os_error() == Some(libc::EBUSY) => {
                        std::thread::sleep(std::time::Duration::from_millis(2))
                    }
                    _ => break,
                }
            }
        }
    }
}

impl Drop for Cgroups {
    fn drop(&mut self) {
        self.remove();
    }
}

fn write(path: &Path, value: &str) -> Result<(), (PathBuf, std::io::Error)> {
    fs::OpenOptions::new()
        .write(true)
        .open(path)
        .and_then(|mut f| f.write_all(value.as_bytes()))
        .map_err(|e| (path.to_owned(), e))
}

fn write_memory_limit(dir: &Path, limits: &Limits) -> Result<(), (PathBuf, std::io::Error)> {
    let bytes = limits.memory.map_or(0, |m| m.0).to_string();
    write(&dir.join("memory.limit_in_bytes"), &bytes)?;
    // With swap accounting, also cap memory+swap so the sandbox cannot swap its way past.
    let memsw = dir.join("memory.memsw.limit_in_bytes");
    if memsw.exists() {
        write(&memsw, &bytes)?;
    }
    Ok(())
}

/// The caller's cgroup path (relative) in the v1 hierarchy of `controller`.
fn own_cgroup<'a>(proc_self_cgroup: &'a str, controller: &str) -> Option<&'a str> {
    proc_self_cgroup.lines().find_map(|line| {
        let mut parts = line.splitn(3, ':');
        let (_, controllers, path) = (parts.next()?, parts.next()?, parts.next()?);
        controllers
            .split(',')
            .any(|c| c == controller)
            .then(|| path.trim_start_matches('/'))
    })
}

/// Removes empty `lockbox-<pid>-*` cgroups whose lockbox process is gone (killed with -9).
fn sweep_orphans(parent: &Path) {
    let Ok(entries) = fs::read_dir(parent) else {
        return;
    };
    for entry in entries.flatten() {
        let name = entry.file_name();
        let Some(pid) = name
            .to_str()
            .and_then(|n| n.strip_prefix("lockbox-"))
            .and_then(|rest| rest.split('-').next())
            .and_then(|pid| pid.parse::<u32>().ok())
        else {
            continue;
        };
        if !Path::new(&format!("/proc/{pid}")).exists() {
            let _ = fs::remove_dir(entry.path());
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn own_cgroup_finds_the_controller_line() {
        let text = "9:name=systemd:/\n4:memory:/process_api/abc\n8:pids:/\n0::/\n";
        assert_eq!(own_cgroup(text, "memory"), Some("process_api/abc"));
        assert_eq!(own_cgroup(text, "pids"), Some(""));
        assert_eq!(own_cgroup(text, "cpu"), None);
    }

    #[test]
    fn without_a_cgroup_root_limits_fall_back_to_rlimits() {
        let root = tempfile::tempdir().unwrap();
        let limits = Limits {
            memory: Some(lockbox_policy::ByteSize(64 << 20)),
            cpu_time: Some(std::time::Duration::from_secs(2)),
            open_files: Some(64),
            ..Limits::default()
        };
        let plan = prepare(&limits, root.path()).unwrap();
        assert!(plan.cgroups.is_none());
        assert_eq!(plan.mechanisms.memory, Some(Mechanism::Rlimit));
        assert!(plan
            .rlimits
            .contains(&(libc::RLIMIT_AS, 64 << 20, 64 << 20)));
        assert!(plan.rlimits.contains(&(libc::RLIMIT_CPU, 2, 3)));
        assert!(plan.rlimits.contains(&(libc::RLIMIT_NOFILE, 64, 64)));
    }
}
