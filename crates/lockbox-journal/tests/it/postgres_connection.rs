//! PostgreSQL connections: a connection the server ends (`pg_terminate_backend`) is
//! re-established on the next call and the run's fencing still holds; TLS is refused with a
//! clear error rather than silently sent in plain text.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::sync::Arc;

use lockbox_journal::{Journal, PostgresStorage, RunId, StartOptions, StepError, Storage};

fn url() -> Option<String> {
    let url = std::env::var("LOCKBOX_TEST_POSTGRES_URL").ok();
    lockbox_testkit::requirement(
        url.is_some(),
        "LOCKBOX_TEST_POSTGRES_URL is unset (run `eval \"$(scripts/start-postgres.sh)\"`)",
    );
    url
}

fn with_param(url: &str, param: &str) -> String {
    let sep = if url.contains('?') { '&' } else { '?' };
    format!("{url}{sep}{param}")
}

async fn admin(url: &str) -> tokio_postgres::Client {
    let (client, conn) = tokio_postgres::connect(url, tokio_postgres::NoTls)
        .await
        .unwrap();
    tokio::spawn(conn);
    client
}

/// Ends every server session of `app` (the storage's connections), as an operator or a
/// failover would.
async fn terminate(admin: &tokio_postgres::Client, app: &str) -> i64 {
    let row = admin
        .query_one(
            "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity
             WHERE application_name = $1",
            &[&app],
        )
        .await
        .unwrap();
    row.get(0)
}

async fn step(run: &lockbox_journal::Run, name: &str) -> Result<u32, StepError<String>> {
    run.record(name, || async { Ok::<_, String>(7) }).await
}

#[tokio::test]
async fn a_terminated_connection_is_reestablished_and_fencing_still_holds() {
    let Some(url) = url() else { return };
    let tag = format!("lbt_reconnect_{}", std::process::id());
    let app_url = with_param(&url, &format!("application_name={tag}"));
    let admin = admin(&url).await;
    let storage = Arc::new(
        PostgresStorage::connect_with(&app_url, Some(&tag), 1)
            .await
            .unwrap(),
    );
    let journal = Journal::open(Arc::clone(&storage) as Arc<dyn Storage>);
    let id = RunId::parse("agent").unwrap();
    let run = journal.start(&id, StartOptions::default()).await.unwrap();
    step(&run, "before").await.unwrap();

    assert!(terminate(&admin, &tag).await >= 1, "no connection to end");
    // The next append reconnects and lands exactly once.
    step(&run, "after").await.unwrap();
    let names: Vec<String> = journal
        .entries(&id, 0)
        .await
        .unwrap()
        .iter()
        .filter_map(|e| match &e.body {
            lockbox_journal::EntryBody::Step { step_id, .. } => Some(step_id.to_string()),
            _ => None,
        })
        .collect();
    assert_eq!(names, ["before", "after"]);

    // A second writer takes the run over; after another lost connection, the first writer's
    // append is still fenced, not let through by the reconnect.
    let other = Journal::open(Arc::new(
        PostgresStorage::connect_with(&url, Some(&tag), 1)
            .await
            .unwrap(),
    ));
    let _newer = other.start(&id, StartOptions::default()).await.unwrap();
    assert!(terminate(&admin, &tag).await >= 1);
    let err = step(&run, "stale").await.unwrap_err();
    assert_eq!(err.code(), "FENCED", "{err}");

    admin
        .batch_execute(&format!("DROP SCHEMA {tag} CASCADE"))
        .await
        .unwrap();
}

#[tokio::test]
async fn sslmode_require_is_refused_with_a_clear_error() {
    let Some(url) = url() else { return };
    let err = PostgresStorage::connect(&with_param(&url, "sslmode=require"))
        .await
        .unwrap_err();
    assert_eq!(err.code(), "STORAGE_UNSUPPORTED");
    assert!(err.to_string().contains("sslmode=require"), "{err}");
}
