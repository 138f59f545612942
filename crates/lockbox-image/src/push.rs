//! The push side of the distribution protocol, and [`Store::push`].
//!
//! A blob is first asked for with `HEAD /v2/<name>/blobs/<digest>`: a registry that has it
//! gets nothing more. Otherwise an upload is started (`POST /v2/<name>/blobs/uploads/`) and
//! the blob sent in one `PUT …?digest=` when it is at most [`PushOptions::chunk_bytes`],
//! else in `PATCH` chunks (`Content-Range`) closed by an empty `PUT …?digest=`. The
//! manifest goes last (`PUT /v2/<name>/manifests/<tag>`, `Content-Type` its media type),
//! so a registry never names an image whose blobs it lacks. Authentication is the pull's
//! (Bearer token for `pull,push`, or Basic, from the same credentials file).

use crate::archive::ExportLayer;
use crate::digest::Digest;
use crate::error::ImageError;
use crate::reference::{Reference, Source};
use crate::registry::Registry;
use crate::store::{flock, Store};
use rustix::fs::FlockOperation;
use serde::Serialize;
use std::io::Read;
use std::path::{Path, PathBuf};
use std::sync::atomic::Ordering;

/// How to push.
#[derive(Debug, Clone)]
pub struct PushOptions {
    /// Registries that may be reached over plain http (loopback ones always may).
    pub insecure_registries: Vec<String>,
    /// The credentials file (default `$REGISTRY_AUTH_FILE`, else `~/.docker/config.json`).
    pub auth_file: Option<PathBuf>,
    /// A blob larger than this is sent in chunks of this size (default 16 MiB).
    pub chunk_bytes: u64,
    /// Which registry certificates are trusted besides the system's roots.
    pub tls: crate::Tls,
}

impl Default for PushOptions {
    fn default() -> Self {
        PushOptions {
            insecure_registries: Vec::new(),
            auth_file: None,
            chunk_bytes: 16 << 20,
            tls: crate::Tls::default(),
        }
    }
}

/// What [`Store::push`] did.
#[derive(Debug, Clone, Serialize)]
pub struct Pushed {
    /// The image's id (its config's digest).
    pub id: String,
    /// Where it went (`registry/repository:tag`).
    pub reference: String,
    /// The manifest's digest: `REGISTRY/REPO@DIGEST` pulls exactly this image.
    pub manifest: String,
    /// Blobs sent.
    pub blobs_uploaded: usize,
    /// Blobs the registry had already.
    pub blobs_skipped: usize,
    /// Bytes sent.
    pub bytes_uploaded: u64,
    /// Layers written again from their unpacked directories (the store had no blob).
    pub layers_regenerated: usize,
}

impl Registry {
    fn url(&self, path: &str) -> String {
        format!("{}/v2/{}/{path}", self.base(), self.repository())
    }

    /// Sends one request, answering one authentication challenge; the response is returned
    /// whatever its status (but a 401 after authenticating is [`ImageError::Unauthorized`]).
    async fn send(
        &self,
        method: reqwest::Method,
        url: &str,
        content_type: Option<&str>,
        extra: &[(&str, String)],
        body: Option<&[u8]>,
        step: &str,
    ) -> Result<reqwest::Response, ImageError> {
        let mut tried_auth = false;
        loop {
            let mut req = self.client().request(method.clone(), url);
            if let Some(t) = content_type {
                req = req.header(reqwest::header::CONTENT_TYPE, t);
            }
            for (k, v) in extra {
                req = req.header(*k, v.as_str());
            }
            if let Some(b) = body {
                req = req
                    .header(reqwest::header::CONTENT_LENGTH, b.len())
                    .body(b.to_vec());
            } else if method == reqwest::Method::PUT || method == reqwest::Method::POST {
                req = req.header(reqwest::header::CONTENT_LENGTH, 0);
            }
            if let Some(auth) = self.current_auth().await {
                req = req.header(reqwest::header::AUTHORIZATION, auth);
            }
            let resp = req
                .send()
                .await
                .map_err(|e| self.error(step, crate::registry::chain(&e)))?;
            if resp.status() == reqwest::StatusCode::UNAUTHORIZED {
                if tried_auth {
                    return Err(ImageError::Unauthorized {
                        registry: self.host().to_owned(),
                        reason: format!("{step}: 401 after authenticating"),
                    });
                }
                tried_auth = true;
                let challenge = resp
                    .headers()
                    .get(reqwest::header::WWW_AUTHENTICATE)
                    .and_then(|v| v.to_str().ok())
                    .unwrap_or("")
                    .to_owned();
                self.answer_challenge(&challenge).await?;
                continue;
            }
            return Ok(resp);
        }
    }

    async fn expect(
        &self,
        resp: reqwest::Response,
        ok: &[u16],
        step: &str,
    ) -> Result<reqwest::Response, ImageError> {
        let status = resp.status();
        if ok.contains(&status.as_u16()) {
            return Ok(resp);
        }
        if status == reqwest::StatusCode::FORBIDDEN {
            return Err(ImageError::Unauthorized {
                registry: self.host().to_owned(),
                reason: format!("{step}: HTTP 403 (no push access to {})", self.repository()),
            });
        }
        let body = crate::registry::read_bounded_prefix(resp, 512).await;
        Err(self.error(
            step,
            format!(
                "HTTP {status}{}",
                if body.is_empty() {
                    String::new()
                } else {
                    format!(": {body}")
                }
            ),
        ))
    }

    /// The upload URL a response's `Location` names (relative to the registry, or absolute).
    fn location(&self, resp: &reqwest::Response, step: &str) -> Result<reqwest::Url, ImageError> {
        let loc = resp
            .headers()
            .get(reqwest::header::LOCATION)
            .and_then(|v| v.to_str().ok())
            .ok_or_else(|| self.error(step, "the registry sent no upload Location"))?;
        let base = reqwest::Url::parse(&self.base())
            .map_err(|e| self.error(step, format!("base URL: {e}")))?;
        base.join(loc)
            .map_err(|e| self.error(step, format!("Location {loc:?}: {e}")))
    }

    /// Whether the repository has blob `digest`.
    pub async fn has_blob(&self, digest: &Digest) -> Result<bool, ImageError> {
        let step = format!("blob {digest} (HEAD)");
        let resp = self
            .send(
                reqwest::Method::HEAD,
                &self.url(&format!("blobs/{digest}")),
                None,
                &[],
                None,
                &step,
            )
            .await?;
        match resp.status().as_u16() {
            200 => Ok(true),
            404 => Ok(false),
            _ => self.expect(resp, &[200], &step).await.map(|_| true),
        }
    }

    /// Uploads the file `file` (`size` bytes, digest `digest`): one PUT when it is at most
    /// `chunk` bytes, else PATCH chunks and a closing PUT.
    pub async fn upload_blob(
        &self,
        digest: &Digest,
        file: &Path,
        size: u64,
        chunk: u64,
    ) -> Result<(), ImageError> {
        let step = format!("upload blob {digest}");
        let resp = self
            .send(
                reqwest::Method::POST,
                &self.url("blobs/uploads/"),
                None,
                &[],
                None,
                &step,
            )
            .await?;
        let resp = self.expect(resp, &[202], &step).await?;
        let mut at = self.location(&resp, &step)?;
        let mut f =
            std::fs::File::open(file).map_err(|e| ImageError::io("open a blob", file, e))?;
        let chunk = chunk.max(1);
        let mut buf = Vec::new();
        let last_body = if size <= chunk {
            f.read_to_end(&mut buf)
                .map_err(|e| ImageError::io("read a blob", file, e))?;
            Some(buf)
        } else {
            let mut sent = 0u64;
            while sent < size {
                buf.clear();
                (&mut f)
                    .take(chunk)
                    .read_to_end(&mut buf)
                    .map_err(|e| ImageError::io("read a blob", file, e))?;
                if buf.is_empty() {
                    return Err(ImageError::io(
                        "read a blob",
                        file,
                        std::io::Error::other("shorter than its size"),
                    ));
                }
                let end = sent + buf.len() as u64 - 1;
                let resp = self
                    .send(
                        reqwest::Method::PATCH,
                        at.as_str(),
                        Some("application/octet-stream"),
                        &[("Content-Range", format!("{sent}-{end}"))],
                        Some(&buf),
                        &step,
                    )
                    .await?;
                let resp = self.expect(resp, &[202, 204], &step).await?;
                at = self.location(&resp, &step)?;
                sent += buf.len() as u64;
            }
            None
        };
        at.query_pairs_mut().append_pair("digest", digest.as_str());
        let resp = self
            .send(
                reqwest::Method::PUT,
                at.as_str(),
                Some("application/octet-stream"),
                &[],
                last_body.as_deref(),
                &step,
            )
            .await?;
        self.expect(resp, &[201, 204], &step).await?;
        Ok(())
    }

    /// PUTs a manifest under `reference` (a tag or its digest) with its media type, and
    /// checks the digest the registry reports (when it does).
    pub async fn put_manifest(
        &self,
        reference: &str,
        media_type: &str,
        bytes: &[u8],
        digest: &Digest,
    ) -> Result<(), ImageError> {
        let step = format!("manifest {}:{reference} (PUT)", self.repository());
        let resp = self
            .send(
                reqwest::Method::PUT,
                &self.url(&format!("manifests/{reference}")),
                Some(media_type),
                &[],
                Some(bytes),
                &step,
            )
            .await?;
        let resp = self.expect(resp, &[201, 202, 204], &step).await?;
        if let Some(d) = resp
            .headers()
            .get("docker-content-digest")
            .and_then(|v| v.to_str().ok())
            .and_then(|v| Digest::parse(v).ok())
        {
            if &d != digest {
                return Err(ImageError::DigestMismatch {
                    what: step,
                    expected: digest.to_string(),
                    actual: d.to_string(),
                });
            }
        }
        Ok(())
    }
}

impl Store {
    /// Pushes image `reference_or_id` to a registry: to `dest` if given, else to the
    /// registry reference it was asked by. Blobs the registry has are not sent; the
    /// manifest (as pulled, or made for the image as `save` makes it) goes last.
    pub async fn push(
        &self,
        reference_or_id: &str,
        dest: Option<&str>,
        opts: &PushOptions,
    ) -> Result<Pushed, ImageError> {
        let target = dest.unwrap_or(reference_or_id);
        let dest_ref: Reference = match Source::parse(target)? {
            Source::Registry(r) => r,
            _ => {
                return Err(ImageError::BadReference {
                    reference: target.to_owned(),
                    reason: "a push needs a registry reference (HOST[:PORT]/REPO[:TAG]); \
                             use `lockbox image save` for an archive"
                        .into(),
                })
            }
        };
        let _shared = {
            let p = self.path().join("store.lock");
            tokio::task::spawn_blocking(move || flock(&p, FlockOperation::LockShared))
                .await
                .map_err(|e| {
                    ImageError::io("lock", PathBuf::new(), std::io::Error::other(e.to_string()))
                })??
        };
        let export = self.export(reference_or_id)?;
        let work = self.work()?;
        let registry = Registry::new(
            &dest_ref,
            &opts.insecure_registries,
            opts.auth_file.as_deref(),
            &opts.tls,
        )?;
        registry.set_push();
        let mut report = Pushed {
            id: export.image.id.clone(),
            reference: dest_ref.to_string(),
            manifest: export.manifest_digest.to_string(),
            blobs_uploaded: 0,
            blobs_skipped: 0,
            bytes_uploaded: 0,
            layers_regenerated: 0,
        };
        let mut done = std::collections::BTreeSet::new();
        for l in &export.layers {
            if !done.insert(l.desc.digest.clone()) {
                continue;
            }
            if registry.has_blob(&l.desc.digest).await? {
                report.blobs_skipped += 1;
                continue;
            }
            let file = self.blob_file_for(l, &work.dir)?;
            if l.blob.is_none() {
                report.layers_regenerated += 1;
            }
            registry
                .upload_blob(&l.desc.digest, &file, l.desc.size, opts.chunk_bytes)
                .await?;
            report.blobs_uploaded += 1;
            report.bytes_uploaded += l.desc.size;
        }
        if registry.has_blob(&export.config_digest).await? {
            report.blobs_skipped += 1;
        } else {
            let file = work.dir.join("config");
            std::fs::write(&file, &export.config)
                .map_err(|e| ImageError::io("write the config", &file, e))?;
            registry
                .upload_blob(
                    &export.config_digest,
                    &file,
                    export.config.len() as u64,
                    opts.chunk_bytes,
                )
                .await?;
            report.blobs_uploaded += 1;
            report.bytes_uploaded += export.config.len() as u64;
        }
        let tag = dest_ref
            .tag
            .clone()
            .unwrap_or_else(|| export.manifest_digest.to_string());
        if let Some(d) = &dest_ref.digest {
            if d != &export.manifest_digest {
                return Err(ImageError::BadReference {
                    reference: target.to_owned(),
                    reason: format!(
                        "it pins {d}, but the image's manifest is {}",
                        export.manifest_digest
                    ),
                });
            }
        }
        registry
            .put_manifest(
                &tag,
                &export.manifest_media_type,
                &export.manifest,
                &export.manifest_digest,
            )
            .await?;
        report.bytes_uploaded += export.manifest.len() as u64;
        Ok(report)
    }

    /// The file a layer's blob is sent from: the stored blob, or its tar stream written
    /// again (and verified) under `work`.
    fn blob_file_for(&self, l: &ExportLayer, work: &Path) -> Result<PathBuf, ImageError> {
        match &l.blob {
            Some(b) => Ok(b.clone()),
            None => {
                let tmp = work.join(format!("blob-{}", l.desc.digest.hex()));
                self.layer_blob_to(l, &tmp)?;
                Ok(tmp)
            }
        }
    }
}

impl Registry {
    /// Ask tokens for `pull,push` from now on.
    pub fn set_push(&self) {
        self.push_flag().store(true, Ordering::Relaxed);
    }
}
