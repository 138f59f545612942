//! The conformance suite: behaviour every [`Storage`] backend must show through the journal
//! API. Scenarios from the step-journal concurrency spec are named after it.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use lockbox_journal::{
    Branches, EntryBody, ForkPoint, Journal, JournalError, RawEntry, RecordOptions, RunId,
    RunState, StartOptions, StepError, StepId, StepOutcome, StorageError, Suspension,
    TerminalState, TxnId, TxnOutcome, TxnOutcomeStore, TxnStoreError,
};
use serde::{Deserialize, Serialize};
use serde_json::json;

pub use super::Fixture;

pub fn id(s: &str) -> RunId {
    RunId::parse(s).unwrap()
}

pub fn opts() -> StartOptions {
    StartOptions::default()
}

pub fn journal(f: &Fixture) -> Journal {
    Journal::open(Arc::clone(&f.storage))
}

pub async fn step_ids(j: &Journal, run: &RunId) -> Vec<String> {
    j.entries(run, 0)
        .await
        .unwrap()
        .into_iter()
        .filter_map(|e| match e.body {
            EntryBody::Step { step_id, .. } => Some(step_id.as_str().to_owned()),
            _ => None,
        })
        .collect()
}

mod concurrency;
mod lifecycle;
mod steps;
mod storage;

pub use concurrency::*;
pub use lifecycle::*;
pub use steps::*;
pub use storage::*;
