//! Console sessions: the server token exchanged (`POST /ui/login`) for a random session id
//! in an HttpOnly, SameSite=Strict cookie and a CSRF value in a cookie the console's script
//! reads and sends back as `X-CSRF-Token`. Sessions live in memory only (a restart logs
//! everyone out), at most [`MAX_SESSIONS`], each forgotten after [`IDLE_EXPIRY`] unused.
//! Ids and CSRF values are compared in constant time.
//!
//! Also here: the cookie and origin checks the auth middleware applies to requests that
//! carry the cookie ([`check_same_origin`]).

use crate::error::ApiError;
use axum::http::header::{COOKIE, HOST, ORIGIN};
use axum::http::{HeaderMap, HeaderValue};
use lockbox_policy::ErrorCode;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use subtle::ConstantTimeEq;

/// Name of the session cookie (HttpOnly).
pub const SESSION_COOKIE: &str = "lockbox_session";
/// Name of the CSRF cookie (readable by the console's script).
pub const CSRF_COOKIE: &str = "lockbox_csrf";
/// Header a state-changing request with the session cookie must carry.
pub const CSRF_HEADER: &str = "x-csrf-token";
/// Sessions at most; a new login beyond it forgets the least recently used one.
pub const MAX_SESSIONS: usize = 64;
/// A session unused this long is forgotten.
pub const IDLE_EXPIRY: Duration = Duration::from_secs(12 * 3600);

struct Session {
    id: String,
    csrf: String,
    last_used: Instant,
}

/// The live console sessions (shared by every handler).
#[derive(Clone, Default)]
pub struct Sessions(Arc<Mutex<Vec<Session>>>);

impl std::fmt::Debug for Sessions {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Sessions(..)")
    }
}

/// `N` random bytes, hex.
pub(crate) fn random_hex<const N: usize>() -> Result<String, ApiError> {
    let mut bytes = [0u8; N];
    getrandom::fill(&mut bytes)
        .map_err(|e| ApiError::new(ErrorCode::Internal, format!("random generator: {e}")))?;
    Ok(bytes.iter().map(|b| format!("{b:02x}")).collect())
}

impl Sessions {
    fn lock(&self) -> std::sync::MutexGuard<'_, Vec<Session>> {
        // A panic elsewhere cannot leave the list half-updated (every change is one push,
        // retain or remove), so a poisoned lock is still usable.
        self.0
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// A new session: its id and its CSRF value.
    pub fn create(&self) -> Result<(String, String), ApiError> {
        let (id, csrf) = (random_hex::<32>()?, random_hex::<32>()?);
        let now = Instant::now();
        let mut all = self.lock();
        all.retain(|s| now.duration_since(s.last_used) < IDLE_EXPIRY);
        if all.len() >= MAX_SESSIONS {
            if let Some(oldest) = (0..all.len()).min_by_key(|&i| all[i].last_used) {
                all.swap_remove(oldest);
            }
        }
        all.push(Session {
            id: id.clone(),
            csrf: csrf.clone(),
            last_used: now,
        });
        Ok((id, csrf))
    }

    /// The CSRF value of the live session `id` (which counts as used now). Every session
    /// is compared, in constant time, so the time taken says nothing about the id.
    pub fn find(&self, id: &str) -> Option<String> {
        let now = Instant::now();
        let mut all = self.lock();
        all.retain(|s| now.duration_since(s.last_used) < IDLE_EXPIRY);
        let mut found = None;
        for s in all.iter_mut() {
            if bool::from(s.id.as_bytes().ct_eq(id.as_bytes())) {
                s.last_used = now;
                found = Some(s.csrf.clone());
            }
        }
        found
    }

    /// Forgets the session `id` (logout).
    pub fn remove(&self, id: &str) {
        self.lock()
            .retain(|s| !bool::from(s.id.as_bytes().ct_eq(id.as_bytes())));
    }
}

/// The value of cookie `name` in the request's `Cookie` headers.
pub fn cookie<'a>(headers: &'a HeaderMap, name: &str) -> Option<&'a str> {
    headers
        .get_all(COOKIE)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(';'))
        .filter_map(|pair| pair.trim().split_once('='))
        .find(|(n, _)| *n == name)
        .map(|(_, v)| v.trim())
}

/// Whether the request's CSRF header equals `csrf` (constant time).
pub fn csrf_matches(headers: &HeaderMap, csrf: &str) -> bool {
    headers
        .get(CSRF_HEADER)
        .is_some_and(|v| bool::from(v.as_bytes().ct_eq(csrf.as_bytes())))
}

/// Refuses a request another site made: `Sec-Fetch-Site` other than `same-origin` or
/// `none` (typed by the user), or an `Origin` whose host is not the `Host` the request
/// was sent to. Browsers send at least one of them; other clients, neither.
pub fn check_same_origin(headers: &HeaderMap) -> Result<(), ApiError> {
    if let Some(site) = headers.get("sec-fetch-site") {
        if !matches!(site.as_bytes(), b"same-origin" | b"none") {
            return Err(forbidden(format!(
                "refused a request from another site (Sec-Fetch-Site: {})",
                String::from_utf8_lossy(site.as_bytes())
            )));
        }
    }
    if let Some(origin) = headers.get(ORIGIN) {
        let host = headers.get(HOST).map(HeaderValue::as_bytes).unwrap_or(b"");
        let ok = [b"http://".as_slice(), b"https://".as_slice()]
            .iter()
            .any(|scheme| origin.as_bytes().strip_prefix(*scheme) == Some(host));
        if !ok || host.is_empty() {
            return Err(forbidden(format!(
                "refused a request from origin {} (not this server's)",
                String::from_utf8_lossy(origin.as_bytes())
            )));
        }
    }
    Ok(())
}

/// `FORBIDDEN` with `message`.
pub fn forbidden(message: impl Into<String>) -> ApiError {
    ApiError::new(ErrorCode::Forbidden, message)
}

/// 403 for a scoped token on a route that moves `what` (snapshots, images) between servers:
/// that is the operator's (a fleet router's) work, and what is imported (a snapshot's record
/// with the spec its forks start with, an image under a name) is trusted as the operator's.
pub(crate) fn operator_only(who: &crate::scope::Principal, what: &str) -> Result<(), ApiError> {
    match who.scope() {
        Some(_) => Err(forbidden(format!(
            "{what} move between servers with the operator's token, not a scoped token's"
        ))),
        None => Ok(()),
    }
}

/// `Set-Cookie` values that start a session.
pub fn set_cookies(id: &str, csrf: &str) -> [String; 2] {
    [
        format!("{SESSION_COOKIE}={id}; HttpOnly; SameSite=Strict; Path=/"),
        format!("{CSRF_COOKIE}={csrf}; SameSite=Strict; Path=/"),
    ]
}

/// `Set-Cookie` values that end a session.
pub fn clear_cookies() -> [String; 2] {
    [
        format!("{SESSION_COOKIE}=; HttpOnly; SameSite=Strict; Path=/; Max-Age=0"),
        format!("{CSRF_COOKIE}=; SameSite=Strict; Path=/; Max-Age=0"),
    ]
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn sessions_are_bounded_and_found_only_by_their_id() {
        let sessions = Sessions::default();
        let (first, csrf) = sessions.create().unwrap();
        assert_eq!(sessions.find(&first).as_deref(), Some(csrf.as_str()));
        assert_eq!(sessions.find(&first[..63]), None);
        assert_eq!(sessions.find(""), None);
        for _ in 0..MAX_SESSIONS {
            sessions.create().unwrap();
        }
        assert_eq!(sessions.0.lock().unwrap().len(), MAX_SESSIONS);
        assert_eq!(sessions.find(&first), None, "the least recently used went");
    }

    #[test]
    fn origin_must_be_this_server() {
        let mut h = HeaderMap::new();
        h.insert(HOST, HeaderValue::from_static("127.0.0.1:7070"));
        assert!(check_same_origin(&h).is_ok(), "no browser headers");
        h.insert(ORIGIN, HeaderValue::from_static("http://127.0.0.1:7070"));
        assert!(check_same_origin(&h).is_ok());
        h.insert(ORIGIN, HeaderValue::from_static("http://127.0.0.1:8080"));
        assert!(check_same_origin(&h).is_err());
        h.insert(ORIGIN, HeaderValue::from_static("null"));
        assert!(check_same_origin(&h).is_err());
        h.remove(ORIGIN);
        h.insert("sec-fetch-site", HeaderValue::from_static("same-site"));
        assert!(check_same_origin(&h).is_err());
    }
}
