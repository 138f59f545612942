//! `lockbox image pull | ls | inspect | rm | prune | save | load | push | commit | build`: the image store of a state directory
//! (`<state-dir>/images`, `lockbox_image::Store`). This file only turns arguments into one
//! store call and prints the result.

use crate::cli::StateArgs;
use crate::error::{CliError, ExitCode};
use crate::output::{eoutln, json, outln};
use clap::{Args, Subcommand};
use lockbox_image::{ImageError, Platform, PruneOptions, PullOptions, Store};
use serde_json::json;
use std::io::IsTerminal;

/// Arguments of `lockbox image`.
#[derive(Debug, Args)]
pub struct ImageArgs {
    #[command(subcommand)]
    pub command: ImageCommand,
    #[command(flatten)]
    pub state: StateArgs,
    /// Print machine-readable JSON.
    #[arg(long, global = true)]
    pub json: bool,
}

/// The `lockbox image` subcommands.
#[derive(Debug, Subcommand)]
pub enum ImageCommand {
    /// Pull an image from a registry or a local source into the store.
    ///
    /// REF is a registry reference (busybox, docker.io/library/busybox:1.36,
    /// HOST:PORT/REPO@sha256:…) or a local source: oci:DIR[:TAG] (an OCI image layout),
    /// oci-archive:FILE, docker-archive:FILE (`docker save`). Credentials come from
    /// $REGISTRY_AUTH_FILE, else ~/.docker/config.json. Plain http is used only for
    /// loopback registries and those named by --insecure-registry.
    Pull {
        /// The image.
        reference: String,
        /// The platform to pick from a multi-platform image: os/arch[/variant]
        /// [default: the host's, e.g. linux/amd64].
        #[arg(long, value_name = "OS/ARCH[/VARIANT]")]
        platform: Option<String>,
        /// Reach this registry (HOST or HOST:PORT) over plain http (repeatable).
        #[arg(long = "insecure-registry", value_name = "HOST")]
        insecure_registry: Vec<String>,
        /// Trust the CA certificates in FILE (PEM) for the registry's https, besides the
        /// system's roots and certs.d (~/.config/containers/certs.d/HOST[:PORT]/*.crt,
        /// /etc/containers/certs.d, /etc/docker/certs.d); a loopback registry is then
        /// spoken to over https too. Repeatable.
        #[arg(long = "ca-cert", value_name = "FILE")]
        ca_cert: Vec<std::path::PathBuf>,
        /// Refuse a layer larger than this, compressed or unpacked (a decompression bomb
        /// stops here), e.g. 512M, 8G.
        #[arg(long, value_name = "SIZE", default_value = "32G")]
        max_layer_size: lockbox_policy::ByteSize,
        /// After the pull, remove the least recently used images nothing holds until the
        /// store takes at most SIZE (unpacked layers and blobs); 0: no bound. `lockbox run
        /// --image` applies the same bound after a pull.
        #[arg(
            long,
            value_name = "SIZE",
            env = "LOCKBOX_MAX_STORE",
            default_value = "20G"
        )]
        max_store: lockbox_policy::ByteSize,
    },
    /// List the images in the store, most recently pulled first.
    Ls,
    /// Show an image: its config, layers (top first), names and holders.
    Inspect {
        /// A reference as pulled, an id, or a unique id prefix.
        reference: String,
    },
    /// Remove a name of an image, or (given an id or its last name) the image and every
    /// layer no other image uses. Refused while a sandbox or snapshot holds it.
    Rm {
        /// References or ids.
        #[arg(required = true)]
        references: Vec<String>,
    },
    /// Remove images without a name (with --all: every image nothing holds), then every
    /// layer and blob no image uses.
    Prune {
        /// Every image nothing holds, named or not.
        #[arg(long)]
        all: bool,
        /// Then remove the least recently used images nothing holds until the store takes
        /// at most SIZE.
        #[arg(long, value_name = "SIZE", env = "LOCKBOX_MAX_STORE")]
        max_store: Option<lockbox_policy::ByteSize>,
    },
    /// Write an image to an archive file, to load on another host.
    ///
    /// oci-archive (the default) is a tar of an OCI image layout, as `skopeo copy
    /// oci-archive:FILE` and `podman load` read it: the image's manifest and config as
    /// pulled (so the same id and manifest digest wherever it is loaded) and its layer
    /// blobs. docker-archive is `docker save`'s format (uncompressed layers, no manifest).
    /// A layer the store has no blob of (one a build made) is written again from its
    /// unpacked directory and must match its recorded diff id. The file appears only when
    /// complete.
    #[command(after_help = concat!(
        "Examples:\n",
        "  lockbox image save app -o app.tar                      an OCI archive\n",
        "  lockbox image save busybox -o bb.tar --format docker-archive\n",
        "  lockbox image load app.tar                             on the other host\n",
    ))]
    Save {
        /// A reference as pulled or built, an id, or a unique id prefix.
        reference: String,
        /// The archive to write (replaced if it exists).
        #[arg(short = 'o', long = "output", value_name = "FILE")]
        output: std::path::PathBuf,
        /// oci-archive or docker-archive.
        #[arg(long, value_name = "FORMAT", default_value = "oci-archive")]
        format: lockbox_image::ArchiveFormat,
    },
    /// Push an image to a registry (OCI distribution API), with the pull's credentials.
    ///
    /// DEST is HOST[:PORT]/REPO[:TAG] [default: REF itself, which must then be a registry
    /// reference]. Blobs the registry has are not sent (HEAD first); others go in one PUT,
    /// or in PATCH chunks when larger than --chunk-size; the manifest (as pulled, or made
    /// for a built image as `save` makes it) goes last, with its media type. Credentials
    /// come from $REGISTRY_AUTH_FILE, else ~/.docker/config.json (Bearer token for
    /// pull,push, or Basic). Plain http only for loopback registries and --insecure-registry.
    #[command(after_help = concat!(
        "Examples:\n",
        "  lockbox image push app registry.example:5000/team/app:1\n",
        "  lockbox image push 127.0.0.1:5000/app:1                 its own name (plain http: loopback)\n",
        "  lockbox image push --insecure-registry reg.lan:5000 app reg.lan:5000/app:1 --json\n",
    ))]
    Push {
        /// The image: a reference as pulled or built, an id, or a unique id prefix.
        reference: String,
        /// Where to push it: HOST[:PORT]/REPO[:TAG].
        dest: Option<String>,
        /// Reach this registry (HOST or HOST:PORT) over plain http (repeatable).
        #[arg(long = "insecure-registry", value_name = "HOST")]
        insecure_registry: Vec<String>,
        /// Trust the CA certificates in FILE (PEM) for the registry's https, besides the
        /// system's roots and certs.d (~/.config/containers/certs.d/HOST[:PORT]/*.crt,
        /// /etc/containers/certs.d, /etc/docker/certs.d); a loopback registry is then
        /// spoken to over https too. Repeatable.
        #[arg(long = "ca-cert", value_name = "FILE")]
        ca_cert: Vec<std::path::PathBuf>,
        /// Send a blob larger than SIZE in chunks of SIZE.
        #[arg(long, value_name = "SIZE", default_value = "16M")]
        chunk_size: lockbox_policy::ByteSize,
    },
    /// Make an image of a running `lockbox serve` sandbox's root writes.
    ///
    /// What the image sandbox SANDBOX (an id) wrote to its root, outside its workdir and
    /// grants (files made, changed and deleted), becomes a new layer on its image, named
    /// by -t in the server's store (its state directory's; `lockbox image ls --state-dir`
    /// of the server's lists it). Deletions are whiteouts; the sandbox goes on running.
    /// The server is reached at --server with the token in --token-file (the server's
    /// own, by default that of --state-dir).
    #[command(after_help = concat!(
        "Examples:\n",
        "  lockbox image commit sb-1a2b3c -t app:2                 serve on 127.0.0.1:7070\n",
        "  lockbox image commit sb-1a2b3c -t app:2 --server 127.0.0.1:8080 --token-file t\n",
        "  lockbox run --image app:2 -- cat /the/file/it/wrote\n",
    ))]
    Commit {
        /// The sandbox's id.
        sandbox: String,
        /// A name for the new image (repeatable), e.g. app:2.
        #[arg(short = 't', long = "tag", value_name = "NAME", required = true)]
        tags: Vec<String>,
        /// The server: HOST:PORT or http://HOST:PORT.
        #[arg(
            long,
            value_name = "ADDR",
            env = "LOCKBOX_SERVER",
            default_value = "127.0.0.1:7070"
        )]
        server: String,
        /// The server's bearer token [default: <state-dir>/server.token].
        #[arg(long, value_name = "FILE")]
        token_file: Option<std::path::PathBuf>,
    },
    /// Load an image from an archive `lockbox image save`, `docker save` or `skopeo copy
    /// oci-archive:` wrote (which one is found from its contents).
    ///
    /// Every blob is verified against its digest and every layer against the config's diff
    /// ids, as in a pull. The image keeps the names the archive gives it; one without names
    /// is named oci-archive:/ABS/FILE (or docker-archive:…).
    Load {
        /// The archive (may be gzip- or zstd-compressed).
        file: std::path::PathBuf,
        /// After the load, remove the least recently used images nothing holds until the
        /// store takes at most SIZE; 0: no bound.
        #[arg(
            long,
            value_name = "SIZE",
            env = "LOCKBOX_MAX_STORE",
            default_value = "20G"
        )]
        max_store: lockbox_policy::ByteSize,
    },
    /// Build an image from a Dockerfile, without a daemon or privilege.
    ///
    /// Each RUN runs in a lockbox sandbox on the layers so far (no network unless
    /// --net-allow or --network host) and what it writes becomes the next layer; COPY/ADD
    /// copy from CONTEXT (wildcards, honouring .dockerignore, never following a symlink) or
    /// an earlier stage or image (--from). An unchanged step is taken from the cache
    /// (CACHED). A failed RUN exits 1 with its exit code named and tags nothing; a
    /// malformed Dockerfile exits 2 naming the line. See docs/images.md, "Building".
    #[command(after_help = concat!(
        "Examples:\n",
        "  lockbox image build -t app .                       ./Dockerfile, context .\n",
        "  lockbox image build -t app:1 -f build/Dockerfile --build-arg VERSION=1.2 .\n",
        "  lockbox image build -t app --net-allow pypi.org:443 --net-allow files.pythonhosted.org:443 .\n",
        "  lockbox image build -t app --no-cache --json .\n",
        "  lockbox run --image app                            its Entrypoint and Cmd\n",
    ))]
    Build {
        /// The build context: the directory COPY and ADD read from.
        context: std::path::PathBuf,
        /// A name for the image (repeatable), e.g. app or app:1.
        #[arg(short = 't', long = "tag", value_name = "NAME", required = true)]
        tags: Vec<String>,
        /// The Dockerfile [default: CONTEXT/Dockerfile].
        #[arg(short = 'f', long = "file", value_name = "PATH")]
        file: Option<std::path::PathBuf>,
        /// A value for an ARG (repeatable): K=V.
        #[arg(long = "build-arg", value_name = "K=V")]
        build_args: Vec<String>,
        /// Run every step, ignoring the cache.
        #[arg(long)]
        no_cache: bool,
        /// The network of RUN steps: none (the default: loopback only) or host (the
        /// host's network, unfiltered).
        #[arg(long, value_name = "MODE", default_value = "none")]
        network: String,
        /// Let RUN steps reach SPEC on the host's network, everything else refused: the
        /// allow-list of `lockbox run --net-allow`, in the same form
        /// ([tcp://|udp://]HOST:PORT, *.example.org:443, 10.0.0.0/8:*, ...; listed names
        /// are resolved by lockbox's resolver, others get NXDOMAIN). Repeatable.
        #[arg(long = "net-allow", value_name = "SPEC", value_parser = crate::cli::parse_net_spec, conflicts_with = "network")]
        net_allow: Vec<lockbox_policy::NetSpec>,
        /// Pull base images over plain http from this registry (HOST or HOST:PORT;
        /// repeatable), as `lockbox image pull --insecure-registry`.
        #[arg(long = "insecure-registry", value_name = "HOST")]
        insecure_registry: Vec<String>,
        /// Trust the CA certificates in FILE (PEM) for the registry's https, besides the
        /// system's roots and certs.d (~/.config/containers/certs.d/HOST[:PORT]/*.crt,
        /// /etc/containers/certs.d, /etc/docker/certs.d); a loopback registry is then
        /// spoken to over https too. Repeatable.
        #[arg(long = "ca-cert", value_name = "FILE")]
        ca_cert: Vec<std::path::PathBuf>,
    },
}

/// The registry trust of `--ca-cert FILE...` (and the default certs.d directories).
fn tls(ca_certs: &[std::path::PathBuf]) -> lockbox_image::Tls {
    lockbox_image::Tls {
        ca_certs: ca_certs.to_vec(),
        ..lockbox_image::Tls::default()
    }
}

/// The store bound after a pull of `pulled` (`--max-store`; 0: none).
fn bound_store(store: &Store, max: u64, pulled: &str) -> Result<(), ImageError> {
    if max == 0 {
        return Ok(());
    }
    let report = store.shrink_to(max, &[pulled])?;
    for id in &report.images_removed {
        eoutln!("lockbox: the store's bound ({max} bytes, --max-store): removed the least recently used image {id}");
    }
    Ok(())
}

impl From<ImageError> for CliError {
    fn from(e: ImageError) -> CliError {
        let hint = match &e {
            ImageError::Held { .. } => Some("stop the sandboxes or delete the snapshots that use it, then retry"),
            ImageError::Unauthorized { .. } => {
                Some("log in with `skopeo login`/`podman login` (writes $REGISTRY_AUTH_FILE) or `docker login`")
            }
            _ => None,
        };
        let error = CliError::new(e.exit_code(), &e);
        match hint {
            Some(h) => error.hint(h),
            None => error,
        }
    }
}

pub fn run(args: &ImageArgs) -> Result<ExitCode, CliError> {
    let state_dir = args
        .state
        .resolve()
        .map_err(|e| CliError::usage(super::chain(&e)))?;
    let store = Store::in_state_dir(&state_dir)?;
    match &args.command {
        ImageCommand::Pull {
            reference,
            platform,
            insecure_registry,
            max_layer_size,
            max_store,
            ca_cert,
        } => {
            let mut opts = PullOptions {
                insecure_registries: insecure_registry.clone(),
                tls: tls(ca_cert),
                max_layer_bytes: max_layer_size.0,
                progress: !args.json && std::io::stderr().is_terminal(),
                ..PullOptions::default()
            };
            if let Some(p) = platform {
                opts.platform = Platform::parse(p)?;
                opts.exact_platform = true;
            }
            let rt = tokio::runtime::Runtime::new()
                .map_err(|e| CliError::new(1, format!("starting the async runtime: {e}")))?;
            let image = rt.block_on(store.pull(reference, &opts))?;
            bound_store(&store, max_store.0, &image.id)?;
            if args.json {
                outln!("{}", json(&image, false));
            } else {
                outln!("{}  {}", image.id, image.references.join(", "));
            }
        }
        ImageCommand::Build {
            context,
            tags,
            file,
            build_args,
            no_cache,
            network,
            net_allow,
            insecure_registry,
            ca_cert,
        } => {
            let pull = PullOptions {
                progress: !args.json && std::io::stderr().is_terminal(),
                insecure_registries: insecure_registry.clone(),
                tls: tls(ca_cert),
                ..PullOptions::default()
            };
            return build(
                &store,
                args.json,
                context,
                tags,
                file.as_deref(),
                build_args,
                *no_cache,
                network,
                net_allow,
                pull,
            );
        }
        ImageCommand::Save {
            reference,
            output,
            format,
        } => {
            let saved = store.save(reference, *format, output)?;
            if args.json {
                outln!("{}", json(&saved, false));
            } else {
                if saved.layers_regenerated > 0 {
                    eoutln!(
                        "lockbox: {} layer(s) written again from their unpacked directories (verified against their diff ids)",
                        saved.layers_regenerated
                    );
                }
                outln!(
                    "{}  {} ({}, {})",
                    saved.id,
                    saved.path.display(),
                    saved.format,
                    human(saved.bytes)
                );
            }
        }
        ImageCommand::Push {
            reference,
            dest,
            insecure_registry,
            chunk_size,
            ca_cert,
        } => {
            let opts = lockbox_image::PushOptions {
                insecure_registries: insecure_registry.clone(),
                tls: tls(ca_cert),
                chunk_bytes: chunk_size.0.max(1),
                ..lockbox_image::PushOptions::default()
            };
            let rt = tokio::runtime::Runtime::new()
                .map_err(|e| CliError::new(1, format!("starting the async runtime: {e}")))?;
            let pushed = rt.block_on(store.push(reference, dest.as_deref(), &opts))?;
            if args.json {
                outln!("{}", json(&pushed, false));
            } else {
                outln!(
                    "{}  {}@{} ({} blobs sent, {} already there, {})",
                    pushed.id,
                    pushed.reference,
                    pushed.manifest,
                    pushed.blobs_uploaded,
                    pushed.blobs_skipped,
                    human(pushed.bytes_uploaded)
                );
            }
        }
        ImageCommand::Commit {
            sandbox,
            tags,
            server,
            token_file,
        } => {
            for t in tags {
                lockbox_image::Source::parse(t)?;
            }
            let token_file = token_file
                .clone()
                .unwrap_or_else(|| state_dir.join("server.token"));
            let made = commit_on_server(server, &token_file, sandbox, tags)?;
            if args.json {
                outln!("{}", json(&made, false));
            } else {
                outln!(
                    "{}  {} (on {}, {})",
                    made["id"].as_str().unwrap_or("?"),
                    made["references"]
                        .as_array()
                        .map(|r| r
                            .iter()
                            .filter_map(|x| x.as_str())
                            .collect::<Vec<_>>()
                            .join(", "))
                        .unwrap_or_default(),
                    made["base"].as_str().unwrap_or("?"),
                    match made["layer"].as_str() {
                        Some(l) => format!("new layer {l}"),
                        None => "no new layer: the sandbox wrote nothing to its root".into(),
                    }
                );
            }
        }
        ImageCommand::Load { file, max_store } => {
            let opts = PullOptions {
                progress: !args.json && std::io::stderr().is_terminal(),
                ..PullOptions::default()
            };
            let rt = tokio::runtime::Runtime::new()
                .map_err(|e| CliError::new(1, format!("starting the async runtime: {e}")))?;
            let image = rt.block_on(store.load_archive(file, &opts))?;
            bound_store(&store, max_store.0, &image.id)?;
            if args.json {
                outln!("{}", json(&image, false));
            } else {
                outln!("{}  {}", image.id, image.references.join(", "));
            }
        }
        ImageCommand::Ls => {
            let all = store.list()?;
            if args.json {
                outln!("{}", json(&json!({ "images": all }), false));
            } else {
                outln!("{:<14}{:<8}{:>12}  {}", "ID", "LAYERS", "SIZE", "NAMES");
                for i in &all {
                    let held = if i.holders.is_empty() {
                        String::new()
                    } else {
                        format!("  (held by {})", i.holders.join(", "))
                    };
                    outln!(
                        "{:<14}{:<8}{:>12}  {}{held}",
                        &i.id[7..19],
                        i.layers,
                        human(i.unpacked_bytes),
                        if i.references.is_empty() {
                            "<none>".to_owned()
                        } else {
                            i.references.join(", ")
                        }
                    );
                }
            }
        }
        ImageCommand::Inspect { reference } => {
            let image = store
                .get(reference)?
                .ok_or_else(|| ImageError::NotFound(reference.clone()))?;
            if args.json {
                outln!("{}", json(&image, true));
            } else {
                let c = &image.config;
                let list = |v: &Option<Vec<String>>| {
                    v.as_ref().map_or("-".to_owned(), |v| format!("{v:?}"))
                };
                outln!("id          {}", image.id);
                outln!(
                    "names       {}",
                    if image.references.is_empty() {
                        "-".into()
                    } else {
                        image.references.join(", ")
                    }
                );
                outln!("source      {}", image.source);
                outln!("platform    {}", image.platform);
                outln!("created     {}", image.created.as_deref().unwrap_or("-"));
                outln!("manifest    {}", image.manifest.as_deref().unwrap_or("-"));
                outln!("entrypoint  {}", list(&c.entrypoint));
                outln!("cmd         {}", list(&c.cmd));
                outln!("workdir     {}", c.working_dir.as_deref().unwrap_or("-"));
                outln!("user        {}", c.user.as_deref().unwrap_or("-"));
                for e in &c.env {
                    outln!("env         {e}");
                }
                outln!(
                    "holders     {}",
                    if image.holders.is_empty() {
                        "-".into()
                    } else {
                        image.holders.join(", ")
                    }
                );
                outln!("layers (top first):");
                for l in &image.layer_info {
                    outln!(
                        "  {}  {}  {}",
                        l.diff_id,
                        human(l.unpacked_bytes),
                        l.path.display()
                    );
                    for s in &l.setid_stripped {
                        outln!("    setuid/setgid stripped: {s}");
                    }
                    for s in &l.skipped {
                        outln!("    skipped: {s}");
                    }
                }
            }
        }
        ImageCommand::Rm { references } => {
            // Every name is checked before anything is removed.
            for r in references {
                store
                    .get(r)?
                    .ok_or_else(|| ImageError::NotFound(r.clone()))?;
            }
            for r in references {
                let removed = store.remove(r)?;
                if args.json {
                    outln!("{}", json(&removed, false));
                } else if removed.image_deleted {
                    outln!(
                        "deleted {} ({}, {} freed)",
                        removed.id,
                        removed.references.join(", "),
                        human(removed.freed_bytes)
                    );
                } else {
                    outln!(
                        "untagged {} (image {} kept: it has other names)",
                        removed.references.join(", "),
                        removed.id
                    );
                }
            }
        }
        ImageCommand::Prune { all, max_store } => {
            let mut report = store.prune(&PruneOptions { all: *all })?;
            if let Some(max) = max_store {
                let more = store.shrink_to(max.0, &[])?;
                report.images_removed.extend(more.images_removed);
                report.layers_removed += more.layers_removed;
                report.blobs_removed += more.blobs_removed;
                report.bytes_freed += more.bytes_freed;
            }
            if args.json {
                outln!("{}", json(&report, false));
            } else {
                for id in &report.images_removed {
                    outln!("deleted {id}");
                }
                outln!(
                    "{} images, {} layers, {} blobs removed; {} freed",
                    report.images_removed.len(),
                    report.layers_removed,
                    report.blobs_removed,
                    human(report.bytes_freed)
                );
            }
        }
    }
    Ok(ExitCode::SUCCESS)
}

/// `POST /v1/sandboxes/{sandbox}/commit-image` on a running `lockbox serve`. Exit codes: 2
/// a sandbox the server does not know or a bad request, 1 the server could not be reached
/// or the commit failed.
fn commit_on_server(
    server: &str,
    token_file: &std::path::Path,
    sandbox: &str,
    tags: &[String],
) -> Result<serde_json::Value, CliError> {
    let token = std::fs::read_to_string(token_file).map_err(|e| {
        CliError::usage(format!(
            "reading the server's token {}: {e}",
            token_file.display()
        ))
        .hint("give the server's --token-file, or its --state-dir")
    })?;
    let base = if server.starts_with("http://") || server.starts_with("https://") {
        server.trim_end_matches('/').to_owned()
    } else {
        format!("http://{server}")
    };
    let url = format!("{base}/v1/sandboxes/{sandbox}/commit-image");
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|e| CliError::new(1, format!("starting the async runtime: {e}")))?;
    let (status, body) = rt.block_on(async {
        let resp = reqwest::Client::new()
            .post(&url)
            .bearer_auth(token.trim())
            .json(&json!({ "tags": tags }))
            .send()
            .await
            .map_err(|e| {
                CliError::new(1, format!("reaching the server at {base}: {e}"))
                    .hint("is `lockbox serve` running there? (--server)")
            })?;
        let status = resp.status();
        let body: serde_json::Value = resp
            .json()
            .await
            .map_err(|e| CliError::new(1, format!("the server's answer: {e}")))?;
        Ok::<_, CliError>((status, body))
    })?;
    if status.is_success() {
        return Ok(body);
    }
    let code = if status.is_client_error() { 2 } else { 1 };
    Err(CliError::new(
        code,
        format!(
            "the server refused the commit: HTTP {status} {}: {}",
            body["code"].as_str().unwrap_or(""),
            body["message"].as_str().unwrap_or("")
        ),
    ))
}

fn human(bytes: u64) -> String {
    const UNITS: [&str; 5] = ["B", "KiB", "MiB", "GiB", "TiB"];
    let mut v = bytes as f64;
    let mut u = 0;
    while v >= 1024.0 && u < UNITS.len() - 1 {
        v /= 1024.0;
        u += 1;
    }
    if u == 0 {
        format!("{bytes} B")
    } else {
        format!("{v:.1} {}", UNITS[u])
    }
}

/// The image of a `lockbox run` (from --image or its profile), found or pulled, held by
/// this process until dropped, its config applied to the policy.
pub struct RunImage {
    _held: lockbox_image::ProcessImage,
    /// The sandbox's root.
    pub root: lockbox_confine::ImageRoot,
    /// The command to run (the given one, or the image's Entrypoint and Cmd).
    pub argv: Vec<std::ffi::OsString>,
}

impl RunImage {
    /// `None` when the policy names no image. Errors are the sandbox's set-up failing
    /// (exit 125), or usage (2) for a bad reference or --platform.
    pub fn prepare(
        policy: &mut lockbox_policy::Policy,
        command: &[std::ffi::OsString],
        how: &crate::cli::RunImageArgs,
        state: &StateArgs,
    ) -> Result<Option<RunImage>, CliError> {
        if policy.image.is_none() {
            return Ok(None);
        }
        let state_dir = state
            .resolve()
            .map_err(|e| CliError::usage(super::chain(&e)))?;
        let reference = policy.image.clone().unwrap_or_default();
        RunImage::open(policy, command, how, &state_dir).map_err(|failure| match failure {
            RunImageFailure::Other(e) => e,
            RunImageFailure::Image(e) => {
                let code = match e {
                    ImageError::BadReference { .. } | ImageError::BadPlatform(_) => 2,
                    _ => 125,
                };
                let error = CliError::new(code, &e);
                match &e {
                    ImageError::NotFound(_) => error.hint(format!(
                        "pull it first (`lockbox image pull {reference}`), or leave out --pull never"
                    )),
                    _ => error,
                }
            }
        })
    }

    /// [`RunImage::prepare`] in the state directory `state_dir`, the image store's own
    /// errors kept as they are.
    pub fn open(
        policy: &mut lockbox_policy::Policy,
        command: &[std::ffi::OsString],
        how: &crate::cli::RunImageArgs,
        state_dir: &std::path::Path,
    ) -> Result<Option<RunImage>, RunImageFailure> {
        let Some(reference) = policy.image.clone() else {
            return Ok(None);
        };
        let mut opts = PullOptions {
            insecure_registries: how.insecure_registry.clone(),
            progress: std::io::stderr().is_terminal(),
            tls: tls(&how.ca_cert),
            ..PullOptions::default()
        };
        if let Some(p) = &how.platform {
            opts.platform = Platform::parse(p)?;
            opts.exact_platform = true;
        }
        let max = match std::env::var("LOCKBOX_MAX_STORE") {
            Ok(text) => {
                text.parse::<lockbox_policy::ByteSize>()
                    .map_err(|e| CliError::usage(format!("LOCKBOX_MAX_STORE: {e}")))?
                    .0
            }
            Err(_) => lockbox_image::DEFAULT_MAX_STORE,
        };
        let store = Store::in_state_dir(state_dir)?;
        let held = lockbox_image::ProcessImage::take(store, &reference, how.pull, &opts, max)?;
        for id in &held.pruned {
            eoutln!("lockbox: the store's bound ({max} bytes, LOCKBOX_MAX_STORE): removed the least recently used image {id}");
        }
        let (root, argv) = lockbox_image::apply(&held.image, policy, command)?;
        Ok(Some(RunImage {
            _held: held,
            root,
            argv,
        }))
    }
}

/// Why [`RunImage::open`] failed: the image store's error, or another one (the async
/// runtime, `LOCKBOX_MAX_STORE`) already said as the command reports it.
pub enum RunImageFailure {
    Image(ImageError),
    Other(CliError),
}

impl From<ImageError> for RunImageFailure {
    fn from(e: ImageError) -> RunImageFailure {
        RunImageFailure::Image(e)
    }
}

impl From<CliError> for RunImageFailure {
    fn from(e: CliError) -> RunImageFailure {
        RunImageFailure::Other(e)
    }
}

#[allow(clippy::too_many_arguments)]
fn build(
    store: &Store,
    as_json: bool,
    context: &std::path::Path,
    tags: &[String],
    file: Option<&std::path::Path>,
    build_args: &[String],
    no_cache: bool,
    network: &str,
    net_allow: &[lockbox_policy::NetSpec],
    pull: PullOptions,
) -> Result<ExitCode, CliError> {
    use lockbox_image::build::{BuildError, BuildOptions};
    let dockerfile = file.map_or_else(|| context.join("Dockerfile"), |f| f.to_owned());
    let text = std::fs::read_to_string(&dockerfile).map_err(|e| {
        CliError::usage(format!(
            "reading the Dockerfile {}: {e}",
            dockerfile.display()
        ))
    })?;
    if !context.is_dir() {
        return Err(CliError::usage(format!(
            "the build context {} is not a directory",
            context.display()
        )));
    }
    let mut args = std::collections::BTreeMap::new();
    for a in build_args {
        let Some((k, v)) = a.split_once('=') else {
            return Err(CliError::usage(format!("--build-arg {a:?}: expected K=V")));
        };
        args.insert(k.to_owned(), v.to_owned());
    }
    // The runtime's own network policy: an allow-list is enforced by lockbox's network
    // supervisor for each RUN as for `lockbox run --net-allow`.
    let net = match network {
        _ if !net_allow.is_empty() => lockbox_policy::Net::Allow(net_allow.to_vec()),
        "none" => lockbox_policy::Net::None,
        "host" => lockbox_policy::Net::Host,
        other => {
            return Err(CliError::usage(format!(
                "--network {other:?}: expected none or host"
            )))
        }
    };
    let policy = lockbox_policy::Policy {
        net,
        ..lockbox_policy::Policy::default()
    };
    policy
        .validate()
        .map_err(|e| CliError::usage(format!("--net-allow: {e}")))?;
    for t in tags {
        lockbox_image::Source::parse(t)?;
    }
    let opts = BuildOptions {
        context: context.to_owned(),
        dockerfile: text,
        tags: tags.to_vec(),
        build_args: args,
        no_cache,
        pull,
        policy,
    };
    let rt = tokio::runtime::Runtime::new()
        .map_err(|e| CliError::new(1, format!("starting the async runtime: {e}")))?;
    let started = std::time::Instant::now();
    let result = rt.block_on(lockbox_image::build::build(store, &opts, &mut |line| {
        eoutln!("{line}")
    }));
    match result {
        Ok(report) => {
            eoutln!(
                "built {} in {:.2}s ({} of {} layer steps cached)",
                report.image.id,
                started.elapsed().as_secs_f64(),
                report.cached,
                report.layer_steps
            );
            if as_json {
                outln!("{}", json(&report.image, true));
            } else {
                outln!(
                    "{}  {}",
                    report.image.id,
                    report.image.references.join(", ")
                );
            }
            Ok(ExitCode::SUCCESS)
        }
        Err(BuildError::Image(e)) => Err(e.into()),
        Err(e) => Err(CliError::new(e.exit_code(), &e)),
    }
}
