//! An image moved from one store to another over a byte stream, as a fleet's router copies
//! images and E2B templates between nodes: [`Store::export_for_transfer`] writes the image's
//! OCI archive and names its sha256; [`receive`] writes the stream on the other side and
//! checks it against that digest; [`Store::import_transfer`] loads it (the image keeps its
//! id) under the name asked for.

use crate::{ArchiveFormat, Image, ImageError, PullOptions, Store};
use futures_util::{Stream, StreamExt};
use sha2::{Digest as _, Sha256};
use std::io::{Read, Seek};
use std::path::Path;
use tokio::io::AsyncWriteExt;

/// An image's archive ready to send: open, and already unlinked (nothing is left behind
/// whatever happens to the transfer).
#[derive(Debug)]
pub struct Outgoing {
    /// The archive, at its start.
    pub file: std::fs::File,
    /// Its size in bytes.
    pub size: u64,
    /// Its sha256, `sha256:HEX`.
    pub digest: String,
}

/// Why [`receive`] kept nothing.
#[derive(Debug, thiserror::Error)]
pub enum ReceiveError {
    /// The stream was longer than allowed.
    #[error("the archive is larger than {0} bytes")]
    TooLarge(u64),
    /// The bytes are not the digest's: tampered, or cut short.
    #[error("the archive's digest is sha256:{got}, not sha256:{want} (tampered or cut)")]
    Mismatch {
        /// What the bytes hash to (hex).
        got: String,
        /// What they were named by (hex).
        want: String,
    },
    /// The stream failed.
    #[error("reading the archive: {0}")]
    Stream(String),
    /// Writing it failed.
    #[error("storing the archive: {0}")]
    Io(#[from] std::io::Error),
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// Whether `digest` is `sha256:` and 64 hex digits; the hex part if so.
pub fn sha256_hex(digest: &str) -> Option<&str> {
    let hex = digest.strip_prefix("sha256:")?;
    (hex.len() == 64 && hex.bytes().all(|b| b.is_ascii_hexdigit())).then_some(hex)
}

/// Writes `chunks` to `path` (at most `max` bytes) and checks their sha256 against `want`
/// (hex). On an error `path` may hold part of it: the caller removes it.
pub async fn receive<S, B, E>(
    mut chunks: S,
    path: &Path,
    want: &str,
    max: u64,
) -> Result<(), ReceiveError>
where
    S: Stream<Item = Result<B, E>> + Unpin,
    B: AsRef<[u8]>,
    E: std::fmt::Display,
{
    let mut file = tokio::fs::File::create(path).await?;
    let mut hasher = Sha256::new();
    let mut size = 0u64;
    while let Some(chunk) = chunks.next().await {
        let chunk = chunk.map_err(|e| ReceiveError::Stream(e.to_string()))?;
        let chunk = chunk.as_ref();
        size += chunk.len() as u64;
        if size > max {
            return Err(ReceiveError::TooLarge(max));
        }
        hasher.update(chunk);
        file.write_all(chunk).await?;
    }
    file.flush().await?;
    let got = hex(&hasher.finalize());
    if !got.eq_ignore_ascii_case(want) {
        return Err(ReceiveError::Mismatch {
            got,
            want: want.to_owned(),
        });
    }
    Ok(())
}

impl Store {
    /// `reference`'s image as an OCI archive written under `scratch` (a directory of the
    /// caller's), opened, unlinked, hashed.
    pub fn export_for_transfer(
        &self,
        reference: &str,
        scratch: &Path,
    ) -> Result<Outgoing, ImageError> {
        if self.get(reference)?.is_none() {
            return Err(ImageError::NotFound(reference.to_owned()));
        }
        std::fs::create_dir_all(scratch)
            .map_err(|e| ImageError::io("make the directory", scratch, e))?;
        let mut suffix = [0u8; 8];
        getrandom::fill(&mut suffix)
            .map_err(|e| ImageError::io("name the archive", scratch, std::io::Error::other(e)))?;
        let path = scratch.join(format!(".export-{}.tar", hex(&suffix)));
        let opened = self
            .save(reference, ArchiveFormat::OciArchive, &path)
            .and_then(|_| {
                std::fs::File::open(&path).map_err(|e| ImageError::io("open the archive", &path, e))
            });
        let _ = std::fs::remove_file(&path);
        let mut file = opened?;
        let mut hasher = Sha256::new();
        let mut buf = vec![0u8; 1 << 20];
        let mut size = 0u64;
        loop {
            let n = file
                .read(&mut buf)
                .map_err(|e| ImageError::io("read the archive", &path, e))?;
            if n == 0 {
                break;
            }
            hasher.update(&buf[..n]);
            size += n as u64;
        }
        file.rewind()
            .map_err(|e| ImageError::io("read the archive", &path, e))?;
        Ok(Outgoing {
            file,
            size,
            digest: format!("sha256:{}", hex(&hasher.finalize())),
        })
    }

    /// Loads the archive `file` ([`Store::export_for_transfer`]'s, received) and names its
    /// image `name` as well.
    pub async fn import_transfer(&self, file: &Path, name: &str) -> Result<Image, ImageError> {
        let image = self.load_archive(file, &PullOptions::default()).await?;
        self.tag(&image.id, name)?;
        Ok(image)
    }
}
