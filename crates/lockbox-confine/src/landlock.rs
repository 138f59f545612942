//! Landlock, the second wall behind the mount namespace: even if a path became reachable
//! (a bug in our mounts, a bind a process could create), Landlock only allows what the
//! policy grants. Rules are added in the sandbox init after `pivot_root` and enforced in
//! the command child, so the init itself stays outside the domain: Landlock's ptrace and
//! signal scoping then stop the command from tracing or signalling the init or anything
//! outside the sandbox.
//!
//! The syscalls are called directly (see `sys`) rather than through the `landlock` crate:
//! rules are added after the clone, where nothing may allocate, and the crate's builder
//! allocates. The access masks below follow `include/uapi/linux/landlock.h`.

use crate::sys;

/// Landlock access classes used by lockbox rules.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum RuleAccess {
    /// List directory contents only.
    ListDir,
    /// Read files, list directories, execute.
    Read,
    /// Read and execute one file (a granted read-only file).
    ReadFile,
    /// Everything the kernel's ABI knows.
    Full,
    /// Read and write one file (a granted writable file).
    ReadWriteFile,
    /// Read, write and ioctl a device file.
    Device,
    /// A directory of devices (devpts): list, read, write, ioctl.
    DeviceDir,
    /// An image root's `/`: everything but making device nodes and device ioctls (the
    /// devices the sandbox may use have rules of their own). Rights add up along a path,
    /// so this holds below `/` too: see `plan::image_stage` on what then keeps a read-only
    /// grant read-only.
    ImageRoot,
}

const EXECUTE: u64 = 1 << 0;
const WRITE_FILE: u64 = 1 << 1;
const READ_FILE: u64 = 1 << 2;
const READ_DIR: u64 = 1 << 3;
const MAKE_CHAR: u64 = 1 << 6;
const MAKE_BLOCK: u64 = 1 << 11;
const TRUNCATE: u64 = 1 << 14;
const IOCTL_DEV: u64 = 1 << 15;
const SCOPE_ABSTRACT_UNIX_SOCKET: u64 = 1 << 0;
const SCOPE_SIGNAL: u64 = 1 << 1;
const CREATE_RULESET_VERSION: u32 = 1 << 0;

/// The filesystem rights handled by Landlock ABI `abi` (v1: 13, v2: +REFER, v3: +TRUNCATE,
/// v5: +IOCTL_DEV).
pub fn handled_fs(abi: u32) -> u64 {
    let mut mask = (1u64 << 13) - 1;
    if abi >= 2 {
        mask |= 1 << 13;
    }
    if abi >= 3 {
        mask |= TRUNCATE;
    }
    if abi >= 5 {
        mask |= IOCTL_DEV;
    }
    mask
}

/// The scopes (IPC isolation) of ABI `abi`: abstract unix sockets and signals from v6.
pub fn scoped(abi: u32) -> u64 {
    if abi >= 6 {
        SCOPE_ABSTRACT_UNIX_SOCKET | SCOPE_SIGNAL
    } else {
        0
    }
}

impl RuleAccess {
    /// The access bits of this class under ABI `abi`.
    pub fn bits(self, abi: u32) -> u64 {
        let handled = handled_fs(abi);
        let bits = match self {
            RuleAccess::ListDir => READ_DIR,
            RuleAccess::Read => READ_FILE | READ_DIR | EXECUTE,
            RuleAccess::ReadFile => READ_FILE | EXECUTE,
            RuleAccess::Full => handled,
            RuleAccess::ImageRoot => handled & !(MAKE_CHAR | MAKE_BLOCK | IOCTL_DEV),
            RuleAccess::ReadWriteFile => READ_FILE | WRITE_FILE | EXECUTE | TRUNCATE,
            RuleAccess::Device => READ_FILE | WRITE_FILE | IOCTL_DEV | TRUNCATE,
            RuleAccess::DeviceDir => READ_FILE | WRITE_FILE | IOCTL_DEV | TRUNCATE | READ_DIR,
        };
        bits & handled
    }
}

/// The Landlock ABI version of the running kernel, or `None` if Landlock is unavailable
/// (not built in, or not in the `lsm=` list).
pub fn abi_version() -> Option<u32> {
    sys::landlock_create_ruleset(None, CREATE_RULESET_VERSION)
        .ok()
        .map(|v| v as u32)
}

/// The `landlock_ruleset_attr` bytes for ABI `abi`, sized to what that ABI knows so older
/// kernels accept it.
pub fn ruleset_attr(abi: u32) -> Vec<u8> {
    let mut attr = handled_fs(abi).to_ne_bytes().to_vec();
    if abi >= 4 {
        attr.extend_from_slice(&0u64.to_ne_bytes()); // handled_access_net: see issue on net
    }
    if abi >= 6 {
        attr.extend_from_slice(&scoped(abi).to_ne_bytes());
    }
    attr
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn masks_grow_with_the_abi() {
        assert_eq!(handled_fs(1).count_ones(), 13);
        assert_eq!(handled_fs(3).count_ones(), 15);
        assert_eq!(handled_fs(7).count_ones(), 16);
        assert_eq!(ruleset_attr(1).len(), 8);
        assert_eq!(ruleset_attr(5).len(), 16);
        assert_eq!(ruleset_attr(7).len(), 24);
    }

    #[test]
    fn rule_bits_never_exceed_the_handled_set() {
        for abi in 1..=7 {
            for access in [
                RuleAccess::ListDir,
                RuleAccess::Read,
                RuleAccess::ReadFile,
                RuleAccess::Full,
                RuleAccess::ReadWriteFile,
                RuleAccess::Device,
                RuleAccess::DeviceDir,
                RuleAccess::ImageRoot,
            ] {
                assert_eq!(access.bits(abi) & !handled_fs(abi), 0);
            }
        }
    }

    #[test]
    fn read_access_cannot_write() {
        assert_eq!(RuleAccess::Read.bits(7) & WRITE_FILE, 0);
    }
}
