//! Integration tests of lockbox-txn, one binary: `cargo test -p lockbox-txn --test it`.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod armed;
mod common;
mod concurrency;
mod crash;
mod gather;
mod hostile_names;
#[cfg(feature = "journaled")]
mod journaled;
mod layer_gather;
mod pipeline;
mod writable;
