//! Bearer-token authentication: the [`Token`] (given in a file, or generated into the state
//! directory with mode 0600) and the middleware that checks it, or the console's session
//! cookie, on every route but `/healthz` and the console's own, in constant time.

use crate::error::ApiError;
use crate::scope::{Principal, Scope};
use crate::{sessions, AppState};
use axum::extract::{Request, State};
use axum::http::header::{AUTHORIZATION, ORIGIN, UPGRADE, WWW_AUTHENTICATE};
use axum::http::{HeaderMap, HeaderValue, Method};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use lockbox_policy::Ceiling;
use std::fmt;
use std::io::Write;
use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use subtle::ConstantTimeEq;

/// Name of the generated token file in the state directory.
pub const TOKEN_FILE: &str = "server.token";

/// A token shorter than this is refused: it could be guessed.
const MIN_TOKEN_LEN: usize = 16;

/// Why a token could not be loaded or created.
#[derive(Debug, thiserror::Error)]
pub enum TokenError {
    /// The token file could not be read.
    #[error("reading token file {path}: {source}")]
    Read {
        /// The file.
        path: PathBuf,
        /// The cause.
        source: std::io::Error,
    },
    /// The token in the file is too short or has characters a header cannot carry.
    #[error("token file {path}: {reason}")]
    Invalid {
        /// The file.
        path: PathBuf,
        /// What is wrong.
        reason: String,
    },
    /// The generated token could not be written.
    #[error("writing token file {path}: {source}")]
    Write {
        /// The file.
        path: PathBuf,
        /// The cause.
        source: std::io::Error,
    },
    /// The OS random generator failed.
    #[error("generating a token: {0}")]
    Random(String),
}

/// The secret a client must send as `Authorization: Bearer <token>`. Its `Debug` does
/// not show it.
#[derive(Clone)]
pub struct Token(Arc<str>);

impl fmt::Debug for Token {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("Token(..)")
    }
}

impl Token {
    /// Uses `secret` as the token (checked like a token file's content).
    pub fn new(secret: &str) -> Result<Token, String> {
        let secret = secret.trim();
        if secret.len() < MIN_TOKEN_LEN {
            return Err(format!(
                "the token has {} characters; at least {MIN_TOKEN_LEN} are needed",
                secret.len()
            ));
        }
        if !secret.bytes().all(|b| b.is_ascii_graphic()) {
            return Err("the token must be printable ASCII without spaces".into());
        }
        Ok(Token(secret.into()))
    }

    /// 32 bytes from the OS random generator, hex-encoded.
    pub fn generate() -> Result<Token, TokenError> {
        let mut bytes = [0u8; 32];
        getrandom::fill(&mut bytes).map_err(|e| TokenError::Random(e.to_string()))?;
        let hex: String = bytes.iter().map(|b| format!("{b:02x}")).collect();
        Ok(Token(hex.into()))
    }

    /// Reads the token from `path` (surrounding whitespace ignored).
    pub fn from_file(path: &Path) -> Result<Token, TokenError> {
        let text = std::fs::read_to_string(path).map_err(|source| TokenError::Read {
            path: path.to_owned(),
            source,
        })?;
        Token::new(&text).map_err(|reason| TokenError::Invalid {
            path: path.to_owned(),
            reason,
        })
    }

    /// The token of `<state_dir>/server.token`: read when it exists (so clients keep
    /// working across restarts), else generated and written there with mode 0600.
    /// Returns the token and the file's path.
    pub fn load_or_create(state_dir: &Path) -> Result<(Token, PathBuf), TokenError> {
        let path = state_dir.join(TOKEN_FILE);
        if path.exists() {
            return Ok((Token::from_file(&path)?, path));
        }
        let token = Token::generate()?;
        write_private(&path, token.secret().as_bytes()).map_err(|source| TokenError::Write {
            path: path.clone(),
            source,
        })?;
        Ok((token, path))
    }

    /// The secret itself (to print on request, never by default).
    pub fn secret(&self) -> &str {
        &self.0
    }

    /// Whether `candidate` is the token; takes the same time wherever they differ.
    pub fn matches(&self, candidate: &[u8]) -> bool {
        self.0.as_bytes().ct_eq(candidate).into()
    }
}

/// Writes `data` to `path` with mode 0600 atomically (temp file, fsync, rename), so a
/// crash leaves no half-written token and no moment where others can read it.
fn write_private(path: &Path, data: &[u8]) -> std::io::Result<()> {
    let dir = path.parent().unwrap_or(Path::new("."));
    std::fs::create_dir_all(dir)?;
    let tmp = dir.join(format!(".{TOKEN_FILE}.{}.tmp", std::process::id()));
    let result = (|| {
        let mut file = std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o600)
            .open(&tmp)?;
        // The umask cannot widen 0600, but a pre-set ACL default could: be explicit.
        file.set_permissions(std::fs::Permissions::from_mode(0o600))?;
        file.write_all(data)?;
        file.write_all(b"\n")?;
        file.sync_all()?;
        std::fs::rename(&tmp, path)?;
        std::fs::File::open(dir)?.sync_all()
    })();
    if result.is_err() {
        let _ = std::fs::remove_file(&tmp);
    }
    result
}

/// The scoped tokens handed out by `POST /v1/tokens` (in memory: they end with the server).
#[derive(Debug, Default)]
pub(crate) struct ScopedTokens {
    tokens: std::sync::Mutex<Vec<ScopedToken>>,
}

#[derive(Debug)]
struct ScopedToken {
    id: String,
    token: Token,
    scope: Arc<Scope>,
}

impl ScopedTokens {
    fn lock(&self) -> std::sync::MutexGuard<'_, Vec<ScopedToken>> {
        self.tokens
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// A new token bound to `ceiling`: its id and secret.
    pub fn mint(&self, ceiling: Ceiling) -> Result<(String, Token), TokenError> {
        let token = Token::generate()?;
        // The id is public (it revokes, with the operator's token): not derived from the secret.
        let id = format!("tok-{}", &Token::generate()?.secret()[..16]);
        self.lock().push(ScopedToken {
            id: id.clone(),
            token: token.clone(),
            scope: Arc::new(Scope::new(ceiling)),
        });
        Ok((id, token))
    }

    /// The scope of the token `secret`, comparing it with every token in constant time.
    fn find(&self, secret: &[u8]) -> Option<Arc<Scope>> {
        let tokens = self.lock();
        let mut found = None;
        for t in tokens.iter() {
            if t.token.matches(secret) {
                found = Some(Arc::clone(&t.scope));
            }
        }
        found
    }

    /// Forgets token `id`; whether there was one.
    pub fn revoke(&self, id: &str) -> bool {
        let mut tokens = self.lock();
        let before = tokens.len();
        tokens.retain(|t| t.id != id);
        tokens.len() != before
    }
}

/// Middleware: answers 401 `UNAUTHORIZED` unless the request carries the token, a scoped
/// token, or the console's session cookie (`/healthz` and the console's own routes under
/// `/ui` excepted: load balancers need no secret, and the console's files hold no data). A
/// request with the cookie must come from this server's origin, and one that changes state
/// also needs the `X-CSRF-Token` header (see `sessions`). A scoped token reaches only its
/// own sandboxes and snapshots and no operator route ([`agent_allowed`]). The request
/// carries its [`Principal`] to the handlers.
pub async fn require_auth(State(app): State<AppState>, mut req: Request, next: Next) -> Response {
    let path = req.uri().path();
    if path == "/" || path == "/healthz" || path == "/ui" || path.starts_with("/ui/") {
        return next.run(req).await;
    }
    match bearer(req.headers()).map(str::to_owned) {
        Some(secret) if app.token.matches(secret.as_bytes()) => {
            req.extensions_mut().insert(Principal::Operator);
            return next.run(req).await;
        }
        Some(secret) => {
            let Some(scope) = app.tokens.find(secret.as_bytes()) else {
                return unauthorized("the bearer token is wrong");
            };
            if let Err(e) = agent_allowed(req.method(), req.uri().path(), &scope) {
                return e.into_response();
            }
            req.extensions_mut().insert(Principal::Agent(scope));
            return next.run(req).await;
        }
        None => {}
    }
    let Some(id) = sessions::cookie(req.headers(), sessions::SESSION_COOKIE) else {
        return unauthorized(
            "missing `Authorization: Bearer <token>` header (or the console's session cookie)",
        );
    };
    let Some(csrf) = app.sessions.find(id) else {
        return unauthorized("the session has ended or is unknown: log in again");
    };
    match cookie_request_allowed(&req, &csrf) {
        Ok(()) => {
            req.extensions_mut().insert(Principal::Operator);
            next.run(req).await
        }
        Err(e) => e.into_response(),
    }
}

/// What a scoped token may reach: `/mcp`, the API document, creating and listing sandboxes
/// and snapshots, and the routes of the sandboxes and snapshots its scope made (another's
/// is `*_NOT_FOUND`, as if it did not exist). Answering approval questions, moving
/// snapshots between nodes (`.../artifact`, whatever the id: its record carries the spec
/// forks start with, and `Lockbox-Snapshot-Scope` adds to an MCP scope), branches,
/// transactions, the journal and tokens are the operator's (403 `FORBIDDEN`): an agent that
/// could approve its own sandbox's destinations, commit any branch or mint tokens would
/// step over its ceiling.
fn agent_allowed(method: &Method, path: &str, scope: &Scope) -> Result<(), ApiError> {
    let parts: Vec<&str> = path.trim_end_matches('/').split('/').skip(1).collect();
    match parts.as_slice() {
        ["openapi.json"] | ["mcp"] | ["v1", "sandboxes"] | ["v1", "snapshots"] => Ok(()),
        ["v1", "sandboxes", _, "approvals", _] if method == Method::POST => Err(
            sessions::forbidden("approval questions are answered by the operator, not by a scoped token"),
        ),
        ["v1", "snapshots", _, "artifact"] => Err(sessions::forbidden(
            "snapshots move between servers with the operator's token, not a scoped token's",
        )),
        ["v1", "sandboxes", id, ..] => scope.sandbox(id),
        ["v1", "snapshots", id, ..] => scope.snapshot(id),
        _ => Err(sessions::forbidden(format!(
            "{path} is the operator's: a scoped token reaches /mcp, /v1/sandboxes and /v1/snapshots only"
        ))),
    }
}

/// The secret of an `Authorization: Bearer <secret>` header, if the request has one.
pub(crate) fn bearer(headers: &HeaderMap) -> Option<&str> {
    headers
        .get(AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| {
            v.strip_prefix("Bearer ")
                .or_else(|| v.strip_prefix("bearer "))
        })
        .map(str::trim)
}

/// The checks on a request authenticated by the session cookie: from this server's origin
/// (any method: reads too, so another site cannot even load a reply it could not read), the
/// CSRF header for anything but GET/HEAD, an `Origin` header for WebSocket upgrades.
fn cookie_request_allowed(req: &Request, csrf: &str) -> Result<(), ApiError> {
    let headers = req.headers();
    let safe = matches!(*req.method(), Method::GET | Method::HEAD);
    let upgrade = headers.contains_key(UPGRADE);
    sessions::check_same_origin(headers)?;
    if upgrade && !headers.contains_key(ORIGIN) {
        return Err(sessions::forbidden(
            "a WebSocket opened with the session cookie needs this server's Origin",
        ));
    }
    if !safe && !sessions::csrf_matches(headers, csrf) {
        return Err(sessions::forbidden(
            "missing or wrong X-CSRF-Token header (the lockbox_csrf cookie's value)",
        ));
    }
    Ok(())
}

pub(crate) fn unauthorized(message: &str) -> Response {
    let mut response =
        ApiError::new(lockbox_policy::ErrorCode::Unauthorized, message).into_response();
    response
        .headers_mut()
        .insert(WWW_AUTHENTICATE, HeaderValue::from_static("Bearer"));
    response
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn generated_token_is_64_hex_chars_and_written_owner_only() {
        let dir = tempfile::tempdir().unwrap();
        let (token, path) = Token::load_or_create(dir.path()).unwrap();
        assert_eq!(token.secret().len(), 64);
        assert!(token.secret().bytes().all(|b| b.is_ascii_hexdigit()));
        let mode = std::fs::metadata(&path).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode, 0o600);
        let (again, _) = Token::load_or_create(dir.path()).unwrap();
        assert!(
            again.matches(token.secret().as_bytes()),
            "reused on restart"
        );
    }

    #[test]
    fn wrong_or_prefix_tokens_do_not_match() {
        let token = Token::new("0123456789abcdef0123").unwrap();
        assert!(token.matches(b"0123456789abcdef0123"));
        assert!(!token.matches(b"0123456789abcdef012"));
        assert!(!token.matches(b"0123456789abcdef01234"));
        assert!(!token.matches(b""));
        assert!(Token::new("short").is_err());
        assert!(Token::new("has a space in the middle").is_err());
    }
}
