//! Integration tests of lockbox-intercept, one binary: `cargo test -p lockbox-intercept --test it`.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod upstream_http2;
