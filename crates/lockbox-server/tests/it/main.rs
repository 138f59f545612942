//! Integration tests of lockbox-server, one binary: `cargo test -p lockbox-server --test it`.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod branches;
mod console;
mod http;
mod snapshot_transfer;
