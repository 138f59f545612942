//! A sandbox of an image: the image found (or pulled) by the pull policy, held while the
//! sandbox runs, and its config applied to the sandbox's policy and command — the one place
//! every front end (`lockbox run --image`, the runtime, transactions) takes an image from.
//!
//! What the config gives, and what wins (docs/images.md, "Running an image"):
//! - `Env`: each variable, unless the policy sets or passes that name itself; `PATH` is the
//!   image's (or Docker's default when the image has none), never the host's; `HOME` the
//!   user's home from the image's `/etc/passwd` (else `/root`) unless set.
//! - `WorkingDir`: the command's directory unless the policy (or a `--workdir`) chose one;
//!   `/` when the image has none, as in Docker.
//! - `User`: presented as the sandbox's ids ([`ImageRoot::ids`]); a name is looked up in the
//!   image's `/etc/passwd` and `/etc/group`.
//! - `Entrypoint` + `Cmd`: the command when none is given. A given command runs as it is
//!   (the entrypoint is not put in front of it: an agent's command must mean what it says).

use crate::{Image, ImageError, PullOptions, Store};
use lockbox_confine::ImageRoot;
use lockbox_policy::Policy;
use std::ffi::OsString;
use std::path::{Path, PathBuf};

/// Docker's `PATH` for an image whose config sets none.
pub const DEFAULT_PATH: &str = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin";

/// When to pull an image (`--pull`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum PullPolicy {
    /// Pull only when the store does not have it (the default).
    #[default]
    Missing,
    /// Pull every time (a tag may have moved).
    Always,
    /// Never pull: an image not in the store is an error.
    Never,
}

impl std::str::FromStr for PullPolicy {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "missing" => Ok(PullPolicy::Missing),
            "always" => Ok(PullPolicy::Always),
            "never" => Ok(PullPolicy::Never),
            other => Err(format!(
                "--pull {other:?}: expected missing, always or never"
            )),
        }
    }
}

impl Store {
    /// The image `reference`, from the store or pulled, as `pull` says.
    pub async fn find_or_pull(
        &self,
        reference: &str,
        pull: PullPolicy,
        opts: &PullOptions,
    ) -> Result<Image, ImageError> {
        if pull != PullPolicy::Always {
            if let Some(image) = self.get(reference)? {
                return Ok(image);
            }
            if pull == PullPolicy::Never {
                return Err(ImageError::NotFound(reference.to_owned()));
            }
        }
        self.pull(reference, opts).await
    }
}

/// An image this process runs sandboxes on (`lockbox run --image`, a transaction's stages,
/// the Python SDK's): found or pulled as the pull policy says, and held by this process
/// ([`process_holder`]) until dropped, so that no `image rm` or prune takes it meanwhile (a
/// hold a killed process leaves ends by itself).
#[derive(Debug)]
pub struct ProcessImage {
    store: Store,
    holder: String,
    /// The image.
    pub image: Image,
    /// The least recently used images the store's bound removed after a pull (ids).
    pub pruned: Vec<String>,
}

impl ProcessImage {
    /// The image `reference` of `store`, pulled if `pull` says so; after a pull the store is
    /// shrunk to `max_store` bytes (0: no bound), keeping this image. Blocking: a pull runs
    /// on an async runtime of its own, so never call this from inside one.
    pub fn take(
        store: Store,
        reference: &str,
        pull: PullPolicy,
        opts: &PullOptions,
        max_store: u64,
    ) -> Result<ProcessImage, ImageError> {
        let holder = process_holder();
        let mut pruned = Vec::new();
        let image = if pull == PullPolicy::Never {
            // Nothing to pull: no async runtime to start, one lookup.
            store.hold(reference, &holder)?
        } else {
            let rt = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .map_err(|source| ImageError::Io {
                    step: "starting the async runtime of a pull",
                    path: store.path().to_owned(),
                    source,
                })?;
            let image = rt.block_on(store.find_or_pull(reference, pull, opts))?;
            if max_store > 0 {
                pruned = store.shrink_to(max_store, &[&image.id])?.images_removed;
            }
            store.hold(&image.id, &holder)?
        };
        Ok(ProcessImage {
            store,
            holder,
            image,
            pruned,
        })
    }
}

impl Drop for ProcessImage {
    fn drop(&mut self) {
        // A hold left behind (the process killed) ends by itself: it names this process.
        let _ = self.store.release(&self.image.id, &self.holder);
    }
}

/// The holder name of the running process (`pid-PID-STARTTIME`): a hold that
/// [`Store::holders`](crate::Store) drops by itself once this process is gone, so a killed
/// `lockbox run` does not keep its image from `rm` for good.
pub fn process_holder() -> String {
    let pid = std::process::id();
    match lockbox_cow::SandboxInit::of(pid) {
        Ok(me) => format!("pid-{}-{}", me.pid, me.start_time),
        Err(_) => format!("pid-{pid}-0"),
    }
}

/// The process a [`process_holder`] name names.
fn process_of(holder: &str) -> Option<lockbox_cow::SandboxInit> {
    let mut parts = holder.strip_prefix("pid-")?.split('-');
    let (Some(pid), Some(start), None) = (parts.next(), parts.next(), parts.next()) else {
        return None;
    };
    Some(lockbox_cow::SandboxInit {
        pid: pid.parse().ok()?,
        start_time: start.parse().ok()?,
    })
}

/// Whether `holder` is a [`process_holder`] name.
pub(crate) fn is_process_holder(holder: &str) -> bool {
    process_of(holder).is_some()
}

/// Whether `holder` names a process ([`process_holder`]) that is gone.
pub(crate) fn is_stale_holder(holder: &str) -> bool {
    process_of(holder).is_some_and(|p| p.is_gone())
}

/// The image's root and command for a sandbox of `policy`, whose policy gets the image's
/// environment, working directory and user (see the module's doc). `command` empty: the
/// image's `Entrypoint` and `Cmd`.
pub fn apply(
    image: &Image,
    policy: &mut Policy,
    command: &[OsString],
) -> Result<(ImageRoot, Vec<OsString>), ImageError> {
    let users = Users::of(&image.layers);
    let ids = match image.config.user.as_deref().filter(|u| !u.is_empty()) {
        None => (0, 0),
        Some(user) => users.ids(user).ok_or_else(|| ImageError::BadConfig {
            image: image.id.clone(),
            reason: format!("its User {user:?} is not in the image's /etc/passwd (or /etc/group)"),
        })?,
    };
    let env = &mut policy.env;
    let ours = |name: &str, env: &lockbox_policy::EnvPolicy| {
        env.set.contains_key(name) || env.pass.iter().any(|p| p == name)
    };
    for entry in &image.config.env {
        let (name, value) = entry.split_once('=').unwrap_or((entry.as_str(), ""));
        if !name.is_empty() && !ours(name, env) {
            env.set.insert(name.to_owned(), value.to_owned());
        }
    }
    if !ours("PATH", env) {
        env.set.insert("PATH".into(), DEFAULT_PATH.into());
    }
    if !ours("HOME", env) {
        let home = users.home(ids.0).unwrap_or_else(|| "/root".into());
        env.set.insert("HOME".into(), home);
    }
    if policy.cwd.is_none() {
        let dir = image
            .config
            .working_dir
            .as_deref()
            .filter(|d| !d.is_empty());
        policy.cwd = Some(PathBuf::from(dir.unwrap_or("/")));
    }
    let argv: Vec<OsString> = if command.is_empty() {
        let config = &image.config;
        let argv: Vec<OsString> = config
            .entrypoint
            .iter()
            .flatten()
            .chain(config.cmd.iter().flatten())
            .map(OsString::from)
            .collect();
        if argv.is_empty() {
            return Err(ImageError::BadConfig {
                image: image.id.clone(),
                reason: "it has no Entrypoint or Cmd: give a command".into(),
            });
        }
        argv
    } else {
        command.to_vec()
    };
    let mut root = ImageRoot::new(image.layers.clone());
    root.ids = ids;
    Ok((root, argv))
}

/// The users and groups of an image (its topmost `/etc/passwd` and `/etc/group`).
#[derive(Debug, Default)]
struct Users {
    /// `name:x:uid:gid:gecos:home:shell` lines, parsed: (name, uid, gid, home).
    passwd: Vec<(String, u32, u32, String)>,
    /// (name, gid).
    groups: Vec<(String, u32)>,
}

impl Users {
    fn of(layers: &[PathBuf]) -> Users {
        let read = |rel: &str| topmost(layers, Path::new(rel)).unwrap_or_default();
        let passwd = read("etc/passwd")
            .lines()
            .filter_map(|l| {
                let f: Vec<&str> = l.split(':').collect();
                Some((
                    (*f.first()?).to_owned(),
                    f.get(2)?.parse().ok()?,
                    f.get(3)?.parse().ok()?,
                    (*f.get(5)?).to_owned(),
                ))
            })
            .collect();
        let groups = read("etc/group")
            .lines()
            .filter_map(|l| {
                let f: Vec<&str> = l.split(':').collect();
                Some(((*f.first()?).to_owned(), f.get(2)?.parse().ok()?))
            })
            .collect();
        Users { passwd, groups }
    }

    /// `user`, `uid`, `user:group` or `uid:gid` as ids (a number need not be listed; its
    /// group is then its passwd entry's, else 0, as in Docker).
    fn ids(&self, spec: &str) -> Option<(u32, u32)> {
        let (user, group) = match spec.split_once(':') {
            Some((u, g)) => (u, Some(g)),
            None => (spec, None),
        };
        let entry = self
            .passwd
            .iter()
            .find(|(name, uid, ..)| name == user || user.parse() == Ok(*uid));
        let uid = match (user.parse::<u32>(), entry) {
            (Ok(uid), _) => uid,
            (Err(_), Some((_, uid, ..))) => *uid,
            (Err(_), None) => return None,
        };
        let gid = match group {
            None => entry.map_or(0, |(_, _, gid, _)| *gid),
            Some(g) => match g.parse::<u32>() {
                Ok(gid) => gid,
                Err(_) => self.groups.iter().find(|(name, _)| name == g)?.1,
            },
        };
        Some((uid, gid))
    }

    fn home(&self, uid: u32) -> Option<String> {
        self.passwd
            .iter()
            .find(|(_, u, ..)| *u == uid)
            .map(|(.., home)| home.clone())
            .filter(|h| !h.is_empty())
    }
}

/// The text of `rel` in the topmost layer that has it (none if a layer above deleted it or
/// it is not a small regular file). Read beneath each layer's root, never through a symlink
/// out of it.
fn topmost(layers: &[PathBuf], rel: &Path) -> Option<String> {
    use std::io::Read;
    use std::os::unix::fs::FileTypeExt;
    for layer in layers {
        let path = layer.join(rel);
        let Ok(meta) = std::fs::symlink_metadata(&path) else {
            continue;
        };
        // An overlayfs whiteout (a 0/0 character device) deletes the name below it.
        if meta.file_type().is_char_device() || !meta.is_file() {
            return None;
        }
        let file = crate::source::open_beneath(layer, rel).ok()?;
        let mut text = String::new();
        file.take(1 << 20).read_to_string(&mut text).ok()?;
        return Some(text);
    }
    None
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    fn users() -> Users {
        Users {
            passwd: vec![
                ("root".into(), 0, 0, "/root".into()),
                ("postgres".into(), 999, 998, "/var/lib/postgresql".into()),
            ],
            groups: vec![("root".into(), 0), ("staff".into(), 50)],
        }
    }

    #[test]
    fn an_images_user_resolves_by_name_number_and_group() {
        let u = users();
        assert_eq!(u.ids("postgres"), Some((999, 998)));
        assert_eq!(u.ids("999"), Some((999, 998)));
        assert_eq!(u.ids("1234"), Some((1234, 0)));
        assert_eq!(u.ids("postgres:staff"), Some((999, 50)));
        assert_eq!(u.ids("1234:77"), Some((1234, 77)));
        assert_eq!(u.ids("nobody-here"), None);
        assert_eq!(u.ids("postgres:nogroup"), None);
        assert_eq!(u.home(999).as_deref(), Some("/var/lib/postgresql"));
    }

    #[test]
    fn a_holder_of_a_process_that_is_gone_is_stale_and_ours_is_not() {
        assert!(!is_stale_holder(&process_holder()));
        // pid 1 exists, but not with start time 1 (it started at boot, time 0 or so ticks
        // later than this fake one, and no process starts at tick 1 after it).
        assert!(is_stale_holder("pid-4194303-1"));
        assert!(!is_stale_holder("sandbox-abc"));
        assert!(!is_stale_holder("pid-x-1"));
    }

    #[test]
    fn pull_policies_parse() {
        assert_eq!("never".parse(), Ok(PullPolicy::Never));
        assert!("sometimes".parse::<PullPolicy>().is_err());
    }
}
