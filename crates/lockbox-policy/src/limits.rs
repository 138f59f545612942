//! Resource limits of a sandbox. How each is enforced (cgroup or rlimit) is decided by
//! `lockbox-confine` from what the kernel lets the caller do.

use crate::error::PolicyError;
use crate::units::{opt_duration_serde, ByteSize};
use serde::{Deserialize, Serialize};
use std::time::Duration;

/// Resource limits; `None` means unlimited.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct Limits {
    /// Memory of the whole sandbox (cgroup) or address space per process (rlimit fallback).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub memory: Option<ByteSize>,
    /// Number of processes (and threads) in the sandbox.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub processes: Option<u64>,
    /// CPU time per process.
    #[serde(with = "opt_duration_serde", skip_serializing_if = "Option::is_none")]
    pub cpu_time: Option<Duration>,
    /// Open file descriptors per process.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub open_files: Option<u64>,
    /// Largest file a process may write.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub file_size: Option<ByteSize>,
}

impl Limits {
    pub(crate) fn validate(&self) -> Result<(), PolicyError> {
        let zero = |field: &'static str| PolicyError::Invalid {
            field,
            reason: "must be greater than zero".into(),
        };
        if self.memory.is_some_and(|m| m.0 < 1 << 20) {
            return Err(PolicyError::Invalid {
                field: "limits.memory",
                reason: "must be at least 1M: no program starts in less".into(),
            });
        }
        if self.processes == Some(0) {
            return Err(zero("limits.processes"));
        }
        if self.cpu_time.is_some_and(|d| d.as_secs() == 0) {
            return Err(PolicyError::Invalid {
                field: "limits.cpu_time",
                reason: "must be at least 1s (the kernel counts whole seconds)".into(),
            });
        }
        if self.open_files.is_some_and(|n| n < 3) {
            return Err(PolicyError::Invalid {
                field: "limits.open_files",
                reason: "must be at least 3 (stdin, stdout, stderr)".into(),
            });
        }
        if self.file_size == Some(ByteSize(0)) {
            return Err(zero("limits.file_size"));
        }
        Ok(())
    }
}
