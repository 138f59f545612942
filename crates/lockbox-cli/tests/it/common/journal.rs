//! A real SQLite journal written by the library, for the tests that read one back
//! (`lockbox journal`, the server's `/v1/journal` routes).
#![allow(clippy::unwrap_used)]

use lockbox_journal::{Journal, RunId, SqliteStorage, StartOptions};
use serde_json::Value;
use std::path::Path;
use std::sync::Arc;

/// Creates the journal `db` with one run, `id`, that recorded `steps` (name, result) in
/// order and is still running; returns the journal's URL (`sqlite:<db>`).
pub async fn with_a_run(db: &Path, id: &str, steps: &[(&str, Value)]) -> String {
    let journal = Journal::open(Arc::new(SqliteStorage::open(db).unwrap()));
    let run = journal
        .start(&RunId::parse(id).unwrap(), StartOptions::default())
        .await
        .unwrap();
    for (name, result) in steps {
        let result = result.clone();
        let _: Value = run
            .record(name, || async move { Ok::<_, String>(result) })
            .await
            .unwrap();
    }
    format!("sqlite:{}", db.display())
}
