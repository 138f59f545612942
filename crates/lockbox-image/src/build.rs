//! `lockbox image build`: a Dockerfile ([`crate::dockerfile`]) run without a daemon or
//! privilege. Each `RUN` runs in a lockbox sandbox whose root is the layers so far and whose
//! writes are kept on the host in the layers' own format: that directory is the next layer.
//! `COPY`/`ADD` write a layer from the context (or an earlier stage); the other instructions
//! change the config only. See docs/images.md, "Building".
//!
//! ## The cache
//!
//! A step that makes a layer is looked up by the sha256 of: the chain of layers below it,
//! the config it runs with (ENV, WORKDIR, USER, SHELL, ARG values), the instruction after substitution,
//! and for `COPY`/`ADD` from the context the content of what is copied (names, modes, sizes,
//! bytes, link targets). A hit reuses the layer (`CACHED`); `--no-cache` skips the lookup.

use crate::dockerfile::{self, Command, CopySpec, DockerfileError, Instruction, Step};
use crate::layer_tar::{is_opaque, is_whiteout};
use crate::{Digest, Image, ImageConfig, ImageError, Platform, PullOptions, PullPolicy, Store};
use lockbox_confine::{RootUpper, Spawn, Stdio, Waited};
use lockbox_policy::Policy;
use sha2::Digest as _;
use std::collections::{BTreeMap, BTreeSet};
use std::ffi::OsString;
use std::os::fd::AsFd;
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::{Component, Path, PathBuf};

/// How to build.
#[derive(Debug, Clone, Default)]
pub struct BuildOptions {
    /// The context directory (COPY/ADD sources are beneath it).
    pub context: PathBuf,
    /// The Dockerfile's text.
    pub dockerfile: String,
    /// Names for the image.
    pub tags: Vec<String>,
    /// `--build-arg K=V`.
    pub build_args: BTreeMap<String, String>,
    /// Skip the cache lookup.
    pub no_cache: bool,
    /// How to pull base images.
    pub pull: PullOptions,
    /// The policy `RUN` steps start from (network, limits); the image's config is applied
    /// over it.
    pub policy: Policy,
}

/// A build's failure.
#[derive(Debug, thiserror::Error)]
pub enum BuildError {
    /// The Dockerfile is malformed.
    #[error(transparent)]
    Dockerfile(#[from] DockerfileError),
    /// A step cannot be done (a missing source, a stage that does not exist).
    #[error("Dockerfile line {line}: {reason}")]
    Step {
        /// The instruction's line.
        line: usize,
        /// What is wrong.
        reason: String,
    },
    /// A `RUN` exited non-zero.
    #[error("Dockerfile line {line}: RUN {command}: exited with code {code}")]
    RunFailed {
        /// The instruction's line.
        line: usize,
        /// The command.
        command: String,
        /// Its exit code.
        code: i32,
    },
    /// A `RUN`'s sandbox could not be started or waited for.
    #[error("Dockerfile line {line}: RUN: the sandbox failed: {reason}")]
    Sandbox {
        /// The instruction's line.
        line: usize,
        /// What failed.
        reason: String,
    },
    /// A store or pull failure.
    #[error(transparent)]
    Image(#[from] ImageError),
}

impl BuildError {
    /// The exit code of `lockbox image build`: 2 a malformed Dockerfile or step, 1 a RUN
    /// that failed (or whose sandbox did), else the image error's.
    pub fn exit_code(&self) -> u8 {
        match self {
            BuildError::Dockerfile(_) | BuildError::Step { .. } => 2,
            BuildError::RunFailed { .. } | BuildError::Sandbox { .. } => 1,
            BuildError::Image(e) => e.exit_code(),
        }
    }
}

fn step_err<T>(line: usize, reason: impl Into<String>) -> Result<T, BuildError> {
    Err(BuildError::Step {
        line,
        reason: reason.into(),
    })
}

/// What a build made.
#[derive(Debug, Clone, serde::Serialize)]
pub struct BuildReport {
    /// The image (tagged).
    pub image: Image,
    /// Steps that made or reused a layer.
    pub layer_steps: usize,
    /// Of those, the ones the cache answered.
    pub cached: usize,
}

#[derive(Debug, Clone)]
struct StageState {
    name: Option<String>,
    /// The platform of its base (`FROM --platform=...`, else the host's).
    platform: Platform,
    /// Base first.
    layers: Vec<Digest>,
    config: ImageConfig,
    shell: Vec<String>,
    args: BTreeMap<String, String>,
}

impl StageState {
    fn var(&self, k: &str) -> Option<String> {
        self.config
            .env
            .iter()
            .rev()
            .find_map(|e| e.strip_prefix(k).and_then(|r| r.strip_prefix('=')))
            .map(str::to_owned)
            .or_else(|| self.args.get(k).cloned())
    }

    fn set_env(&mut self, k: &str, v: &str) {
        let prefix = format!("{k}=");
        self.config.env.retain(|e| !e.starts_with(&prefix));
        self.config.env.push(format!("{k}={v}"));
    }

    fn chain(&self) -> String {
        self.layers
            .iter()
            .map(|d| d.as_str())
            .collect::<Vec<_>>()
            .join(" ")
    }
}

/// Builds the Dockerfile in `opts` and tags the result. `say` gets one line per step
/// (`STEP 2/5: RUN ...`, `CACHED`); a `RUN`'s output goes to this process's stderr.
pub async fn build(
    store: &Store,
    opts: &BuildOptions,
    say: &mut dyn FnMut(&str),
) -> Result<BuildReport, BuildError> {
    let df = dockerfile::parse(&opts.dockerfile)?;
    let bdir = store.build_dir()?;
    let ignore = Ignore::load(&opts.context)?;
    // Docker's automatic platform ARGs, usable in FROM (`FROM --platform=$BUILDPLATFORM`)
    // and, once declared with ARG, in a stage. The build runs on the host's platform.
    let host = Platform::host();
    let mut global = BTreeMap::new();
    for (k, v) in [
        ("BUILDPLATFORM", host.to_string()),
        ("BUILDOS", host.os.clone()),
        ("BUILDARCH", host.architecture.clone()),
        ("TARGETPLATFORM", host.to_string()),
        ("TARGETOS", host.os.clone()),
        ("TARGETARCH", host.architecture.clone()),
    ] {
        global.insert(k.to_owned(), opts.build_args.get(k).cloned().unwrap_or(v));
    }
    for ins in &df.global_args {
        if let Step::Arg(list) = ins.resolve(&|k| lookup(&global, k))? {
            for (k, v) in list {
                if let Some(v) = opts.build_args.get(&k).cloned().or(v) {
                    global.insert(k, v);
                }
            }
        }
    }
    let total: usize = df.stages.iter().map(|s| 1 + s.instructions.len()).sum();
    let mut n = 0;
    let mut stages: Vec<StageState> = Vec::new();
    let mut layer_steps = 0;
    let mut cached = 0;
    let mut scratch_n = 0;
    for stage in &df.stages {
        n += 1;
        let Step::From {
            base,
            name,
            platform,
        } = stage.from.resolve(&|k| lookup(&global, k))?
        else {
            return step_err(stage.from.line, "expected FROM");
        };
        say(&format!("STEP {n}/{total}: FROM {base}"));
        if base.is_empty() {
            return step_err(stage.from.line, "FROM: the image is empty (an unset ARG?)");
        }
        let platform = match platform.as_deref() {
            None => None,
            Some(p) => Some(Platform::parse(p).map_err(|_| BuildError::Step {
                line: stage.from.line,
                reason: format!(
                    "FROM --platform={p}: expected os/arch[/variant], e.g. linux/arm64"
                ),
            })?),
        };
        let mut st = if let Some(prev) = stages
            .iter()
            .find(|s| s.name.as_deref() == Some(&base.to_ascii_lowercase()))
        {
            let mut st = prev.clone();
            st.args.clear();
            st
        } else if base == "scratch" {
            StageState {
                name: None,
                platform: platform.unwrap_or_else(|| host.clone()),
                layers: Vec::new(),
                config: ImageConfig::default(),
                shell: default_shell(),
                args: BTreeMap::new(),
            }
        } else {
            let image = base_image(store, &base, platform.as_ref(), &opts.pull).await?;
            let mut layers = Vec::new();
            for l in image.layer_info.iter().rev() {
                layers.push(Digest::parse(&l.diff_id)?);
            }
            StageState {
                name: None,
                platform: Platform::parse(&image.platform).unwrap_or_else(|_| host.clone()),
                layers,
                config: image.config.clone(),
                shell: default_shell(),
                args: BTreeMap::new(),
            }
        };
        st.name = name;
        for ins in &stage.instructions {
            n += 1;
            let step = ins.resolve(&|k| st.var(k))?;
            say(&format!("STEP {n}/{total}: {}", shown(ins, &step)));
            match step {
                Step::From { .. } => return step_err(ins.line, "unexpected FROM"),
                Step::Arg(list) => {
                    for (k, v) in list {
                        let v = opts
                            .build_args
                            .get(&k)
                            .cloned()
                            .or(v)
                            .or_else(|| global.get(&k).cloned())
                            .unwrap_or_default();
                        st.args.insert(k, v);
                    }
                }
                Step::Env(pairs) => {
                    for (k, v) in pairs {
                        st.set_env(&k, &v);
                    }
                }
                Step::Workdir(dir) => {
                    let base = st.config.working_dir.clone().unwrap_or_else(|| "/".into());
                    let p = Path::new(&base).join(&dir);
                    let p = p.to_string_lossy().into_owned();
                    st.config.working_dir = Some(p.clone());
                    // As Docker: a missing working directory is made (a layer of its own).
                    let parts = clean(&p, ins.line)?;
                    let lowers: Vec<PathBuf> = st
                        .layers
                        .iter()
                        .rev()
                        .filter_map(|d| store.layer_path(d))
                        .collect();
                    if let Some(missing) = missing_dirs(&lowers, &parts) {
                        layer_steps += 1;
                        let key = cache_key(&st, &format!("WORKDIR {p}"), None);
                        if let Some(hit) = (!opts.no_cache).then(|| store.cache_get(&key)).flatten()
                        {
                            say("  CACHED");
                            cached += 1;
                            st.layers.extend(hit);
                            continue;
                        }
                        let dir = bdir.path().join(format!("workdir-{n}"));
                        let mut at = dir.clone();
                        mkdirs(&at)?;
                        for (i, c) in parts.iter().enumerate() {
                            at.push(c);
                            if i >= missing {
                                mkdirs(&at)?;
                                std::fs::set_permissions(
                                    &at,
                                    std::fs::Permissions::from_mode(0o755),
                                )
                                .map_err(|e| ImageError::io("create", &at, e))?;
                            } else {
                                // An existing directory keeps its mode (a 1777 /tmp stays).
                                mkdirs(&at)?;
                                let mode = visible(&lowers, &parts[..=i])
                                    .first()
                                    .and_then(|&top| {
                                        std::fs::metadata(lowers[top].join(parts[..=i].join("/")))
                                            .ok()
                                    })
                                    .map_or(0o755, |m| m.mode() & 0o7777);
                                std::fs::set_permissions(
                                    &at,
                                    std::fs::Permissions::from_mode(mode),
                                )
                                .map_err(|e| ImageError::io("create", &at, e))?;
                            }
                        }
                        let d = store.add_layer_dir(&dir)?;
                        store.cache_put(&key, Some(&d))?;
                        st.layers.push(d);
                    }
                }
                Step::User(u) => st.config.user = Some(u),
                Step::Label(pairs) => st.config.labels.extend(pairs),
                Step::Expose(ports) => {
                    for p in ports {
                        if !st.config.exposed_ports.contains(&p) {
                            st.config.exposed_ports.push(p);
                        }
                    }
                }
                Step::StopSignal(s) => st.config.stop_signal = Some(s),
                Step::Shell(v) => st.shell = v,
                Step::Entrypoint(c) => {
                    st.config.entrypoint = Some(c.argv(&st.shell));
                    // As Docker: ENTRYPOINT resets a CMD inherited from the base.
                    st.config.cmd = None;
                }
                Step::Cmd(c) => st.config.cmd = Some(c.argv(&st.shell)),
                Step::Run(cmd) => {
                    layer_steps += 1;
                    let key = cache_key(&st, &format!("RUN {cmd:?}"), None);
                    if let Some(hit) = (!opts.no_cache).then(|| store.cache_get(&key)).flatten() {
                        say("  CACHED");
                        cached += 1;
                        st.layers.extend(hit);
                        continue;
                    }
                    let layer = run_step(store, bdir.path(), &st, ins, &cmd, &opts.policy)?;
                    store.cache_put(&key, layer.as_ref())?;
                    st.layers.extend(layer);
                }
                Step::Copy(spec) => {
                    layer_steps += 1;
                    if spec.chown.is_some() {
                        say("  note: --chown is not applied: files in a lockbox image are presented as owned by root");
                    }
                    let from_stage: Option<StageState> = match &spec.from {
                        Some(f) => match stages
                            .iter()
                            .find(|s| s.name.as_deref() == Some(&f.to_ascii_lowercase()))
                            .or_else(|| f.parse::<usize>().ok().and_then(|i| stages.get(i)))
                        {
                            Some(s) => Some(s.clone()),
                            // Not a stage: an image reference, as Docker's `COPY --from=IMAGE`
                            // (pulled if the store lacks it).
                            None => {
                                if f.parse::<usize>().is_ok() {
                                    return step_err(
                                        ins.line,
                                        format!("--from={f}: no earlier stage of that index"),
                                    );
                                }
                                if let Err(e) = crate::Source::parse(f) {
                                    return step_err(
                                        ins.line,
                                        format!("--from={f}: neither an earlier stage nor an image reference: {e}"),
                                    );
                                }
                                let image = store
                                    .find_or_pull(f, PullPolicy::Missing, &opts.pull)
                                    .await?;
                                let mut layers = Vec::new();
                                for l in image.layer_info.iter().rev() {
                                    layers.push(Digest::parse(&l.diff_id)?);
                                }
                                Some(StageState {
                                    name: None,
                                    platform: st.platform.clone(),
                                    layers,
                                    config: image.config.clone(),
                                    shell: default_shell(),
                                    args: BTreeMap::new(),
                                })
                            }
                        },
                        None => None,
                    };
                    let content = match &from_stage {
                        Some(s) => format!("stage {}", s.chain()),
                        None => context_digest(&opts.context, &ignore, &spec, ins.line)?,
                    };
                    let key = cache_key(&st, &format!("COPY {spec:?}"), Some(&content));
                    if let Some(hit) = (!opts.no_cache).then(|| store.cache_get(&key)).flatten() {
                        say("  CACHED");
                        cached += 1;
                        st.layers.extend(hit);
                        continue;
                    }
                    let dir = bdir.path().join(format!("copy-{n}"));
                    std::fs::create_dir(&dir)
                        .map_err(|e| ImageError::io("create a layer directory", &dir, e))?;
                    let workdir = st.config.working_dir.clone().unwrap_or_else(|| "/".into());
                    match &from_stage {
                        Some(s) => {
                            let lowers: Vec<PathBuf> = s
                                .layers
                                .iter()
                                .rev()
                                .filter_map(|d| store.layer_path(d))
                                .collect();
                            copy_from_layers(&lowers, &spec, &workdir, &dir, ins.line)?
                        }
                        None => copy_from_context(
                            &opts.context,
                            &ignore,
                            &spec,
                            &workdir,
                            &dir,
                            ins.line,
                        )?,
                    }
                    let d = store.add_layer_dir(&dir)?;
                    store.cache_put(&key, Some(&d))?;
                    st.layers.push(d);
                }
            }
        }
        stages.push(st);
    }
    let Some(last) = stages.pop() else {
        return step_err(1, "no stage");
    };
    if last.layers.is_empty() {
        scratch_n += 1;
    }
    if scratch_n > 0 {
        return step_err(
            df.stages.last().map_or(1, |s| s.from.line),
            "the image has no layers (FROM scratch with nothing added)",
        );
    }
    let image = store.add_image_for(
        &last.platform,
        &last.config,
        &last.layers,
        &opts.tags,
        "build",
    )?;
    drop(bdir);
    Ok(BuildReport {
        image,
        layer_steps,
        cached,
    })
}

/// A stage's base image: from the store when it is there for `platform` (any platform when
/// none is asked for), else pulled for it (from a multi-platform image, that platform's
/// manifest). An image that is not for `platform` is an error listing what it is for.
async fn base_image(
    store: &Store,
    base: &str,
    platform: Option<&Platform>,
    pull: &PullOptions,
) -> Result<Image, ImageError> {
    let Some(want) = platform else {
        return store.find_or_pull(base, PullPolicy::Missing, pull).await;
    };
    let is_for = |image: &Image| {
        Platform::parse(&image.platform)
            .is_ok_and(|p| want.matches(&p.os, &p.architecture, p.variant.as_deref()))
    };
    if let Some(image) = store.get(base)?.filter(|i| is_for(i)) {
        return Ok(image);
    }
    let opts = PullOptions {
        platform: want.clone(),
        exact_platform: true,
        ..pull.clone()
    };
    store.pull(base, &opts).await
}

fn lookup(m: &BTreeMap<String, String>, k: &str) -> Option<String> {
    m.get(k).cloned()
}

fn default_shell() -> Vec<String> {
    vec!["/bin/sh".into(), "-c".into()]
}

fn shown(ins: &Instruction, step: &Step) -> String {
    match step {
        Step::Run(_) | Step::Cmd(_) | Step::Entrypoint(_) | Step::Shell(_) => ins.to_string(),
        _ => format!("{} {}", ins.keyword, ins.args),
    }
}

fn cache_key(st: &StageState, what: &str, content: Option<&str>) -> Digest {
    let mut h = sha2::Sha256::new();
    for part in [
        "lockbox-build-cache-1",
        &st.chain(),
        &serde_json::to_string(&st.config).unwrap_or_default(),
        &st.shell.join("\0"),
        // ARG values are in RUN's environment.
        &serde_json::to_string(&st.args).unwrap_or_default(),
        what,
        content.unwrap_or(""),
    ] {
        h.update(part.as_bytes());
        h.update([0u8]);
    }
    Digest::from_hasher(h)
}

/// The files lockbox mounts its own over in a sandbox's root (read-only binds, so the
/// sandbox cannot have written them): their empty mount points are not part of a layer.
const MOUNT_POINTS: &[&str] = &[
    "etc/hosts",
    "etc/hostname",
    "etc/resolv.conf",
    "etc/apt/apt.conf.d/99lockbox-sandbox-user",
];

fn run_step(
    store: &Store,
    bdir: &Path,
    st: &StageState,
    ins: &Instruction,
    cmd: &Command,
    base: &Policy,
) -> Result<Option<Digest>, BuildError> {
    let line = ins.line;
    if st.layers.is_empty() {
        return step_err(
            line,
            "RUN in a stage with no layers (FROM scratch): there is no shell",
        );
    }
    let mut layers = Vec::new();
    for d in st.layers.iter().rev() {
        layers.push(store.layer_path(d).ok_or_else(|| BuildError::Step {
            line,
            reason: format!("layer {d} is no longer in the store"),
        })?);
    }
    let image = Image {
        id: "build".into(),
        references: Vec::new(),
        layers,
        config: st.config.clone(),
        manifest: None,
        source: "build".into(),
        platform: String::new(),
        created: None,
        pulled_at: 0,
        layer_info: Vec::new(),
        holders: Vec::new(),
    };
    let mut policy = base.clone();
    // ARGs are in the environment of RUN (not of the image).
    for (k, v) in &st.args {
        if !st
            .config
            .env
            .iter()
            .any(|e| e.starts_with(&format!("{k}=")))
        {
            policy.env.set.insert(k.clone(), v.clone());
        }
    }
    let argv: Vec<OsString> = cmd.argv(&st.shell).into_iter().map(Into::into).collect();
    let (mut root, argv) = crate::apply(&image, &mut policy, &argv)?;
    let step = bdir.join(format!("run-{line}"));
    let upper = step.join("upper");
    let work = step.join("work");
    for d in [&upper, &work] {
        std::fs::create_dir_all(d).map_err(|e| ImageError::io("create a layer directory", d, e))?;
    }
    root.upper = Some(RootUpper {
        upper: upper.clone(),
        work: work.clone(),
    });
    let err_fd = |e: std::io::Error| ImageError::io("duplicate stderr", "/dev/stderr", e);
    let out = std::io::stderr()
        .as_fd()
        .try_clone_to_owned()
        .map_err(err_fd)?;
    let err = std::io::stderr()
        .as_fd()
        .try_clone_to_owned()
        .map_err(err_fd)?;
    let sandbox = |reason: String| BuildError::Sandbox { line, reason };
    let mut running = Spawn::command(&policy, &argv)
        .image_root(root)
        .stdio(Stdio {
            stdin: None,
            stdout: Some(out),
            stderr: Some(err),
        })
        .start()
        .map_err(|e| sandbox(e.to_string()))?;
    let code = match running
        .wait(None, None)
        .map_err(|e| sandbox(e.to_string()))?
    {
        Waited::Exited(o) => o.exit_code(),
        other => return Err(sandbox(format!("{other:?}"))),
    };
    if code != 0 {
        return Err(BuildError::RunFailed {
            line,
            command: ins.args.clone(),
            code,
        });
    }
    // The upper was mounted volatile: make it durable before it is kept.
    if let Ok(f) = std::fs::File::open(&upper) {
        rustix::fs::syncfs(&f).map_err(|e| ImageError::io("syncfs", &upper, e.into()))?;
    }
    remove_mount_points(&upper);
    let _ = crate::remove_tree(&work);
    if std::fs::read_dir(&upper)
        .map(|mut d| d.next().is_none())
        .unwrap_or(false)
    {
        return Ok(None);
    }
    Ok(Some(store.add_layer_dir(&upper)?))
}

/// Directories lockbox mounts its own file systems on (`/dev`, `/proc`, the sandbox's own
/// `/tmp`): a RUN's writes there never reach the upper, so an empty one there is only the
/// mount point.
const MOUNT_DIRS: &[&str] = &["dev", "proc", "sys", "tmp"];

/// Removes lockbox's empty mount points from a kept upper, and then the directories that
/// held them if they are left empty and are not opaque (they were made for the mount
/// points; an image directory of the same name is still in the layer below). A RUN could
/// not have written those files (read-only binds) nor deleted them (busy).
fn remove_mount_points(upper: &Path) {
    for d in MOUNT_DIRS {
        let p = upper.join(d);
        if std::fs::symlink_metadata(&p).is_ok_and(|m| m.is_dir()) && !is_opaque(&p) {
            // Fails (and keeps it) when not empty.
            let _ = std::fs::remove_dir(&p);
        }
    }
    for rel in MOUNT_POINTS {
        let p = upper.join(rel);
        if let Ok(md) = std::fs::symlink_metadata(&p) {
            if md.is_file() && md.len() == 0 {
                let _ = std::fs::remove_file(&p);
            }
        }
        let mut dir = p.parent().map(Path::to_path_buf);
        while let Some(d) = dir {
            if d == upper || is_opaque(&d) {
                break;
            }
            // Fails (and stops) when not empty.
            if std::fs::remove_dir(&d).is_err() {
                break;
            }
            dir = d.parent().map(Path::to_path_buf);
        }
    }
}

/// `.dockerignore`: patterns of paths (relative to the context) not copied; `!` excepts;
/// the last pattern that matches wins; a directory's exclusion covers what is inside.
#[derive(Debug, Default)]
struct Ignore {
    rules: Vec<(bool, Vec<String>)>,
}

impl Ignore {
    fn load(context: &Path) -> Result<Ignore, BuildError> {
        let p = context.join(".dockerignore");
        let text = match std::fs::read_to_string(&p) {
            Ok(t) => t,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Ignore::default()),
            Err(e) => return Err(ImageError::io("read", p, e).into()),
        };
        let mut rules = Vec::new();
        for line in text.lines() {
            let l = line.trim();
            if l.is_empty() || l.starts_with('#') {
                continue;
            }
            let (neg, pat) = match l.strip_prefix('!') {
                Some(r) => (true, r.trim()),
                None => (false, l),
            };
            let parts: Vec<String> = pat
                .split('/')
                .filter(|c| !c.is_empty() && *c != ".")
                .map(str::to_owned)
                .collect();
            if !parts.is_empty() {
                rules.push((neg, parts));
            }
        }
        Ok(Ignore { rules })
    }

    /// Whether `rel` (components) is excluded.
    fn excluded(&self, rel: &[String]) -> bool {
        let mut out = false;
        for (neg, pat) in &self.rules {
            // A pattern matches the path or any of its ancestors.
            let hit = (1..=rel.len()).any(|n| glob_parts(pat, &rel[..n]));
            if hit {
                out = !neg;
            }
        }
        out
    }
}

fn glob_parts(pat: &[String], path: &[String]) -> bool {
    match pat.split_first() {
        None => path.is_empty(),
        Some((p, rest)) if p == "**" => (0..=path.len()).any(|i| glob_parts(rest, &path[i..])),
        Some((p, rest)) => match path.split_first() {
            Some((c, prest)) => glob(p.as_bytes(), c.as_bytes()) && glob_parts(rest, prest),
            None => false,
        },
    }
}

/// Go's `filepath.Match` (what Docker uses for COPY sources and `.dockerignore`) within
/// one path component: `*`, `?`, `[a-z]`, `[^...]` (or `[!...]`), `\\` escapes the next
/// byte. A malformed class matches nothing.
fn glob(p: &[u8], s: &[u8]) -> bool {
    match (p.first(), s.first()) {
        (None, None) => true,
        (Some(b'*'), _) => glob(&p[1..], s) || (!s.is_empty() && glob(p, &s[1..])),
        (Some(b'?'), Some(_)) => glob(&p[1..], &s[1..]),
        (Some(b'['), Some(&c)) => {
            matches!(class(&p[1..], c), Some((true, rest)) if glob(rest, &s[1..]))
        }
        (Some(b'\\'), Some(&c)) if p.len() > 1 => p[1] == c && glob(&p[2..], &s[1..]),
        (Some(a), Some(b)) if a == b => glob(&p[1..], &s[1..]),
        _ => false,
    }
}

/// A `[...]` class (`p` after the `[`) against `c`: whether it matches, and the pattern
/// after the `]`; None when the class is not closed.
fn class(p: &[u8], c: u8) -> Option<(bool, &[u8])> {
    fn one(p: &[u8]) -> Option<(u8, &[u8])> {
        match p {
            [b'\\', c, rest @ ..] | [c, rest @ ..] => Some((*c, rest)),
            [] => None,
        }
    }
    let (negated, mut p) = match p.first() {
        Some(b'^' | b'!') => (true, &p[1..]),
        _ => (false, p),
    };
    let mut hit = false;
    let mut first = true;
    loop {
        if p.first() == Some(&b']') && !first {
            return Some((hit != negated, &p[1..]));
        }
        first = false;
        let (lo, rest) = one(p)?;
        p = rest;
        let hi = match p {
            [b'-', next, ..] if *next != b']' => {
                let (hi, rest) = one(&p[1..])?;
                p = rest;
                hi
            }
            _ => lo,
        };
        hit |= lo <= c && c <= hi;
    }
}

/// A source's components beneath the context; `..` that would leave it is refused.
fn clean(rel: &str, line: usize) -> Result<Vec<String>, BuildError> {
    let mut out: Vec<String> = Vec::new();
    for c in Path::new(rel).components() {
        match c {
            Component::Normal(n) => out.push(n.to_string_lossy().into_owned()),
            Component::ParentDir if out.pop().is_none() => {
                return step_err(line, format!("{rel}: outside the build context"));
            }
            _ => {}
        }
    }
    Ok(out)
}

/// The host path of a context source, refusing a path that goes through a symlink (it
/// could lead out of the context). The source itself may be a symlink: it is copied as one.
fn context_source(
    context: &Path,
    parts: &[String],
    rel: &str,
    line: usize,
) -> Result<PathBuf, BuildError> {
    let mut p = context.to_path_buf();
    for (i, c) in parts.iter().enumerate() {
        p.push(c);
        if i + 1 < parts.len() {
            match std::fs::symlink_metadata(&p) {
                Ok(md) if md.file_type().is_symlink() => {
                    return step_err(line, format!("{rel}: goes through the symlink {c:?}; lockbox never follows symlinks in the context"));
                }
                _ => {}
            }
        }
    }
    if std::fs::symlink_metadata(&p).is_err() {
        return step_err(
            line,
            format!("{rel}: no such file or directory in the build context"),
        );
    }
    Ok(p)
}

fn context_digest(
    context: &Path,
    ignore: &Ignore,
    spec: &CopySpec,
    line: usize,
) -> Result<String, BuildError> {
    let mut h = sha2::Sha256::new();
    for (parts, p) in context_sources(context, ignore, spec, line)? {
        hash_tree(&p, &parts, ignore, &mut h)?;
    }
    Ok(Digest::from_hasher(h).to_string())
}

/// Whether a source is a pattern (Docker's: `*`, `?` or `[` not escaped with `\`).
fn has_wildcard(src: &str) -> bool {
    let mut escaped = false;
    for c in src.chars() {
        match c {
            _ if escaped => escaped = false,
            '\\' => escaped = true,
            '*' | '?' | '[' => return true,
            _ => {}
        }
    }
    false
}

/// What a directory holds, for expanding a pattern: each name and whether it is a real
/// directory (a symlink is not: patterns are never expanded through one).
type Lister<'a> = dyn Fn(&[String]) -> Vec<(String, bool)> + 'a;

/// The paths (components) `pattern` matches, sorted; component by component, as Docker's
/// `filepath.Match` (`*` and `?` never match `/`). Empty when nothing matches.
fn expand(pattern: &[String], list: &Lister<'_>) -> Vec<Vec<String>> {
    let mut found: Vec<Vec<String>> = vec![Vec::new()];
    for (i, pat) in pattern.iter().enumerate() {
        let last = i + 1 == pattern.len();
        let mut next = Vec::new();
        for dir in &found {
            for (name, is_dir) in list(dir) {
                if (last || is_dir) && glob(pat.as_bytes(), name.as_bytes()) {
                    let mut p = dir.clone();
                    p.push(name);
                    next.push(p);
                }
            }
        }
        found = next;
    }
    found.sort();
    found.dedup();
    found
}

/// The context sources of `spec` (components and host path), each pattern expanded: one
/// that matches nothing (or only what `.dockerignore` excludes) is an error naming it.
fn context_sources(
    context: &Path,
    ignore: &Ignore,
    spec: &CopySpec,
    line: usize,
) -> Result<Vec<(Vec<String>, PathBuf)>, BuildError> {
    let mut out = Vec::new();
    for src in &spec.sources {
        let parts = clean(src, line)?;
        if !has_wildcard(src) {
            let p = context_source(context, &parts, src, line)?;
            out.push((parts, p));
            continue;
        }
        let list = |dir: &[String]| -> Vec<(String, bool)> {
            let d = context.join(dir.join("/"));
            let Ok(rd) = std::fs::read_dir(&d) else {
                return Vec::new();
            };
            rd.flatten()
                .filter_map(|e| {
                    let name = e.file_name().to_string_lossy().into_owned();
                    let mut rel = dir.to_vec();
                    rel.push(name.clone());
                    let is_dir = e.file_type().ok()?.is_dir();
                    (!ignore.excluded(&rel)).then_some((name, is_dir))
                })
                .collect()
        };
        let matched = expand(&parts, &list);
        if matched.is_empty() {
            return step_err(
                line,
                format!("{src}: no file in the build context matches this pattern"),
            );
        }
        for m in matched {
            let p = context.join(m.join("/"));
            out.push((m, p));
        }
    }
    Ok(out)
}

fn hash_tree(
    p: &Path,
    rel: &[String],
    ignore: &Ignore,
    h: &mut sha2::Sha256,
) -> Result<(), BuildError> {
    if !rel.is_empty() && ignore.excluded(rel) {
        return Ok(());
    }
    let md = std::fs::symlink_metadata(p).map_err(|e| ImageError::io("read", p, e))?;
    h.update(rel.join("/").as_bytes());
    h.update(format!("\0{:o}\0{}\0", md.mode(), md.len()).as_bytes());
    if md.is_dir() {
        let mut names: Vec<String> = std::fs::read_dir(p)
            .map_err(|e| ImageError::io("read", p, e))?
            .filter_map(|e| e.ok().map(|e| e.file_name().to_string_lossy().into_owned()))
            .collect();
        names.sort();
        for n in names {
            let mut r = rel.to_vec();
            r.push(n.clone());
            hash_tree(&p.join(&n), &r, ignore, h)?;
        }
    } else if md.file_type().is_symlink() {
        let t = std::fs::read_link(p).map_err(|e| ImageError::io("read", p, e))?;
        h.update(t.as_os_str().as_encoded_bytes());
    } else if md.is_file() {
        let mut f = std::fs::File::open(p).map_err(|e| ImageError::io("read", p, e))?;
        let mut sink = crate::layer_tar::HashingSink {
            hasher: sha2::Sha256::new(),
            count: 0,
        };
        std::io::copy(&mut f, &mut sink).map_err(|e| ImageError::io("read", p, e))?;
        h.update(sink.hasher.finalize());
    }
    Ok(())
}

/// Where a source goes in the layer: a directory's contents into `dest`; a file to `dest`
/// itself, or under it when `dest` ends in `/` or there are several sources.
/// `sources`: how many there are once patterns are expanded; several need a destination
/// that is a directory, written ending in `/` (as Docker says).
fn dest_root(
    spec: &CopySpec,
    sources: usize,
    workdir: &str,
    layer: &Path,
    line: usize,
) -> Result<(PathBuf, bool), BuildError> {
    let abs = if spec.dest.starts_with('/') {
        PathBuf::from(&spec.dest)
    } else {
        Path::new(workdir).join(&spec.dest)
    };
    let parts = clean(&abs.to_string_lossy(), line)?;
    let into_dir = spec.dest.ends_with('/') || spec.dest == "." || spec.dest == "..";
    if sources > 1 && !into_dir {
        return step_err(
            line,
            format!(
                "{} {}: {sources} sources (after expanding patterns): the destination {:?} must be a directory and end with a /",
                if spec.add { "ADD" } else { "COPY" },
                spec.sources.join(" "),
                spec.dest
            ),
        );
    }
    Ok((layer.join(parts.join("/")), into_dir))
}

fn copy_from_context(
    context: &Path,
    ignore: &Ignore,
    spec: &CopySpec,
    workdir: &str,
    layer: &Path,
    line: usize,
) -> Result<(), BuildError> {
    let sources = context_sources(context, ignore, spec, line)?;
    let (dest, into_dir) = dest_root(spec, sources.len(), workdir, layer, line)?;
    for (parts, p) in sources {
        let md = std::fs::symlink_metadata(&p).map_err(|e| ImageError::io("read", &p, e))?;
        if md.is_dir() {
            copy_tree(&p, &dest, &parts, ignore, spec.chmod)?;
        } else if spec.add && md.is_file() && is_archive(&p) {
            extract(&p, &dest, line)?;
        } else {
            let name = parts.last().cloned().unwrap_or_default();
            let target = if into_dir {
                dest.join(name)
            } else {
                dest.clone()
            };
            copy_tree(&p, &target, &parts, ignore, spec.chmod)?;
        }
    }
    Ok(())
}

fn mkdirs(p: &Path) -> Result<(), BuildError> {
    std::fs::create_dir_all(p).map_err(|e| ImageError::io("create", p, e).into())
}

/// Makes `p` a real directory: a symlink (or file) an earlier source put there is replaced,
/// never written through.
fn real_dir(p: &Path) -> Result<(), BuildError> {
    if let Ok(md) = std::fs::symlink_metadata(p) {
        if md.is_dir() {
            return Ok(());
        }
        std::fs::remove_file(p).map_err(|e| ImageError::io("replace", p, e))?;
    }
    mkdirs(p)
}

/// Copies `src` to `dst` (a directory's contents into `dst`), never following symlinks.
fn copy_tree(
    src: &Path,
    dst: &Path,
    rel: &[String],
    ignore: &Ignore,
    chmod: Option<u32>,
) -> Result<(), BuildError> {
    if !rel.is_empty() && ignore.excluded(rel) {
        return Ok(());
    }
    let md = std::fs::symlink_metadata(src).map_err(|e| ImageError::io("read", src, e))?;
    if let Some(parent) = dst.parent() {
        mkdirs(parent)?;
    }
    let io = |e, p: &Path| BuildError::from(ImageError::io("copy", p, e));
    if md.is_dir() {
        real_dir(dst)?;
        let mut names: Vec<String> = std::fs::read_dir(src)
            .map_err(|e| io(e, src))?
            .filter_map(|e| e.ok().map(|e| e.file_name().to_string_lossy().into_owned()))
            .collect();
        names.sort();
        for n in names {
            let mut r = rel.to_vec();
            r.push(n.clone());
            copy_tree(&src.join(&n), &dst.join(&n), &r, ignore, chmod)?;
        }
        let mode = chmod.unwrap_or(md.mode() & 0o7777);
        std::fs::set_permissions(dst, std::fs::Permissions::from_mode(mode | 0o700))
            .map_err(|e| io(e, dst))?;
    } else if md.file_type().is_symlink() {
        let t = std::fs::read_link(src).map_err(|e| io(e, src))?;
        let _ = std::fs::remove_file(dst);
        std::os::unix::fs::symlink(t, dst).map_err(|e| io(e, dst))?;
    } else if md.is_file() {
        let _ = std::fs::remove_file(dst);
        std::fs::copy(src, dst).map_err(|e| io(e, dst))?;
        let mode = chmod.unwrap_or(md.mode() & 0o777);
        std::fs::set_permissions(dst, std::fs::Permissions::from_mode(mode))
            .map_err(|e| io(e, dst))?;
    }
    Ok(())
}

fn is_archive(p: &Path) -> bool {
    let n = p.to_string_lossy();
    [".tar", ".tar.gz", ".tgz", ".tar.zst", ".tar.zstd"]
        .iter()
        .any(|s| n.ends_with(s))
}

fn extract(p: &Path, dest: &Path, line: usize) -> Result<(), BuildError> {
    mkdirs(dest)?;
    let f = std::fs::File::open(p).map_err(|e| ImageError::io("open", p, e))?;
    let name = p.to_string_lossy().into_owned();
    let stream = crate::store::decompressed(std::io::BufReader::new(f), &name)?;
    let mut a = tar::Archive::new(stream);
    a.set_preserve_permissions(true);
    a.set_unpack_xattrs(false);
    // `unpack` refuses entries that would land outside `dest` (`..`, through symlinks).
    a.unpack(dest).map_err(|e| BuildError::Step {
        line,
        reason: format!("ADD {name}: extracting: {e}"),
    })
}

/// The merged view of `layers` (top first) at `rel`: the layers (indexes) in which it is
/// visible, top first; empty when it does not exist.
fn visible(layers: &[PathBuf], rel: &[String]) -> Vec<usize> {
    let mut out = Vec::new();
    for (i, l) in layers.iter().enumerate() {
        // Ancestors: a whiteout or a non-directory hides everything below; an opaque one
        // hides the lower layers.
        let mut stop_after = false;
        let mut p = l.clone();
        let mut hidden = false;
        for c in &rel[..rel.len().saturating_sub(1)] {
            p.push(c);
            match std::fs::symlink_metadata(&p) {
                Ok(md) if is_whiteout(&md) || !md.is_dir() => {
                    hidden = true;
                    break;
                }
                Ok(_) if is_opaque(&p) => stop_after = true,
                _ => {}
            }
        }
        if hidden {
            break;
        }
        let full = l.join(rel.join("/"));
        match std::fs::symlink_metadata(&full) {
            Ok(md) if is_whiteout(&md) => break,
            Ok(md) => {
                out.push(i);
                if !md.is_dir() || is_opaque(&full) {
                    break;
                }
            }
            Err(_) => {}
        }
        if stop_after {
            break;
        }
    }
    out
}

/// The index of the first component of `parts` missing from the merged `layers`, when
/// every one that exists is a real directory; None when it all exists, or when a symlink or
/// file is on the way (the sandbox follows it; lockbox does not shadow it with a directory).
fn missing_dirs(layers: &[PathBuf], parts: &[String]) -> Option<usize> {
    for i in 1..=parts.len() {
        let vis = visible(layers, &parts[..i]);
        let Some(&top) = vis.first() else {
            return Some(i - 1);
        };
        let md = std::fs::symlink_metadata(layers[top].join(parts[..i].join("/"))).ok()?;
        if !md.is_dir() {
            return None;
        }
    }
    None
}

fn copy_merged(
    layers: &[PathBuf],
    rel: &[String],
    dst: &Path,
    chmod: Option<u32>,
) -> Result<bool, BuildError> {
    let vis = visible(layers, rel);
    let Some(&top) = vis.first() else {
        return Ok(false);
    };
    let src = layers[top].join(rel.join("/"));
    let md = std::fs::symlink_metadata(&src).map_err(|e| ImageError::io("read", &src, e))?;
    if !md.is_dir() {
        copy_tree(&src, dst, &[], &Ignore::default(), chmod)?;
        return Ok(true);
    }
    real_dir(dst)?;
    let mut names = BTreeSet::new();
    for &i in &vis {
        let d = layers[i].join(rel.join("/"));
        if let Ok(rd) = std::fs::read_dir(&d) {
            for e in rd.flatten() {
                names.insert(e.file_name().to_string_lossy().into_owned());
            }
        }
    }
    for n in names {
        let mut r = rel.to_vec();
        r.push(n.clone());
        copy_merged(layers, &r, &dst.join(&n), chmod)?;
    }
    let mode = chmod.unwrap_or(md.mode() & 0o7777);
    std::fs::set_permissions(dst, std::fs::Permissions::from_mode(mode | 0o700))
        .map_err(|e| ImageError::io("copy", dst, e))?;
    Ok(true)
}

fn copy_from_layers(
    layers: &[PathBuf],
    spec: &CopySpec,
    workdir: &str,
    layer: &Path,
    line: usize,
) -> Result<(), BuildError> {
    let from = spec.from.as_deref().unwrap_or("");
    // What the merged layers show in a directory: names not whited out, and whether each
    // is a real directory.
    let list = |dir: &[String]| -> Vec<(String, bool)> {
        let mut names = BTreeSet::new();
        for &i in &visible(layers, dir) {
            if let Ok(rd) = std::fs::read_dir(layers[i].join(dir.join("/"))) {
                names.extend(
                    rd.flatten()
                        .map(|e| e.file_name().to_string_lossy().into_owned()),
                );
            }
        }
        names
            .into_iter()
            .filter_map(|n| {
                let mut rel = dir.to_vec();
                rel.push(n.clone());
                let top = *visible(layers, &rel).first()?;
                let md = std::fs::symlink_metadata(layers[top].join(rel.join("/"))).ok()?;
                Some((n, md.is_dir()))
            })
            .collect()
    };
    let mut sources = Vec::new();
    for src in &spec.sources {
        let parts = clean(src, line)?;
        if !has_wildcard(src) {
            sources.push((src.clone(), parts));
            continue;
        }
        let matched = expand(&parts, &list);
        if matched.is_empty() {
            return step_err(
                line,
                format!("--from={from}: {src}: nothing in that stage matches this pattern"),
            );
        }
        sources.extend(matched.into_iter().map(|m| (src.clone(), m)));
    }
    let (dest, into_dir) = dest_root(spec, sources.len(), workdir, layer, line)?;
    for (src, parts) in sources {
        let vis = visible(layers, &parts);
        let Some(&top) = vis.first() else {
            return step_err(line, format!("--from={from}: {src}: no such file or directory in that stage (a path through a symlink is not followed)"));
        };
        let is_dir =
            std::fs::symlink_metadata(layers[top].join(parts.join("/"))).is_ok_and(|m| m.is_dir());
        let target = if is_dir || !into_dir {
            dest.clone()
        } else {
            dest.join(parts.last().cloned().unwrap_or_default())
        };
        copy_merged(layers, &parts, &target, spec.chmod)?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ig(text: &str) -> Ignore {
        let d = tempfile::tempdir().unwrap();
        std::fs::write(d.path().join(".dockerignore"), text).unwrap();
        Ignore::load(d.path()).unwrap()
    }

    fn parts(p: &str) -> Vec<String> {
        p.split('/').map(str::to_owned).collect()
    }

    #[test]
    fn dockerignore_patterns_exclude_and_exceptions_include_again() {
        let i = ig("# comment\n*.log\nbuild/\n**/secret\n!keep.log\n");
        assert!(i.excluded(&parts("a.log")));
        assert!(!i.excluded(&parts("keep.log")));
        assert!(i.excluded(&parts("build/x/y")));
        assert!(i.excluded(&parts("deep/er/secret")));
        assert!(!i.excluded(&parts("src/main.rs")));
        assert!(
            !i.excluded(&parts("sub/a.log")),
            "*.log is rooted at the context"
        );
    }

    #[test]
    fn a_symlink_copied_earlier_is_replaced_not_written_through() {
        let d = tempfile::tempdir().unwrap();
        let (ctx, outside, layer) = (
            d.path().join("ctx"),
            d.path().join("outside"),
            d.path().join("layer"),
        );
        std::fs::create_dir_all(ctx.join("b/x")).unwrap();
        std::fs::create_dir_all(&outside).unwrap();
        std::fs::create_dir_all(&layer).unwrap();
        std::fs::write(ctx.join("b/x/f"), "data").unwrap();
        std::os::unix::fs::symlink(&outside, ctx.join("x")).unwrap();
        let spec = CopySpec {
            add: false,
            from: None,
            chown: None,
            chmod: None,
            sources: vec!["x".into(), "b".into()],
            dest: "/dst/".into(),
        };
        copy_from_context(&ctx, &Ignore::default(), &spec, "/", &layer, 1).unwrap();
        assert!(std::fs::read_dir(&outside).unwrap().next().is_none());
        assert_eq!(
            std::fs::read_to_string(layer.join("dst/x/f")).unwrap(),
            "data"
        );
        // A source through a symlink is refused.
        let spec = CopySpec {
            sources: vec!["x/anything".into()],
            ..spec
        };
        let e = copy_from_context(&ctx, &Ignore::default(), &spec, "/", &layer, 7).unwrap_err();
        assert!(
            e.to_string().contains("line 7") && e.to_string().contains("symlink"),
            "{e}"
        );
    }

    #[test]
    fn globs_match_as_docker_does_within_one_component() {
        let g = |p: &str, s: &str| glob(p.as_bytes(), s.as_bytes());
        assert!(g("*.py", "main.py") && g("*.py", ".hidden.py") && !g("*.py", "main.pyc"));
        assert!(g("file?.txt", "file1.txt") && !g("file?.txt", "file10.txt"));
        assert!(g("[a-c]x", "bx") && !g("[a-c]x", "dx") && g("[^a-c]x", "dx"));
        assert!(g("[!a]", "b") && !g("[!a]", "a") && g("[]a]", "]"));
        assert!(g("\\*", "*") && !g("\\*", "x") && !g("[a-", "a"));
        assert!(has_wildcard("src/*.txt") && has_wildcard("a[0-9]") && !has_wildcard("a\\*b"));
        assert!(!has_wildcard("plain/path.txt"));
    }

    #[test]
    fn a_pattern_expands_in_the_context_sorted_and_never_through_a_symlink() {
        let d = tempfile::tempdir().unwrap();
        let ctx = d.path();
        std::fs::create_dir_all(ctx.join("src/deep")).unwrap();
        std::fs::create_dir_all(ctx.join("other")).unwrap();
        for f in [
            "b.py",
            "a.py",
            "c.txt",
            "src/x.txt",
            "src/y.txt",
            "src/z.log",
            "other/o.txt",
        ] {
            std::fs::write(ctx.join(f), f).unwrap();
        }
        std::os::unix::fs::symlink(ctx.join("src"), ctx.join("link")).unwrap();
        let spec = |sources: &[&str]| CopySpec {
            add: false,
            from: None,
            chown: None,
            chmod: None,
            sources: sources.iter().map(|s| s.to_string()).collect(),
            dest: "/app/".into(),
        };
        let names = |sources: &[&str], ignore: &Ignore| -> Vec<String> {
            context_sources(ctx, ignore, &spec(sources), 1)
                .unwrap()
                .into_iter()
                .map(|(p, _)| p.join("/"))
                .collect()
        };
        let none = Ignore::default();
        assert_eq!(names(&["*.py"], &none), ["a.py", "b.py"]);
        assert_eq!(
            names(&["*/*.txt"], &none),
            ["other/o.txt", "src/x.txt", "src/y.txt"]
        );
        assert_eq!(names(&["src/[xz].*"], &none), ["src/x.txt", "src/z.log"]);
        assert_eq!(names(&["src/*.txt"], &ig("src/y.txt\n")), ["src/x.txt"]);
        let e = context_sources(ctx, &none, &spec(&["*.rs"]), 4).unwrap_err();
        assert!(
            e.to_string().contains("line 4") && e.to_string().contains("*.rs"),
            "{e}"
        );
        // `link` (a symlink to src) is not expanded through.
        let e = context_sources(ctx, &none, &spec(&["link/*"]), 5).unwrap_err();
        assert!(e.to_string().contains("link/*"), "{e}");
    }

    #[test]
    fn several_sources_need_a_destination_ending_in_a_slash() {
        let d = tempfile::tempdir().unwrap();
        let mut spec = CopySpec {
            add: false,
            from: None,
            chown: None,
            chmod: None,
            sources: vec!["*.py".into()],
            dest: "/app".into(),
        };
        assert!(dest_root(&spec, 1, "/", d.path(), 3).is_ok());
        let e = dest_root(&spec, 2, "/", d.path(), 3).unwrap_err();
        assert!(
            e.to_string().contains("line 3") && e.to_string().contains("end with a /"),
            "{e}"
        );
        spec.dest = "/app/".into();
        assert!(dest_root(&spec, 2, "/", d.path(), 3).unwrap().1);
        spec.dest = ".".into();
        assert!(dest_root(&spec, 2, "/", d.path(), 3).unwrap().1);
    }

    #[test]
    fn sources_cannot_leave_the_context() {
        assert!(clean("../etc/passwd", 3).is_err());
        assert_eq!(clean("a/../b/./c", 3).unwrap(), vec!["b", "c"]);
    }
}

/// What [`commit_upper`] made.
#[derive(Debug, Clone, serde::Serialize)]
pub struct Committed {
    /// The new image.
    pub image: Image,
    /// The new layer's diff id (none when the sandbox wrote nothing to its root).
    pub layer: Option<String>,
    /// The image it was made on (its id).
    pub base: String,
}

/// `lockbox image commit`: the writes of a running image sandbox's root (its overlay
/// `upper`, in overlayfs format: whiteouts for deletions, opaque directories) as a new layer
/// on top of image `base` (an id), named `names`. The upper is not changed: it is written
/// as a layer tar stream (as a push would send it), unpacked into the store with the pull's
/// checks, and lockbox's own mount points (`/dev`, `/proc`, `/tmp`, `/etc/hosts`, ...) are
/// left out, as for a build's `RUN`. The base's config is kept.
pub fn commit_upper(
    store: &Store,
    upper: &Path,
    base: &str,
    names: &[String],
    source: &str,
) -> Result<Committed, ImageError> {
    for n in names {
        crate::Source::parse(n)?;
    }
    let image = store
        .get(base)?
        .ok_or_else(|| ImageError::NotFound(base.to_owned()))?;
    // The upper is mounted volatile: its writes reach the disk now.
    if let Ok(f) = std::fs::File::open(upper) {
        rustix::fs::syncfs(&f).map_err(|e| ImageError::io("syncfs", upper, e.into()))?;
    }
    let bdir = store.build_dir()?;
    let tar = bdir.path().join("upper.tar");
    let out = std::fs::File::create(&tar).map_err(|e| ImageError::io("create a layer", &tar, e))?;
    crate::layer_tar::write_layer_tar(upper, std::io::BufWriter::new(out))?;
    let dir = bdir.path().join("layer");
    std::fs::create_dir(&dir).map_err(|e| ImageError::io("create a layer", &dir, e))?;
    let f = std::fs::File::open(&tar).map_err(|e| ImageError::io("open a layer", &tar, e))?;
    crate::unpack::unpack(std::io::BufReader::new(f), &dir, "the sandbox's root")?;
    remove_mount_points(&dir);
    let mut layers: Vec<Digest> = image
        .layer_info
        .iter()
        .rev()
        .map(|l| Digest::parse(&l.diff_id))
        .collect::<Result<_, _>>()?;
    let empty = std::fs::read_dir(&dir)
        .map(|mut d| d.next().is_none())
        .unwrap_or(false);
    let layer = if empty {
        None
    } else {
        let d = store.add_layer_dir(&dir)?;
        layers.push(d.clone());
        Some(d.to_string())
    };
    let base = image.id.clone();
    let image = store.add_image(&image.config, &layers, names, source)?;
    drop(bdir);
    Ok(Committed { image, layer, base })
}
