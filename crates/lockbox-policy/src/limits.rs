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
    /// Inodes (files, directories, symlinks, hard links) each tmpfs the sandbox can write
    /// may hold: `/tmp`, `/dev/shm` and a bounded upper layer. `None`: the default of
    /// [`Limits::tmpfs_inodes`].
    #[serde(skip_serializing_if = "Option::is_none")]
    pub inodes: Option<u64>,
}

/// Inodes per writable tmpfs when neither `inodes` nor `memory` says otherwise. A tmpfs
/// inode costs about 1 KiB of unreclaimable kernel memory (inode and dentry), which no
/// rlimit counts: this keeps one mount under about 256 MiB of it.
pub const DEFAULT_TMPFS_INODES: u64 = 262_144;

/// Bytes of `memory` per inode when the bound is derived from a memory limit: the kernel
/// memory of a full mount's inodes then stays about the memory limit.
pub const MEMORY_PER_TMPFS_INODE: u64 = 1024;

/// Bytes of a bounded upper layer's `max_size` per inode it may hold. A tmpfs counts only
/// data pages against its size (directories, empty files, short symlinks and hard links
/// cost none), while on the host's disk a directory takes a 4 KiB block: one inode per
/// 4 KiB keeps what the layer costs once stored at most about twice its size.
pub const UPPER_BYTES_PER_INODE: u64 = 4096;

/// Inodes of a bounded upper layer that are not the sandbox's: the tmpfs root, `upper`,
/// `work`, and overlayfs's `work/work` and shared whiteout.
pub const UPPER_OWN_INODES: u64 = 5;

/// Free inodes overlayfs needs, besides its own, while it mounts (its feature probes).
const UPPER_MOUNT_INODES: u64 = 2;

impl Limits {
    /// Each limit this one leaves out taken from `fallback`.
    pub fn or(self, fallback: &Limits) -> Limits {
        Limits {
            memory: self.memory.or(fallback.memory),
            processes: self.processes.or(fallback.processes),
            cpu_time: self.cpu_time.or(fallback.cpu_time),
            open_files: self.open_files.or(fallback.open_files),
            file_size: self.file_size.or(fallback.file_size),
            inodes: self.inodes.or(fallback.inodes),
        }
    }

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
        if self.inodes == Some(0) {
            return Err(PolicyError::Invalid {
                field: "limits.inodes",
                reason: "must be greater than zero (0 would mean no bound to the kernel)".into(),
            });
        }
        Ok(())
    }

    /// The inode bound of each tmpfs the sandbox can write (`/tmp`, `/dev/shm`):
    /// `inodes` if set, else [`DEFAULT_TMPFS_INODES`], or one per
    /// [`MEMORY_PER_TMPFS_INODE`] bytes of `memory` if that is fewer.
    pub fn tmpfs_inodes(&self) -> u64 {
        self.inodes.unwrap_or_else(|| match self.memory {
            Some(m) => (m.0 / MEMORY_PER_TMPFS_INODE).clamp(1, DEFAULT_TMPFS_INODES),
            None => DEFAULT_TMPFS_INODES,
        })
    }

    /// The inode bound of a bounded upper layer of `max_size` bytes: one per
    /// [`UPPER_BYTES_PER_INODE`] bytes (at least the two overlayfs needs to mount), no
    /// more than [`Limits::tmpfs_inodes`], plus [`UPPER_OWN_INODES`].
    pub fn upper_inodes(&self, max_size: ByteSize) -> u64 {
        (max_size.0 / UPPER_BYTES_PER_INODE)
            .min(self.tmpfs_inodes())
            .max(UPPER_MOUNT_INODES)
            .saturating_add(UPPER_OWN_INODES)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tmpfs_inodes_default_to_262144_or_one_per_kib_of_memory() {
        let mut limits = Limits::default();
        assert_eq!(limits.tmpfs_inodes(), 262_144);
        limits.memory = Some(ByteSize(64 << 20));
        assert_eq!(limits.tmpfs_inodes(), 65_536);
        limits.memory = Some(ByteSize(16 << 30));
        assert_eq!(limits.tmpfs_inodes(), 262_144);
        limits.inodes = Some(1_000_000);
        assert_eq!(limits.tmpfs_inodes(), 1_000_000);
        limits.inodes = Some(0);
        assert!(limits.validate().is_err());
    }

    #[test]
    fn an_upper_layer_holds_one_inode_per_4k_of_its_size_within_the_tmpfs_bound() {
        let limits = Limits::default();
        assert_eq!(
            limits.upper_inodes(ByteSize(1 << 20)),
            256 + UPPER_OWN_INODES
        );
        assert_eq!(limits.upper_inodes(ByteSize(1)), 2 + UPPER_OWN_INODES);
        assert_eq!(
            limits.upper_inodes(ByteSize(64 << 30)),
            262_144 + UPPER_OWN_INODES
        );
        let small = Limits {
            inodes: Some(100),
            ..Limits::default()
        };
        assert_eq!(
            small.upper_inodes(ByteSize(1 << 20)),
            100 + UPPER_OWN_INODES
        );
    }
}
