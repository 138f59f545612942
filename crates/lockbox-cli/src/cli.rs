//! Command-line definitions. Flags become a `lockbox_policy::Policy` in one place,
//! [`PolicyArgs::to_policy`].

use anyhow::Context;
use clap::{Args, Parser, Subcommand, ValueEnum};
use lockbox_intercept::{AllowRule, AuthRule, CredentialSpec};
use lockbox_policy::{parse_duration, ByteSize, EnvPolicy, Net, NetSpec, Policy};
use std::ffi::OsString;
use std::path::{Path, PathBuf};
use std::time::Duration;

macro_rules! txn_exit_codes {
    () => {
        "\
Exit codes of `lockbox pipeline`, `lockbox gather` and `lockbox txn commit|abort`:
  0    committed (or --dry-run / --prepare / abort succeeded)
  1    a stage failed; nothing committed
  3    merge conflict under --conflict fail; nothing committed
  4    commit failed; if past its commit point, `lockbox txn recover` finishes it
  5    workdir busy (--lock) or stale base (the workdir changed the same paths)
  124  a stage timed out; nothing committed
  125  a stage's sandbox (or the transaction store) could not be set up
  2    usage error, unknown id, wrong state
  74   done, but stdout could not be written (a closed pipe is not an error)
`lockbox txn show ID` says which one a finished transaction returned and why."
    };
}

macro_rules! branch_exit_codes {
    () => {
        "\
Exit codes of `lockbox branch`:
  0  done
  2  usage error, unknown branch id, bad --hunks (no such hunk)
  4  commit failed (the branch is kept)
  5  stale base: the workdir changed under the branch since it began (use --force)
  74 done, but stdout could not be written (a closed pipe is not an error)"
    };
}

macro_rules! run_exit_codes {
    () => {
        "\
Exit codes of `lockbox run`:
  N        the command's own exit code
  4        with --workdir: committing the branch failed (it is kept)
  5        with --workdir: stale base, the workdir changed under the branch (it is kept)
  128+N    the command was killed by signal N (137: also when it exceeded --max-memory)
  124      the timeout expired and the sandbox was stopped
  125      the sandbox could not be set up (the message names what is missing)
  126/127  the command could not be executed / was not found inside the sandbox
  2        usage error"
    };
}

const PRE_ARM_EXAMPLES: &str = "\
Examples:
  lockbox pre-arm start                 start the helper (returns once it listens)
  lockbox run -- python3 -c 'print(1)'  the first run of a policy starts directly...
  lockbox run -- python3 -c 'print(2)'  ...the next ones in a spare
  lockbox pre-arm status --json         pid, socket, spares per policy, runs handed over
  lockbox pre-arm stop
  LOCKBOX_PRE_ARM=0 lockbox run -- true never use the helper (or: --no-pre-arm)

Exit codes: 0 done; 1 no helper runs (status), or it could not be started; 2 usage.
The socket is in $LOCKBOX_PRE_ARM_DIR, else $XDG_RUNTIME_DIR/lockbox, else
/tmp/lockbox-UID (a directory of the user's, mode 0700). See docs/pre-arm.md.";

/// Run untrusted code confined, without privilege.
#[derive(Debug, Parser)]
#[command(
    name = "lockbox",
    version,
    about,
    after_help = concat!(
        "Examples:\n",
        "  lockbox run -- python3 -c 'print(1)'          a command, confined\n",
        "  lockbox run --workdir . -- make test            writes land on a branch, committed on success\n",
        "  lockbox run --workdir . --on-exit keep -- ./agent.sh && lockbox branch list\n",
        "  lockbox pipeline --workdir . --stage 'make fmt' --stage 'make test'\n",
        "  lockbox check                                   what this kernel lets lockbox use\n",
        "\nEach command has its own --help with examples; `lockbox man` prints the manual.\n\n",
        run_exit_codes!()
    )
)]
pub struct Cli {
    #[command(subcommand)]
    pub command: Command,
}

/// `lockbox run ...` parsed without building the other commands' arguments: building the
/// whole command tree is a tenth of lockbox's start-up, paid by the command agents call in
/// loops. `None` for anything else, and for anything it cannot parse (`--help`, an error):
/// the full parser then gives the usual messages.
pub fn parse_run_only(args: &[OsString]) -> Option<RunArgs> {
    use clap::FromArgMatches;
    if args.get(1).map(OsString::as_os_str) != Some("run".as_ref()) {
        return None;
    }
    // `lockbox run -- CMD...`, the form agents call in loops, has no flag to parse: every
    // argument after `--` is the command's, and the rest are the defaults. Building even
    // `run`'s own arguments costs about 0.1 ms and 18 page faults (measured on a `dist`
    // build), 3% of a pre-armed run.
    if args.get(2).map(OsString::as_os_str) == Some("--".as_ref()) {
        return Some(RunArgs {
            command: args[3..].to_vec(),
            ..RunArgs::default()
        });
    }
    let run = RunArgs::augment_args(clap::Command::new("run"));
    let matches = clap::Command::new("lockbox")
        .subcommand(run)
        .try_get_matches_from(args)
        .ok()?;
    RunArgs::from_arg_matches(matches.subcommand_matches("run")?).ok()
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// Run a command in a new sandbox.
    ///
    /// The sandbox gets its own user, mount, pid, network, ipc, uts and cgroup namespaces, a
    /// root that holds only what is granted (by default /usr, /bin, /sbin, /lib, /lib64 and
    /// /etc without its secrets, read-only, plus a private /tmp, a minimal /dev and its own
    /// /proc), Landlock and seccomp, no capabilities, and no network but loopback.
    #[command(after_help = concat!(
        "Examples:\n",
        "  lockbox run -- python3 -c 'import os; print(os.getuid())'\n",
        "  lockbox run -r ~/project --timeout 30s --max-memory 512M -- python3 ~/project/main.py\n",
        "  lockbox run -w ./out -- sh -c 'echo hi > out/hello.txt'\n",
        "  lockbox run --workdir . --dry-run -- sh -c 'echo x > new.txt'   print what it would change\n",
        "  lockbox run --workdir . --max-disk 1G -- make                  commit its writes if make succeeds\n",
        "  lockbox run --net-allow pypi.org:443 --net-allow files.pythonhosted.org:443 -- pip download requests\n",
        "  lockbox run --json -- true                                    the report as JSON on stdout\n",
        "  lockbox run --image debian:12 -- cat /etc/debian_version      an image's userland (pulled once)\n",
        "  lockbox run --image python:3.12-slim --workdir . -- python3 main.py\n",
        "  lockbox run --image oci:./layout:v1 --pull never              the image's Entrypoint and Cmd\n\n",
        run_exit_codes!()
    ))]
    Run(RunArgs),
    /// Show which kernel features lockbox can use here.
    #[command(after_help = "\
Examples:
  lockbox check                       every feature, and whether a sandbox starts
  lockbox check --json | jq .landlock
  lockbox check --explain -w ./out    the mounts and Landlock rules a policy would get
  lockbox check --explain --image busybox   the same on an image's root (from the store)")]
    Check(CheckArgs),
    /// Review, commit or abort kept copy-on-write branches (from `run --workdir`).
    #[command(after_help = concat!(
        "Examples:\n",
        "  lockbox run --workdir . --on-exit keep -- ./agent.sh\n",
        "  lockbox branch list\n",
        "  lockbox branch diff ID             every change, as a unified diff\n",
        "  lockbox branch diff ID src/main.rs\n",
        "  lockbox branch commit ID           or: lockbox branch abort ID\n",
        "  lockbox branch hunks ID src/main.rs   numbered hunks of one file, and a review token\n",
        "  lockbox branch commit ID --review TOKEN --hunks src/main.rs:0,2 --only README.md\n",
        "                                     hunks 0 and 2 of src/main.rs and README.md;\n",
        "                                     the rest stays in the branch (--drop-rest: dropped)\n",
        "  lockbox branch commit ID -p        choose hunk by hunk (y/n/q), like git add -p\n\n",
        branch_exit_codes!()
    ))]
    Branch(BranchArgs),
    /// List, show, diff and delete snapshots of long-lived sandboxes' files.
    ///
    /// Snapshots are taken of running sandboxes of `lockbox serve` or `Sandbox.open`
    /// (`POST /v1/sandboxes/{id}/snapshots`, `box.snapshot()`) and forked or restored
    /// there; this command reads and deletes them in a state directory.
    #[command(after_help = concat!(
        "Examples:\n",
        "  lockbox snapshot list                  every snapshot, oldest first\n",
        "  lockbox snapshot show ID\n",
        "  lockbox snapshot diff ID               the snapshot against its workdir as it is now\n",
        "  lockbox snapshot diff ID OTHER         what turns snapshot ID into snapshot OTHER\n",
        "  lockbox snapshot rm ID                 refused while forks or other snapshots use it\n",
        "  lockbox --json snapshot list\n\n",
        "Exit codes: 0 done; 2 usage or an unknown id; 4 failed (a snapshot still in use, the store)."
    ))]
    Snapshot(SnapshotArgs),
    /// Pull or build OCI images into the store and list, inspect and remove them (no daemon,
    /// no privilege).
    #[command(after_help = concat!(
        "Examples:\n",
        "  lockbox image pull busybox                      docker.io/library/busybox:latest\n",
        "  lockbox image pull --platform linux/arm64 python:3.12-slim\n",
        "  lockbox image pull 127.0.0.1:5000/team/app:1    plain http: a loopback registry\n",
        "  lockbox image pull --insecure-registry reg.lan:5000 reg.lan:5000/app:1\n",
        "  lockbox image pull oci:./layout:v1              an OCI layout (skopeo, umoci, buildah)\n",
        "  lockbox image pull docker-archive:app.tar       `docker save` output\n",
        "  lockbox image ls\n",
        "  lockbox image inspect busybox                   config, layers (top first), holders\n",
        "  lockbox image rm busybox                        refused while a sandbox holds it\n",
        "  lockbox image prune --all\n",
        "  lockbox image build -t app .                    ./Dockerfile; each RUN in a sandbox\n",
        "  lockbox image save app -o app.tar               an OCI archive (skopeo, podman read it)\n",
        "  lockbox image load app.tar                      the same image (id, manifest) elsewhere\n",
        "  lockbox image push app reg.example/team/app:1   credentials as for pull\n",
        "  lockbox image commit SANDBOX -t app:2           a served sandbox's root writes\n",
        "  lockbox image ls --json\n\n",
        "Exit codes: 0 done; 1 the pull failed (registry, network, digest, a hostile layer) or a\n",
        "build's RUN failed; 2 usage, a bad reference, an unknown image or a bad Dockerfile (its\n",
        "line named); 4 the store could not be read or written;\n",
        "5 the image is in use (its holders are named). See docs/images.md."
    ))]
    Image(crate::commands::image::ImageArgs),
    /// Inspect and fork durable step journals of agent runs.
    #[command(after_help = "\
Examples:
  lockbox journal --journal sqlite:runs.db list
  lockbox journal --journal sqlite:runs.db status RUN
  lockbox journal --journal sqlite:runs.db dump RUN --json
  lockbox journal --journal sqlite:runs.db fork RUN --from-step llm#3
  LOCKBOX_JOURNAL=postgres://lockbox@127.0.0.1:5432/lockbox lockbox journal list")]
    Journal(crate::commands::journal::JournalArgs),
    /// Run shell stages in order, each on the writes of the ones before, stdout piped to the
    /// next; commit all their writes to the workdir or none.
    ///
    /// Consecutive stages that can share a sandbox (the same policy, the usual case) run in
    /// one, each stage with a fresh /tmp; see docs/transactions.md, "Pipes".
    #[command(after_help = concat!(
        "Examples:\n",
        "  lockbox pipeline --workdir . --stage 'ruff format .' --stage 'pytest -q'\n",
        "  lockbox pipeline --workdir . --dry-run --stage './codegen.sh'      print the changes, commit nothing\n",
        "  lockbox pipeline --workdir . --stage 'cat data.csv' --stage 'sort > sorted.csv'\n",
        "  lockbox pipeline --workdir . --prepare --stage 'make' && lockbox txn list\n\n",
        txn_exit_codes!()
    ))]
    Pipeline(crate::commands::txn::PipelineArgs),
    /// Run named sources in parallel sandboxes, merge their writes under a conflict policy,
    /// run a consumer on the merged view; commit all or none.
    #[command(after_help = concat!(
        "Examples:\n",
        "  lockbox gather --workdir . --source 'a=./try-a.sh' --source 'b=./try-b.sh'\n",
        "  lockbox gather --workdir . --conflict markers --source 'x=echo 1 > f' --source 'y=echo 2 > f'\n",
        "  lockbox gather --workdir . --source 'lint=ruff check . > lint.txt' \\\n",
        "      --source 'test=pytest -q > test.txt' --consumer 'cat $LOCKBOX_INPUTS/*'\n\n",
        txn_exit_codes!()
    ))]
    Gather(crate::commands::txn::GatherArgs),
    /// List, show, commit, abort or recover transactions.
    #[command(after_help = concat!(
        "Examples:\n",
        "  lockbox txn list\n",
        "  lockbox txn show ID                 its record, exit code and what it means\n",
        "  lockbox txn commit ID --only src    commit part of a prepared transaction\n",
        "  lockbox txn recover --workdir .     finish or roll back what a crash interrupted\n\n",
        txn_exit_codes!()
    ))]
    Txn(crate::commands::txn::TxnArgs),
    /// Serve long-lived sandboxes over HTTP (REST + JSON, SSE, WebSocket), with sessions,
    /// background processes, PTYs, files and workspace branches.
    Serve(crate::commands::serve::ServeArgs),
    /// Serve sandboxes as MCP tools over stdio, for agents: create, exec, run_code, files,
    /// changes, diff, commit, abort, snapshot, fork, restore.
    Mcp(crate::commands::mcp::McpArgs),
    /// Keep sandboxes set up ahead for `lockbox run`: start, stop or show this user's
    /// pre-arm helper.
    ///
    /// The helper (a `lockbox` process of the user's, no privilege) keeps a few sandboxes
    /// per policy in recent use with namespaces, root, Landlock and seccomp in place,
    /// waiting for a command. A `lockbox run` of such a policy hands its command, stdio and
    /// environment over and pays only for the command's exec; exit codes, signals,
    /// --timeout, limits, --report and messages are those of a direct start. A run with a
    /// terminal on its stdio, --workdir, --image, a network list or a credential starts
    /// directly, as does a policy with no spare yet. The helper exits after --idle without a run.
    #[command(after_help = PRE_ARM_EXAMPLES)]
    PreArm(crate::commands::pre_arm::PreArmArgs),
    /// Print a shell completion script on stdout.
    #[command(after_help = COMPLETIONS_EXAMPLES)]
    Completions {
        /// The shell: bash, zsh, fish, elvish or powershell.
        #[arg(value_enum)]
        shell: clap_complete::Shell,
    },
    /// Print lockbox's manual page (roff, generated from this help) on stdout, or write
    /// one page per command into a directory.
    #[command(after_help = MAN_EXAMPLES)]
    Man {
        /// Write lockbox.1 and lockbox-COMMAND.1 (lockbox-branch-diff.1, ...) into DIR
        /// instead.
        #[arg(long, value_name = "DIR")]
        dir: Option<PathBuf>,
    },
}

const MAN_EXAMPLES: &str = "\
Examples:
  lockbox man | man -l -
  lockbox man --dir /usr/local/share/man/man1 && man lockbox-run";

const COMPLETIONS_EXAMPLES: &str = "\
Examples:
  lockbox completions bash > /etc/bash_completion.d/lockbox
  lockbox completions zsh > \"${fpath[1]}/_lockbox\"
  lockbox completions fish > ~/.config/fish/completions/lockbox.fish";

#[derive(Debug, Args)]
pub struct BranchArgs {
    #[command(subcommand)]
    pub command: BranchCommand,
    #[command(flatten)]
    pub state: StateArgs,
    /// Print machine-readable JSON.
    #[arg(long, global = true)]
    pub json: bool,
}

#[derive(Debug, Args)]
pub struct SnapshotArgs {
    #[command(subcommand)]
    pub command: SnapshotCommand,
    #[command(flatten)]
    pub state: StateArgs,
    /// Print machine-readable JSON.
    #[arg(long, global = true)]
    pub json: bool,
}

#[derive(Debug, Subcommand)]
pub enum SnapshotCommand {
    /// List snapshots, oldest first.
    List,
    /// Show a snapshot's record, who uses it, and its changes against its workdir.
    Show {
        /// The snapshot's id (from `lockbox snapshot list`).
        id: String,
    },
    /// Show what changed from snapshot ID to snapshot OTHER (of the same workdir), or
    /// without OTHER, the snapshot's changes against its workdir as it is now.
    Diff {
        /// The snapshot's id.
        id: String,
        /// Another snapshot of the same workdir.
        other: Option<String>,
    },
    /// Delete snapshots (refused while forks or other snapshots use one).
    Rm {
        /// The snapshots' ids.
        #[arg(required = true)]
        ids: Vec<String>,
    },
}

#[derive(Debug, Subcommand)]
pub enum BranchCommand {
    /// List branches (kept ones, and orphans left by a killed lockbox).
    List,
    /// Show a branch's record and its change set.
    Show {
        /// The branch's id (from `lockbox branch list`).
        id: String,
    },
    /// Show what a branch changes: unified diffs for text, a summary for binary files.
    Diff {
        /// The branch's id (from `lockbox branch list`).
        id: String,
        /// Only this path, or the changes below it (relative to the workdir).
        path: Option<PathBuf>,
    },
    /// Show one file's diff as numbered hunks (for `commit --hunks`).
    Hunks {
        /// The branch's id (from `lockbox branch list`).
        id: String,
        /// The file, relative to the workdir.
        path: PathBuf,
    },
    /// Apply a branch to its workdir, then remove it; or apply part of it (`--only`,
    /// `--exclude`, `--hunks`, `-p`) and keep the rest in the branch.
    Commit {
        /// The branch's id (from `lockbox branch list`).
        id: String,
        /// Commit even if the workdir changed the same paths since the branch began.
        #[arg(long)]
        force: bool,
        /// Commit only this path (and what is below it); repeatable.
        #[arg(long, value_name = "PATH")]
        only: Vec<PathBuf>,
        /// Leave this path (and what is below it) in the branch; repeatable.
        #[arg(long, value_name = "PATH")]
        exclude: Vec<PathBuf>,
        /// Commit only these hunks of PATH, numbered as `lockbox branch hunks` shows them
        /// (`PATH:` alone: none, the file is not touched); repeatable.
        #[arg(long, value_name = "PATH:N,N")]
        hunks: Vec<std::ffi::OsString>,
        /// After a partial commit, remove the branch with what was not committed.
        #[arg(long)]
        drop_rest: bool,
        /// The review token `lockbox branch show` / `lockbox branch hunks` printed: the
        /// commit is refused (exit 5, STALE_REVIEW) if the branch's changes are no longer
        /// what that review listed, so hunk numbers mean what you read.
        #[arg(long, value_name = "TOKEN")]
        review: Option<String>,
        /// Choose hunk by hunk on the terminal: y (commit it), n (leave it), q (stop
        /// choosing; the rest is left), like `git add -p`.
        #[arg(short = 'p', long = "patch")]
        interactive: bool,
    },
    /// Discard a branch.
    Abort {
        /// The branch's id (from `lockbox branch list`).
        id: String,
    },
}

#[derive(Debug, Clone, Default, Args)]
pub struct StateArgs {
    /// lockbox's state directory (branches live in it) [default: $LOCKBOX_STATE_DIR, else
    /// /var/lib/lockbox for root, else $XDG_STATE_HOME/lockbox or ~/.local/state/lockbox].
    #[arg(long, value_name = "DIR", global = true)]
    pub state_dir: Option<PathBuf>,
}

impl StateArgs {
    /// The state directory to use (`lockbox_cow::default_state_dir`'s rule).
    /// Made absolute: overlay mounts and recorded branch paths need one.
    pub fn resolve(&self) -> anyhow::Result<PathBuf> {
        let dir = self
            .state_dir
            .clone()
            .or_else(lockbox_cow::default_state_dir)
            .ok_or_else(|| {
                anyhow::anyhow!(
                    "no state directory: no home directory was found; set --state-dir or LOCKBOX_STATE_DIR"
                )
            })?;
        std::path::absolute(&dir).map_err(|e| {
            anyhow::anyhow!(
                "state directory {}: cannot make it absolute: {e}",
                dir.display()
            )
        })
    }
}

/// The operator's ceiling for agents (`lockbox mcp`, `lockbox serve`'s `/mcp` and scoped
/// tokens): what a sandbox an agent asks for may be granted at most. Without these flags,
/// nothing beyond the default reads: no other host path, no writable one, no workdir, no
/// network but the sandbox's own loopback. A request beyond it is refused, naming the
/// field (BEYOND_CEILING); see docs/security.md, "Ceilings".
#[derive(Debug, Clone, Default, Args)]
pub struct CeilingArgs {
    /// A ceiling profile (TOML: read, write, workdirs, net, credentials, [limits], timeout,
    /// sandboxes; see docs/mcp.md); the --allow-* flags add to it.
    #[arg(long, value_name = "FILE")]
    pub ceiling: Option<PathBuf>,
    /// Agents may make PATH, or a path below it, readable (`fs_readable`). Repeatable.
    #[arg(long, value_name = "PATH")]
    pub allow_read: Vec<PathBuf>,
    /// Agents may make PATH, or a path below it, writable on the host (`fs_writable`).
    /// Repeatable.
    #[arg(long, value_name = "PATH")]
    pub allow_write: Vec<PathBuf>,
    /// Agents may use DIR, or a directory below it, as a workdir (a copy-on-write view they
    /// can commit back to DIR). Repeatable.
    #[arg(long, value_name = "DIR")]
    pub allow_workdir: Vec<PathBuf>,
    /// Agents may ask for this network form: allow (an allow-list), deny (the host's network
    /// but a deny-list) or host (the host's network, its loopback included). Repeatable.
    #[arg(long, value_name = "FORM", value_parser = ["allow", "deny", "host"])]
    pub allow_net: Vec<String>,
    /// Agents may run sandboxes on this image (`image`): a reference (`busybox:1.36`,
    /// `oci:/srv/images/app:v1`), or a prefix of the store's form ending in `*`
    /// (`docker.io/library/*`, `oci:/srv/images/*`). Repeatable; none by default.
    #[arg(long, value_name = "IMAGE")]
    pub allow_image: Vec<String>,
}

impl CeilingArgs {
    /// The profile (if any) widened by the flags; relative paths are made absolute. Errors
    /// name the file or flag (usage errors, exit 2).
    pub fn resolve(&self) -> Result<lockbox_policy::Ceiling, crate::error::CliError> {
        use crate::error::CliError;
        let mut ceiling = match &self.ceiling {
            Some(file) => {
                let text = std::fs::read_to_string(file)
                    .map_err(|e| CliError::usage(format!("--ceiling {}: {e}", file.display())))?;
                lockbox_policy::Ceiling::from_toml(&text)
                    .map_err(|e| CliError::usage(format!("--ceiling {}: {e}", file.display())))?
            }
            None => lockbox_policy::Ceiling::default(),
        };
        let absolute = |flag: &str, paths: &[PathBuf]| -> Result<Vec<PathBuf>, CliError> {
            paths
                .iter()
                .map(|p| {
                    std::path::absolute(p)
                        .map_err(|e| CliError::usage(format!("{flag} {}: {e}", p.display())))
                })
                .collect()
        };
        let mut net = Vec::new();
        for form in &self.allow_net {
            net.push(
                form.parse()
                    .map_err(|e| CliError::usage(format!("--allow-net: {e}")))?,
            );
        }
        let mut images = Vec::new();
        for image in &self.allow_image {
            // A whole reference is compared in the store's form (`busybox` is
            // `docker.io/library/busybox:latest`); a prefix is taken as written.
            if image.ends_with('*') {
                images.push(image.clone());
            } else {
                let source = lockbox_image::Source::parse(image)
                    .map_err(|e| CliError::usage(format!("--allow-image {image}: {e}")))?;
                images.push(source.name());
            }
        }
        ceiling.widen(lockbox_policy::Ceiling {
            read: absolute("--allow-read", &self.allow_read)?,
            write: absolute("--allow-write", &self.allow_write)?,
            workdirs: absolute("--allow-workdir", &self.allow_workdir)?,
            net,
            images,
            ..lockbox_policy::Ceiling::default()
        });
        Ok(ceiling)
    }
}

/// The flags' defaults, as clap gives them when none is given (`parse_run_only`'s test
/// holds the two together).
impl Default for WorkspaceArgs {
    fn default() -> WorkspaceArgs {
        WorkspaceArgs {
            workdir: None,
            on_exit: BranchAction::Commit,
            on_error: BranchAction::Abort,
            dry_run: false,
            force: false,
            max_disk: None,
            state: StateArgs::default(),
        }
    }
}

/// What happens to a `--workdir` branch when the sandbox ends.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum BranchAction {
    /// Apply the changes to the workdir.
    Commit,
    /// Discard the changes.
    Abort,
    /// Keep the branch for review (`lockbox branch`).
    Keep,
}

/// Copy-on-write workspace flags of `lockbox run`.
#[derive(Debug, Args)]
pub struct WorkspaceArgs {
    /// Show DIR inside at its own path (and as the default cwd) as a copy-on-write view:
    /// writes go to a branch in the state directory; DIR changes only on commit.
    #[arg(long, value_name = "DIR")]
    pub workdir: Option<PathBuf>,
    /// What to do with the branch when the command succeeds.
    #[arg(
        long,
        value_enum,
        default_value = "commit",
        value_name = "ACTION",
        requires = "workdir"
    )]
    pub on_exit: BranchAction,
    /// What to do when it fails (non-zero exit, signal or timeout).
    #[arg(
        long,
        value_enum,
        default_value = "abort",
        value_name = "ACTION",
        requires = "workdir"
    )]
    pub on_error: BranchAction,
    /// Print the change set (`A path`, `M path`, `D path`, `T path`) on stdout (or into
    /// the --report/--json report) and discard it.
    #[arg(long, requires = "workdir")]
    pub dry_run: bool,
    /// Commit even if the workdir changed the same paths while the sandbox ran.
    #[arg(long, requires = "workdir")]
    pub force: bool,
    /// Bound the branch (e.g. 1G): writes beyond it fail inside with ENOSPC. The branch is
    /// held in memory (a tmpfs) while the sandbox runs, then stored in the state directory.
    /// It holds at most one inode (file, directory, symlink, hard link) per 4K of SIZE, and
    /// no more than --max-inodes.
    #[arg(long, value_name = "SIZE", value_parser = parse_disk_size, requires = "workdir")]
    pub max_disk: Option<ByteSize>,
    #[command(flatten)]
    pub state: StateArgs,
}

#[derive(Debug, Default, Args)]
pub struct RunArgs {
    #[command(flatten)]
    pub policy: PolicyArgs,
    #[command(flatten)]
    pub workspace: WorkspaceArgs,
    /// Write a JSON report (exit code, signal, timing, peak memory, mechanisms; with
    /// --workdir the branch and its changes) to FILE; `-` is stdout.
    #[arg(long, value_name = "FILE")]
    pub report: Option<PathBuf>,
    /// Print the JSON report on stdout when the sandbox has ended, as one line after
    /// whatever the command printed (same as --report -).
    #[arg(long)]
    pub json: bool,
    /// Append the network supervisor's decisions to FILE (created 0600), one JSON line
    /// each: every connect or send towards the host's network, allowed or refused, and every
    /// DNS query lockbox's resolver answered, every request on an --http-auth/--http-allow
    /// host, with the reason, the address or name, and the asking process (pid, command
    /// line). Needs --net-allow or --net-deny. See
    /// docs/security.md "Audit log".
    #[arg(long, value_name = "FILE")]
    pub audit: Option<PathBuf>,
    /// Ask instead of refusing: a connect, send or DNS query towards a destination the
    /// --net-allow list does not hold waits while lockbox asks on its terminal (/dev/tty):
    /// [o]nce (this call), [a]lways (this destination, for the rest of the sandbox's life)
    /// or [N]o. No answer within --net-ask-timeout denies; the answer is echoed with the
    /// destination it decided. Needs --net-allow and a terminal (exit 2 without one). The
    /// sandbox cannot forge a question: the command runs in a session of its own, on a
    /// pseudo-terminal lockbox relays where lockbox's stdio is the terminal (raw mode, as
    /// `ssh -t`: Ctrl-C reaches the command, Ctrl-Z does not suspend), and its output and
    /// the keystrokes are held while a question is open; what the sandbox chose (command
    /// line, name) is shown escaped. See docs/security.md "Approvals".
    #[arg(long)]
    pub net_ask: bool,
    /// How long a --net-ask question waits for its answer before the call is denied
    /// (e.g. 10s, 2m) [default: 30s].
    #[arg(long, value_name = "DURATION", value_parser = parse_dur, requires = "net_ask")]
    pub net_ask_timeout: Option<Duration>,
    /// A secret the sandbox may use but never read: NAME=env:VAR (a variable of lockbox's
    /// own environment) or NAME=file:PATH, read once when lockbox starts and kept in its
    /// memory. An --http-auth rule says which host's requests it goes on;
    /// NAME@HOST[,HOST...]=SOURCE also binds it to those hosts (a rule for another is
    /// refused). Repeatable.
    #[arg(long, value_name = "NAME[@HOSTS]=SOURCE", value_parser = parse_rule::<CredentialSpec>)]
    pub credential: Vec<CredentialSpec>,
    /// 'HOST bearer NAME' (Authorization: Bearer <credential NAME>) or 'HOST header
    /// HEADER-NAME NAME': lockbox terminates the sandbox's TLS connections to HOST with a
    /// CA of its own (made for this sandbox, trusted by the sandbox's view of the system
    /// trust store and by SSL_CERT_FILE, REQUESTS_CA_BUNDLE, CURL_CA_BUNDLE,
    /// NODE_EXTRA_CA_CERTS), sets the header on every request (whatever the sandbox put
    /// there: a placeholder, or nothing), and sends it on over TLS to the real HOST,
    /// verifying its certificate. HOST must be allowed by name with --net-allow. HTTP/1.1 or
    /// HTTP/2 from the sandbox; an HTTP/1.1 upgrade (WebSocket) is checked, then its bytes
    /// pass unread. Repeatable. See docs/security.md "Credentials".
    #[arg(long = "http-auth", value_name = "RULE", value_parser = parse_rule::<AuthRule>)]
    pub http_auth: Vec<AuthRule>,
    /// 'METHOD HOST/PATH-PREFIX' (METHOD may be *): on HOST (intercepted as --http-auth
    /// does, credential or not) only requests a rule lists go through; others get 403 from
    /// lockbox and never reach the server. A prefix matches whole path segments
    /// (/v1/models: /v1/models and /v1/models/x, not /v1/modelsx), read one way: paths a
    /// server could read otherwise ('.' or '..' segments, ';', '\', NUL, non-ASCII, '%'
    /// escapes of '.', '/', '\', '%' or of non-ASCII, '%u') are refused. Repeatable.
    #[arg(long = "http-allow", value_name = "RULE", value_parser = parse_rule::<AllowRule>)]
    pub http_allow: Vec<AllowRule>,
    /// Also trust the CA certificates of FILE (PEM) for the real servers of --http-auth and
    /// --http-allow hosts, besides the host's trust store (a private CA, a test server).
    #[arg(long = "upstream-ca", value_name = "FILE")]
    pub upstream_ca: Option<PathBuf>,
    #[command(flatten)]
    pub image: RunImageArgs,
    /// Start this user's pre-arm helper if none runs (in the background; this run starts
    /// directly): it keeps sandboxes set up ahead for the policies in recent use, and later
    /// runs of those policies start in one (`"pre_armed": true` in the report). Same as
    /// LOCKBOX_PRE_ARM=1. Runs with a terminal on their stdio, --workdir, --image, a network
    /// list or a credential always start directly. See `lockbox pre-arm --help`,
    /// docs/pre-arm.md.
    #[arg(long, conflicts_with = "no_pre_arm")]
    pub pre_arm: bool,
    /// Start directly even when a pre-arm helper runs (same as LOCKBOX_PRE_ARM=0).
    #[arg(long)]
    pub no_pre_arm: bool,
    /// The command and its arguments (after `--`). With --image it may be left out: the
    /// image's Entrypoint and Cmd run.
    #[arg(last = true, value_name = "CMD")]
    pub command: Vec<OsString>,
}

/// How `lockbox run` and `lockbox txn` get an --image (a profile's `image` too).
#[derive(Debug, Clone, Default, Args)]
pub struct RunImageArgs {
    /// When to pull the image: missing (only when the store lacks it), always (a tag may
    /// have moved), never (an image not in the store is an error).
    #[arg(long, value_name = "WHEN", default_value = "missing", value_parser = parse_pull)]
    pub pull: lockbox_image::PullPolicy,
    /// The platform to pull from a multi-platform image: os/arch[/variant] [default: the
    /// host's].
    #[arg(long, value_name = "OS/ARCH[/VARIANT]")]
    pub platform: Option<String>,
    /// A registry that may be pulled from over plain http (loopback ones always may).
    /// Repeatable.
    #[arg(long = "insecure-registry", value_name = "HOST[:PORT]")]
    pub insecure_registry: Vec<String>,
    /// Also trust the CA certificates of FILE (PEM) for registries spoken to over https,
    /// besides the system's roots and certs.d (as `lockbox image pull --ca-cert`).
    /// Repeatable.
    #[arg(long = "ca-cert", value_name = "FILE")]
    pub ca_cert: Vec<PathBuf>,
}

fn parse_pull(s: &str) -> Result<lockbox_image::PullPolicy, String> {
    s.parse()
}

#[derive(Debug, Args)]
pub struct CheckArgs {
    /// Print the result as JSON.
    #[arg(long)]
    pub json: bool,
    /// Also print the setup plan (mounts, Landlock rules) for the given policy flags.
    #[arg(long)]
    pub explain: bool,
    #[command(flatten)]
    pub policy: PolicyArgs,
    #[command(flatten)]
    pub state: StateArgs,
}

#[derive(Debug, Clone, Copy, ValueEnum)]
pub enum NetArg {
    /// Own network namespace with loopback only (default).
    None,
    /// The host's network.
    Host,
}

/// Flags that make up a policy (shared by `run` and `check --explain`).
#[derive(Debug, Default, Args)]
pub struct PolicyArgs {
    /// Load a policy from a TOML profile; flags given here override or add to it.
    #[arg(long, value_name = "FILE")]
    pub profile: Option<PathBuf>,
    /// Run on the userland of OCI image REF instead of the host's: its layers (pulled into
    /// the state directory's store, see `lockbox image`) are the read-only lowers of the
    /// sandbox's root, writes to it vanish with the sandbox, and its Env, WorkingDir, User
    /// and (without a command) Entrypoint and Cmd apply. Grants and --workdir are mounted
    /// into it at their own paths. REF: busybox, docker.io/library/debian:12,
    /// HOST:PORT/REPO:TAG, oci:DIR[:TAG], oci-archive:FILE, docker-archive:FILE. See
    /// docs/images.md.
    #[arg(long, value_name = "REF")]
    pub image: Option<String>,
    /// Make PATH readable (read-only, same path inside). Repeatable.
    #[arg(short = 'r', long = "read", value_name = "PATH")]
    pub read: Vec<PathBuf>,
    /// Make PATH writable (read-write, same path inside; writes reach the host). Repeatable.
    #[arg(short = 'w', long = "write", value_name = "PATH")]
    pub write: Vec<PathBuf>,
    /// Do not grant the default read set (/usr, /bin, /sbin, /lib, /lib64, /etc).
    #[arg(long)]
    pub no_default_reads: bool,
    /// Network access: `none` (own namespace, loopback only; the default) or `host` (the
    /// host's network, unfiltered).
    #[arg(long, value_enum, value_name = "MODE", conflicts_with_all = ["net_allow", "net_deny"])]
    pub net: Option<NetArg>,
    /// Let the sandbox reach SPEC on the host's network; everything else stays refused
    /// (loopback inside always works). SPEC: [tcp://|udp://]HOST:PORT, HOST a name
    /// (example.org), every subdomain of one (*.example.org, not the apex), an IPv4 address
    /// or CIDR block, or [IPv6] / [IPv6/prefix]; PORT a number, A-B or *. No scheme = TCP
    /// and UDP. Names are case-insensitive and may be internationalised. The sandbox's
    /// resolver is lockbox: listed names are resolved on the host when asked, every other
    /// name gets NXDOMAIN, and an address is reachable once an answer for a listed name gave
    /// it (never the host's loopback or link-local addresses unless listed as addresses).
    /// Repeatable. Refused attempts fail with EACCES and are counted in --report.
    #[arg(long = "net-allow", value_name = "SPEC", value_parser = parse_net_spec, conflicts_with = "net_deny")]
    pub net_allow: Vec<NetSpec>,
    /// Let the sandbox reach the host's network except SPEC (same form as --net-allow, but
    /// names are resolved once at start and pinned, so no *. wildcards; the host's loopback
    /// is never reachable this way). Repeatable.
    #[arg(long = "net-deny", value_name = "SPEC", value_parser = parse_net_spec)]
    pub net_deny: Vec<NetSpec>,
    /// Memory limit (e.g. 256M, 1G): whole sandbox via cgroup when possible (killed with
    /// exit 137 when exceeded), else address space per process (allocations fail).
    #[arg(long, value_name = "SIZE", value_parser = parse_size)]
    pub max_memory: Option<ByteSize>,
    /// Maximum number of processes and threads in the sandbox.
    #[arg(long, value_name = "N")]
    pub max_processes: Option<u64>,
    /// CPU time per process (e.g. 10s): SIGXCPU, then SIGKILL a second later.
    #[arg(long, value_name = "SECS", value_parser = parse_dur)]
    pub max_cpu_time: Option<Duration>,
    /// Maximum open file descriptors per process.
    #[arg(long, value_name = "N")]
    pub max_open_files: Option<u64>,
    /// Largest file a process may write (e.g. 100M); beyond it writes fail (SIGXFSZ).
    #[arg(long, value_name = "SIZE", value_parser = parse_size)]
    pub max_file_size: Option<ByteSize>,
    /// Most inodes (files, directories, symlinks, hard links) in each tmpfs the sandbox
    /// can write: /tmp, /dev/shm and a --max-disk branch (which also holds at most one per
    /// 4K of --max-disk) [default: 262144, or one per 1K of --max-memory if fewer].
    #[arg(long, value_name = "N")]
    pub max_inodes: Option<u64>,
    /// Wall-clock limit (e.g. 500ms, 10s, 2m): then SIGTERM to every process in the
    /// sandbox, SIGKILL after --kill-grace, exit code 124.
    #[arg(long, value_name = "DURATION", value_parser = parse_dur)]
    pub timeout: Option<Duration>,
    /// Time between SIGTERM and SIGKILL when the sandbox is stopped [default: 2s].
    #[arg(long, value_name = "DURATION", value_parser = parse_dur)]
    pub kill_grace: Option<Duration>,
    /// Set an environment variable (NAME=VALUE). Repeatable.
    #[arg(long = "env", value_name = "NAME=VALUE", value_parser = parse_env)]
    pub env: Vec<(String, String)>,
    /// Pass the caller's variable NAME through. Repeatable.
    #[arg(long = "env-pass", value_name = "NAME")]
    pub env_pass: Vec<String>,
    /// Start from an empty environment instead of PATH, LANG, LC_ALL, TERM and HOME=/tmp.
    #[arg(long)]
    pub clean_env: bool,
    /// Working directory inside [default: the current directory if visible inside, else /].
    #[arg(long, value_name = "DIR")]
    pub cwd: Option<PathBuf>,
    /// Hostname inside [default: lockbox].
    #[arg(long, value_name = "NAME")]
    pub hostname: Option<String>,
    /// Hand the caller's file descriptor N to the command (same number). Repeatable. The
    /// command gets whatever the descriptor reaches: a host socket keeps the host's network
    /// (under --net-allow/--net-deny its connects and sends are still checked against the
    /// list; under --net none nothing checks them). See docs/security.md.
    #[arg(long = "pass-fd", value_name = "N")]
    pub pass_fd: Vec<i32>,
}

fn parse_size(s: &str) -> Result<ByteSize, String> {
    s.parse()
        .map_err(|e: lockbox_policy::PolicyError| e.to_string())
}

/// A `--max-disk` size: 0 would be no bound at all to the kernel's tmpfs.
fn parse_disk_size(s: &str) -> Result<ByteSize, String> {
    match parse_size(s)? {
        ByteSize(0) => Err("must be greater than zero".into()),
        size => Ok(size),
    }
}

pub(crate) fn parse_dur(s: &str) -> Result<Duration, String> {
    parse_duration(s).map_err(|e| e.to_string())
}

pub(crate) fn parse_net_spec(s: &str) -> Result<NetSpec, String> {
    NetSpec::parse(s).map_err(|e| e.to_string())
}

pub(crate) fn parse_rule<T: std::str::FromStr<Err = lockbox_intercept::Error>>(
    s: &str,
) -> Result<T, String> {
    s.parse()
        .map_err(|e: lockbox_intercept::Error| e.to_string())
}

fn parse_env(s: &str) -> Result<(String, String), String> {
    EnvPolicy::parse_assignment(s).map_err(|e| e.to_string())
}

impl PolicyArgs {
    /// The one conversion from flags (and profile) to a policy. Relative paths are taken
    /// from the current directory.
    pub fn to_policy(&self) -> anyhow::Result<Policy> {
        self.to_policy_over(None)
    }

    /// Like [`PolicyArgs::to_policy`], starting from `base` instead of the default policy
    /// unless a profile is given (a transaction stage's own options over the shared ones).
    pub fn to_policy_over(&self, base: Option<&Policy>) -> anyhow::Result<Policy> {
        let mut policy = match &self.profile {
            Some(path) => {
                let text = std::fs::read_to_string(path)
                    .with_context(|| format!("reading profile {}", path.display()))?;
                Policy::from_toml(&text)
                    .with_context(|| format!("in profile {}", path.display()))?
            }
            None => base.cloned().unwrap_or_default(),
        };
        let cwd = std::env::current_dir().context("reading the current directory")?;
        let abs = |p: &Path| {
            if p.is_absolute() {
                p.to_owned()
            } else {
                cwd.join(p)
            }
        };
        if let Some(image) = &self.image {
            policy.image = Some(image.clone());
        }
        policy.fs.read.extend(self.read.iter().map(|p| abs(p)));
        policy.fs.write.extend(self.write.iter().map(|p| abs(p)));
        if self.no_default_reads {
            policy.fs.default_reads = false;
        }
        if let Some(net) = self.net {
            policy.net = match net {
                NetArg::None => Net::None,
                NetArg::Host => Net::Host,
            };
        }
        if !self.net_allow.is_empty() {
            let mut specs = match std::mem::take(&mut policy.net) {
                Net::Allow(specs) => specs,
                _ => Vec::new(),
            };
            specs.extend(self.net_allow.iter().cloned());
            policy.net = Net::Allow(specs);
        }
        if !self.net_deny.is_empty() {
            let mut specs = match std::mem::take(&mut policy.net) {
                Net::Deny(specs) => specs,
                _ => Vec::new(),
            };
            specs.extend(self.net_deny.iter().cloned());
            policy.net = Net::Deny(specs);
        }
        let limits = &mut policy.limits;
        limits.memory = self.max_memory.or(limits.memory);
        limits.processes = self.max_processes.or(limits.processes);
        limits.cpu_time = self.max_cpu_time.or(limits.cpu_time);
        limits.open_files = self.max_open_files.or(limits.open_files);
        limits.file_size = self.max_file_size.or(limits.file_size);
        limits.inodes = self.max_inodes.or(limits.inodes);
        policy.timeout = self.timeout.or(policy.timeout);
        if let Some(grace) = self.kill_grace {
            policy.kill_grace = grace;
        }
        policy.env.set.extend(self.env.iter().cloned());
        policy.env.pass.extend(self.env_pass.iter().cloned());
        policy.env.clean |= self.clean_env;
        if let Some(dir) = &self.cwd {
            policy.cwd = Some(abs(dir));
        }
        if let Some(name) = &self.hostname {
            policy.hostname = name.clone();
        }
        policy.pass_fds.extend(&self.pass_fd);
        policy.validate()?;
        Ok(policy)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn args(line: &[&str]) -> Vec<OsString> {
        std::iter::once("lockbox")
            .chain(line.iter().copied())
            .map(OsString::from)
            .collect()
    }

    #[test]
    fn run_only_parser_agrees_with_the_full_one() {
        let lines: &[&[&str]] = &[
            // Taken without clap: everything after `--` is the command's, flags included.
            &["run", "--", "true"],
            &["run", "--"],
            &["run", "--", "--json", "-r", "/x", "--help", "--"],
            &["run", "--", "sh", "-c", "exit 3"],
            &[
                "run",
                "-r",
                "/opt",
                "-w",
                "/tmp/x",
                "--timeout",
                "3s",
                "--",
                "sh",
                "-c",
                "x",
            ],
            &[
                "run",
                "--workdir",
                ".",
                "--on-exit",
                "keep",
                "--max-disk",
                "1G",
                "--",
                "make",
            ],
            &[
                "run",
                "--net-allow",
                "example.org:443",
                "--json",
                "--",
                "curl",
                "--",
                "-x",
            ],
            &[
                "run",
                "--env",
                "A=1",
                "--max-memory",
                "64M",
                "--report",
                "-",
                "--",
                "true",
            ],
        ];
        for line in lines {
            let fast = parse_run_only(&args(line)).expect("parsed by the fast path");
            let Command::Run(full) = Cli::try_parse_from(args(line)).unwrap().command else {
                panic!("not run: {line:?}");
            };
            assert_eq!(format!("{fast:?}"), format!("{full:?}"), "{line:?}");
        }
    }

    #[test]
    fn run_only_parser_leaves_help_errors_and_other_commands_to_the_full_one() {
        for line in [
            &["run", "--help"][..],
            &["run", "--no-such-flag", "--", "true"],
            &["run", "true"],
            &["check"],
            &["--version"],
        ] {
            assert!(parse_run_only(&args(line)).is_none(), "{line:?}");
        }
    }
}
