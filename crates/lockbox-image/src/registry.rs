//! A small registry client (OCI distribution spec, pull side) over `reqwest`.
//!
//! Why not `oci-client`: it brings a second major of reqwest (0.13) and chrono, regex, strum
//! and several proc-macro crates into the build, and it gives none of the bounds lockbox
//! needs (a size bound on manifests, configs and tokens; a redirect bound; no https→http
//! downgrade; plain http only for loopback or named registries). The pull side of the
//! protocol is small: `GET /v2/<name>/manifests/<ref>`, `GET /v2/<name>/blobs/<digest>`,
//! and the `WWW-Authenticate` challenge (Bearer token or Basic).

use crate::digest::Digest;
use crate::error::ImageError;
use crate::reference::{Reference, DOCKER_HUB};
use base64::Engine as _;
use sha2::Digest as _;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

/// How many redirects a request may follow (a registry that redirects forever is refused).
pub const MAX_REDIRECTS: usize = 10;

/// A registry's credentials, as `user:password`.
#[derive(Clone)]
pub struct Credentials {
    user: String,
    password: String,
}

impl std::fmt::Debug for Credentials {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Credentials({}, <hidden>)", self.user)
    }
}

impl Credentials {
    fn basic(&self) -> String {
        let raw = format!("{}:{}", self.user, self.password);
        format!(
            "Basic {}",
            base64::engine::general_purpose::STANDARD.encode(raw)
        )
    }
}

/// Where credentials come from: `$REGISTRY_AUTH_FILE` (containers-auth.json), else
/// `~/.docker/config.json`; the entry of `auths` whose key names `registry` (a bare host,
/// or a URL such as `https://index.docker.io/v1/`), its `auth` being base64 `user:password`.
pub fn credentials_for(
    registry: &str,
    file: Option<&Path>,
) -> Result<Option<Credentials>, ImageError> {
    let file = match file
        .map(Path::to_path_buf)
        .or_else(|| std::env::var_os("REGISTRY_AUTH_FILE").map(PathBuf::from))
    {
        Some(f) if !f.as_os_str().is_empty() => f,
        _ => match dirs::home_dir() {
            Some(h) => h.join(".docker/config.json"),
            None => return Ok(None),
        },
    };
    let text = match std::fs::read(&file) {
        Ok(t) => t,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(ImageError::io("read registry credentials", &file, e)),
    };
    let damaged = |reason: String| ImageError::Damaged {
        path: file.clone(),
        reason,
    };
    let v: serde_json::Value =
        serde_json::from_slice(&text).map_err(|e| damaged(format!("not JSON: {e}")))?;
    let Some(auths) = v.get("auths").and_then(|a| a.as_object()) else {
        return Ok(None);
    };
    for (key, entry) in auths {
        if normalise_host(key) != registry {
            continue;
        }
        let Some(auth) = entry.get("auth").and_then(|a| a.as_str()) else {
            continue;
        };
        let decoded = base64::engine::general_purpose::STANDARD
            .decode(auth.trim())
            .map_err(|e| damaged(format!("auths.{key}.auth: not base64: {e}")))?;
        let decoded = String::from_utf8(decoded)
            .map_err(|_| damaged(format!("auths.{key}.auth: not UTF-8")))?;
        let (user, password) = decoded
            .split_once(':')
            .ok_or_else(|| damaged(format!("auths.{key}.auth: not user:password")))?;
        return Ok(Some(Credentials {
            user: user.to_owned(),
            password: password.to_owned(),
        }));
    }
    Ok(None)
}

fn normalise_host(key: &str) -> String {
    let k = key
        .strip_prefix("https://")
        .or_else(|| key.strip_prefix("http://"))
        .unwrap_or(key);
    let host = k.split('/').next().unwrap_or(k);
    match host {
        "index.docker.io" | "registry-1.docker.io" => DOCKER_HUB.to_owned(),
        h => h.to_owned(),
    }
}

/// True for `localhost`, 127.0.0.0/8 and ::1 (with or without a port).
pub fn is_loopback(host: &str) -> bool {
    let h = if let Some(rest) = host.strip_prefix('[') {
        rest.split(']').next().unwrap_or(rest)
    } else {
        host.rsplit_once(':').map_or(host, |(h, _)| h)
    };
    h == "localhost"
        || h.parse::<std::net::IpAddr>()
            .is_ok_and(|ip| ip.is_loopback())
}

/// A client for one repository of one registry.
#[derive(Debug)]
pub struct Registry {
    client: reqwest::Client,
    base: String,
    host: String,
    repository: String,
    credentials: Option<Credentials>,
    auth: tokio::sync::Mutex<Option<String>>,
    insecure: Vec<String>,
    /// Ask tokens for `pull,push` (a push) rather than `pull`.
    push: std::sync::atomic::AtomicBool,
}

impl Registry {
    /// A client for `reference`'s repository. `insecure` names registries that may be
    /// reached over plain http (loopback ones are, unless `tls` has a CA certificate for
    /// them).
    pub fn new(
        reference: &Reference,
        insecure: &[String],
        auth_file: Option<&Path>,
        tls: &crate::Tls,
    ) -> Result<Registry, ImageError> {
        let host = reference.api_host().to_owned();
        let roots = trusted_roots(tls, &[&reference.registry, &host])?;
        let plain = (is_loopback(&host) && roots.is_empty())
            || insecure
                .iter()
                .any(|h| h == &reference.registry || h == &host);
        let base = format!("{}://{host}", if plain { "http" } else { "https" });
        let policy = reqwest::redirect::Policy::custom(|attempt| {
            if attempt.previous().len() >= MAX_REDIRECTS {
                attempt.error(format!("more than {MAX_REDIRECTS} redirects"))
            } else if attempt.url().scheme() == "http"
                && attempt
                    .previous()
                    .last()
                    .is_some_and(|p| p.scheme() == "https")
            {
                attempt.error("a redirect from https to plain http")
            } else {
                attempt.follow()
            }
        });
        let mut builder = reqwest::Client::builder();
        for cert in roots {
            builder = builder.add_root_certificate(cert);
        }
        let client = builder
            .redirect(policy)
            .connect_timeout(Duration::from_secs(30))
            .read_timeout(Duration::from_secs(120))
            .user_agent(concat!("lockbox/", env!("CARGO_PKG_VERSION")))
            .build()
            .map_err(|e| ImageError::Registry {
                registry: reference.registry.clone(),
                step: "client".into(),
                reason: chain(&e),
            })?;
        Ok(Registry {
            client,
            base,
            host,
            repository: reference.repository.clone(),
            credentials: credentials_for(&reference.registry, auth_file)?,
            auth: tokio::sync::Mutex::new(None),
            insecure: insecure.to_vec(),
            push: std::sync::atomic::AtomicBool::new(false),
        })
    }

    pub(crate) fn base(&self) -> String {
        self.base.clone()
    }

    pub(crate) fn repository(&self) -> &str {
        &self.repository
    }

    pub(crate) fn host(&self) -> &str {
        &self.host
    }

    pub(crate) fn client(&self) -> &reqwest::Client {
        &self.client
    }

    pub(crate) fn push_flag(&self) -> &std::sync::atomic::AtomicBool {
        &self.push
    }

    pub(crate) async fn current_auth(&self) -> Option<String> {
        self.auth.lock().await.clone()
    }

    pub(crate) fn error(&self, step: &str, reason: impl Into<String>) -> ImageError {
        self.err(step, reason)
    }

    pub(crate) async fn answer_challenge(&self, challenge: &str) -> Result<(), ImageError> {
        self.authenticate(challenge).await
    }

    fn err(&self, step: &str, reason: impl Into<String>) -> ImageError {
        let mut reason = reason.into();
        let trust = format!(
            "give its CA certificate with --ca-cert FILE, or put it in \
             ~/.config/containers/certs.d/{}/ca.crt; see docs/images.md, \"Registries\"",
            self.host
        );
        if reason.contains("certificate") {
            reason.push_str(&format!(
                " (the registry's TLS certificate is not trusted: {trust})"
            ));
        } else if reason.contains("HTTP request to an HTTPS server") {
            // A loopback registry is spoken to in plain http unless a CA is given for it.
            reason.push_str(&format!(" (it speaks https: {trust})"));
        }
        ImageError::Registry {
            registry: self.host.clone(),
            step: step.to_owned(),
            reason,
        }
    }

    /// GET `path` (under /v2/<repository>/), answering one authentication challenge.
    async fn get(
        &self,
        path: &str,
        accept: Option<&str>,
        step: &str,
    ) -> Result<reqwest::Response, ImageError> {
        let url = format!("{}/v2/{}/{path}", self.base, self.repository);
        let mut tried_auth = false;
        loop {
            let mut req = self.client.get(&url);
            if let Some(a) = accept {
                req = req.header(reqwest::header::ACCEPT, a);
            }
            if let Some(auth) = self.auth.lock().await.clone() {
                req = req.header(reqwest::header::AUTHORIZATION, auth);
            }
            let resp = req.send().await.map_err(|e| self.err(step, chain(&e)))?;
            if resp.status() == reqwest::StatusCode::UNAUTHORIZED && !tried_auth {
                tried_auth = true;
                let challenge = resp
                    .headers()
                    .get(reqwest::header::WWW_AUTHENTICATE)
                    .and_then(|v| v.to_str().ok())
                    .unwrap_or("")
                    .to_owned();
                self.authenticate(&challenge).await?;
                continue;
            }
            if resp.status() == reqwest::StatusCode::UNAUTHORIZED {
                return Err(ImageError::Unauthorized {
                    registry: self.host.clone(),
                    reason: format!("{step}: 401 after authenticating"),
                });
            }
            if !resp.status().is_success() {
                let status = resp.status();
                let body = read_bounded_prefix(resp, 512).await;
                return Err(self.err(
                    step,
                    format!(
                        "HTTP {status}{}",
                        if body.is_empty() {
                            String::new()
                        } else {
                            format!(": {body}")
                        }
                    ),
                ));
            }
            return Ok(resp);
        }
    }

    /// Answers a `WWW-Authenticate` challenge: a Bearer token from the realm, or Basic.
    async fn authenticate(&self, challenge: &str) -> Result<(), ImageError> {
        let (scheme, params) = parse_challenge(challenge);
        match scheme.to_ascii_lowercase().as_str() {
            "basic" => {
                let creds = self.credentials.as_ref().ok_or_else(|| ImageError::Unauthorized {
                    registry: self.host.clone(),
                    reason: "the registry asks for a user and password (Basic) and none are configured".into(),
                })?;
                *self.auth.lock().await = Some(creds.basic());
                Ok(())
            }
            "bearer" => {
                let realm = params
                    .iter()
                    .find(|(k, _)| k == "realm")
                    .map(|(_, v)| v.clone())
                    .ok_or_else(|| self.err("token", "a Bearer challenge without a realm"))?;
                let realm_url = reqwest::Url::parse(&realm)
                    .map_err(|e| self.err("token", format!("realm {realm:?}: {e}")))?;
                let realm_host = realm_url.host_str().unwrap_or("").to_owned();
                match realm_url.scheme() {
                    "https" => {}
                    "http" if is_loopback(&realm_host)
                        || self.insecure.iter().any(|h| h.split(':').next() == Some(realm_host.as_str())) => {}
                    _ => return Err(self.err("token", format!("realm {realm:?}: only https (or http on loopback or an --insecure-registry host)"))),
                }
                let mut query: Vec<(String, String)> = Vec::new();
                for (k, v) in &params {
                    if k == "service" || k == "scope" {
                        query.push((k.clone(), v.clone()));
                    }
                }
                if !query.iter().any(|(k, _)| k == "scope") {
                    let actions = if self.push.load(Ordering::Relaxed) {
                        "pull,push"
                    } else {
                        "pull"
                    };
                    query.push((
                        "scope".into(),
                        format!("repository:{}:{actions}", self.repository),
                    ));
                }
                let mut req = self.client.get(realm_url).query(&query);
                if let Some(c) = &self.credentials {
                    req = req.header(reqwest::header::AUTHORIZATION, c.basic());
                }
                let resp = req.send().await.map_err(|e| self.err("token", chain(&e)))?;
                let status = resp.status();
                if status == reqwest::StatusCode::UNAUTHORIZED
                    || status == reqwest::StatusCode::FORBIDDEN
                {
                    return Err(ImageError::Unauthorized {
                        registry: self.host.clone(),
                        reason: format!("the token server answered HTTP {status}"),
                    });
                }
                if !status.is_success() {
                    return Err(self.err("token", format!("HTTP {status}")));
                }
                let body = read_bounded(resp, 1 << 20, "token")
                    .await
                    .map_err(|e| self.retag(e))?;
                let v: serde_json::Value = serde_json::from_slice(&body)
                    .map_err(|e| self.err("token", format!("not JSON: {e}")))?;
                let token = v
                    .get("token")
                    .or_else(|| v.get("access_token"))
                    .and_then(|t| t.as_str())
                    .filter(|t| !t.is_empty())
                    .ok_or_else(|| self.err("token", "the answer has no token"))?;
                *self.auth.lock().await = Some(format!("Bearer {token}"));
                Ok(())
            }
            _ => Err(ImageError::Unauthorized {
                registry: self.host.clone(),
                reason: format!("unsupported challenge {challenge:?}"),
            }),
        }
    }

    fn retag(&self, e: ImageError) -> ImageError {
        match e {
            ImageError::Registry { step, reason, .. } => self.err(&step, reason),
            e => e,
        }
    }

    /// Fetches a manifest or index (at most `limit` bytes), verifying it against `expect`
    /// (a pinned digest) or the registry's `Docker-Content-Digest`. Returns the bytes and
    /// their digest.
    pub async fn manifest(
        &self,
        reference: &str,
        expect: Option<&Digest>,
        limit: u64,
    ) -> Result<(Vec<u8>, Digest), ImageError> {
        let step = format!("manifest {}:{reference}", self.repository);
        let resp = self
            .get(
                &format!("manifests/{reference}"),
                Some(crate::oci::MANIFEST_ACCEPT),
                &step,
            )
            .await?;
        let header = resp
            .headers()
            .get("docker-content-digest")
            .and_then(|v| v.to_str().ok())
            .and_then(|v| Digest::parse(v).ok());
        let body = read_bounded(resp, limit, &step)
            .await
            .map_err(|e| self.retag(e))?;
        let actual = Digest::of(&body);
        if let Some(expected) = expect.or(header.as_ref()) {
            if &actual != expected {
                return Err(ImageError::DigestMismatch {
                    what: step,
                    expected: expected.to_string(),
                    actual: actual.to_string(),
                });
            }
        }
        Ok((body, actual))
    }

    /// Fetches a small blob (a config) into memory, verified.
    pub async fn blob_bytes(&self, digest: &Digest, limit: u64) -> Result<Vec<u8>, ImageError> {
        let step = format!("blob {digest}");
        let resp = self.get(&format!("blobs/{digest}"), None, &step).await?;
        let body = read_bounded(resp, limit, &step)
            .await
            .map_err(|e| self.retag(e))?;
        let actual = Digest::of(&body);
        if &actual != digest {
            return Err(ImageError::DigestMismatch {
                what: step,
                expected: digest.to_string(),
                actual: actual.to_string(),
            });
        }
        Ok(body)
    }

    /// Streams a blob into `file` while hashing it; fails unless it is exactly `size` bytes
    /// with digest `digest`. `progress` counts the bytes as they come.
    pub async fn blob_to_file(
        &self,
        digest: &Digest,
        size: u64,
        file: &Path,
        progress: &AtomicU64,
    ) -> Result<(), ImageError> {
        let step = format!("blob {digest}");
        let mut resp = self.get(&format!("blobs/{digest}"), None, &step).await?;
        let mut out = std::fs::File::create(file)
            .map_err(|e| ImageError::io("create a download file", file, e))?;
        let mut hasher = sha2::Sha256::new();
        let mut count = 0u64;
        while let Some(chunk) = resp
            .chunk()
            .await
            .map_err(|e| self.err(&step, format!("reading the body: {}", chain(&e))))?
        {
            count += chunk.len() as u64;
            if count > size {
                return Err(ImageError::SizeMismatch {
                    what: step,
                    expected: size,
                    actual: count,
                });
            }
            hasher.update(&chunk);
            out.write_all(&chunk)
                .map_err(|e| ImageError::io("write a download file", file, e))?;
            progress.fetch_add(chunk.len() as u64, Ordering::Relaxed);
        }
        if count != size {
            return Err(ImageError::SizeMismatch {
                what: format!("{step} (truncated)"),
                expected: size,
                actual: count,
            });
        }
        let actual = Digest::from_hasher(hasher);
        if &actual != digest {
            return Err(ImageError::DigestMismatch {
                what: step,
                expected: digest.to_string(),
                actual: actual.to_string(),
            });
        }
        out.sync_all()
            .map_err(|e| ImageError::io("fsync a download file", file, e))?;
        Ok(())
    }
}

/// Reads a body of at most `limit` bytes; more is an error, not a truncation.
async fn read_bounded(
    mut resp: reqwest::Response,
    limit: u64,
    what: &str,
) -> Result<Vec<u8>, ImageError> {
    if resp.content_length().is_some_and(|n| n > limit) {
        return Err(ImageError::TooLarge {
            what: what.to_owned(),
            limit,
        });
    }
    let mut body = Vec::new();
    while let Some(chunk) = resp.chunk().await.map_err(|e| ImageError::Registry {
        registry: String::new(),
        step: what.to_owned(),
        reason: format!("reading the body: {}", chain(&e)),
    })? {
        if body.len() as u64 + chunk.len() as u64 > limit {
            return Err(ImageError::TooLarge {
                what: what.to_owned(),
                limit,
            });
        }
        body.extend_from_slice(&chunk);
    }
    Ok(body)
}

/// The first `n` bytes of an error body, as text on one line.
pub(crate) async fn read_bounded_prefix(mut resp: reqwest::Response, n: usize) -> String {
    let mut body = Vec::new();
    while let Ok(Some(chunk)) = resp.chunk().await {
        body.extend_from_slice(&chunk);
        if body.len() >= n {
            break;
        }
    }
    body.truncate(n);
    String::from_utf8_lossy(&body)
        .split_whitespace()
        .collect::<Vec<_>>()
        .join(" ")
}

/// `Bearer realm="…",service="…",scope="…"` → ("Bearer", [(realm, …), …]).
pub fn parse_challenge(header: &str) -> (String, Vec<(String, String)>) {
    let header = header.trim();
    let (scheme, rest) = header.split_once(' ').unwrap_or((header, ""));
    let mut params = Vec::new();
    let mut s = rest.trim();
    while !s.is_empty() {
        let Some((key, after)) = s.split_once('=') else {
            break;
        };
        let key = key
            .trim()
            .trim_start_matches(',')
            .trim()
            .to_ascii_lowercase();
        let after = after.trim_start();
        let (value, next) = if let Some(q) = after.strip_prefix('"') {
            let mut value = String::new();
            let mut chars = q.char_indices();
            let mut end = q.len();
            while let Some((i, c)) = chars.next() {
                match c {
                    '\\' => {
                        if let Some((_, c2)) = chars.next() {
                            value.push(c2);
                        }
                    }
                    '"' => {
                        end = i + 1;
                        break;
                    }
                    c => value.push(c),
                }
            }
            (value, &q[end.min(q.len())..])
        } else {
            let end = after.find(',').unwrap_or(after.len());
            (after[..end].trim().to_owned(), &after[end..])
        };
        params.push((key, value));
        s = next.trim_start().trim_start_matches(',').trim_start();
    }
    (scheme.to_owned(), params)
}

/// An error and its sources on one line (reqwest's own message is only the outermost).
/// The CA certificates `tls` trusts for a registry named `names` (as written, and its API
/// host): every `--ca-cert` file, and the `*.crt` files of `certs.d/NAME/` directories. A
/// file that cannot be read or holds no PEM certificate is an error naming it.
fn trusted_roots(
    tls: &crate::Tls,
    names: &[&str],
) -> Result<Vec<reqwest::Certificate>, ImageError> {
    let mut files = tls.ca_certs.clone();
    for dir in &tls.certs_dirs {
        let mut seen = Vec::new();
        for name in names {
            if seen.contains(name) || name.is_empty() || name.contains('/') || name.starts_with('.')
            {
                continue;
            }
            seen.push(name);
            let Ok(entries) = std::fs::read_dir(dir.join(name)) else {
                continue;
            };
            let mut crts: Vec<std::path::PathBuf> = entries
                .flatten()
                .map(|e| e.path())
                .filter(|p| p.extension().is_some_and(|x| x == "crt"))
                .collect();
            crts.sort();
            files.extend(crts);
        }
    }
    let mut roots = Vec::new();
    for f in files {
        let pem = std::fs::read(&f).map_err(|e| ImageError::BadCaCert {
            path: f.clone(),
            reason: e.to_string(),
        })?;
        let certs =
            reqwest::Certificate::from_pem_bundle(&pem).map_err(|e| ImageError::BadCaCert {
                path: f.clone(),
                reason: chain(&e),
            })?;
        if certs.is_empty() {
            return Err(ImageError::BadCaCert {
                path: f,
                reason: "no PEM certificate in it".into(),
            });
        }
        roots.extend(certs);
    }
    Ok(roots)
}

pub(crate) fn chain(e: &dyn std::error::Error) -> String {
    let mut text = e.to_string();
    let mut source = e.source();
    while let Some(s) = source {
        let t = s.to_string();
        if !text.contains(&t) {
            text.push_str(": ");
            text.push_str(&t);
        }
        source = s.source();
    }
    text
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn bearer_challenges_are_parsed_with_quoted_commas() {
        let (s, p) = parse_challenge(
            r#"Bearer realm="https://auth.docker.io/token",service="registry.docker.io",scope="repository:library/busybox:pull,push""#,
        );
        assert_eq!(s, "Bearer");
        assert_eq!(
            p[0],
            ("realm".into(), "https://auth.docker.io/token".into())
        );
        assert_eq!(p[1], ("service".into(), "registry.docker.io".into()));
        assert_eq!(
            p[2],
            (
                "scope".into(),
                "repository:library/busybox:pull,push".into()
            )
        );
        let (s, p) = parse_challenge(r#"Basic realm="Registry Realm""#);
        assert_eq!((s.as_str(), p.len()), ("Basic", 1));
    }

    #[test]
    fn loopback_hosts() {
        for h in ["127.0.0.1:5000", "localhost", "[::1]:80", "127.1.2.3"] {
            assert!(is_loopback(h), "{h}");
        }
        for h in ["10.0.0.1:5000", "registry.example", "[::2]:5000"] {
            assert!(!is_loopback(h), "{h}");
        }
    }

    #[test]
    fn auth_file_keys_match_hosts() {
        assert_eq!(normalise_host("https://index.docker.io/v1/"), "docker.io");
        assert_eq!(normalise_host("127.0.0.1:5000"), "127.0.0.1:5000");
        assert_eq!(normalise_host("http://r.example:80/x"), "r.example:80");
    }
}
