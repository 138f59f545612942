//! The shared conformance suite against the file backend.
#![allow(clippy::unwrap_used, clippy::expect_used)] // test helpers outside #[test] fns

use crate::common;

conformance_suite!(common::file);
