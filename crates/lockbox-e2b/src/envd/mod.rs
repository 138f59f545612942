//! envd, E2B's in-sandbox daemon (`spec/envd/` of e2b-dev/E2B), answered by lockbox
//! outside the sandbox: Connect RPC `process.Process` ([`process`]) and
//! `filesystem.Filesystem` ([`filesystem`]) over [`connect`]'s framing, and REST `/files`,
//! `/health`, `/envs`, `/metrics`. Each request carries its [`crate::Target`] as an
//! extension. Every path and process lives inside the sandbox: the runtime resolves them
//! there, never on the host.
//!
//! **Users.** E2B names a user per call (`Authorization: Basic base64("NAME:")`; none = the
//! default user `user`). A lockbox sandbox runs everything as one uid, so `root` and `user`
//! differ only in their home: `/root` and `/home/user`, when the sandbox has that
//! directory, else `/tmp` (lockbox's default `HOME`), else `/`. The home is a process's
//! default cwd (and its `HOME` when it is the user's own), and what relative paths are
//! resolved against. Other names are refused (`invalid_argument`).

pub mod connect;
pub mod filesystem;
pub mod process;
pub mod proto;
pub mod rest;

use crate::{E2b, Target};
use axum::extract::Request;
use axum::Router;
use connect::{Code, ConnectError};
use lockbox_runtime::{RuntimeError, Sandbox};
use std::collections::HashMap;
use std::sync::{Arc, Mutex};

/// envd's routes.
pub fn router(e2b: E2b) -> Router {
    let envd = Envd {
        e2b: e2b.clone(),
        state: Arc::new(State::default()),
    };
    Router::new()
        .merge(process::routes())
        .merge(filesystem::routes())
        .with_state(envd)
        .merge(rest::router(e2b))
}

/// What envd's handlers share: E2B, and what envd remembers beside the runtime.
#[derive(Debug, Clone)]
pub struct Envd {
    e2b: E2b,
    state: Arc<State>,
}

/// What envd remembers per sandbox that the runtime does not: each process's E2B config
/// and tag, each user's home, the polled watchers.
#[derive(Debug, Default)]
struct State {
    /// lockbox sandbox id -> lockbox process id -> what E2B started it with.
    processes: Mutex<HashMap<String, HashMap<String, process::Started>>>,
    /// (lockbox sandbox id, user) -> home.
    homes: Mutex<HashMap<(String, User), String>>,
    /// Watcher id -> its events so far.
    watchers: Mutex<HashMap<String, filesystem::Watcher>>,
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    // A panic while holding the lock leaves plain data behind: keep using it.
    m.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// E2B's users (see the module docs).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum User {
    /// `root`.
    Root,
    /// `user`, E2B's default.
    User,
}

impl User {
    /// The user's name.
    pub fn name(self) -> &'static str {
        match self {
            User::Root => "root",
            User::User => "user",
        }
    }

    /// The user called `name` (`""`: the default user).
    pub fn named(name: &str) -> Option<User> {
        match name {
            "root" => Some(User::Root),
            "user" | "" => Some(User::User),
            _ => None,
        }
    }

    /// The user's own home (used when the sandbox has it).
    pub fn home(self) -> &'static str {
        match self {
            User::Root => "/root",
            User::User => "/home/user",
        }
    }
}

/// One call's sandbox and user.
#[derive(Debug)]
pub struct Ctx {
    /// The lockbox sandbox serving it (its id is the E2B id, or after a resume another).
    pub sandbox: Sandbox,
    /// Who the call runs as.
    pub user: User,
    /// The user's home inside the sandbox (`/` when it has none).
    pub home: String,
    /// The E2B sandbox's id.
    pub id: String,
}

impl Ctx {
    /// `path` inside the sandbox (see [`resolve`]).
    pub fn resolve(&self, path: &str) -> String {
        resolve(&self.home, path)
    }
}

/// Where E2B keeps a file's metadata: its extended attributes in this namespace, one per
/// key (`user.e2b.author`), whoever set them (an upload's `X-Metadata-*` headers, or code in
/// the sandbox).
pub const METADATA_XATTRS: &str = "user.e2b.";

/// A file's E2B metadata: its [`METADATA_XATTRS`] attributes, by key.
pub fn metadata(xattrs: &std::collections::BTreeMap<String, String>) -> HashMap<String, String> {
    xattrs
        .iter()
        .filter_map(|(name, value)| {
            let key = name.strip_prefix(METADATA_XATTRS)?;
            (!key.is_empty()).then(|| (key.to_owned(), value.clone()))
        })
        .collect()
}

/// `path` inside the sandbox as envd reads it, in its RPCs and its REST `/files` alike:
/// as given when absolute, else below the user's `home`; `~` and `~/...` name the home,
/// and so do `` and `.` (`./` is dropped).
pub fn resolve(home: &str, path: &str) -> String {
    let below = if path == "~" {
        ""
    } else if let Some(rest) = path.strip_prefix("~/") {
        rest.trim_start_matches('/')
    } else if path.starts_with('/') {
        return path.to_owned();
    } else {
        path
    };
    let below = below.trim_start_matches("./");
    if below.is_empty() || below == "." {
        home.to_owned()
    } else if home.ends_with('/') {
        format!("{home}{below}")
    } else {
        format!("{home}/{below}")
    }
}

/// What a handler needs from the request before its body is read.
#[derive(Debug, Clone)]
pub struct Head {
    target: Option<Target>,
    headers: http::HeaderMap,
}

impl Head {
    /// The request's routing target and headers.
    pub fn of(req: &Request) -> Head {
        Head {
            target: req.extensions().get::<Target>().cloned(),
            headers: req.headers().clone(),
        }
    }
}

impl Envd {
    /// The call's sandbox (access token checked) and user.
    pub async fn ctx(&self, head: &Head) -> Result<Ctx, ConnectError> {
        let Some(target) = &head.target else {
            return Err(ConnectError::new(
                Code::InvalidArgument,
                "no sandbox named: send E2b-Sandbox-Id and E2b-Sandbox-Port",
            ));
        };
        let id = target.sandbox.clone();
        let known = self.e2b.registry.get(&id);
        if let Some(token) = known.as_ref().and_then(|s| s.access_token.as_deref()) {
            use subtle::ConstantTimeEq;
            let sent = head
                .headers
                .get("x-access-token")
                .map(|v| v.as_bytes())
                .unwrap_or_default();
            if !bool::from(token.as_bytes().ct_eq(sent)) {
                return Err(ConnectError::new(
                    Code::Unauthenticated,
                    "missing or wrong X-Access-Token for this sandbox",
                ));
            }
        }
        // The admission set the lockbox sandbox serving it (another id after a resume).
        let sandbox = self
            .e2b
            .runtime
            .sandbox(&target.instance)
            .map_err(|e| rt_error(&id, e))?;
        let user = user_of(&head.headers)?;
        let home = self.home(&sandbox, user).await;
        Ok(Ctx {
            sandbox,
            user,
            home,
            id,
        })
    }

    async fn home(&self, sandbox: &Sandbox, user: User) -> String {
        let key = (sandbox.id().to_owned(), user);
        if let Some(home) = lock(&self.state.homes).get(&key) {
            return home.clone();
        }
        let home = home_of(sandbox, user).await;
        lock(&self.state.homes).insert(key, home.clone());
        home
    }

    /// Environment variables the sandbox was created with (E2B's `envVars`).
    pub fn sandbox_env(&self, id: &str) -> HashMap<String, String> {
        self.e2b.registry.get(id).map(|s| s.env).unwrap_or_default()
    }
}

/// `user`'s home in `sandbox`: their own when the sandbox has it (`/home/user` is a host
/// template's workdir), else lockbox's default HOME (`/tmp`, writable in every sandbox),
/// else `/`.
pub async fn home_of(sandbox: &Sandbox, user: User) -> String {
    for candidate in [user.home(), crate::HOME] {
        if let Ok(st) = sandbox.stat(candidate).await {
            if st.kind == lockbox_runtime::FileKind::Dir {
                return candidate.to_owned();
            }
        }
    }
    "/".to_owned()
}

/// The call's user, from `Authorization: Basic base64("NAME:")`.
fn user_of(headers: &http::HeaderMap) -> Result<User, ConnectError> {
    use base64::Engine;
    let Some(auth) = headers.get(http::header::AUTHORIZATION) else {
        return Ok(User::User);
    };
    let bad = || {
        ConnectError::new(
            Code::InvalidArgument,
            "Authorization: expected Basic base64(\"root:\") or base64(\"user:\")",
        )
    };
    let text = auth.to_str().map_err(|_| bad())?;
    let Some(encoded) = text.strip_prefix("Basic ") else {
        return Err(bad());
    };
    let decoded = base64::engine::general_purpose::STANDARD
        .decode(encoded.trim())
        .map_err(|_| bad())?;
    let decoded = String::from_utf8(decoded).map_err(|_| bad())?;
    let name = decoded.split(':').next().unwrap_or("");
    User::named(name).ok_or_else(|| ConnectError::new(Code::InvalidArgument, no_such_user(name)))
}

/// The error for a user name other than `root` and `user`.
pub fn no_such_user(name: &str) -> String {
    format!("user {name:?} does not exist: lockbox sandboxes have users root and user")
}

/// A runtime error as the Connect code the SDK turns into the matching exception.
pub fn rt_error(sandbox: &str, e: RuntimeError) -> ConnectError {
    let code = match &e {
        RuntimeError::SandboxNotFound { .. } | RuntimeError::SandboxNotRunning { .. } => {
            return ConnectError::new(
                Code::Unavailable,
                format!("The sandbox {sandbox} was not found ({e})"),
            )
        }
        RuntimeError::ProcessNotFound { .. } | RuntimeError::ProcessNotRunning { .. } => {
            Code::NotFound
        }
        RuntimeError::FileNotFound { .. } => Code::NotFound,
        RuntimeError::AlreadyExists { .. } => Code::AlreadyExists,
        RuntimeError::NotADirectory { .. }
        | RuntimeError::IsADirectory { .. }
        | RuntimeError::InvalidRequest { .. } => Code::InvalidArgument,
        RuntimeError::PathOutsideSandbox { .. }
        | RuntimeError::ReadOnly { .. }
        | RuntimeError::PermissionDenied { .. } => Code::PermissionDenied,
        RuntimeError::NotSupported { .. } => Code::FailedPrecondition,
        RuntimeError::LimitReached { .. } => Code::ResourceExhausted,
        _ => Code::Internal,
    };
    ConnectError::new(code, e.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn basic(value: &str) -> http::HeaderMap {
        use base64::Engine;
        let mut h = http::HeaderMap::new();
        let v = format!(
            "Basic {}",
            base64::engine::general_purpose::STANDARD.encode(value)
        );
        h.insert(http::header::AUTHORIZATION, v.parse().unwrap());
        h
    }

    #[test]
    fn the_basic_auth_username_picks_root_or_user() {
        assert_eq!(user_of(&basic("root:")).unwrap(), User::Root);
        assert_eq!(user_of(&basic("user:")).unwrap(), User::User);
        assert_eq!(user_of(&http::HeaderMap::new()).unwrap(), User::User);
        let e = user_of(&basic("mallory:")).unwrap_err();
        assert_eq!(e.code, Code::InvalidArgument);
        assert!(e.message.contains("mallory"));
    }
}
