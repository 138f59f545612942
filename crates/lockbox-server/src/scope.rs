//! Who is asking, and what an agent may do (issue 32).
//!
//! The operator (the server's own token, the console's cookie) is trusted: `/v1` does what
//! it asks, as before. An agent (MCP over stdio or `/mcp`, a scoped token on `/v1`) works in
//! a [`Scope`]: the operator's [`Ceiling`] bounds every sandbox it creates or forks, checked
//! here and only here ([`Scope::admit`], [`Scope::admit_fork`]), and it sees and acts on
//! only the sandboxes and snapshots it made (an operator's sandbox with wider grants is not
//! its to exec in).

use crate::error::ApiError;
use lockbox_policy::{BeyondCeiling, Ceiling, ErrorCode};
use lockbox_runtime::{Runtime, SandboxSpec};
use serde_json::json;
use std::collections::HashSet;
use std::sync::{Arc, Mutex, PoisonError};

/// Who a request comes from.
#[derive(Debug, Clone)]
pub enum Principal {
    /// The operator: everything `/v1` offers.
    Operator,
    /// An agent bound to a scope.
    Agent(Arc<Scope>),
}

/// A ceiling and what was made under it.
#[derive(Debug, Default)]
pub struct Scope {
    ceiling: Ceiling,
    made: Mutex<Made>,
}

#[derive(Debug, Default)]
struct Made {
    sandboxes: HashSet<String>,
    snapshots: HashSet<String>,
    /// Sandboxes admitted and still being made ([`Admitted`]).
    starting: usize,
}

/// Room for sandboxes being made under a scope's `sandboxes` bound, held until they are
/// adopted (or their creation failed): concurrent creations cannot pass the bound together.
#[derive(Debug)]
#[must_use = "the room is given back when this is dropped"]
pub struct Admitted<'a> {
    scope: &'a Scope,
    count: usize,
}

impl Drop for Admitted<'_> {
    fn drop(&mut self) {
        let mut made = self.scope.made();
        made.starting = made.starting.saturating_sub(self.count);
    }
}

impl Scope {
    /// A scope with nothing made yet.
    pub fn new(ceiling: Ceiling) -> Scope {
        Scope {
            ceiling,
            made: Mutex::default(),
        }
    }

    fn made(&self) -> std::sync::MutexGuard<'_, Made> {
        // The sets stay consistent whatever panicked while holding them.
        self.made.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Bounds a creation: a snapshot it starts from must be this scope's, limits it leaves
    /// out get the ceiling's maxima, and its policy, workdir and credentials must be within
    /// the ceiling (`BEYOND_CEILING` naming the field otherwise), as must the count of the
    /// scope's running sandboxes. Hold the result until the sandbox is adopted.
    pub fn admit(
        &self,
        runtime: &Runtime,
        spec: &mut SandboxSpec,
    ) -> Result<Admitted<'_>, ApiError> {
        let mut workdir = spec.workdir.clone();
        if let Some(snapshot) = &spec.from_snapshot {
            self.snapshot(snapshot)?;
            workdir = workdir.or(Some(runtime.snapshot_info(snapshot)?.workdir));
        }
        self.ceiling.fill_limits(&mut spec.policy);
        normalise_image(spec)?;
        self.check(spec, workdir.as_deref())?;
        self.reserve(runtime, 1)
    }

    /// Bounds `count` forks of `snapshot`: it must be this scope's, its recorded spec within
    /// the ceiling (the ceiling may have been lowered since it was taken), and the forks
    /// within the scope's `sandboxes`. Hold the result until the forks are adopted.
    pub fn admit_fork(
        &self,
        runtime: &Runtime,
        snapshot: &str,
        count: usize,
    ) -> Result<Admitted<'_>, ApiError> {
        self.snapshot(snapshot)?;
        let spec = runtime.snapshot_spec(snapshot)?;
        self.check(&spec, spec.workdir.as_deref())?;
        self.reserve(runtime, count)
    }

    /// Reserves room for `count` more running sandboxes under the ceiling's `sandboxes`
    /// (alone: for forks of the scope's own sandbox, whose policy was admitted).
    pub fn reserve(&self, runtime: &Runtime, count: usize) -> Result<Admitted<'_>, ApiError> {
        let running: Vec<String> = runtime
            .list_sandboxes()?
            .into_iter()
            .filter(|s| s.state == lockbox_runtime::SandboxState::Running)
            .map(|s| s.id.to_string())
            .collect();
        let mut made = self.made();
        let mine = running
            .iter()
            .filter(|id| made.sandboxes.contains(*id))
            .count();
        self.ceiling
            .check_sandboxes(mine + made.starting, count)
            .map_err(beyond)?;
        made.starting += count;
        Ok(Admitted { scope: self, count })
    }

    fn check(&self, spec: &SandboxSpec, workdir: Option<&std::path::Path>) -> Result<(), ApiError> {
        self.ceiling
            .check(&spec.policy, workdir, &|p| std::fs::canonicalize(p))
            .map_err(beyond)?;
        for rule in &spec.http.auth {
            self.ceiling
                .check_credential(&rule.credential)
                .map_err(beyond)?;
        }
        Ok(())
    }

    /// `SANDBOX_NOT_FOUND` unless this scope made sandbox `id` (another's is not its to see).
    pub fn sandbox(&self, id: &str) -> Result<(), ApiError> {
        if self.made().sandboxes.contains(id) {
            return Ok(());
        }
        Err(ApiError::from(
            lockbox_runtime::RuntimeError::SandboxNotFound { id: id.to_owned() },
        ))
    }

    /// `SNAPSHOT_NOT_FOUND` unless this scope took snapshot `id`.
    pub fn snapshot(&self, id: &str) -> Result<(), ApiError> {
        if self.made().snapshots.contains(id) {
            return Ok(());
        }
        Err(
            ApiError::new(ErrorCode::SnapshotNotFound, format!("no snapshot {id}"))
                .with_details(json!({ "id": id })),
        )
    }

    /// Whether this scope made sandbox `id`.
    pub fn owns_sandbox(&self, id: &str) -> bool {
        self.made().sandboxes.contains(id)
    }

    /// Whether this scope took snapshot `id`.
    pub fn owns_snapshot(&self, id: &str) -> bool {
        self.made().snapshots.contains(id)
    }

    /// Records sandboxes made under this scope.
    pub fn adopt_sandboxes<'a>(&self, ids: impl IntoIterator<Item = &'a str>) {
        self.made()
            .sandboxes
            .extend(ids.into_iter().map(str::to_owned));
    }

    /// Records a snapshot taken under this scope.
    pub fn adopt_snapshot(&self, id: &str) {
        self.made().snapshots.insert(id.to_owned());
    }
}

impl Principal {
    /// `SANDBOX_NOT_FOUND` for an agent that did not make sandbox `id`.
    pub fn sandbox(&self, id: &str) -> Result<(), ApiError> {
        match self {
            Principal::Operator => Ok(()),
            Principal::Agent(scope) => scope.sandbox(id),
        }
    }

    /// `SNAPSHOT_NOT_FOUND` for an agent that did not take snapshot `id`.
    pub fn snapshot(&self, id: &str) -> Result<(), ApiError> {
        match self {
            Principal::Operator => Ok(()),
            Principal::Agent(scope) => scope.snapshot(id),
        }
    }

    /// The agent's scope, if it is one.
    pub fn scope(&self) -> Option<&Arc<Scope>> {
        match self {
            Principal::Operator => None,
            Principal::Agent(scope) => Some(scope),
        }
    }
}

/// `BEYOND_CEILING` (403), the field named as the client spells it.
fn beyond(e: BeyondCeiling) -> ApiError {
    let field = crate::wire::wire_field(e.field);
    ApiError::new(
        ErrorCode::BeyondCeiling,
        format!(
            "{field}: {} is beyond the operator's ceiling ({})",
            e.requested, e.ceiling
        ),
    )
    .with_details(json!({ "field": field, "requested": e.requested, "ceiling": e.ceiling }))
}

/// An agent's image reference in the form the image store names it, which the ceiling's
/// `images` are written in and the sandbox then runs (and records) by: a registry
/// reference normalised (`busybox` is `docker.io/library/busybox:latest`), a local
/// source's path canonical (links and `..` resolved, so a link inside an allowed directory
/// that points out of it is out of it; a path that does not exist is left absolute, and
/// the pull fails on it).
fn normalise_image(spec: &mut SandboxSpec) -> Result<(), ApiError> {
    use lockbox_image::Source;
    let Some(text) = &spec.policy.image else {
        return Ok(());
    };
    let source = Source::parse(text).map_err(|e| {
        ApiError::new(e.code(), format!("image: {e}"))
            .with_details(serde_json::json!({ "field": "image" }))
    })?;
    let real = |p: &std::path::Path| std::fs::canonicalize(p).unwrap_or_else(|_| p.to_owned());
    let source = match source {
        Source::OciDir { dir, tag } => Source::OciDir {
            dir: real(&dir),
            tag,
        },
        Source::OciArchive(p) => Source::OciArchive(real(&p)),
        Source::DockerArchive(p) => Source::DockerArchive(real(&p)),
        registry => registry,
    };
    spec.policy.image = Some(source.name());
    Ok(())
}
