//! lockbox-e2b's end-to-end tests, one binary: E2B's envd protocol served over HTTP by
//! `lockbox_e2b::wrap` on a real runtime and real sandboxes, driven the way the E2B SDK
//! drives it (Connect RPC, JSON and binary codecs), as root and again as uid 65534.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod common;
mod control;
mod envd;
mod filesystem;
mod network;
mod pool;
mod process;
mod restart;
mod template_start;
