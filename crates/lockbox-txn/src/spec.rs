//! [`TxnSpec`]: a whole transaction as data — stages or sources and consumer, each with its
//! policy, and how it commits. The front ends only *build* one (the CLI from flags, the Python
//! SDK as JSON); [`TxnSpec::build`] turns it into a [`Pipeline`] or [`Gather`], the one place
//! where that happens.
//!
//! The JSON form (what the Python SDK sends):
//!
//! ```json
//! { "kind": "pipeline", "state_dir": "/var/lib/lockbox", "workdir": "/src/repo",
//!   "stages": [ { "name": "", "policy": { ... }, "argv": ["/bin/sh", "-c", "make"],
//!                 "retries": 0, "writable": ["src"] } ],
//!   "lock": { "mode": "wait", "timeout": 2.5 }, "only": ["src"], "exclude": [] }
//! ```
//!
//! Paths use the lossless form of `lockbox_policy::name` (a string, or `{"bytes": base64}`).
//!
//! A stage's `policy.image` names an OCI image to run it on. This crate does not hold the
//! image store: a front end that has one resolves images with
//! [`TxnSpec::build_with_images`]; [`TxnSpec::build`] refuses such a stage.

use std::ffi::OsString;
use std::path::PathBuf;
use std::time::Duration;

use lockbox_confine::ImageRoot;
use lockbox_policy::ErrorCode;

use lockbox_policy::Policy;
use serde::{Deserialize, Serialize};

use crate::{
    ConflictPolicy, Gather, LockPolicy, Pipeline, PreparedTxn, Selection, Stage, TxnError, TxnKind,
    TxnOutcome,
};

/// One stage (pipeline stage, gather source or consumer).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct StageSpec {
    /// Its name: a gather source's name; empty for a pipeline stage (`stage-N`).
    #[serde(default)]
    pub name: String,
    /// Its sandbox policy (the transaction adds the workdir's view).
    #[serde(default)]
    pub policy: Policy,
    /// The command.
    pub argv: Vec<String>,
    /// How many times a failed run is retried, each on a fresh layer.
    #[serde(default)]
    pub retries: u32,
    /// Only these parts of the workdir are writable (relative to it); absent: all of it;
    /// empty: none.
    #[serde(
        default,
        skip_serializing_if = "Option::is_none",
        with = "lockbox_policy::name::json::option_vec"
    )]
    pub writable: Option<Vec<PathBuf>>,
}

impl StageSpec {
    /// A stage running `/bin/sh -c script` under `policy`.
    pub fn sh(policy: Policy, script: &str) -> StageSpec {
        StageSpec {
            name: String::new(),
            policy,
            argv: vec!["/bin/sh".into(), "-c".into(), script.into()],
            retries: 0,
            writable: None,
        }
    }

    /// The stage, its policy checked (`what` names it in the error: `stage 2`) and its image,
    /// if any, resolved by `images`.
    fn build(&self, what: &str, images: &mut ImageResolver<'_>) -> Result<Stage, TxnError> {
        self.policy.validate().map_err(|e| TxnError::Usage {
            reason: format!("{what}: {e}"),
        })?;
        let mut policy = self.policy.clone();
        let argv: Vec<OsString> = self.argv.iter().map(Into::into).collect();
        let (argv, root) = match policy.image.clone() {
            None => (argv, None),
            Some(image) => {
                let (root, argv) = images(&mut policy, &argv).map_err(|e| TxnError::Image {
                    stage: what.to_owned(),
                    image,
                    reason: e.reason,
                    code: e.code,
                    exit: e.exit_code,
                })?;
                (argv, Some(root))
            }
        };
        let mut stage = Stage::new(policy, argv)
            .named(&self.name)
            .retries(self.retries);
        if let Some(root) = root {
            stage = stage.image_root(root);
        }
        Ok(match &self.writable {
            Some(parts) => stage.writable(parts.clone()),
            None => stage,
        })
    }
}

/// Resolves the image a stage's policy names (`policy.image`) from the front end's image
/// store: applies the image's config to the policy (environment, working directory, user)
/// and returns the image's root and the command to run (the stage's own, or the image's
/// `Entrypoint` and `Cmd` when it has none). It keeps the image held (not removable) for as
/// long as the transaction may run.
pub type ImageResolver<'a> =
    dyn FnMut(&mut Policy, &[OsString]) -> Result<(ImageRoot, Vec<OsString>), StageImageError> + 'a;

/// Why a stage's image could not be resolved, as the image store said.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StageImageError {
    /// What went wrong (the image store's message).
    pub reason: String,
    /// Its machine-readable code (`IMAGE_NOT_FOUND`, ...).
    pub code: ErrorCode,
    /// The exit code a command reports it with.
    pub exit_code: u8,
}

/// A whole transaction. Build it, then [`TxnSpec::build`] it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TxnSpec {
    /// A pipeline (`stages`) or a gather (`sources`, `consumer`).
    pub kind: TxnKind,
    /// Where records, layers and locks live.
    #[serde(with = "lockbox_policy::name::json")]
    pub state_dir: PathBuf,
    /// The directory the transaction commits to.
    #[serde(with = "lockbox_policy::name::json")]
    pub workdir: PathBuf,
    /// A pipeline's stages, in order.
    #[serde(default)]
    pub stages: Vec<StageSpec>,
    /// A gather's sources.
    #[serde(default)]
    pub sources: Vec<StageSpec>,
    /// A gather's consumer.
    #[serde(default)]
    pub consumer: Option<StageSpec>,
    /// How a gather (or a streamed pipeline) merges layers that change the same paths.
    #[serde(default)]
    pub conflict: ConflictPolicy,
    /// A pipeline whose stages run at once with live pipes (merged like gather sources).
    #[serde(default)]
    pub stream: bool,
    /// Concurrency control against other transactions on the workdir.
    #[serde(default, with = "lock_json")]
    pub lock: LockPolicy,
    /// Commit only changes at or below these paths (relative to the workdir).
    #[serde(default, with = "lockbox_policy::name::json::vec")]
    pub only: Vec<PathBuf>,
    /// Discard changes at or below these paths.
    #[serde(default, with = "lockbox_policy::name::json::vec")]
    pub exclude: Vec<PathBuf>,
    /// Bytes of a stage's stdout kept in memory before spilling to a file.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub memory_bound: Option<usize>,
}

impl TxnSpec {
    /// An empty spec of `kind` over `workdir`, records in `state_dir`.
    pub fn new(kind: TxnKind, state_dir: PathBuf, workdir: PathBuf) -> TxnSpec {
        TxnSpec {
            kind,
            state_dir,
            workdir,
            stages: Vec::new(),
            sources: Vec::new(),
            consumer: None,
            conflict: ConflictPolicy::default(),
            stream: false,
            lock: LockPolicy::default(),
            only: Vec::new(),
            exclude: Vec::new(),
            memory_bound: None,
        }
    }

    /// The transaction, ready to run; `stdin` feeds a pipeline's first stage. Every stage's
    /// policy is checked; a spec with fields of the other kind is refused, and so is a stage
    /// with an image (see [`TxnSpec::build_with_images`]).
    pub fn build(&self, stdin: Option<Vec<u8>>) -> Result<Txn, TxnError> {
        self.build_with_images(stdin, &mut |_, _| {
            Err(StageImageError {
                reason: "this front end has no image store to run stages on images".into(),
                code: ErrorCode::TxnUsage,
                exit_code: 2,
            })
        })
    }

    /// [`TxnSpec::build`], with the images stages name resolved by `images`.
    pub fn build_with_images(
        &self,
        stdin: Option<Vec<u8>>,
        images: &mut ImageResolver<'_>,
    ) -> Result<Txn, TxnError> {
        let usage = |reason: &str| TxnError::Usage {
            reason: reason.to_owned(),
        };
        let selection = Selection {
            only: self.only.clone(),
            exclude: self.exclude.clone(),
        };
        match self.kind {
            TxnKind::Pipeline => {
                if !self.sources.is_empty() || self.consumer.is_some() {
                    return Err(usage("a pipeline has stages, not sources or a consumer"));
                }
                let mut p = Pipeline::new(&self.state_dir, &self.workdir)
                    .lock(self.lock)
                    .select(selection);
                for (i, s) in self.stages.iter().enumerate() {
                    p = p.stage(s.build(&format!("stage {}", i + 1), images)?);
                }
                if let Some(bytes) = stdin {
                    p = p.stdin(bytes);
                }
                if let Some(bound) = self.memory_bound {
                    p = p.memory_bound(bound);
                }
                if self.stream {
                    p = p.stream(self.conflict);
                }
                Ok(Txn::Pipeline(p))
            }
            TxnKind::Gather => {
                if !self.stages.is_empty() || self.stream {
                    return Err(usage("a gather has sources and a consumer, not stages"));
                }
                if stdin.is_some() {
                    return Err(usage("a gather takes no stdin"));
                }
                let mut g = Gather::new(&self.state_dir, &self.workdir)
                    .lock(self.lock)
                    .select(selection)
                    .conflict_policy(self.conflict);
                for s in &self.sources {
                    g = g.source(&s.name, s.build(&format!("source {:?}", s.name), images)?);
                }
                if let Some(c) = &self.consumer {
                    g = g.consumer(c.build("the consumer", images)?);
                }
                if let Some(bound) = self.memory_bound {
                    g = g.memory_bound(bound);
                }
                Ok(Txn::Gather(Box::new(g)))
            }
        }
    }
}

/// A built transaction: run it, dry-run it or prepare it.
#[derive(Debug, Clone)]
pub enum Txn {
    /// Stages in order.
    Pipeline(Pipeline),
    /// Sources in parallel, then a consumer.
    Gather(Box<Gather>),
}

impl Txn {
    /// Runs every stage and keeps the layers (see [`Pipeline::prepare`]).
    pub fn prepare(&self) -> Result<PreparedTxn, TxnError> {
        match self {
            Txn::Pipeline(p) => p.prepare(),
            Txn::Gather(g) => g.prepare(),
        }
    }

    /// Runs and commits if every stage succeeded.
    pub fn run(&self) -> Result<TxnOutcome, TxnError> {
        match self {
            Txn::Pipeline(p) => p.run(),
            Txn::Gather(g) => g.run(),
        }
    }

    /// Runs, reports the changes and aborts.
    pub fn dry_run(&self) -> Result<TxnOutcome, TxnError> {
        match self {
            Txn::Pipeline(p) => p.dry_run(),
            Txn::Gather(g) => g.dry_run(),
        }
    }
}

/// [`LockPolicy`] as JSON: `{"mode": "optimistic" | "fail_if_busy"}` or
/// `{"mode": "wait", "timeout": SECONDS | null}`.
mod lock_json {
    use super::*;
    use serde::{Deserializer, Serializer};

    #[derive(Serialize, Deserialize)]
    #[serde(rename_all = "snake_case", tag = "mode")]
    enum Wire {
        Optimistic,
        FailIfBusy,
        Wait {
            #[serde(default)]
            timeout: Option<f64>,
        },
    }

    pub fn serialize<S: Serializer>(lock: &LockPolicy, s: S) -> Result<S::Ok, S::Error> {
        match lock {
            LockPolicy::Optimistic => Wire::Optimistic,
            LockPolicy::FailIfBusy => Wire::FailIfBusy,
            LockPolicy::Wait(t) => Wire::Wait {
                timeout: t.map(|t| t.as_secs_f64()),
            },
        }
        .serialize(s)
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<LockPolicy, D::Error> {
        // `null` is the default, as an absent field is.
        Ok(match Option::<Wire>::deserialize(d)? {
            None | Some(Wire::Optimistic) => LockPolicy::Optimistic,
            Some(Wire::FailIfBusy) => LockPolicy::FailIfBusy,
            Some(Wire::Wait { timeout }) => LockPolicy::Wait(match timeout {
                None => None,
                Some(t) => Some(
                    Duration::try_from_secs_f64(t.max(0.0)).map_err(serde::de::Error::custom)?,
                ),
            }),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pipeline() -> TxnSpec {
        let mut spec = TxnSpec::new(TxnKind::Pipeline, "/state".into(), "/work".into());
        let mut stage = StageSpec::sh(Policy::default(), "make");
        stage.writable = Some(vec!["src".into()]);
        stage.retries = 2;
        spec.stages.push(stage);
        spec.lock = LockPolicy::Wait(Some(Duration::from_millis(2500)));
        spec.only = vec!["src".into()];
        spec
    }

    #[test]
    fn a_spec_reads_back_as_itself_from_json() {
        let spec = pipeline();
        let json = serde_json::to_string(&spec).unwrap();
        let back: TxnSpec = serde_json::from_str(&json).unwrap();
        assert_eq!(back, spec);
        let v: serde_json::Value = serde_json::from_str(&json).unwrap();
        assert_eq!(
            v["lock"],
            serde_json::json!({ "mode": "wait", "timeout": 2.5 })
        );
        assert_eq!(v["kind"], "pipeline");
    }

    #[test]
    fn the_python_sdks_form_is_a_spec() {
        // What python/lockbox/_sdk.py sends (fields it leaves out take their defaults).
        let json = r#"{"kind": "gather", "state_dir": "/s", "workdir": "/w",
            "sources": [{"name": "a", "policy": {}, "argv": ["true"]}],
            "consumer": null, "conflict": "markers", "lock": null}"#;
        let spec: TxnSpec = serde_json::from_str(json).unwrap();
        assert_eq!(spec.kind, TxnKind::Gather);
        assert_eq!(spec.conflict, ConflictPolicy::Markers);
        assert_eq!(spec.lock, LockPolicy::Optimistic);
        assert!(matches!(spec.build(None).unwrap(), Txn::Gather(_)));
    }

    #[test]
    fn a_stage_on_an_image_gets_the_resolvers_root_and_command_or_its_error() {
        let mut spec = pipeline();
        spec.stages[0].policy.image = Some("busybox".into());
        // Without an image store: refused, naming the stage and the image.
        let e = spec.build(None).unwrap_err();
        assert_eq!(e.exit_code(), 2);
        assert!(e.to_string().contains("stage 1: image \"busybox\""), "{e}");
        // The resolver's config applies to the stage's policy; its root and command are
        // the stage's.
        let root = ImageRoot {
            layers: vec!["/layers/a".into()],
            ..ImageRoot::default()
        };
        let txn = spec
            .build_with_images(None, &mut |policy, argv| {
                assert_eq!(argv[2], "make");
                policy.env.set.insert("FROM_IMAGE".into(), "1".into());
                Ok((
                    root.clone(),
                    vec!["/bin/sh".into(), "-c".into(), "gmake".into()],
                ))
            })
            .unwrap();
        let Txn::Pipeline(p) = txn else {
            panic!("not a pipeline")
        };
        let stage = &p.stages[0];
        assert_eq!(stage.image_root.as_ref(), Some(&root));
        assert_eq!(stage.argv[2], "gmake");
        assert_eq!(stage.policy.env.set["FROM_IMAGE"], "1");
        // A store's refusal keeps its code and exit code.
        let e = spec
            .build_with_images(None, &mut |_, _| {
                Err(StageImageError {
                    reason: "no such image".into(),
                    code: ErrorCode::ImageNotFound,
                    exit_code: 2,
                })
            })
            .unwrap_err();
        assert_eq!(e.code(), ErrorCode::ImageNotFound);
        assert!(e.to_string().ends_with("no such image"), "{e}");
    }

    #[test]
    fn a_spec_mixing_kinds_or_with_a_bad_policy_is_refused_naming_the_stage() {
        let mut spec = pipeline();
        spec.sources.push(StageSpec::sh(Policy::default(), "true"));
        let e = spec.build(None).unwrap_err();
        assert!(e.to_string().contains("not sources"), "{e}");

        let mut spec = pipeline();
        spec.stages.push(StageSpec::sh(Policy::default(), "true"));
        spec.stages[1].policy.cwd = Some("relative".into());
        let e = spec.build(None).unwrap_err();
        assert!(e.to_string().contains("stage 2: "), "{e}");
    }
}
