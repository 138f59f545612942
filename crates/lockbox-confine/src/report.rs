//! The protocol between lockbox and a sandbox: fixed-size records on a close-on-exec
//! seqpacket socket (a socket, so a record can carry a descriptor). The child reports with
//! a [`Record`]; the parent releases a gated sandbox with a [`Go`].
//!
//! The sandbox init and the command child cannot allocate (see `sys`), so they report with
//! a 16-byte record instead of a message string; the parent turns it into an error that
//! names the step and path. The socket is close-on-exec, so the sandboxed command never
//! holds it and cannot forge a record.

pub use lockbox_netsup::handover::{NetHandover, NetTaken};

/// What a record says.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Record {
    /// A setup step failed: `step` (a [`Step`] code), `errno`, and the index of the plan
    /// item or path involved.
    Failed {
        /// Which step.
        step: Step,
        /// The errno.
        errno: i32,
        /// Index into the plan (meaning depends on the step).
        index: u32,
    },
    /// The command exited with this code.
    Exited(i32),
    /// The command was killed by this signal.
    Signaled(i32),
    /// A detached mount of overlay number `overlay`'s bounded upper tmpfs travels with this
    /// record (`SCM_RIGHTS`).
    Upper {
        /// Index of the overlay in the plan.
        overlay: u32,
    },
    /// Resource usage of every process reaped in the sandbox. Sent right before the status,
    /// once the init has killed and reaped everything left.
    Usage {
        /// User + system CPU time in microseconds.
        cpu_us: u64,
        /// Largest resident set of one process, in KiB.
        max_rss_kb: u32,
    },
}

/// Setup steps of the init and the command child, in the order they run.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u32)]
#[allow(missing_docs)]
pub enum Step {
    JoinCgroup = 1,
    WriteSetgroups,
    WriteUidMap,
    WriteGidMap,
    UnshareCgroup,
    MakeMountsPrivate,
    CaptureSource,
    MountStage,
    Mount,
    PivotRoot,
    RemountRootReadonly,
    SetHostname,
    LoopbackUp,
    LandlockRuleset,
    LandlockRule,
    SetDumpable,
    SetDeathSignal,
    BlockSignals,
    ForkCommand,
    SetRlimit,
    PassFd,
    Chdir,
    NoNewPrivs,
    DropCapabilities,
    LandlockRestrict,
    SeccompFilter,
    Exec,
    RedirectStdio,
    NetFilter,
    NetHandover,
    UnshareIpc,
    LimitUserQuota,
    HideCommandLine,
    NetNamespace,
    Helper,
    DnsSockets,
    NewSession,
    LeanExec,
}

impl Step {
    const ALL: [Step; 38] = [
        Step::JoinCgroup,
        Step::WriteSetgroups,
        Step::WriteUidMap,
        Step::WriteGidMap,
        Step::UnshareCgroup,
        Step::MakeMountsPrivate,
        Step::CaptureSource,
        Step::MountStage,
        Step::Mount,
        Step::PivotRoot,
        Step::RemountRootReadonly,
        Step::SetHostname,
        Step::LoopbackUp,
        Step::LandlockRuleset,
        Step::LandlockRule,
        Step::SetDumpable,
        Step::SetDeathSignal,
        Step::BlockSignals,
        Step::ForkCommand,
        Step::SetRlimit,
        Step::PassFd,
        Step::Chdir,
        Step::NoNewPrivs,
        Step::DropCapabilities,
        Step::LandlockRestrict,
        Step::SeccompFilter,
        Step::Exec,
        Step::RedirectStdio,
        Step::NetFilter,
        Step::NetHandover,
        Step::UnshareIpc,
        Step::LimitUserQuota,
        Step::HideCommandLine,
        Step::NetNamespace,
        Step::Helper,
        Step::DnsSockets,
        Step::NewSession,
        Step::LeanExec,
    ];

    pub(crate) fn from_code(code: u32) -> Option<Step> {
        Step::ALL.iter().copied().find(|s| *s as u32 == code)
    }

    /// A short lowercase description for messages.
    pub fn describe(self) -> &'static str {
        match self {
            Step::JoinCgroup => "joining the sandbox cgroup",
            Step::WriteSetgroups => "writing /proc/self/setgroups",
            Step::WriteUidMap => "writing the uid map",
            Step::WriteGidMap => "writing the gid map",
            Step::UnshareCgroup => "creating the cgroup namespace",
            Step::MakeMountsPrivate => "making mounts private",
            Step::CaptureSource => "binding",
            Step::MountStage => "mounting the new root (a tmpfs on /tmp)",
            Step::Mount => "building the root",
            Step::PivotRoot => "pivot_root into the new root",
            Step::RemountRootReadonly => "making the new root read-only",
            Step::SetHostname => "setting the hostname",
            Step::LoopbackUp => "bringing up loopback",
            Step::DnsSockets => "binding lockbox's resolver in the sandbox (127.0.0.153:53)",
            Step::NetNamespace => "creating the network namespace",
            Step::Helper => "running the set-up helper",
            Step::LandlockRuleset => "creating the landlock ruleset",
            Step::LandlockRule => "adding a landlock rule for",
            Step::SetDumpable => "making the init non-dumpable",
            Step::SetDeathSignal => "setting the parent-death signal",
            Step::BlockSignals => "setting up signal forwarding",
            Step::ForkCommand => "forking the command",
            Step::SetRlimit => "setting a resource limit",
            Step::PassFd => "passing file descriptor",
            Step::Chdir => "changing to the working directory",
            Step::NoNewPrivs => "setting no_new_privs",
            Step::DropCapabilities => "dropping capabilities",
            Step::LandlockRestrict => "enforcing landlock",
            Step::SeccompFilter => "installing the seccomp filter",
            Step::Exec => "executing",
            Step::RedirectStdio => "redirecting standard input/output",
            Step::NetFilter => "installing the seccomp filter of the network or rename supervisor",
            Step::NetHandover => "handing the seccomp filter to the network or rename supervisor",
            Step::UnshareIpc => "creating the next command's IPC namespace",
            Step::LimitUserQuota => "limiting the sandbox's share of a per-user quota:",
            Step::HideCommandLine => "hiding the caller's command line from the sandbox",
            Step::NewSession => "starting the command's session on its terminal",
            Step::LeanExec => "re-executing the sandbox's init small (its agent's executable)",
        }
    }
}

const KIND_FAILED: u32 = 1;
const KIND_EXITED: u32 = 2;
const KIND_SIGNALED: u32 = 3;
const KIND_USAGE: u32 = 4;
const KIND_UPPER: u32 = 5;
/// Distinct kinds, so that a record read the wrong way round is garbage, not a status.
const KIND_GO: u32 = 6;
// 7 and 8 are the network supervisor's handover records (`lockbox_netsup::handover`).

/// Size of an encoded record.
pub const RECORD_LEN: usize = 16;
// The network supervisor's handover records travel in the same buffers.
const _: () = assert!(RECORD_LEN == lockbox_netsup::handover::RECORD_LEN);

/// The parent's go to a gated sandbox: run the next command. Descriptors sent along with
/// it replace the command's stdio, in order, where `stdio` says so.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Go {
    /// Whether a descriptor sent along replaces descriptor 0, 1, 2.
    pub stdio: [bool; 3],
    /// Whether the last descriptor sent along is the command of a pre-armed sandbox (see
    /// `armed`).
    pub command: bool,
}

impl Go {
    /// Encodes to the wire form.
    pub fn encode(self) -> [u8; RECORD_LEN] {
        let mask = self
            .stdio
            .iter()
            .enumerate()
            .fold(0u32, |mask, (i, given)| mask | u32::from(*given) << i)
            | u32::from(self.command) << 3;
        encode_words([KIND_GO, mask, 0, 0])
    }

    /// Decodes the wire form; `None` for garbage. Allocation-free: the child reads it.
    pub fn decode(bytes: &[u8; RECORD_LEN]) -> Option<Go> {
        let word = |i| decode_word(bytes, i);
        if word(0) != KIND_GO || word(1) > 0b1111 {
            return None;
        }
        Some(Go {
            stdio: [0, 1, 2].map(|i| word(1) & (1 << i) != 0),
            command: word(1) & (1 << 3) != 0,
        })
    }
}

fn encode_words(words: [u32; 4]) -> [u8; RECORD_LEN] {
    let mut out = [0u8; RECORD_LEN];
    for (i, word) in words.into_iter().enumerate() {
        out[i * 4..i * 4 + 4].copy_from_slice(&word.to_ne_bytes());
    }
    out
}

fn decode_word(bytes: &[u8; RECORD_LEN], i: usize) -> u32 {
    let mut w = [0u8; 4];
    w.copy_from_slice(&bytes[i * 4..i * 4 + 4]);
    u32::from_ne_bytes(w)
}

impl Record {
    /// Encodes to the wire form (native endian; both ends are the same machine).
    pub fn encode(self) -> [u8; RECORD_LEN] {
        let (kind, a, b, c) = match self {
            Record::Failed { step, errno, index } => {
                (KIND_FAILED, step as u32, errno as u32, index)
            }
            Record::Exited(code) => (KIND_EXITED, code as u32, 0, 0),
            Record::Signaled(sig) => (KIND_SIGNALED, sig as u32, 0, 0),
            Record::Upper { overlay } => (KIND_UPPER, overlay, 0, 0),
            Record::Usage { cpu_us, max_rss_kb } => {
                (KIND_USAGE, cpu_us as u32, (cpu_us >> 32) as u32, max_rss_kb)
            }
        };
        encode_words([kind, a, b, c])
    }

    /// Decodes the wire form; `None` for garbage.
    pub fn decode(bytes: &[u8; RECORD_LEN]) -> Option<Record> {
        let word = |i| decode_word(bytes, i);
        match word(0) {
            KIND_FAILED => Some(Record::Failed {
                step: Step::from_code(word(1))?,
                errno: word(2) as i32,
                index: word(3),
            }),
            KIND_EXITED => Some(Record::Exited(word(1) as i32)),
            KIND_SIGNALED => Some(Record::Signaled(word(1) as i32)),
            KIND_UPPER => Some(Record::Upper { overlay: word(1) }),
            KIND_USAGE => Some(Record::Usage {
                cpu_us: u64::from(word(1)) | (u64::from(word(2)) << 32),
                max_rss_kb: word(3),
            }),
            _ => None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn records_round_trip() {
        for r in [
            Record::Exited(0),
            Record::Exited(255),
            Record::Signaled(9),
            Record::Upper { overlay: 2 },
            Record::Usage {
                cpu_us: (7 << 32) + 5,
                max_rss_kb: 1234,
            },
            Record::Failed {
                step: Step::Exec,
                errno: libc::ENOENT,
                index: 3,
            },
        ] {
            assert_eq!(Record::decode(&r.encode()), Some(r));
        }
        assert_eq!(Record::decode(&[0xff; RECORD_LEN]), None);
    }

    #[test]
    fn every_go_round_trips_and_is_no_report() {
        for mask in 0..16u8 {
            let go = Go {
                stdio: [0, 1, 2].map(|i| mask & (1 << i) != 0),
                command: mask & 8 != 0,
            };
            assert_eq!(Go::decode(&go.encode()), Some(go));
            assert_eq!(Record::decode(&go.encode()), None);
        }
        assert_eq!(Go::decode(&Record::Exited(0).encode()), None);
        assert_eq!(Go::decode(&[0xff; RECORD_LEN]), None);
    }

    #[test]
    fn the_network_handover_round_trips_and_is_nothing_else() {
        let handover = NetHandover {
            listener: 7,
            dns_udp: -1,
            dns_tcp: 9,
        };
        assert_eq!(NetHandover::decode(&handover.encode()), Some(handover));
        assert_eq!(NetTaken::decode(&NetTaken.encode()), Some(NetTaken));
        assert_eq!(NetTaken::decode(&handover.encode()), None);
        assert_eq!(NetHandover::decode(&NetTaken.encode()), None);
        for other in [handover.encode(), NetTaken.encode()] {
            assert_eq!(Record::decode(&other), None);
            assert_eq!(Go::decode(&other), None);
        }
    }

    #[test]
    fn every_step_code_decodes() {
        for step in Step::ALL {
            assert_eq!(Step::from_code(step as u32), Some(step));
        }
    }
}
