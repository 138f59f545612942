//! The host's dynamic loader and shared libraries of the agent, for a sandbox on an image
//! root (issue 29): the agent is a host binary linked against the host's libc, which an
//! image need not have (busybox and Alpine images have no glibc at all). So the loader and
//! the libraries it resolves for the agent are bound read-only in lockbox's own `/dev`
//! beside the agent ([`LOADER_PATH`], [`LIB_DIR`]), and the agent is started through that
//! loader (`LOADER --library-path LIB_DIR AGENT ARGS`): the agent runs on the host's libc,
//! while the commands it starts run on the image's (nothing is put in their environment).
//!
//! The libraries are what the loader itself says it would load (`LOADER --list AGENT`, what
//! `ldd` runs), so `DT_RUNPATH`, `ld.so.cache` and dependencies of dependencies resolve as
//! on the host. A statically linked agent (no `PT_INTERP`) needs neither.

use crate::SetupError;
use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::Mutex;

/// Where the agent's loader is bound inside a sandbox on an image root.
pub const LOADER_PATH: &str = "/dev/.lockbox-ld.so";
/// The directory of lockbox's own `/dev` holding the agent's shared libraries there.
pub const LIB_DIR: &str = "/dev/.lockbox-lib";

/// The loader of an agent binary and the libraries it loads for it.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct AgentLoader {
    /// The host's loader (the binary's `PT_INTERP`).
    pub loader: PathBuf,
    /// (name the binary needs it by, host path), bound at `LIB_DIR/NAME`.
    pub libs: Vec<(String, PathBuf)>,
}

/// The loader and libraries of the host binary `exe` (canonical path); `None` for a
/// statically linked one. Remembered per path and modification time.
pub(crate) fn of(exe: &Path) -> Result<Option<AgentLoader>, SetupError> {
    type Cache = HashMap<(PathBuf, Option<std::time::SystemTime>), Option<AgentLoader>>;
    static CACHE: Mutex<Option<Cache>> = Mutex::new(None);
    let failed = |e: std::io::Error| SetupError::Path {
        path: exe.to_owned(),
        what: "finding the agent's loader and libraries",
        source: e,
    };
    let mtime = std::fs::metadata(exe).and_then(|m| m.modified()).ok();
    let key = (exe.to_owned(), mtime);
    if let Some(found) = CACHE
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .as_ref()
        .and_then(|c| c.get(&key))
    {
        return Ok(found.clone());
    }
    let bytes = std::fs::read(exe).map_err(failed)?;
    let found = match interpreter(&bytes).map_err(failed)? {
        None => None,
        Some(loader) => {
            let out = std::process::Command::new(&loader)
                .arg("--list")
                .arg(exe)
                .env_clear()
                .stdin(std::process::Stdio::null())
                .stderr(std::process::Stdio::null())
                .output()
                .map_err(|e| SetupError::Path {
                    path: loader.clone(),
                    what: "running the agent's loader with --list",
                    source: e,
                })?;
            if !out.status.success() {
                return Err(failed(std::io::Error::other(format!(
                    "{} --list failed ({})",
                    loader.display(),
                    out.status
                ))));
            }
            let libs = parse_list(&String::from_utf8_lossy(&out.stdout)).map_err(failed)?;
            Some(AgentLoader { loader, libs })
        }
    };
    CACHE
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .get_or_insert_with(HashMap::new)
        .insert(key, found.clone());
    Ok(found)
}

/// The `PT_INTERP` of an ELF64 little-endian executable (what x86_64 and aarch64 run), if
/// it has one.
fn interpreter(elf: &[u8]) -> std::io::Result<Option<PathBuf>> {
    use std::os::unix::ffi::OsStrExt;
    let bad = |why: &str| std::io::Error::other(format!("not an ELF64 executable: {why}"));
    if elf.get(..4) != Some(b"\x7fELF") {
        return Err(bad("no ELF magic"));
    }
    if elf.get(4) != Some(&2) || elf.get(5) != Some(&1) {
        return Err(bad("not 64-bit little-endian"));
    }
    let u16_at = |at: usize| -> Option<u64> {
        Some(u64::from(u16::from_le_bytes(
            elf.get(at..at + 2)?.try_into().ok()?,
        )))
    };
    let u32_at = |at: usize| -> Option<u32> {
        Some(u32::from_le_bytes(elf.get(at..at + 4)?.try_into().ok()?))
    };
    let u64_at = |at: usize| -> Option<u64> {
        Some(u64::from_le_bytes(elf.get(at..at + 8)?.try_into().ok()?))
    };
    let as_usize = |v: u64| usize::try_from(v).ok();
    let phoff = u64_at(0x20)
        .and_then(as_usize)
        .ok_or_else(|| bad("header"))?;
    let phentsize = u16_at(0x36)
        .and_then(as_usize)
        .ok_or_else(|| bad("header"))?;
    let phnum = u16_at(0x38)
        .and_then(as_usize)
        .ok_or_else(|| bad("header"))?;
    const PT_INTERP: u32 = 3;
    for i in 0..phnum {
        let at = phoff + i * phentsize;
        if u32_at(at) != Some(PT_INTERP) {
            continue;
        }
        let offset = u64_at(at + 8).and_then(as_usize);
        let size = u64_at(at + 32).and_then(as_usize);
        let text = offset
            .zip(size)
            .and_then(|(o, s)| elf.get(o..o.checked_add(s)?))
            .ok_or_else(|| bad("PT_INTERP out of the file"))?;
        let text = text.split(|&b| b == 0).next().unwrap_or_default();
        return Ok(Some(PathBuf::from(std::ffi::OsStr::from_bytes(text))));
    }
    Ok(None)
}

/// The `NAME => PATH (ADDR)` lines of `ld.so --list`; the loader's own line and the vDSO
/// (no `=>`) are not libraries to bind. A library not found is an error naming it.
fn parse_list(text: &str) -> std::io::Result<Vec<(String, PathBuf)>> {
    let mut libs = Vec::new();
    for line in text.lines() {
        let Some((name, rest)) = line.trim().split_once(" => ") else {
            continue;
        };
        let path = rest.split(" (").next().unwrap_or_default().trim();
        if path == "not found" || !path.starts_with('/') {
            return Err(std::io::Error::other(format!(
                "the agent's library {name} is not found on the host"
            )));
        }
        if name.contains('/') || name.is_empty() {
            continue;
        }
        libs.push((name.to_owned(), PathBuf::from(path)));
    }
    Ok(libs)
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn the_loaders_list_gives_each_library_by_the_name_it_is_needed_by() {
        let text = "\tlinux-vdso.so.1 (0x00007ffd)\n\
                    \tlibgcc_s.so.1 => /lib/x86_64-linux-gnu/libgcc_s.so.1 (0x00007f1)\n\
                    \tlibc.so.6 => /lib/x86_64-linux-gnu/libc.so.6 (0x00007f2)\n\
                    \t/lib64/ld-linux-x86-64.so.2 (0x00007f3)\n";
        let libs = parse_list(text).unwrap();
        assert_eq!(
            libs,
            vec![
                (
                    "libgcc_s.so.1".into(),
                    "/lib/x86_64-linux-gnu/libgcc_s.so.1".into()
                ),
                ("libc.so.6".into(), "/lib/x86_64-linux-gnu/libc.so.6".into()),
            ]
        );
        assert!(parse_list("\tlibfoo.so.1 => not found\n").is_err());
    }

    #[test]
    fn this_test_binary_has_the_hosts_loader_and_its_libc() {
        let exe = std::fs::canonicalize(std::env::current_exe().unwrap()).unwrap();
        let found = of(&exe).unwrap().unwrap();
        assert!(found.loader.is_file(), "{found:?}");
        assert!(found
            .libs
            .iter()
            .any(|(n, p)| n.starts_with("libc.so") && p.is_file()));
    }

    #[test]
    fn a_file_that_is_not_elf_has_no_loader() {
        assert!(interpreter(b"#!/bin/sh\n").is_err());
    }
}
