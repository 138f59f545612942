//! filesystem tests
