//! Integration tests of lockbox-cli (the real `lockbox` binary), one binary:
//! `cargo test -p lockbox-cli --test it`.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod branch_hunks;
mod build;
mod common;
mod doc_examples;
mod docs;
mod edges;
mod escape;
mod escape_net;
mod host_spend;
mod image;
mod image_transfer;
mod journal;
mod mcp;
mod names;
mod net;
mod net_credentials;
mod net_names;
mod pre_arm;
mod run;
mod serve;
mod serve_approvals;
mod serve_hostile;
mod serve_image;
mod serve_image_commit;
mod serve_ports;
mod serve_shapes;
mod serve_support;
mod snapshots;
mod txn;
mod workdir;
