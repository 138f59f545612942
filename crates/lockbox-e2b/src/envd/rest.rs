//! envd's REST API (`spec/envd/envd.yaml`): `GET /health`, `GET /envs`, `GET /metrics`,
//! and files: `GET /files` (download, streamed) and `POST /files` (upload, as
//! `multipart/form-data` or `application/octet-stream`, either of them gzip-encoded), on
//! the runtime's file API.
//! Relative paths are relative to the E2B user's home ([`crate::HOME`]); `username` is
//! accepted and ignored (every process of a lockbox sandbox runs as one user).

use crate::control::runtime_error;
use crate::{E2b, E2bError, Target};
use axum::body::Body;
use axum::extract::{Query, Request, State};
use axum::http::{header, HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::{Extension, Json, Router};
use futures_util::TryStreamExt;
use lockbox_runtime::{RuntimeError, Sandbox, WriteOptions};
use serde::Deserialize;
use serde_json::{json, Value};
use std::sync::{Arc, OnceLock};

/// The largest `multipart/form-data` upload (it is read whole before being written);
/// `application/octet-stream` uploads are streamed and have no such bound.
pub const MAX_MULTIPART: usize = 256 << 20;

/// envd's REST routes.
pub fn router(e2b: E2b) -> Router {
    Router::new()
        .route("/health", get(health))
        .route("/envs", get(envs))
        .route("/metrics", get(metrics))
        .route("/files", get(download).post(upload))
        .with_state(e2b)
}

async fn health() -> StatusCode {
    StatusCode::NO_CONTENT
}

async fn envs(State(e2b): State<E2b>, Extension(target): Extension<Target>) -> Json<Value> {
    let env = e2b
        .registry
        .get(&target.sandbox)
        .map(|s| s.env)
        .unwrap_or_default();
    Json(json!(env))
}

async fn metrics(State(e2b): State<E2b>, Extension(target): Extension<Target>) -> Json<Value> {
    let cpus = std::thread::available_parallelism().map_or(1, |n| n.get());
    let usage = e2b
        .runtime
        .sandbox_info(&target.instance)
        .ok()
        .and_then(|i| i.usage);
    let mem_used = usage.as_ref().map_or(0, |u| u.rss_bytes);
    let ts = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs());
    Json(json!({
        "ts": ts,
        "cpu_count": cpus,
        "cpu_used_pct": 0.0,
        "mem_total": 0,
        "mem_used": mem_used,
        "disk_used": 0,
        "disk_total": 0,
    }))
}

#[derive(Debug, Deserialize)]
struct FileQuery {
    path: Option<String>,
    username: Option<String>,
}

/// Paths of one request in its sandbox: relative ones below the home of the user the query
/// names, looked up (one `stat` in the sandbox) only if a path needs it.
struct Paths<'a> {
    sandbox: &'a Sandbox,
    username: Option<&'a str>,
    home: Option<String>,
}

impl<'a> Paths<'a> {
    fn new(sandbox: &'a Sandbox, query: &'a FileQuery) -> Paths<'a> {
        let username = query.username.as_deref();
        Paths {
            sandbox,
            username,
            home: None,
        }
    }

    /// `path` inside the sandbox (see [`super::resolve`]).
    async fn resolve(&mut self, path: &str) -> Result<String, E2bError> {
        if path.starts_with('/') {
            return Ok(path.to_owned());
        }
        let home = match &self.home {
            Some(home) => home.clone(),
            None => {
                let name = self.username.unwrap_or("");
                let user = super::User::named(name).ok_or_else(|| {
                    E2bError::new(StatusCode::BAD_REQUEST, super::no_such_user(name))
                })?;
                let home = super::home_of(self.sandbox, user).await;
                self.home = Some(home.clone());
                home
            }
        };
        Ok(super::resolve(&home, path))
    }
}

/// A file error as envd answers it (`{"code", "message"}`, by status).
fn file_error(path: &str, e: &RuntimeError) -> E2bError {
    match e {
        RuntimeError::FileNotFound { .. } => E2bError::new(
            StatusCode::NOT_FOUND,
            format!("path '{path}' does not exist"),
        ),
        RuntimeError::SandboxNotFound { .. } | RuntimeError::SandboxNotRunning { .. } => {
            crate::sandbox_not_found(path)
        }
        other => runtime_error(other),
    }
}

async fn download(
    State(e2b): State<E2b>,
    Extension(target): Extension<Target>,
    Query(query): Query<FileQuery>,
) -> Result<Response, E2bError> {
    let Some(path) = query.path.as_deref().filter(|p| !p.is_empty()) else {
        return Err(E2bError::new(StatusCode::BAD_REQUEST, "path: required"));
    };
    let sandbox = e2b
        .runtime
        .sandbox(&target.instance)
        .map_err(|_| crate::sandbox_not_found(&target.sandbox))?;
    let path = Paths::new(&sandbox, &query).resolve(path).await?;
    let read = sandbox
        .read_file(&path, None)
        .await
        .map_err(|e| file_error(&path, &e))?;
    let stream = tokio_util::io::ReaderStream::new(read.body);
    Ok((
        [
            (header::CONTENT_TYPE, "application/octet-stream".to_owned()),
            (header::CONTENT_LENGTH, read.size.to_string()),
        ],
        Body::from_stream(stream),
    )
        .into_response())
}

/// envd's `EntryInfo` of a written file, with its metadata (none: no field).
fn entry(path: &str, st: &lockbox_runtime::FileStat) -> Value {
    let name = path.rsplit('/').next().unwrap_or(path);
    let mut info = json!({"path": path, "name": name, "type": "file"});
    let metadata = super::metadata(&st.xattrs);
    if !metadata.is_empty() {
        info["metadata"] = json!(metadata);
    }
    info
}

/// The prefix of the upload headers that carry a file's metadata, one per key.
const METADATA_HEADERS: &str = "x-metadata-";

/// An upload's metadata (`X-Metadata-KEY: VALUE`) as the extended attributes that keep it
/// ([`super::METADATA_XATTRS`]`KEY`): keys lowercased (header names are), values printable
/// US-ASCII, as E2B's SDKs check before sending. Anything else is refused before a byte is
/// written.
fn metadata_xattrs(
    headers: &HeaderMap,
) -> Result<std::collections::BTreeMap<String, String>, E2bError> {
    let mut xattrs = std::collections::BTreeMap::new();
    for (name, value) in headers {
        let Some(key) = name.as_str().strip_prefix(METADATA_HEADERS) else {
            continue;
        };
        let bad = |why: &str| E2bError::new(StatusCode::BAD_REQUEST, format!("{name}: {why}"));
        if key.is_empty() {
            return Err(bad("an empty metadata key"));
        }
        let value = value
            .to_str()
            .ok()
            .filter(|v| v.bytes().all(|b| (0x20..0x7f).contains(&b)))
            .ok_or_else(|| bad("a metadata value is printable US-ASCII"))?;
        xattrs.insert(format!("{}{key}", super::METADATA_XATTRS), value.to_owned());
    }
    Ok(xattrs)
}

/// The path a signed file URL was signed for: the only one its upload may write.
#[derive(Debug, Clone)]
pub struct SignedPath(pub String);

async fn upload(
    State(e2b): State<E2b>,
    Extension(target): Extension<Target>,
    signed: Option<Extension<SignedPath>>,
    Query(query): Query<FileQuery>,
    req: Request,
) -> Result<Response, E2bError> {
    let headers = req.headers().clone();
    let gzip = match headers.get(header::CONTENT_ENCODING).map(|v| v.as_bytes()) {
        None => false,
        Some(e) if e.eq_ignore_ascii_case(b"identity") => false,
        Some(e) if e.eq_ignore_ascii_case(b"gzip") => true,
        Some(e) => {
            return Err(E2bError::new(
                StatusCode::UNSUPPORTED_MEDIA_TYPE,
                format!(
                    "Content-Encoding {:?}: not supported (gzip or identity)",
                    String::from_utf8_lossy(e)
                ),
            ))
        }
    };
    // The same metadata goes on every file of the upload; a file it replaces takes its own
    // with it (none given: none left).
    let options = WriteOptions {
        xattrs: metadata_xattrs(&headers)?,
        ..WriteOptions::default()
    };
    let sandbox = e2b
        .runtime
        .sandbox(&target.instance)
        .map_err(|_| crate::sandbox_not_found(&target.sandbox))?;
    let mut paths = Paths::new(&sandbox, &query);
    let content_type = headers
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .unwrap_or("")
        .to_owned();
    let mut written = Vec::new();
    if content_type.starts_with("multipart/form-data") {
        let boundary = boundary_of(&content_type).ok_or_else(|| {
            E2bError::new(
                StatusCode::BAD_REQUEST,
                "Content-Type: multipart/form-data without a boundary",
            )
        })?;
        let body = axum::body::to_bytes(req.into_body(), MAX_MULTIPART)
            .await
            .map_err(|e| {
                E2bError::new(
                    StatusCode::PAYLOAD_TOO_LARGE,
                    format!(
                        "a multipart upload of at most {MAX_MULTIPART} bytes (use application/octet-stream for larger files): {e}"
                    ),
                )
            })?;
        let body = if gzip {
            gunzip_whole(&body)?
        } else {
            body.to_vec()
        };
        let parts = parse_multipart(&body, &boundary)?;
        let single = parts.len() == 1;
        // Every part's path first: a refused one must not leave the others written.
        let mut files = Vec::with_capacity(parts.len());
        for (filename, data) in parts {
            let path = match (&query.path, single) {
                (Some(p), true) if !p.is_empty() => p.clone(),
                _ => filename.ok_or_else(|| {
                    E2bError::new(
                        StatusCode::BAD_REQUEST,
                        "a file part without a filename (its path)",
                    )
                })?,
            };
            let path = paths.resolve(&path).await?;
            if let Some(Extension(SignedPath(allowed))) = &signed {
                if paths.resolve(allowed).await? != path {
                    return Err(E2bError::new(
                        StatusCode::UNAUTHORIZED,
                        format!("{path}: the URL's signature is for {allowed} only"),
                    ));
                }
            }
            files.push((path, data));
        }
        for (path, data) in files {
            let reader = std::io::Cursor::new(data);
            let st = sandbox
                .write_file(&path, Box::pin(reader), options.clone())
                .await
                .map_err(|e| file_error(&path, &e))?;
            written.push(entry(&path, &st));
        }
    } else {
        let Some(path) = query.path.as_deref().filter(|p| !p.is_empty()) else {
            return Err(E2bError::new(StatusCode::BAD_REQUEST, "path: required"));
        };
        let path = paths.resolve(path).await?;
        let stream = req
            .into_body()
            .into_data_stream()
            .map_err(std::io::Error::other);
        // Set when the body is not valid gzip: the client's error (400), not the server's.
        let bad_gzip = Arc::new(OnceLock::new());
        let reader: std::pin::Pin<Box<dyn tokio::io::AsyncRead + Send>> = if gzip {
            let decoded = gunzip_stream(stream, bad_gzip.clone());
            Box::pin(tokio_util::io::StreamReader::new(decoded))
        } else {
            Box::pin(tokio_util::io::StreamReader::new(stream))
        };
        let st = sandbox
            .write_file(&path, reader, options)
            .await
            .map_err(|e| match bad_gzip.get() {
                Some(why) => E2bError::new(StatusCode::BAD_REQUEST, format!("gzip body: {why}")),
                None => file_error(&path, &e),
            })?;
        written.push(entry(&path, &st));
    }
    let mut out = HeaderMap::new();
    out.insert(
        header::CONTENT_TYPE,
        header::HeaderValue::from_static("application/json"),
    );
    Ok((StatusCode::OK, out, Json(Value::Array(written))).into_response())
}

/// A gzip-encoded multipart body (`Content-Encoding: gzip`), decoded whole: at most
/// [`MAX_MULTIPART`] bytes once decoded.
fn gunzip_whole(body: &[u8]) -> Result<Vec<u8>, E2bError> {
    use std::io::Read;
    let mut out = Vec::new();
    flate2::read::GzDecoder::new(body)
        .take(MAX_MULTIPART as u64 + 1)
        .read_to_end(&mut out)
        .map_err(|e| E2bError::new(StatusCode::BAD_REQUEST, format!("gzip body: {e}")))?;
    if out.len() > MAX_MULTIPART {
        return Err(E2bError::new(
            StatusCode::PAYLOAD_TOO_LARGE,
            format!("a multipart upload of at most {MAX_MULTIPART} bytes once decoded"),
        ));
    }
    Ok(out)
}

/// Input fed to the gzip decoder per step: it bounds what one step's output holds in
/// memory (deflate expands by at most ~1032 times).
const GUNZIP_STEP: usize = 4096;

/// A gzip-encoded upload body decoded as it arrives (an octet-stream upload has no size
/// bound, so it is never held whole).
fn gunzip_stream<S>(
    body: S,
    bad_gzip: Arc<OnceLock<String>>,
) -> impl futures_util::Stream<Item = std::io::Result<bytes::Bytes>> + Send
where
    S: futures_util::Stream<Item = std::io::Result<bytes::Bytes>> + Send + Unpin,
{
    use futures_util::StreamExt;
    use std::io::Write;
    struct State<S> {
        body: S,
        pending: bytes::Bytes,
        decoder: Option<flate2::write::GzDecoder<Vec<u8>>>,
        bad_gzip: Arc<OnceLock<String>>,
    }
    let state = State {
        body,
        pending: bytes::Bytes::new(),
        decoder: Some(flate2::write::GzDecoder::new(Vec::new())),
        bad_gzip,
    };
    futures_util::stream::unfold(state, |mut st| async move {
        loop {
            let decoder = st.decoder.as_mut()?;
            if !st.pending.is_empty() {
                let step = st.pending.split_to(st.pending.len().min(GUNZIP_STEP));
                if let Err(e) = decoder.write_all(&step) {
                    st.decoder = None;
                    return Some((Err(gzip_error(e, &st.bad_gzip)), st));
                }
                let out = std::mem::take(decoder.get_mut());
                if !out.is_empty() {
                    return Some((Ok(bytes::Bytes::from(out)), st));
                }
                continue;
            }
            match st.body.next().await {
                Some(Ok(chunk)) => st.pending = chunk,
                Some(Err(e)) => {
                    st.decoder = None;
                    return Some((Err(e), st));
                }
                None => {
                    let mut decoder = st.decoder.take()?;
                    // A truncated stream is an error, not a short file.
                    let item = match decoder.try_finish() {
                        Ok(()) => Ok(bytes::Bytes::from(std::mem::take(decoder.get_mut()))),
                        Err(e) => Err(gzip_error(e, &st.bad_gzip)),
                    };
                    return Some((item, st));
                }
            }
        }
    })
}

fn gzip_error(e: std::io::Error, bad_gzip: &OnceLock<String>) -> std::io::Error {
    let _ = bad_gzip.set(e.to_string());
    std::io::Error::new(std::io::ErrorKind::InvalidData, format!("gzip body: {e}"))
}

/// The `boundary` parameter of a multipart Content-Type.
fn boundary_of(content_type: &str) -> Option<String> {
    content_type.split(';').skip(1).find_map(|param| {
        let (name, value) = param.trim().split_once('=')?;
        name.trim()
            .eq_ignore_ascii_case("boundary")
            .then(|| value.trim().trim_matches('"').to_owned())
            .filter(|b| !b.is_empty())
    })
}

fn find(haystack: &[u8], needle: &[u8], from: usize) -> Option<usize> {
    haystack
        .get(from..)?
        .windows(needle.len())
        .position(|w| w == needle)
        .map(|i| i + from)
}

/// One part of a multipart body: its filename (the file's path) and bytes.
type Part = (Option<String>, Vec<u8>);

/// The parts of a `multipart/form-data` body: each one's filename and bytes.
fn parse_multipart(body: &[u8], boundary: &str) -> Result<Vec<Part>, E2bError> {
    let malformed = |why: &str| {
        E2bError::new(
            StatusCode::BAD_REQUEST,
            format!("malformed multipart/form-data body: {why}"),
        )
    };
    let delimiter = format!("--{boundary}");
    let next = format!("\r\n--{boundary}");
    let mut at = find(body, delimiter.as_bytes(), 0).ok_or_else(|| malformed("no boundary"))?
        + delimiter.len();
    let mut parts = Vec::new();
    loop {
        if body.get(at..at + 2) == Some(b"--") {
            return Ok(parts);
        }
        // The line break after the delimiter.
        at = find(body, b"\r\n", at)
            .ok_or_else(|| malformed("a delimiter without a line break"))?
            + 2;
        let head_end =
            find(body, b"\r\n\r\n", at).ok_or_else(|| malformed("a part without headers' end"))?;
        let head = String::from_utf8_lossy(&body[at..head_end]).into_owned();
        let data_start = head_end + 4;
        let data_end = find(body, next.as_bytes(), data_start)
            .ok_or_else(|| malformed("a part without a closing boundary"))?;
        let filename = head.lines().find_map(|line| {
            let (name, value) = line.split_once(':')?;
            if !name.trim().eq_ignore_ascii_case("content-disposition") {
                return None;
            }
            value.split(';').find_map(|p| {
                let (k, v) = p.trim().split_once('=')?;
                (k.trim() == "filename").then(|| v.trim().trim_matches('"').to_owned())
            })
        });
        parts.push((filename, body[data_start..data_end].to_vec()));
        at = data_end + next.len();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_multipart_body_as_httpx_sends_it_gives_each_files_path_and_bytes() {
        let body = b"--xyz\r\nContent-Disposition: form-data; name=\"file\"; filename=\"a/b.txt\"\r\nContent-Type: application/octet-stream\r\n\r\nhello\r\n--xyz\r\nContent-Disposition: form-data; name=\"file\"; filename=\"/abs\"\r\n\r\n\r\n--x\r\n--xyz--\r\n";
        let parts = parse_multipart(body, "xyz").unwrap();
        assert_eq!(parts.len(), 2);
        assert_eq!(parts[0], (Some("a/b.txt".into()), b"hello".to_vec()));
        assert_eq!(parts[1], (Some("/abs".into()), b"\r\n--x".to_vec()));
        assert_eq!(
            boundary_of("multipart/form-data; boundary=\"xyz\""),
            Some("xyz".into())
        );
    }

    fn gunzip_chunks(chunks: Vec<Vec<u8>>) -> std::io::Result<Vec<u8>> {
        use futures_util::StreamExt;
        let body = futures_util::stream::iter(
            chunks
                .into_iter()
                .map(|c| Ok::<_, std::io::Error>(bytes::Bytes::from(c))),
        );
        let rt = tokio::runtime::Builder::new_current_thread()
            .build()
            .map_err(std::io::Error::other)?;
        rt.block_on(async {
            let mut out = Vec::new();
            let mut s = std::pin::pin!(gunzip_stream(body, Arc::new(OnceLock::new())));
            while let Some(chunk) = s.next().await {
                out.extend_from_slice(&chunk?);
            }
            Ok(out)
        })
    }

    #[test]
    fn a_gzip_upload_body_decodes_whatever_its_chunking_and_a_truncated_one_fails() {
        use std::io::Write;
        let plain: Vec<u8> = (0..200_000u32)
            .flat_map(|i| (i % 251).to_le_bytes())
            .collect();
        let mut enc = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
        enc.write_all(&plain).unwrap();
        let gz = enc.finish().unwrap();
        assert_eq!(gunzip_chunks(vec![gz.clone()]).unwrap(), plain);
        let small: Vec<Vec<u8>> = gz.chunks(7).map(<[u8]>::to_vec).collect();
        assert_eq!(gunzip_chunks(small).unwrap(), plain);
        let cut = gunzip_chunks(vec![gz[..gz.len() / 2].to_vec()]).unwrap_err();
        assert_eq!(cut.kind(), std::io::ErrorKind::InvalidData);
        assert!(gunzip_chunks(vec![b"not gzip at all".to_vec()]).is_err());
        assert_eq!(gunzip_whole(&gz).unwrap(), plain);
    }

    #[test]
    fn relative_paths_and_the_tilde_are_under_the_home_directory_as_in_the_rpcs() {
        use super::super::resolve;
        assert_eq!(resolve("/home/user", "a.txt"), "/home/user/a.txt");
        assert_eq!(resolve("/home/user", "./a.txt"), "/home/user/a.txt");
        assert_eq!(resolve("/tmp", "."), "/tmp");
        assert_eq!(resolve("/tmp", ""), "/tmp");
        assert_eq!(resolve("/home/user", "/etc/x"), "/etc/x");
        assert_eq!(resolve("/home/user", "~"), "/home/user");
        assert_eq!(resolve("/home/user", "~/a/b"), "/home/user/a/b");
        assert_eq!(resolve("/home/user", "~//etc"), "/home/user/etc");
        assert_eq!(resolve("/", "a"), "/a");
        assert_eq!(resolve("/", "~/a"), "/a");
        assert_eq!(resolve("/home/user", "~user"), "/home/user/~user");
    }
}
