//! Integration tests of lockbox-journal, one binary: `cargo test -p lockbox-journal --test it`.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod backend_damage;
/// Fixtures of every backend and the conformance suite (`conformance_suite!`).
#[macro_use]
mod common;
mod conformance_file;
mod conformance_postgres;
mod conformance_sqlite;
mod crash;
mod exactly_once;
mod postgres_connection;
