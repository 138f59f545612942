//! [`ErrorCode`]: every stable error code lockbox answers with — in `--json` output, HTTP
//! replies, transaction records and Python exceptions — in one enum, so that a front end
//! maps codes with an exhaustive `match` (the server's HTTP status, Python's exception
//! classes) and a new code cannot be forgotten.
//!
//! Each crate's error type says which code it is (`PolicyError::code`, `SetupError::code`,
//! `CowError::code`, ...). On the wire a code is its `SCREAMING_SNAKE` name. This crate has
//! no other content, so that every crate (the journal too, which knows nothing of sandboxes)
//! can depend on it.

use serde::{Deserialize, Deserializer, Serialize, Serializer};
use std::fmt;

macro_rules! codes {
    ($( $family:ident { $( $(#[$doc:meta])* $variant:ident = $name:literal, )* } )*) => {
        /// A stable error code (see the module doc).
        #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
        pub enum ErrorCode {
            $( $( $(#[$doc])* #[doc = concat!("`", $name, "`")] $variant, )* )*
        }

        impl ErrorCode {
            /// Every code, in declaration order.
            pub const ALL: &'static [ErrorCode] = &[$( $( ErrorCode::$variant, )* )*];

            /// The code's wire name, e.g. `STALE_BASE`.
            pub fn as_str(self) -> &'static str {
                match self {
                    $( $( ErrorCode::$variant => $name, )* )*
                }
            }

            /// Which part of lockbox raises it.
            pub fn family(self) -> Family {
                match self {
                    $( $( ErrorCode::$variant => Family::$family, )* )*
                }
            }

            /// The code named `name`, if there is one.
            pub fn from_name(name: &str) -> Option<ErrorCode> {
                match name {
                    $( $( $name => Some(ErrorCode::$variant), )* )*
                    _ => None,
                }
            }
        }
    };
}

/// Which part of lockbox raises a code (Python picks an exception's base class by it).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Family {
    /// A policy no sandbox can honour (`lockbox-policy`).
    Policy,
    /// A sandbox that could not be set up (`lockbox-confine`).
    Setup,
    /// Branches and commits (`lockbox-cow`).
    Cow,
    /// Transactions (`lockbox-txn`).
    Txn,
    /// The step journal (`lockbox-journal`).
    Journal,
    /// Long-lived sandboxes (`lockbox-runtime`).
    Runtime,
    /// The HTTP layer itself (`lockbox-server`).
    Server,
    /// OCI images: references, registries, the image store (`lockbox-image`).
    Image,
    /// A fleet's router (`python/lockbox/_router`, docs/fleet.md): the node that holds what a
    /// request names cannot take it, or no node can.
    Fleet,
}

impl Family {
    /// Its lowercase name (`"policy"`, ...).
    pub fn as_str(self) -> &'static str {
        match self {
            Family::Policy => "policy",
            Family::Setup => "setup",
            Family::Cow => "cow",
            Family::Txn => "txn",
            Family::Journal => "journal",
            Family::Runtime => "runtime",
            Family::Server => "server",
            Family::Image => "image",
            Family::Fleet => "fleet",
        }
    }
}

codes! {
    Policy {
        BadSize = "BAD_SIZE",
        BadDuration = "BAD_DURATION",
        RelativePath = "RELATIVE_PATH",
        ReservedPath = "RESERVED_PATH",
        BadEnv = "BAD_ENV",
        InvalidPolicy = "INVALID_POLICY",
        BadNetSpec = "BAD_NET_SPEC",
        BadProfile = "BAD_PROFILE",
        /// A policy that is not one (the Python SDK's JSON form did not parse).
        BadPolicy = "BAD_POLICY",
    }
    Setup {
        FeatureMissing = "FEATURE_MISSING",
        NetNameUnresolved = "NET_NAME_UNRESOLVED",
        CloneFailed = "CLONE_FAILED",
        SetupStepFailed = "SETUP_STEP_FAILED",
        InitDied = "INIT_DIED",
        SeccompBuildFailed = "SECCOMP_BUILD_FAILED",
        CgroupFailed = "CGROUP_FAILED",
        SequenceUnsupported = "SEQUENCE_UNSUPPORTED",
        SuperviseFailed = "SUPERVISE_FAILED",
    }
    Cow {
        /// A path that is not a plain relative one (also a policy path that cannot be used).
        BadPath = "BAD_PATH",
        InvalidBranchId = "INVALID_BRANCH_ID",
        StateDir = "STATE_DIR",
        CreateBranchDir = "CREATE_BRANCH_DIR",
        BranchNotFound = "BRANCH_NOT_FOUND",
        OpenWorkdir = "OPEN_WORKDIR",
        ImportUpper = "IMPORT_UPPER",
        WorkdirLock = "WORKDIR_LOCK",
        WorkdirMismatch = "WORKDIR_MISMATCH",
        StateWorkdirOverlap = "STATE_WORKDIR_OVERLAP",
        WriteBranchMeta = "WRITE_BRANCH_META",
        ReadBranchMeta = "READ_BRANCH_META",
        CorruptBranchMeta = "CORRUPT_BRANCH_META",
        RemoveBranch = "REMOVE_BRANCH",
        ListBranches = "LIST_BRANCHES",
        ReadBranchEntry = "READ_BRANCH_ENTRY",
        ReadWorkdirEntry = "READ_WORKDIR_ENTRY",
        SpecialFiles = "SPECIAL_FILES",
        ReservedName = "RESERVED_NAME",
        StaleBase = "STALE_BASE",
        /// A commit that follows a review would write what the review did not show.
        StaleReview = "STALE_REVIEW",
        WorkdirPermission = "WORKDIR_PERMISSION",
        ResolveBeneath = "RESOLVE_BENEATH",
        CommitStage = "COMMIT_STAGE",
        CommitSyncfs = "COMMIT_SYNCFS",
        CommitRename = "COMMIT_RENAME",
        CommitMkdir = "COMMIT_MKDIR",
        CommitDelete = "COMMIT_DELETE",
        CommitSetMeta = "COMMIT_SET_META",
        Fsync = "FSYNC",
        UnsupportedOverlay = "UNSUPPORTED_OVERLAY",
        NotChanged = "NOT_CHANGED",
        /// A hunk number the file's diff does not have.
        BadHunk = "BAD_HUNK",
        /// A partial commit of a branch whose full commit was interrupted.
        BranchCommitting = "BRANCH_COMMITTING",
        /// A partial commit interrupted past its commit point was finished instead.
        PartCommitFinished = "PART_COMMIT_FINISHED",
        InvalidSnapshotId = "INVALID_SNAPSHOT_ID",
        SnapshotNotFound = "SNAPSHOT_NOT_FOUND",
        /// A snapshot held by forks or stacked on by other snapshots.
        SnapshotInUse = "SNAPSHOT_IN_USE",
        /// Making, reading or removing a snapshot failed (disk, permissions).
        SnapshotStore = "SNAPSHOT_STORE",
    }
    Txn {
        InvalidTxnId = "INVALID_TXN_ID",
        TxnNotFound = "TXN_NOT_FOUND",
        TxnUsage = "TXN_USAGE",
        TxnWrongState = "TXN_WRONG_STATE",
        TxnStore = "TXN_STORE",
        TxnWriteRecord = "TXN_WRITE_RECORD",
        TxnReadRecord = "TXN_READ_RECORD",
        TxnCorruptRecord = "TXN_CORRUPT_RECORD",
        TxnStdio = "TXN_STDIO",
        WorkdirBusy = "WORKDIR_BUSY",
        TxnApply = "TXN_APPLY",
        /// The blocking task of a journaled transaction step died.
        JournalTask = "JOURNAL_TASK",
    }
    Journal {
        InvalidRunId = "INVALID_RUN_ID",
        InvalidStepName = "INVALID_STEP_NAME",
        InvalidBranchKey = "INVALID_BRANCH_KEY",
        DuplicateBranchKey = "DUPLICATE_BRANCH_KEY",
        ReplayMismatch = "REPLAY_MISMATCH",
        VersionMismatch = "VERSION_MISMATCH",
        MetadataMismatch = "METADATA_MISMATCH",
        TerminalRun = "TERMINAL_RUN",
        Fenced = "FENCED",
        OffsetConflict = "OFFSET_CONFLICT",
        JournalCorruption = "JOURNAL_CORRUPTION",
        UnsupportedFormat = "UNSUPPORTED_FORMAT",
        StepTooLarge = "STEP_TOO_LARGE",
        EncodeValue = "ENCODE_VALUE",
        DecodeValue = "DECODE_VALUE",
        RunNotFound = "RUN_NOT_FOUND",
        NoJournal = "NO_JOURNAL",
        RunExists = "RUN_EXISTS",
        StepNotFound = "STEP_NOT_FOUND",
        OffsetOutOfRange = "OFFSET_OUT_OF_RANGE",
        NotSuspended = "NOT_SUSPENDED",
        TxnOutcomeLookup = "TXN_OUTCOME_LOOKUP",
        InvalidStorageUrl = "INVALID_STORAGE_URL",
        StorageIo = "STORAGE_IO",
        StorageSqlite = "STORAGE_SQLITE",
        StoragePostgres = "STORAGE_POSTGRES",
        InvalidSchema = "INVALID_SCHEMA",
        StorageUnsupported = "STORAGE_UNSUPPORTED",
        StorageWorkerGone = "STORAGE_WORKER_GONE",
        /// A recorded step failed (its error is the step's recorded outcome).
        StepFailed = "STEP_FAILED",
        /// A value the journal cannot record (the Python SDK's pickling failed).
        NotSerializable = "NOT_SERIALIZABLE",
    }
    Runtime {
        SandboxNotFound = "SANDBOX_NOT_FOUND",
        SandboxNotRunning = "SANDBOX_NOT_RUNNING",
        SessionNotFound = "SESSION_NOT_FOUND",
        SessionTerminated = "SESSION_TERMINATED",
        ProcessNotFound = "PROCESS_NOT_FOUND",
        ProcessNotRunning = "PROCESS_NOT_RUNNING",
        NotSupported = "NOT_SUPPORTED",
        FileNotFound = "FILE_NOT_FOUND",
        PathOutsideSandbox = "PATH_OUTSIDE_SANDBOX",
        NotADirectory = "NOT_A_DIRECTORY",
        IsADirectory = "IS_A_DIRECTORY",
        AlreadyExists = "ALREADY_EXISTS",
        ReadOnly = "READ_ONLY",
        PermissionDenied = "PERMISSION_DENIED",
        NoWorkdir = "NO_WORKDIR",
        /// No exposed port of this number in the sandbox (expose it first).
        PortNotExposed = "PORT_NOT_EXPOSED",
        /// The port is exposed but nothing in the sandbox listens on it.
        PortNotListening = "PORT_NOT_LISTENING",
        /// No code context of this id in the sandbox (create it first; `default` is
        /// created on use).
        ContextNotFound = "CONTEXT_NOT_FOUND",
        /// No approval question of this id pending in the sandbox (never asked, timed
        /// out, or its caller is gone).
        QuestionNotFound = "QUESTION_NOT_FOUND",
        /// The approval question was decided already.
        QuestionDecided = "QUESTION_DECIDED",
        /// A snapshot's artifact (moved from another node) whose manifest or a blob is not
        /// the one its digest names, or that is malformed or cut short: nothing of it was
        /// kept (`details.reason`: `digest_mismatch`, `size_mismatch` or `malformed`).
        BadArtifact = "BAD_ARTIFACT",
        InvalidRequest = "INVALID_REQUEST",
        LimitReached = "LIMIT_REACHED",
        SetupFailed = "SETUP_FAILED",
        Conflict = "CONFLICT",
        Internal = "INTERNAL",
    }
    Server {
        Unauthorized = "UNAUTHORIZED",
        /// A console request with the session cookie but from another origin or without
        /// the CSRF token.
        Forbidden = "FORBIDDEN",
        /// An agent's request (MCP, a scoped token) asks for more than the operator's
        /// ceiling allows; the details name the field and the ceiling.
        BeyondCeiling = "BEYOND_CEILING",
        /// No scoped token of this id (never minted, or revoked).
        TokenNotFound = "TOKEN_NOT_FOUND",
        NotFound = "NOT_FOUND",
        MethodNotAllowed = "METHOD_NOT_ALLOWED",
        RequestTimeout = "REQUEST_TIMEOUT",
        PayloadTooLarge = "PAYLOAD_TOO_LARGE",
        UnsupportedMediaType = "UNSUPPORTED_MEDIA_TYPE",
        RangeNotSatisfiable = "RANGE_NOT_SATISFIABLE",
        ServerBusy = "SERVER_BUSY",
    }
    Image {
        /// A malformed image reference, platform, digest or holder name, or an ambiguous
        /// id prefix.
        BadReference = "BAD_REFERENCE",
        /// No image of this name or id in the store.
        ImageNotFound = "IMAGE_NOT_FOUND",
        /// An image a sandbox or snapshot holds (the holders are named).
        ImageInUse = "IMAGE_IN_USE",
        /// A multi-platform image without the asked platform.
        NoPlatform = "NO_PLATFORM",
        /// The registry could not be reached or answered an error.
        RegistryFailed = "REGISTRY_FAILED",
        /// The registry refused the credentials (or wants some and none are configured).
        RegistryAuth = "REGISTRY_AUTH",
        /// A blob or manifest whose digest or size is not the one that names it.
        DigestMismatch = "DIGEST_MISMATCH",
        /// A manifest, config or layer that cannot be used: malformed, beyond a bound, or
        /// hostile (an entry that would leave its layer).
        BadImage = "BAD_IMAGE",
        /// The image store could not be read or written.
        ImageStore = "IMAGE_STORE",
    }
    Fleet {
        /// The node that holds the sandbox, snapshot or scoped token cannot be reached now
        /// (its server down or restarting, frozen, being checked after it came back);
        /// `details.node` and `details.reason` say which and why. It may come back: retry.
        NodeUnreachable = "NODE_UNREACHABLE",
        /// No node is up to take the request (or none the `placement` hint names, or every
        /// one is full).
        NoNode = "NO_NODE",
        /// The sandbox's node was lost, or came back without it (`details.reason`); listed
        /// `lost` until deleted.
        SandboxLost = "SANDBOX_LOST",
        /// Every node that held the snapshot (its own and those it was copied to) is lost.
        SnapshotLost = "SNAPSHOT_LOST",
        /// The node of what the request names (a branch, a transaction, a run, a scoped
        /// token) is lost, and it with it.
        NodeLost = "NODE_LOST",
        /// The store that keeps the fleet's placements (Ray's GCS, PostgreSQL) did not
        /// answer; nothing was sent to a node. Retry.
        StoreUnavailable = "STORE_UNAVAILABLE",
    }
}

impl fmt::Display for ErrorCode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl PartialEq<str> for ErrorCode {
    fn eq(&self, other: &str) -> bool {
        self.as_str() == other
    }
}

impl PartialEq<&str> for ErrorCode {
    fn eq(&self, other: &&str) -> bool {
        self.as_str() == *other
    }
}

impl Serialize for ErrorCode {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(self.as_str())
    }
}

impl<'de> Deserialize<'de> for ErrorCode {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<ErrorCode, D::Error> {
        let name = String::deserialize(d)?;
        ErrorCode::from_name(&name)
            .ok_or_else(|| serde::de::Error::custom(format!("unknown error code {name:?}")))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_code_has_one_name_that_reads_back() {
        let mut names = std::collections::HashSet::new();
        for &code in ErrorCode::ALL {
            let name = code.as_str();
            assert!(names.insert(name), "{name} twice");
            assert!(
                name.bytes().all(|b| b.is_ascii_uppercase() || b == b'_'),
                "{name}"
            );
            assert_eq!(ErrorCode::from_name(name), Some(code));
            let json = serde_json::to_string(&code).unwrap();
            assert_eq!(serde_json::from_str::<ErrorCode>(&json).unwrap(), code);
        }
        assert!(serde_json::from_str::<ErrorCode>("\"NO_SUCH_CODE\"").is_err());
    }
}
