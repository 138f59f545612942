//! Integration tests of lockbox-runtime, one binary: `cargo test -p lockbox-runtime --test it`.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod audit;
mod common;
mod contexts;
mod credentials;
mod files_workspace;
mod fork_cycles;
mod forks;
mod gather;
mod hardening;
mod image;
mod network;
mod pool;
mod ports;
mod processes;
mod sessions;
mod snapshots;
mod templates;
mod watch;
