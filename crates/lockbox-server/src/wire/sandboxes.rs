//! Sandboxes: create, list, describe, delete.

use super::{check_ms, ms, policy_error, time};
use crate::error::ApiError;
use crate::openapi::{MAX_GRACE_MS, MAX_MS};
use lockbox_policy::name::Decoded;
use lockbox_policy::{ByteSize, Net, Policy};
use lockbox_runtime::{OnExit, SandboxSpec, SandboxState};
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::path::PathBuf;
use std::time::Duration;
use utoipa::{IntoParams, ToSchema};

/// `POST /v1/sandboxes`.
#[derive(Debug, Default, Deserialize, ToSchema)]
#[serde(default, deny_unknown_fields)]
pub struct CreateSandbox {
    /// Extra absolute host paths readable inside.
    #[schema(value_type = Vec<String>)]
    pub fs_readable: Vec<PathBuf>,
    /// Absolute host paths writable inside: writes reach the host directly, with no branch.
    #[schema(value_type = Vec<String>)]
    pub fs_writable: Vec<PathBuf>,
    /// Grant /usr, /bin, /sbin, /lib, /lib64 and /etc (minus secrets) read-only (default
    /// true).
    pub default_reads: Option<bool>,
    /// `none` (loopback only, default) or `host`.
    pub net: Option<Net>,
    /// Memory limit, bytes or `512M`.
    pub max_memory: Option<ByteSize>,
    /// Processes and threads.
    #[schema(minimum = 1)]
    pub max_processes: Option<u64>,
    /// Descriptors per process.
    #[schema(minimum = 1)]
    pub max_open_files: Option<u64>,
    /// Largest file written, bytes or `100M`.
    pub max_file_size: Option<ByteSize>,
    /// Inodes per writable tmpfs (`/tmp`, `/dev/shm`, a bounded branch).
    #[schema(minimum = 1)]
    pub max_inodes: Option<u64>,
    /// Wall-clock lifetime of the sandbox.
    #[schema(minimum = 1, maximum = 2_592_000_000_u64)]
    pub timeout_ms: Option<u64>,
    /// SIGTERM → SIGKILL delay when processes are stopped.
    #[schema(maximum = 60_000)]
    pub kill_grace_ms: Option<u64>,
    /// Variables set in every session and process.
    pub env: BTreeMap<String, String>,
    /// Start from an empty environment instead of PATH, LANG, LC_ALL, TERM, HOME=/tmp.
    pub clean_env: bool,
    /// Absolute working directory inside (default: workdir, else /tmp).
    #[schema(value_type = Option<String>)]
    pub cwd: Option<PathBuf>,
    /// Hostname inside.
    pub hostname: Option<String>,
    /// Absolute host directory the sandbox sees (at the same path) through a copy-on-write
    /// branch: writes stay in the branch until committed (see changes, diff, commit, abort).
    #[serde(with = "lockbox_policy::name::json::option")]
    #[schema(value_type = Option<Decoded>)]
    pub workdir: Option<PathBuf>,
    /// What deleting the sandbox does with the branch: `keep` (default), `commit`, `abort`.
    pub on_exit: Option<OnExitName>,
    /// Delete the sandbox after this long without a request.
    #[schema(minimum = 1, maximum = 2_592_000_000_u64)]
    pub idle_timeout_ms: Option<u64>,
    /// Free-form labels, returned as given.
    pub labels: BTreeMap<String, String>,
    /// Start from this snapshot's files (a fork of it); `workdir` is then the snapshot's.
    pub from_snapshot: Option<String>,
    /// Approvals: with `net.allow`, an unlisted destination is asked (`GET approvals`), not
    /// refused.
    pub net_ask: bool,
    /// How long a question waits for its verdict before the call is denied (default
    /// 30,000); needs `net_ask`.
    #[schema(minimum = 1, maximum = 2_592_000_000_u64)]
    pub net_ask_timeout_ms: Option<u64>,
    /// `HOST bearer NAME` or `HOST header HEADER-NAME NAME`: lockbox terminates the
    /// sandbox's HTTPS to HOST and puts the server's credential NAME (`lockbox serve
    /// --credential`) on each request; HOST must be allowed by name in `net.allow`.
    pub http_auth: Vec<String>,
    /// `METHOD HOST/PATH-PREFIX`: on HOST (intercepted), only the listed requests pass.
    pub http_allow: Vec<String>,
    /// An OCI image the sandbox runs on instead of the host's userland (`busybox:1.36`,
    /// `ghcr.io/org/app:1`, `oci:/srv/images/app:v1`; see docs/images.md): pulled into the
    /// server's image store if it lacks it, held while the sandbox lives. Its Env,
    /// WorkingDir and User apply to every session and process; sessions need `bash` in
    /// the image. An agent (MCP, scoped token) may name only images its ceiling allows
    /// (`--allow-image`).
    pub image: Option<String>,
    /// When `image` is pulled: `missing` (the default: only when the server's store lacks
    /// it), `always` (pulled again: a tag may have moved), `never` (an image not in the
    /// store is `IMAGE_NOT_FOUND`). Needs `image`.
    pub image_pull: Option<ImagePull>,
}

/// When a sandbox's `image` is pulled (`image_pull`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, Serialize, ToSchema)]
#[serde(rename_all = "lowercase")]
pub enum ImagePull {
    /// Only when the store lacks it.
    Missing,
    /// Every time.
    Always,
    /// Never: an image not in the store is an error.
    Never,
}

/// One rule of `http_auth` or `http_allow`, parsed; errors name the field.
fn parse_rules<T>(field: &str, rules: &[String]) -> Result<Vec<T>, ApiError>
where
    T: std::str::FromStr<Err = lockbox_runtime::InterceptError>,
{
    rules
        .iter()
        .map(|rule| {
            rule.parse::<T>().map_err(|e| {
                let why = match e {
                    lockbox_runtime::InterceptError::BadRule { reason, .. } => reason,
                    other => other.to_string(),
                };
                ApiError::invalid(field, format!("{field}: {rule:?}: {why}"))
            })
        })
        .collect()
}

impl CreateSandbox {
    /// The one conversion from the HTTP body to a policy and a sandbox spec.
    pub fn into_spec(self) -> Result<SandboxSpec, ApiError> {
        let mut policy = Policy::default();
        policy.fs.read = self.fs_readable;
        policy.fs.write = self.fs_writable;
        if let Some(default_reads) = self.default_reads {
            policy.fs.default_reads = default_reads;
        }
        policy.net = self.net.unwrap_or_default();
        policy.limits.memory = self.max_memory;
        policy.limits.processes = self.max_processes;
        policy.limits.open_files = self.max_open_files;
        policy.limits.file_size = self.max_file_size;
        policy.limits.inodes = self.max_inodes;
        policy.timeout = self.timeout_ms.map(Duration::from_millis);
        if let Some(ms) = self.kill_grace_ms {
            policy.kill_grace = Duration::from_millis(ms);
        }
        policy.env.set = self.env;
        policy.env.clean = self.clean_env;
        policy.cwd = self.cwd;
        if let Some(image) = self.image {
            if image.trim().is_empty() {
                return Err(ApiError::invalid("image", "image: must not be empty"));
            }
            policy.image = Some(image);
        }
        let image_pull = match (self.image_pull, &policy.image) {
            (None, _) => lockbox_image::PullPolicy::Missing,
            (Some(_), None) => {
                return Err(ApiError::invalid(
                    "image_pull",
                    "image_pull says when to pull the sandbox's image: give image too",
                ))
            }
            (Some(ImagePull::Missing), Some(_)) => lockbox_image::PullPolicy::Missing,
            (Some(ImagePull::Always), Some(_)) => lockbox_image::PullPolicy::Always,
            (Some(ImagePull::Never), Some(_)) => lockbox_image::PullPolicy::Never,
        };
        if let Some(hostname) = self.hostname {
            policy.hostname = hostname;
        }
        check_ms("timeout_ms", self.timeout_ms, MAX_MS)?;
        check_ms("kill_grace_ms", self.kill_grace_ms, MAX_GRACE_MS)?;
        check_ms("idle_timeout_ms", self.idle_timeout_ms, MAX_MS)?;
        check_ms("net_ask_timeout_ms", self.net_ask_timeout_ms, MAX_MS)?;
        let net_ask = match (self.net_ask, self.net_ask_timeout_ms) {
            (false, None) => None,
            (false, Some(_)) => {
                return Err(ApiError::invalid(
                    "net_ask_timeout_ms",
                    "net_ask_timeout_ms: needs net_ask: true",
                ))
            }
            (true, _) if !matches!(policy.net, Net::Allow(_)) => {
                return Err(ApiError::invalid(
                    "net_ask",
                    "net_ask: asks about destinations off the allow-list, so it needs net {\"allow\": [...]}",
                ))
            }
            (true, Some(0)) => {
                return Err(ApiError::invalid(
                    "net_ask_timeout_ms",
                    "net_ask_timeout_ms: must be greater than zero",
                ))
            }
            (true, ms) => Some(
                ms.map_or(lockbox_runtime::DEFAULT_ASK_TIMEOUT, Duration::from_millis),
            ),
        };
        policy.validate().map_err(policy_error)?;
        let http = lockbox_runtime::HttpRules::new(
            parse_rules("http_auth", &self.http_auth)?,
            parse_rules("http_allow", &self.http_allow)?,
        )
        .map_err(|e| ApiError::invalid("http_auth", format!("http_auth: {e}")))?;
        if let Some(workdir) = &self.workdir {
            if !workdir.is_absolute() {
                return Err(ApiError::invalid(
                    "workdir",
                    format!("workdir: path {workdir:?} must be absolute"),
                ));
            }
        }
        if self.idle_timeout_ms == Some(0) {
            return Err(ApiError::invalid(
                "idle_timeout_ms",
                "idle_timeout_ms: must be greater than zero (leave it out for none)",
            ));
        }
        Ok(SandboxSpec {
            policy,
            workdir: self.workdir,
            on_exit: self.on_exit.map(OnExit::from).unwrap_or_default(),
            idle_timeout: self.idle_timeout_ms.map(Duration::from_millis),
            labels: self.labels,
            from_snapshot: self
                .from_snapshot
                .map(|s| {
                    lockbox_runtime::SnapshotId::parse(&s).map_err(|e| {
                        ApiError::invalid("from_snapshot", format!("from_snapshot: {e}"))
                    })
                })
                .transpose()?,
            net_ask,
            http,
            image_pull,
            ..SandboxSpec::default()
        })
    }
}

/// What deleting a sandbox does with its branch, as a client names it.
#[derive(Debug, Clone, Copy, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum OnExitName {
    /// `keep`.
    Keep,
    /// `commit`.
    Commit,
    /// `abort`.
    Abort,
}

impl From<OnExitName> for OnExit {
    fn from(o: OnExitName) -> OnExit {
        match o {
            OnExitName::Keep => OnExit::Keep,
            OnExitName::Commit => OnExit::Commit,
            OnExitName::Abort => OnExit::Abort,
        }
    }
}

/// A sandbox as the API shows it ([`lockbox_runtime::SandboxInfo`]).
#[derive(Debug, Serialize, ToSchema)]
#[schema(as = Sandbox)]
pub struct SandboxInfo {
    pub id: String,
    /// `running`, `stopped` or `lost`.
    pub state: StateName,
    pub created_at: String,
    #[serde(serialize_with = "lockbox_policy::name::json::option::serialize")]
    #[schema(value_type = Option<Decoded>, required = true)]
    pub workdir: Option<PathBuf>,
    #[schema(required = true)]
    pub branch: Option<String>,
    /// What deleting the sandbox did with its branch.
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schema(value_type = BranchActionName, required = false)]
    pub branch_action: Option<BranchActionName>,
    pub labels: BTreeMap<String, String>,
    pub sessions: usize,
    pub processes: usize,
    #[schema(required = true)]
    pub policy: Option<PolicySummary>,
    #[schema(required = true)]
    pub usage: Option<ResourceUse>,
}

/// What deleting a sandbox did with its branch ([`lockbox_runtime::BranchAction`]).
#[derive(Debug, Clone, Copy, Serialize, ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum BranchActionName {
    /// Kept for later (`lockbox branch`).
    Kept,
    /// Committed to the workdir.
    Committed,
    /// Discarded.
    Aborted,
    /// There was nothing in it.
    Empty,
}

impl From<lockbox_runtime::BranchAction> for BranchActionName {
    fn from(a: lockbox_runtime::BranchAction) -> BranchActionName {
        use lockbox_runtime::BranchAction as A;
        match a {
            A::Kept => BranchActionName::Kept,
            A::Committed => BranchActionName::Committed,
            A::Aborted => BranchActionName::Aborted,
            A::Empty => BranchActionName::Empty,
        }
    }
}

impl From<lockbox_runtime::SandboxInfo> for SandboxInfo {
    fn from(i: lockbox_runtime::SandboxInfo) -> SandboxInfo {
        SandboxInfo {
            id: i.id.into(),
            state: i.state.into(),
            created_at: time(i.created_at),
            workdir: i.workdir,
            branch: i.branch.map(|b| b.to_string()),
            branch_action: i.branch_action.map(BranchActionName::from),
            labels: i.labels,
            sessions: i.sessions,
            processes: i.processes,
            policy: i.policy.map(PolicySummary::from),
            usage: i.usage.map(ResourceUse::from),
        }
    }
}

/// A sandbox's policy in brief ([`lockbox_runtime::PolicySummary`]).
#[derive(Debug, Serialize, ToSchema)]
pub struct PolicySummary {
    /// `none` (loopback only), `host`, `allow` (only `net_destinations`) or `deny` (all but
    /// `net_destinations`).
    pub net: NetKindName,
    #[schema(value_type = Vec<String>)]
    pub net_destinations: Vec<lockbox_policy::NetSpec>,
    pub default_reads: bool,
    #[serde(serialize_with = "lockbox_policy::name::json::vec::serialize")]
    #[schema(value_type = Vec<Decoded>)]
    pub fs_readable: Vec<PathBuf>,
    #[serde(serialize_with = "lockbox_policy::name::json::vec::serialize")]
    #[schema(value_type = Vec<Decoded>)]
    pub fs_writable: Vec<PathBuf>,
    #[schema(required = true)]
    pub max_memory_bytes: Option<u64>,
    #[schema(required = true)]
    pub max_processes: Option<u64>,
    #[schema(required = true)]
    pub max_cpu_time_ms: Option<u64>,
    #[schema(required = true)]
    pub max_file_size_bytes: Option<u64>,
    #[schema(required = true)]
    pub idle_timeout_ms: Option<u64>,
    /// The OCI image it runs on (`image` as created), `null` for the host's userland.
    #[schema(required = true)]
    pub image: Option<String>,
}

/// A sandbox's network ([`lockbox_runtime::NetKind`]).
#[derive(Debug, Clone, Copy, Serialize, ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum NetKindName {
    /// Loopback only.
    None,
    /// The host's network.
    Host,
    /// Only `net_destinations`.
    Allow,
    /// All but `net_destinations`.
    Deny,
}

impl From<lockbox_runtime::PolicySummary> for PolicySummary {
    fn from(p: lockbox_runtime::PolicySummary) -> PolicySummary {
        use lockbox_runtime::NetKind;
        PolicySummary {
            net: match p.net {
                NetKind::None => NetKindName::None,
                NetKind::Host => NetKindName::Host,
                NetKind::Allow => NetKindName::Allow,
                NetKind::Deny => NetKindName::Deny,
            },
            net_destinations: p.net_destinations,
            default_reads: p.default_reads,
            fs_readable: p.fs_readable,
            fs_writable: p.fs_writable,
            max_memory_bytes: p.max_memory_bytes,
            max_processes: p.max_processes,
            max_cpu_time_ms: p.max_cpu_time.map(ms),
            max_file_size_bytes: p.max_file_size_bytes,
            idle_timeout_ms: p.idle_timeout.map(ms),
            image: p.image,
        }
    }
}

/// What a running sandbox's processes use ([`lockbox_runtime::ResourceUse`]).
#[derive(Debug, Serialize, ToSchema)]
pub struct ResourceUse {
    pub processes: u32,
    pub threads: u32,
    pub rss_bytes: u64,
    pub cpu_ms: u64,
}

impl From<lockbox_runtime::ResourceUse> for ResourceUse {
    fn from(u: lockbox_runtime::ResourceUse) -> ResourceUse {
        ResourceUse {
            processes: u.processes,
            threads: u.threads,
            rss_bytes: u.rss_bytes,
            cpu_ms: ms(u.cpu),
        }
    }
}

/// `GET /v1/sandboxes?state=`.
#[derive(Debug, Default, Deserialize, IntoParams, ToSchema)]
#[serde(default, deny_unknown_fields)]
#[into_params(parameter_in = Query)]
pub struct ListSandboxes {
    /// Only sandboxes in this state (`running`: the live ones).
    pub state: Option<StateName>,
}

/// A sandbox state as a client names it.
#[derive(Debug, Clone, Copy, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum StateName {
    /// `running`.
    Running,
    /// `stopped`.
    Stopped,
    /// `lost`.
    Lost,
}

impl From<SandboxState> for StateName {
    fn from(s: SandboxState) -> StateName {
        match s {
            SandboxState::Running => StateName::Running,
            SandboxState::Stopped => StateName::Stopped,
            SandboxState::Lost => StateName::Lost,
        }
    }
}

impl From<StateName> for SandboxState {
    fn from(s: StateName) -> SandboxState {
        match s {
            StateName::Running => SandboxState::Running,
            StateName::Stopped => SandboxState::Stopped,
            StateName::Lost => SandboxState::Lost,
        }
    }
}

/// `GET /v1/sandboxes` and the forks of `POST /v1/snapshots/{id}/fork`.
#[derive(Debug, Serialize, ToSchema)]
pub struct SandboxList {
    /// The sandboxes.
    pub sandboxes: Vec<SandboxInfo>,
}
