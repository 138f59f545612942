//! Shared test support: backend fixtures and the conformance suite every backend must pass.
#![allow(dead_code)]

pub mod suite;

use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use lockbox_journal::{FileStorage, PostgresStorage, SqliteStorage, Storage};

type Reopen = Box<dyn Fn() -> Pin<Box<dyn Future<Output = Arc<dyn Storage>>>>>;

/// A fresh, empty journal of one backend, and a way to open it again (as a restarted process
/// would).
pub struct Fixture {
    pub storage: Arc<dyn Storage>,
    reopen: Reopen,
    _dir: Option<tempfile::TempDir>,
    /// PostgreSQL: `(url, schema)` to drop afterwards, so a shared server stays tidy.
    drop_schema: Option<(String, String)>,
}

impl Drop for Fixture {
    fn drop(&mut self) {
        let Some((url, schema)) = self.drop_schema.take() else {
            return;
        };
        // Drop runs inside the test's runtime: do the async cleanup on a thread of its own.
        let cleanup = std::thread::spawn(move || {
            let rt = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .unwrap();
            rt.block_on(async move {
                if let Ok((client, conn)) =
                    tokio_postgres::connect(&url, tokio_postgres::NoTls).await
                {
                    tokio::spawn(conn);
                    let _ = client
                        .batch_execute(&format!("DROP SCHEMA IF EXISTS {schema} CASCADE"))
                        .await;
                }
            });
        });
        let _ = cleanup.join();
    }
}

impl Fixture {
    pub async fn reopen(&self) -> Arc<dyn Storage> {
        (self.reopen)().await
    }
}

pub async fn sqlite() -> Option<Fixture> {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("journal.db");
    let storage: Arc<dyn Storage> = Arc::new(SqliteStorage::open(&path).unwrap());
    Some(Fixture {
        storage,
        reopen: Box::new(move || {
            let path = path.clone();
            Box::pin(
                async move { Arc::new(SqliteStorage::open(&path).unwrap()) as Arc<dyn Storage> },
            )
        }),
        _dir: Some(dir),
        drop_schema: None,
    })
}

pub async fn file() -> Option<Fixture> {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("runs");
    let storage: Arc<dyn Storage> = Arc::new(FileStorage::open(&path).unwrap());
    Some(Fixture {
        storage,
        reopen: Box::new(move || {
            let path = path.clone();
            Box::pin(async move { Arc::new(FileStorage::open(&path).unwrap()) as Arc<dyn Storage> })
        }),
        _dir: Some(dir),
        drop_schema: None,
    })
}

/// The PostgreSQL fixture: a fresh schema in the server named by `LOCKBOX_TEST_POSTGRES_URL`.
/// Unset: a loud skip, or a failure under `LOCKBOX_TEST_REQUIRE=all`.
pub async fn postgres() -> Option<Fixture> {
    let Ok(url) = std::env::var("LOCKBOX_TEST_POSTGRES_URL") else {
        lockbox_testkit::requirement(
            false,
            "LOCKBOX_TEST_POSTGRES_URL is unset (run `eval \"$(scripts/start-postgres.sh)\"`)",
        );
        return None;
    };
    static NEXT: AtomicU64 = AtomicU64::new(0);
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .subsec_nanos();
    let schema = format!(
        "lbt_{}_{}_{}",
        std::process::id(),
        NEXT.fetch_add(1, Ordering::Relaxed),
        nanos
    );
    let storage: Arc<dyn Storage> = Arc::new(
        PostgresStorage::connect_in_schema(&url, &schema)
            .await
            .unwrap(),
    );
    let drop_schema = Some((url.clone(), schema.clone()));
    Some(Fixture {
        storage,
        drop_schema,
        reopen: Box::new(move || {
            let (url, schema) = (url.clone(), schema.clone());
            Box::pin(async move {
                Arc::new(
                    PostgresStorage::connect_in_schema(&url, &schema)
                        .await
                        .unwrap(),
                ) as Arc<dyn Storage>
            })
        }),
        _dir: None,
    })
}

/// Expands to one `#[tokio::test]` per conformance test, each on a fresh fixture from
/// `$fixture` (an `async fn() -> Option<Fixture>`; `None` skips).
#[macro_export]
macro_rules! conformance_suite {
    ($fixture:path) => {
        $crate::conformance_suite!(@tests $fixture;
            sequential_loop_replays_without_running_closures,
            step_ids_count_per_name,
            hash_in_step_name_is_rejected,
            journaled_error_replays_as_same_error,
            retryable_error_is_not_journaled,
            retry_in_session_reuses_the_step_id,
            replay_mismatch_carries_fields,
            replay_mismatch_on_foreign_name,
            version_and_metadata_mismatch,
            terminal_run_cannot_start,
            stale_session_is_fenced,
            fencing_holds_across_storage_handles,
            refused_calls_do_not_fence_the_live_session,
            distinct_name_concurrency_replays_correctly,
            same_name_concurrency_via_parallel_replays_by_key,
            raw_same_name_concurrency_misassigns_and_parallel_fixes_it,
            parallel_validates_keys_and_orders_results,
            nested_parallel_prefixes_names,
            replay_yields_so_branches_interleave,
            suspend_resume_complete_lifecycle,
            fork_copies_prefix_and_leaves_source,
            step_too_large_is_refused,
            entries_survive_reopen_and_runs_are_listed,
            storage_enforces_offsets_and_sessions,
            fencing_is_atomic_with_appends,
            concurrent_runs_all_land,
            record_txn_does_not_commit_twice,
        );
    };
    (@tests $fixture:path; $($name:ident),* $(,)?) => {
        $(
            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn $name() {
                if let Some(fixture) = $fixture().await {
                    common::suite::$name(&fixture).await;
                }
            }
        )*
    };
}
