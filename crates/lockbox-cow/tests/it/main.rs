//! Integration tests of lockbox-cow, one binary: `cargo test -p lockbox-cow --test it`.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;
mod cow;
mod crash;
mod hunks;
mod layers;
mod prop;
/// The shell-script model of a change (also used by lockbox-cli's workdir tests).
#[path = "common/script.rs"]
mod script;
mod snapshots;
