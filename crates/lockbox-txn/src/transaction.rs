//! [`Transaction`]: a pipeline or a gather, for code that handles either (the CLI's report,
//! a journaled transaction step).

use crate::{Gather, Pipeline, PreparedTxn, TxnError, TxnOutcome};

/// A pipeline or a gather, ready to run.
#[derive(Debug, Clone)]
pub enum Transaction {
    /// Sequential stages.
    Pipeline(Pipeline),
    /// Parallel sources, then a consumer (boxed: its consumer makes it large).
    Gather(Box<Gather>),
}

impl Transaction {
    /// Runs everything and keeps the layers (see [`Pipeline::prepare`]).
    pub fn prepare(&self) -> Result<PreparedTxn, TxnError> {
        match self {
            Transaction::Pipeline(p) => p.prepare(),
            Transaction::Gather(g) => g.prepare(),
        }
    }

    /// Runs everything and commits on success.
    pub fn run(&self) -> Result<TxnOutcome, TxnError> {
        crate::options::run(self.prepare()?)
    }

    /// Runs everything, reports the union of changes, commits nothing.
    pub fn dry_run(&self) -> Result<TxnOutcome, TxnError> {
        crate::options::dry_run(self.prepare()?)
    }

    /// Runs under the id derived from `key` (see [`crate::TxnOptions::key`]).
    pub fn key(self, key: &str) -> Transaction {
        match self {
            Transaction::Pipeline(p) => Transaction::Pipeline(p.key(key)),
            Transaction::Gather(g) => Transaction::Gather(Box::new(g.key(key))),
        }
    }
}

impl From<Pipeline> for Transaction {
    fn from(p: Pipeline) -> Transaction {
        Transaction::Pipeline(p)
    }
}

impl From<Gather> for Transaction {
    fn from(g: Gather) -> Transaction {
        Transaction::Gather(Box::new(g))
    }
}
