//! Integration tests of lockbox-confine, one binary: `cargo test -p lockbox-confine --test it`.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod armed;
mod gate;
mod image;
mod overlay;
mod sequence;
mod stdio;
