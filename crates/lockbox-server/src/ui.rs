//! The console's static files (`crates/lockbox-server/ui/`), embedded at build time by
//! `build.rs`; in debug builds `LOCKBOX_UI_DIR=/path` serves them from that directory
//! instead, read on every request (for working on the console without rebuilding).
//!
//! [`lookup`] maps a path under `/ui/` to a file: an unknown path without an extension is
//! `index.html` (the console routes on the client), an unknown one with an extension is
//! `None`. Responses get their headers in `routes::console`.
//!
//! The page names its scripts and style sheet under `/ui/v/VERSION/` ([`asset_prefix`]),
//! `VERSION` being a hash of every embedded file: their content never changes at that
//! address, so the browser keeps them without asking again (`immutable`) and a new build
//! changes the address. Only the page itself is fetched on every load.

use std::borrow::Cow;

/// The embedded files: `(path relative to ui/, content)`.
static FILES: &[(&str, &[u8])] = include!(concat!(env!("OUT_DIR"), "/ui_files.rs"));

/// The console's entry page.
pub const INDEX: &str = "index.html";

/// A file to answer with.
#[derive(Debug)]
pub struct UiFile {
    /// Its path relative to `ui/`.
    pub name: String,
    /// Its content.
    pub body: Cow<'static, [u8]>,
}

impl UiFile {
    /// A strong `ETag`: a hash of the content and its length (`DefaultHasher::new` has
    /// fixed keys: the same content has the same tag in every process of this build).
    pub fn etag(&self) -> String {
        use std::hash::Hasher;
        let mut h = std::hash::DefaultHasher::new();
        h.write(&self.body);
        format!("\"{:016x}-{:x}\"", h.finish(), self.body.len())
    }

    /// The `Content-Type` by extension (the console has few kinds of file).
    pub fn content_type(&self) -> &'static str {
        match self.name.rsplit_once('.').map(|(_, ext)| ext) {
            Some("html") => "text/html; charset=utf-8",
            Some("js" | "mjs") => "text/javascript; charset=utf-8",
            Some("css") => "text/css; charset=utf-8",
            Some("json" | "map") => "application/json",
            Some("svg") => "image/svg+xml",
            Some("png") => "image/png",
            Some("ico") => "image/x-icon",
            Some("woff2") => "font/woff2",
            Some("txt" | "md") => "text/plain; charset=utf-8",
            _ => "application/octet-stream",
        }
    }
}

/// A hash of every embedded file (hex): the `VERSION` of the page's asset addresses. In a
/// debug build serving `LOCKBOX_UI_DIR`, `dev` (files there change without a rebuild).
pub fn version() -> &'static str {
    static VERSION: std::sync::OnceLock<String> = std::sync::OnceLock::new();
    VERSION.get_or_init(|| {
        #[cfg(debug_assertions)]
        if std::env::var_os("LOCKBOX_UI_DIR").is_some() {
            return DEV_VERSION.to_owned();
        }
        use std::hash::Hasher;
        let mut h = std::hash::DefaultHasher::new();
        for (name, body) in FILES {
            h.write(name.as_bytes());
            h.write_usize(body.len());
            h.write(body);
        }
        format!("{:016x}", h.finish())
    })
}

/// The version of files served from `LOCKBOX_UI_DIR` (never cached for long).
pub const DEV_VERSION: &str = "dev";

/// Where the page's assets are: `/ui/v/VERSION/`. The page's file names them under `/ui/@/`,
/// replaced by this when it is served.
pub fn asset_prefix() -> String {
    format!("/ui/v/{}/", version())
}

/// The placeholder of [`asset_prefix`] in `index.html`.
pub const ASSET_PLACEHOLDER: &str = "/ui/@/";

/// Whether `rel` names a file inside `ui/`: relative, no `..`, no empty or hidden parts.
fn is_plain(rel: &str) -> bool {
    !rel.is_empty()
        && rel
            .split('/')
            .all(|part| !part.is_empty() && !part.starts_with('.') && !part.contains('\\'))
}

/// The file for `rel` (the path after `/ui/`; empty for `/ui` itself).
pub async fn lookup(rel: &str) -> Option<UiFile> {
    let rel = if rel.is_empty() { INDEX } else { rel };
    if let Some(file) = read(rel).await {
        return Some(file);
    }
    let last = rel.rsplit('/').next().unwrap_or(rel);
    if last.contains('.') {
        return None;
    }
    read(INDEX).await
}

async fn read(rel: &str) -> Option<UiFile> {
    if !is_plain(rel) {
        return None;
    }
    #[cfg(debug_assertions)]
    if let Some(dir) = std::env::var_os("LOCKBOX_UI_DIR") {
        let path = std::path::Path::new(&dir).join(rel);
        return match tokio::fs::read(&path).await {
            Ok(body) => Some(UiFile {
                name: rel.to_owned(),
                body: Cow::Owned(body),
            }),
            Err(_) => None,
        };
    }
    FILES
        .iter()
        .find(|(name, _)| *name == rel)
        .map(|(name, body)| UiFile {
            name: (*name).to_owned(),
            body: Cow::Borrowed(body),
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_plain_relative_paths_name_files() {
        assert!(is_plain("index.html"));
        assert!(is_plain("js/app.js"));
        for bad in [
            "",
            "../x",
            "a/../b",
            "/etc/passwd",
            ".git/config",
            "a//b",
            "a\\b",
        ] {
            assert!(!is_plain(bad), "{bad}");
        }
    }
}
