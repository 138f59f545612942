//! The conformance suite: behaviour every [`Storage`] backend must show through the journal
//! API. Scenarios from the step-journal concurrency spec are named after it.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use lockbox_journal::{
    Branches, EntryBody, ForkPoint, Journal, JournalError, RawEntry, RecordOptions, RunId,
    RunState, StartOptions, StepError, StepId, StepOutcome, Suspension, TerminalState, TxnId,
    TxnOutcome, TxnOutcomeStore, TxnStoreError,
};
use serde::{Deserialize, Serialize};
use serde_json::json;

use super::Fixture;

fn id(s: &str) -> RunId {
    RunId::parse(s).unwrap()
}

fn opts() -> StartOptions {
    StartOptions::default()
}

fn journal(f: &Fixture) -> Journal {
    Journal::open(Arc::clone(&f.storage))
}

async fn step_ids(j: &Journal, run: &RunId) -> Vec<String> {
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

/// Spec: "Sequential code is always safe": a loop of `llm` and `tool` steps replays from the
/// journal without running any closure again.
pub async fn sequential_loop_replays_without_running_closures(f: &Fixture) {
    let j = journal(f);
    let r = id("seq");
    let calls = AtomicU32::new(0);
    let run = j.start(&r, opts()).await.unwrap();
    let mut first = Vec::new();
    for i in 0..5u32 {
        let reply: String = run
            .record("llm", || async {
                calls.fetch_add(1, Ordering::SeqCst);
                Ok::<_, String>(format!("reply {i}"))
            })
            .await
            .unwrap();
        let tool: u32 = run
            .record("tool", || async {
                calls.fetch_add(1, Ordering::SeqCst);
                Ok::<_, String>(i * 10)
            })
            .await
            .unwrap();
        first.push((reply, tool));
    }
    assert_eq!(calls.load(Ordering::SeqCst), 10);
    drop(run);

    let run = j.start(&r, opts()).await.unwrap();
    for (i, expected) in first.iter().enumerate() {
        let reply: String = run
            .record("llm", || async {
                calls.fetch_add(1, Ordering::SeqCst);
                Ok::<_, String>("new".to_owned())
            })
            .await
            .unwrap();
        let tool: u32 = run
            .record("tool", || async {
                calls.fetch_add(1, Ordering::SeqCst);
                Ok::<_, String>(999)
            })
            .await
            .unwrap();
        assert_eq!(&(reply, tool), expected, "iteration {i}");
    }
    assert_eq!(calls.load(Ordering::SeqCst), 10, "replay ran a closure");
    // Past the journaled prefix, steps run for real again.
    let fresh: u32 = run
        .record("tool", || async { Ok::<_, String>(7) })
        .await
        .unwrap();
    assert_eq!(fresh, 7);
    assert_eq!(step_ids(&j, &r).await.last().unwrap(), "tool#6");
}

pub async fn step_ids_count_per_name(f: &Fixture) {
    let j = journal(f);
    let r = id("ids");
    let run = j.start(&r, opts()).await.unwrap();
    for name in ["llm", "llm", "tool", "llm", "tool:search"] {
        let _: u8 = run.record(name, || async { Ok::<_, ()>(1) }).await.unwrap();
    }
    assert_eq!(
        step_ids(&j, &r).await,
        ["llm", "llm#2", "tool", "llm#3", "tool:search"]
    );
    let kinds: Vec<_> = j
        .entries(&r, 0)
        .await
        .unwrap()
        .iter()
        .map(|e| (e.offset, e.session, e.body.kind()))
        .collect();
    assert_eq!(kinds[0], (0, 1, "start"));
    assert_eq!(kinds.len(), 6);
    assert!(kinds.iter().enumerate().all(|(i, k)| k.0 == i as u64));
}

pub async fn hash_in_step_name_is_rejected(f: &Fixture) {
    let j = journal(f);
    let run = j.start(&id("hash"), opts()).await.unwrap();
    let ran = AtomicU32::new(0);
    let err = run
        .record("llm#2", || async {
            ran.fetch_add(1, Ordering::SeqCst);
            Ok::<u8, ()>(1)
        })
        .await
        .unwrap_err();
    assert_eq!(err.code(), "INVALID_STEP_NAME");
    assert!(format!("{err:?}").contains("'#'"), "{err:?}");
    assert_eq!(ran.load(Ordering::SeqCst), 0);
    assert!(step_ids(&j, &id("hash")).await.is_empty());
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
enum ToolError {
    NotFound { path: String },
    RateLimited,
}

pub async fn journaled_error_replays_as_same_error(f: &Fixture) {
    let j = journal(f);
    let r = id("err");
    let run = j.start(&r, opts()).await.unwrap();
    let err = run
        .record("read", || async {
            Err::<String, _>(ToolError::NotFound { path: "/x".into() })
        })
        .await
        .unwrap_err();
    assert_eq!(
        err.into_failed(),
        Some(ToolError::NotFound { path: "/x".into() })
    );
    drop(run);
    let run = j.start(&r, opts()).await.unwrap();
    let replayed = run
        .record("read", || async {
            Ok::<String, ToolError>("now it works".into())
        })
        .await
        .unwrap_err();
    assert_eq!(replayed.code(), "STEP_FAILED");
    assert_eq!(
        replayed.into_failed(),
        Some(ToolError::NotFound { path: "/x".into() })
    );
    let entries = j.entries(&r, 0).await.unwrap();
    assert!(matches!(
        &entries[1].body,
        EntryBody::Step { outcome: StepOutcome::Err(v), .. } if v == &json!({"NotFound": {"path": "/x"}})
    ));
}

pub async fn retryable_error_is_not_journaled(f: &Fixture) {
    let j = journal(f);
    let r = id("retry");
    let retry = RecordOptions::retry_when(|e: &ToolError| *e == ToolError::RateLimited);
    let run = j.start(&r, opts()).await.unwrap();
    let err = run
        .record_with("llm", retry, || async {
            Err::<u32, _>(ToolError::RateLimited)
        })
        .await
        .unwrap_err();
    assert_eq!(err.into_failed(), Some(ToolError::RateLimited));
    assert!(
        step_ids(&j, &r).await.is_empty(),
        "retryable error journaled"
    );
    drop(run);
    let run = j.start(&r, opts()).await.unwrap();
    let v = run
        .record_with("llm", retry, || async { Ok::<u32, ToolError>(5) })
        .await
        .unwrap();
    assert_eq!(v, 5);
    assert_eq!(step_ids(&j, &r).await, ["llm"]);
}

pub async fn replay_mismatch_carries_fields(f: &Fixture) {
    let j = journal(f);
    let r = id("mismatch");
    let run = j.start(&r, opts()).await.unwrap();
    let _: u8 = run.record("a", || async { Ok::<_, ()>(1) }).await.unwrap();
    let _: u8 = run.record("b", || async { Ok::<_, ()>(2) }).await.unwrap();
    drop(run);
    // A code change inside a parallel branch: branch "x" (now "y") step ids collide with
    // nothing, but a renamed step under the same counter key does collide.
    let run = j.start(&r, opts()).await.unwrap();
    let _: u8 = run.record("a", || async { Ok::<_, ()>(1) }).await.unwrap();
    let run2 = run.clone();
    // Same id "b" produced from a different name is impossible by construction, so force
    // the collision the spec describes through a suspension with the same id.
    let err = run2.suspend::<_, u8>("b", &()).await.unwrap_err();
    match err {
        JournalError::ReplayMismatch {
            run_id,
            step_id,
            journaled_name,
            called_name,
            offset,
        } => {
            assert_eq!(run_id, r);
            assert_eq!(step_id.as_str(), "b");
            assert_eq!(journaled_name, "step b");
            assert_eq!(called_name, "suspend b");
            assert_eq!(offset, 2);
        }
        other => panic!("expected ReplayMismatch, got {other:?}"),
    }
}

/// A journal written by other code (another naming scheme, a hand edit) holds a step whose
/// stored name differs from the name that produces its id now.
pub async fn replay_mismatch_on_foreign_name(f: &Fixture) {
    let j = journal(f);
    let r = id("foreign");
    let session = f.storage.acquire_session(&r).await.unwrap();
    for (offset, body) in [
        EntryBody::Start {
            version: None,
            metadata: serde_json::Value::Null,
        },
        EntryBody::Step {
            step_id: StepId::parse("fetch").unwrap(),
            name: "fetch_v1".into(),
            outcome: StepOutcome::Ok(json!(1)),
        },
    ]
    .into_iter()
    .enumerate()
    {
        let entry = lockbox_journal::Entry {
            format: lockbox_journal::FORMAT_VERSION,
            run: r.clone(),
            offset: offset as u64,
            session,
            at_ms: 0,
            body,
        };
        f.storage
            .append(&r, lockbox_journal::entry::encode(&entry).unwrap())
            .await
            .unwrap();
    }
    let run = j.start(&r, opts()).await.unwrap();
    let err = run
        .record("fetch", || async { Ok::<u8, ()>(2) })
        .await
        .unwrap_err();
    match err {
        StepError::Journal(JournalError::ReplayMismatch {
            step_id,
            journaled_name,
            called_name,
            offset,
            ..
        }) => {
            assert_eq!(step_id.as_str(), "fetch");
            assert_eq!(journaled_name, "fetch_v1");
            assert_eq!(called_name, "fetch");
            assert_eq!(offset, 1);
        }
        other => panic!("expected ReplayMismatch, got {other:?}"),
    }
}

pub async fn version_and_metadata_mismatch(f: &Fixture) {
    let j = journal(f);
    let r = id("ver");
    let v1 = StartOptions {
        version: Some("v1".into()),
        metadata: json!({"user": "ada"}),
    };
    drop(j.start(&r, v1.clone()).await.unwrap());
    let err = j
        .start(
            &r,
            StartOptions {
                version: Some("v2".into()),
                ..v1.clone()
            },
        )
        .await
        .unwrap_err();
    match &err {
        JournalError::VersionMismatch {
            run_id,
            journaled,
            requested,
        } => {
            assert_eq!(run_id, &r);
            assert_eq!(journaled.as_deref(), Some("v1"));
            assert_eq!(requested.as_deref(), Some("v2"));
        }
        other => panic!("expected VersionMismatch, got {other:?}"),
    }
    let err = j
        .start(
            &r,
            StartOptions {
                metadata: json!({"user": "bob"}),
                ..v1.clone()
            },
        )
        .await
        .unwrap_err();
    match &err {
        JournalError::MetadataMismatch {
            journaled,
            requested,
            ..
        } => {
            assert_eq!(journaled, &json!({"user": "ada"}));
            assert_eq!(requested, &json!({"user": "bob"}));
        }
        other => panic!("expected MetadataMismatch, got {other:?}"),
    }
    assert_eq!(err.code(), "METADATA_MISMATCH");
    // The refused starts did not take a session: a matching start is session 2.
    assert_eq!(j.start(&r, v1).await.unwrap().session(), 2);
}

pub async fn terminal_run_cannot_start(f: &Fixture) {
    let j = journal(f);
    for (name, state) in [
        ("done", TerminalState::Completed),
        ("failed", TerminalState::Failed),
        ("cancelled", TerminalState::Cancelled),
    ] {
        let r = id(name);
        let run = j.start(&r, opts()).await.unwrap();
        match state {
            TerminalState::Completed => run.complete(&json!({"answer": 42})).await.unwrap(),
            TerminalState::Failed => run.fail(&"boom").await.unwrap(),
            TerminalState::Cancelled => run.cancel("user").await.unwrap(),
        }
        let late = run
            .record("after", || async { Ok::<u8, ()>(1) })
            .await
            .unwrap_err();
        assert_eq!(late.code(), "TERMINAL_RUN");
        match j.start(&r, opts()).await.unwrap_err() {
            JournalError::TerminalRun { run_id, state: s } => {
                assert_eq!((run_id, s), (r.clone(), state));
            }
            other => panic!("expected TerminalRun, got {other:?}"),
        }
        let status = j.status(&r).await.unwrap();
        assert_eq!(status.state, RunState::Finished { outcome: state });
    }
}

pub async fn stale_session_is_fenced(f: &Fixture) {
    let j = journal(f);
    let r = id("fence");
    let old = j.start(&r, opts()).await.unwrap();
    let _: u8 = old.record("a", || async { Ok::<_, ()>(1) }).await.unwrap();
    let new = j.start(&r, opts()).await.unwrap();
    assert!(new.session() > old.session());
    let err = old
        .record("b", || async { Ok::<u8, ()>(2) })
        .await
        .unwrap_err();
    match err {
        StepError::Journal(JournalError::Fenced {
            run_id,
            session,
            current,
        }) => {
            assert_eq!(run_id, r);
            assert_eq!(session, old.session());
            assert_eq!(current, new.session());
        }
        other => panic!("expected Fenced, got {other:?}"),
    }
    // The new session is unaffected and sees the old session's step.
    let a: u8 = new.record("a", || async { Ok::<_, ()>(9) }).await.unwrap();
    assert_eq!(a, 1);
    let b: u8 = new.record("b", || async { Ok::<_, ()>(3) }).await.unwrap();
    assert_eq!(b, 3);
    assert_eq!(step_ids(&j, &r).await, ["a", "b"]);
}

/// Two handles on one journal, as two processes would have: the newer session wins and each
/// handle sees the other's appends.
pub async fn fencing_holds_across_storage_handles(f: &Fixture) {
    let j1 = journal(f);
    let j2 = Journal::open(f.reopen().await);
    let r = id("two-procs");
    let old = j1.start(&r, opts()).await.unwrap();
    let _: u8 = old.record("a", || async { Ok::<_, ()>(1) }).await.unwrap();
    let new = j2.start(&r, opts()).await.unwrap();
    let err = old
        .record("b", || async { Ok::<u8, ()>(2) })
        .await
        .unwrap_err();
    assert_eq!(err.code(), "FENCED");
    let a: u8 = new.record("a", || async { Ok::<_, ()>(9) }).await.unwrap();
    assert_eq!(a, 1, "handle 2 did not see handle 1's step");
    let _: u8 = new.record("b", || async { Ok::<_, ()>(3) }).await.unwrap();
    // Handle 1 starts again (session 3) after handle 2 appended: it sees b and appends after it.
    let again = j1.start(&r, opts()).await.unwrap();
    let _: u8 = again
        .record("a", || async { Ok::<_, ()>(0) })
        .await
        .unwrap();
    let b: u8 = again
        .record("b", || async { Ok::<_, ()>(0) })
        .await
        .unwrap();
    assert_eq!(b, 3);
    let _: u8 = again
        .record("c", || async { Ok::<_, ()>(4) })
        .await
        .unwrap();
    assert_eq!(step_ids(&j2, &r).await, ["a", "b", "c"]);
    assert_eq!(again.session(), 3);
}

/// A duplicate resume event, a fork onto a live run or a mismatched start must not take a
/// session: that would fence the writer that is driving the run.
pub async fn refused_calls_do_not_fence_the_live_session(f: &Fixture) {
    let j = journal(f);
    let live = id("live");
    let run = j
        .start(
            &live,
            StartOptions {
                version: Some("v1".into()),
                ..opts()
            },
        )
        .await
        .unwrap();
    let _: u8 = run.record("a", || async { Ok::<_, ()>(1) }).await.unwrap();
    assert_eq!(
        j.resume(&live, &1).await.unwrap_err().code(),
        "NOT_SUSPENDED"
    );
    let other = id("other");
    drop(j.start(&other, opts()).await.unwrap());
    assert_eq!(
        j.fork(&other, &ForkPoint::Offset(1), &live)
            .await
            .unwrap_err()
            .code(),
        "RUN_EXISTS"
    );
    assert_eq!(
        j.start(&live, opts()).await.unwrap_err().code(),
        "VERSION_MISMATCH"
    );
    assert_eq!(
        j.resume(&id("ghost"), &1).await.unwrap_err().code(),
        "RUN_NOT_FOUND"
    );
    let _: u8 = run.record("b", || async { Ok::<_, ()>(2) }).await.unwrap();
    assert_eq!(step_ids(&j, &live).await, ["a", "b"]);
    // An accepted cancel does fence it.
    j.cancel(&live, "operator").await.unwrap();
    let err = run
        .record("c", || async { Ok::<u8, ()>(3) })
        .await
        .unwrap_err();
    assert_eq!(err.code(), "FENCED");
}

/// Spec: "Concurrent calls with distinct names will also be safe".
pub async fn distinct_name_concurrency_replays_correctly(f: &Fixture) {
    let j = journal(f);
    let r = id("distinct");
    let run = j.start(&r, opts()).await.unwrap();
    let search = run.record("tool:search", || async {
        tokio::time::sleep(Duration::from_millis(20)).await;
        Ok::<_, ()>("results".to_owned())
    });
    let weather = run.record("tool:weather", || async { Ok::<_, ()>("sunny".to_owned()) });
    let (s, w) = tokio::join!(search, weather);
    assert_eq!((s.unwrap(), w.unwrap()), ("results".into(), "sunny".into()));
    drop(run);
    // Replay in the opposite order.
    let run = j.start(&r, opts()).await.unwrap();
    let weather = run.record("tool:weather", || async { Ok::<_, ()>(String::new()) });
    let search = run.record("tool:search", || async { Ok::<_, ()>(String::new()) });
    let (w, s) = tokio::join!(weather, search);
    assert_eq!((s.unwrap(), w.unwrap()), ("results".into(), "sunny".into()));
}

async fn fetch_branches(
    run: &lockbox_journal::Run,
    order: &[&str],
    live: bool,
) -> Vec<(String, String)> {
    let branches: Branches<'_, String> = order
        .iter()
        .map(|key| {
            let key = key.to_string();
            let k2 = key.clone();
            (key, move |ctx: lockbox_journal::Run| async move {
                let data: String = ctx
                    .record("fetch", || async {
                        assert!(live, "branch {k2} ran a journaled step");
                        if k2 == "a" {
                            tokio::time::sleep(Duration::from_millis(15)).await;
                        }
                        Ok::<_, ()>(format!("data-{k2}"))
                    })
                    .await
                    .unwrap();
                ctx.record("process", || async { Ok::<_, ()>(format!("{data}!")) })
                    .await
                    .unwrap()
            })
        })
        .collect();
    run.parallel(branches)
        .await
        .unwrap()
        .into_iter()
        .map(|(k, v)| (k.as_str().to_owned(), v))
        .collect()
}

/// Spec: "For workflow branches with the same step names use ctx.parallel()".
pub async fn same_name_concurrency_via_parallel_replays_by_key(f: &Fixture) {
    let j = journal(f);
    let r = id("par");
    let run = j.start(&r, opts()).await.unwrap();
    let first = fetch_branches(&run, &["a", "b"], true).await;
    assert_eq!(
        first,
        [
            ("a".into(), "data-a!".into()),
            ("b".into(), "data-b!".into())
        ]
    );
    let mut ids = step_ids(&j, &r).await;
    ids.sort();
    assert_eq!(ids, ["a:fetch", "a:process", "b:fetch", "b:process"]);
    drop(run);
    let run = j.start(&r, opts()).await.unwrap();
    let replayed = fetch_branches(&run, &["b", "a"], false).await;
    assert_eq!(replayed, first);
}

/// Spec: "Dangerous: same name, concurrent execution" — the documented hazard, shown: when
/// the branches reach `record` in another order on replay, each gets the other's value and no
/// error is raised. The same work through `parallel` replays correctly.
pub async fn raw_same_name_concurrency_misassigns_and_parallel_fixes_it(f: &Fixture) {
    let j = journal(f);
    let r = id("hazard");
    let run = j.start(&r, opts()).await.unwrap();
    let process = |run: lockbox_journal::Run, item: &'static str| async move {
        run.record("process", || async move {
            Ok::<_, ()>(format!("processed {item}"))
        })
        .await
        .unwrap()
    };
    let (a, b) = tokio::join!(process(run.clone(), "a"), process(run.clone(), "b"));
    assert_eq!((a.as_str(), b.as_str()), ("processed a", "processed b"));
    drop(run);
    // Replay where b reaches `record` first (a scheduling change).
    let run = j.start(&r, opts()).await.unwrap();
    let (b, a) = tokio::join!(process(run.clone(), "b"), process(run.clone(), "a"));
    assert_eq!(
        b, "processed a",
        "hazard not reproduced: b got its own value"
    );
    assert_eq!(a, "processed b");

    // The fix: key the branches.
    let r = id("hazard-fixed");
    let keyed = |run: lockbox_journal::Run, order: [&'static str; 2]| async move {
        let branches: Branches<'_, String> = order
            .into_iter()
            .map(|item| {
                (item, move |ctx: lockbox_journal::Run| async move {
                    ctx.record("process", || async move {
                        Ok::<_, ()>(format!("processed {item}"))
                    })
                    .await
                    .unwrap()
                })
            })
            .collect();
        run.parallel(branches).await.unwrap()
    };
    let run = j.start(&r, opts()).await.unwrap();
    let first = keyed(run, ["a", "b"]).await;
    let run = j.start(&r, opts()).await.unwrap();
    let replayed = keyed(run, ["b", "a"]).await;
    assert_eq!(first, replayed);
    assert_eq!(
        replayed.values().cloned().collect::<Vec<_>>(),
        ["processed a", "processed b"]
    );
}

pub async fn parallel_validates_keys_and_orders_results(f: &Fixture) {
    let j = journal(f);
    let run = j.start(&id("keys"), opts()).await.unwrap();
    for bad in ["", "a:b", "a#1", "a b"] {
        let err = run
            .parallel(Branches::new().branch(bad, |_ctx| async { 1 }))
            .await
            .unwrap_err();
        assert_eq!(err.code(), "INVALID_BRANCH_KEY", "{bad:?}");
    }
    let err = run
        .parallel(
            Branches::new()
                .branch("x", |_ctx| async { 1 })
                .branch("x", |_ctx| async { 2 }),
        )
        .await
        .unwrap_err();
    assert_eq!(err.code(), "DUPLICATE_BRANCH_KEY");
    let results = run
        .parallel(
            Branches::new()
                .branch("zeta", |ctx| async move { ctx.prefix().to_owned() })
                .branch("alpha", |ctx| async move { ctx.prefix().to_owned() })
                .branch("mid", |ctx| async move { ctx.prefix().to_owned() }),
        )
        .await
        .unwrap();
    let got: Vec<_> = results
        .into_iter()
        .map(|(k, v)| (k.to_string(), v))
        .collect();
    assert_eq!(
        got,
        [
            ("alpha".to_owned(), "alpha:".to_owned()),
            ("mid".into(), "mid:".into()),
            ("zeta".into(), "zeta:".into())
        ]
    );
}

pub async fn nested_parallel_prefixes_names(f: &Fixture) {
    let j = journal(f);
    let r = id("nested");
    let run = j.start(&r, opts()).await.unwrap();
    run.parallel(Branches::new().branch("outer", |ctx| async move {
        ctx.parallel(Branches::new().branch("inner", |ctx| async move {
            let _: u8 = ctx
                .record("leaf", || async { Ok::<_, ()>(1) })
                .await
                .unwrap();
        }))
        .await
        .unwrap();
    }))
    .await
    .unwrap();
    assert_eq!(step_ids(&j, &r).await, ["outer:inner:leaf"]);
}

pub async fn suspend_resume_complete_lifecycle(f: &Fixture) {
    let j = journal(f);
    let r = id("life");
    let run = j.start(&r, opts()).await.unwrap();
    let plan: String = run
        .record("plan", || async { Ok::<_, ()>("deploy".to_owned()) })
        .await
        .unwrap();
    let s: Suspension<bool> = run
        .suspend("approval", &json!({"plan": plan}))
        .await
        .unwrap();
    assert_eq!(s, Suspension::Suspended);
    drop(run);
    assert_eq!(
        j.status(&r).await.unwrap().state,
        RunState::Suspended {
            event: "approval".into()
        }
    );
    // Restarting before the answer: still suspended, nothing appended twice.
    let run = j.start(&r, opts()).await.unwrap();
    let _: String = run
        .record("plan", || async { Ok::<_, ()>(String::new()) })
        .await
        .unwrap();
    assert_eq!(
        run.suspend::<_, bool>("approval", &json!({}))
            .await
            .unwrap(),
        Suspension::Suspended
    );
    drop(run);
    j.resume(&r, &true).await.unwrap();
    assert_eq!(j.status(&r).await.unwrap().state, RunState::Running);
    assert_eq!(
        j.resume(&r, &true).await.unwrap_err().code(),
        "NOT_SUSPENDED"
    );

    let run = j.start(&r, opts()).await.unwrap();
    let _: String = run
        .record("plan", || async { Ok::<_, ()>(String::new()) })
        .await
        .unwrap();
    let s: Suspension<bool> = run.suspend("approval", &json!({})).await.unwrap();
    assert_eq!(s, Suspension::Resumed(true));
    run.complete(&"shipped").await.unwrap();
    let kinds: Vec<_> = j
        .entries(&r, 0)
        .await
        .unwrap()
        .iter()
        .map(|e| e.body.kind())
        .collect();
    assert_eq!(
        kinds,
        ["start", "step", "suspend", "start", "resume", "start", "complete"]
    );
    let status = j.status(&r).await.unwrap();
    assert_eq!(status.steps, 1);
    assert_eq!(status.entries, 7);
    assert_eq!(
        status.state,
        RunState::Finished {
            outcome: TerminalState::Completed
        }
    );
}

pub async fn fork_copies_prefix_and_leaves_source(f: &Fixture) {
    let j = journal(f);
    let src = id("src");
    let run = j.start(&src, opts()).await.unwrap();
    for i in 0..3u32 {
        let _: u32 = run
            .record("llm", || async move { Ok::<_, ()>(i) })
            .await
            .unwrap();
    }
    run.complete(&"done").await.unwrap();
    let before = j.raw_entries(&src, 0).await.unwrap();

    let fork = id("src-fork");
    j.fork(
        &src,
        &ForkPoint::Step(StepId::parse("llm#3").unwrap()),
        &fork,
    )
    .await
    .unwrap();
    assert_eq!(
        j.raw_entries(&src, 0).await.unwrap(),
        before,
        "source changed"
    );
    assert_eq!(step_ids(&j, &fork).await, ["llm", "llm#2"]);
    // The fork is live: llm#3 runs again, with a new value.
    let run = j.start(&fork, opts()).await.unwrap();
    let mut got = Vec::new();
    for _ in 0..3 {
        got.push(
            run.record("llm", || async { Ok::<u32, ()>(100) })
                .await
                .unwrap(),
        );
    }
    assert_eq!(got, [0, 1, 100]);

    let at_offset = id("src-at2");
    j.fork(&src, &ForkPoint::Offset(2), &at_offset)
        .await
        .unwrap();
    assert_eq!(j.entries(&at_offset, 0).await.unwrap().len(), 2);
    assert_eq!(
        j.fork(&src, &ForkPoint::Offset(2), &at_offset)
            .await
            .unwrap_err()
            .code(),
        "RUN_EXISTS"
    );
    assert_eq!(
        j.fork(&src, &ForkPoint::Offset(99), &id("x"))
            .await
            .unwrap_err()
            .code(),
        "OFFSET_OUT_OF_RANGE"
    );
    assert_eq!(
        j.fork(
            &src,
            &ForkPoint::Step(StepId::parse("nope").unwrap()),
            &id("y")
        )
        .await
        .unwrap_err()
        .code(),
        "STEP_NOT_FOUND"
    );
}

pub async fn step_too_large_is_refused(f: &Fixture) {
    let j = journal(f).with_max_entry_bytes(4096);
    let r = id("big");
    let run = j.start(&r, opts()).await.unwrap();
    let err = run
        .record("blob", || async { Ok::<_, ()>("x".repeat(5000)) })
        .await
        .unwrap_err();
    match err {
        StepError::Journal(JournalError::StepTooLarge {
            step_id,
            size,
            limit,
            ..
        }) => {
            assert_eq!(step_id.as_str(), "blob");
            assert!(size > 5000);
            assert_eq!(limit, 4096);
        }
        other => panic!("expected StepTooLarge, got {other:?}"),
    }
    // Nothing was journaled and the run goes on.
    let ok: String = run
        .record("small", || async { Ok::<_, ()>("y".repeat(100)) })
        .await
        .unwrap();
    assert_eq!(ok.len(), 100);
    assert_eq!(step_ids(&j, &r).await, ["small"]);
    assert_eq!(lockbox_journal::DEFAULT_MAX_ENTRY_BYTES, 8 * 1024 * 1024);
}

pub async fn entries_survive_reopen_and_runs_are_listed(f: &Fixture) {
    let j = journal(f);
    for name in ["r2", "r1"] {
        let run = j.start(&id(name), opts()).await.unwrap();
        let _: String = run
            .record("s", || async move { Ok::<_, ()>(format!("v-{name}")) })
            .await
            .unwrap();
    }
    let j2 = Journal::open(f.reopen().await);
    assert_eq!(j2.list().await.unwrap(), [id("r1"), id("r2")]);
    let run = j2.start(&id("r1"), opts()).await.unwrap();
    assert_eq!(run.session(), 2);
    let v: String = run
        .record("s", || async { Ok::<_, ()>(String::new()) })
        .await
        .unwrap();
    assert_eq!(v, "v-r1");
    assert_eq!(j2.entries(&id("r1"), 2).await.unwrap()[0].offset, 2);
    assert_eq!(
        j2.status(&id("missing")).await.unwrap_err().code(),
        "RUN_NOT_FOUND"
    );
}

fn raw(run: &RunId, offset: u64, session: u64) -> RawEntry {
    lockbox_journal::entry::encode(&lockbox_journal::Entry {
        format: lockbox_journal::FORMAT_VERSION,
        run: run.clone(),
        offset,
        session,
        at_ms: 0,
        body: EntryBody::Cancel { reason: "x".into() },
    })
    .unwrap()
}

pub async fn storage_enforces_offsets_and_sessions(f: &Fixture) {
    let s = &f.storage;
    let r = id("raw");
    assert!(s.read(&r, 0).await.unwrap().is_empty());
    let err = s.append(&r, raw(&r, 0, 1)).await.unwrap_err();
    assert_eq!(err.code(), "FENCED", "append without a session");
    assert_eq!(s.acquire_session(&r).await.unwrap(), 1);
    assert_eq!(s.acquire_session(&r).await.unwrap(), 2);
    s.append(&r, raw(&r, 0, 2)).await.unwrap();
    let err = s.append(&r, raw(&r, 0, 2)).await.unwrap_err();
    assert_eq!(err.code(), "OFFSET_CONFLICT");
    let err = s.append(&r, raw(&r, 2, 2)).await.unwrap_err();
    assert_eq!(err.code(), "OFFSET_CONFLICT", "gap accepted");
    let err = s.append(&r, raw(&r, 1, 1)).await.unwrap_err();
    assert_eq!(err.code(), "FENCED");
    s.append(&r, raw(&r, 1, 2)).await.unwrap();
    let got = s.read(&r, 1).await.unwrap();
    assert_eq!(got, [raw(&r, 1, 2)]);
}

/// Sixteen runs append at once (the SQLite backend group-commits them).
pub async fn concurrent_runs_all_land(f: &Fixture) {
    let j = journal(f);
    let mut tasks = Vec::new();
    for n in 0..16u32 {
        let j = j.clone();
        tasks.push(tokio::spawn(async move {
            let r = id(&format!("c{n}"));
            let run = j.start(&r, opts()).await.unwrap();
            for i in 0..10u32 {
                let _: u32 = run
                    .record("step", || async move { Ok::<_, ()>(n * 100 + i) })
                    .await
                    .unwrap();
            }
        }));
    }
    for t in tasks {
        t.await.unwrap();
    }
    for n in 0..16u32 {
        let r = id(&format!("c{n}"));
        let values: Vec<_> = j
            .entries(&r, 0)
            .await
            .unwrap()
            .into_iter()
            .filter_map(|e| match e.body {
                EntryBody::Step {
                    outcome: StepOutcome::Ok(v),
                    ..
                } => v.as_u64(),
                _ => None,
            })
            .collect();
        let expected: Vec<u64> = (0..10).map(|i| u64::from(n * 100 + i)).collect();
        assert_eq!(values, expected, "run c{n}");
    }
}

/// A fake transaction store standing in for `lockbox-txn`: commits are counted.
#[derive(Default)]
struct FakeTxns {
    committed: Mutex<HashMap<String, serde_json::Value>>,
    commits: AtomicU32,
}

impl FakeTxns {
    fn commit(&self, txn: &TxnId, value: serde_json::Value) {
        self.commits.fetch_add(1, Ordering::SeqCst);
        self.committed
            .lock()
            .unwrap()
            .insert(txn.as_str().to_owned(), value);
    }
}

#[async_trait]
impl TxnOutcomeStore for FakeTxns {
    async fn outcome(&self, txn: &TxnId) -> Result<Option<TxnOutcome>, TxnStoreError> {
        Ok(self
            .committed
            .lock()
            .unwrap()
            .get(txn.as_str())
            .cloned()
            .map(TxnOutcome::Committed))
    }
}

/// Issue 6: "kill between txn commit and journal append; replay does not commit twice".
pub async fn record_txn_does_not_commit_twice(f: &Fixture) {
    let j = journal(f);
    let r = id("txn");
    let store = FakeTxns::default();
    let run = j.start(&r, opts()).await.unwrap();
    // The first attempt commits, then the process "dies" before the journal append: the
    // step's future is dropped right after the commit.
    let txn_seen = Mutex::new(None);
    {
        let attempt = run.record_txn("apply", &store, |txn| async {
            store.commit(&txn, json!("commit-1"));
            *txn_seen.lock().unwrap() = Some(txn);
            std::future::pending::<Result<String, String>>().await
        });
        let _ = tokio::time::timeout(Duration::from_millis(20), attempt).await;
    }
    assert!(step_ids(&j, &r).await.is_empty());
    let txn = txn_seen.lock().unwrap().clone().unwrap();
    assert_eq!(txn.as_str(), "txn/apply");
    drop(run);

    let run = j.start(&r, opts()).await.unwrap();
    let store_ref = &store;
    let v: String = run
        .record_txn("apply", &store, |txn| async move {
            let store = store_ref;
            store.commit(&txn, json!("commit-2"));
            Ok::<_, String>("commit-2".to_owned())
        })
        .await
        .unwrap();
    assert_eq!(v, "commit-1");
    assert_eq!(store.commits.load(Ordering::SeqCst), 1, "committed twice");
    assert_eq!(step_ids(&j, &r).await, ["apply"]);
    drop(run);
    // And once journaled, the store is not even asked.
    let run = j.start(&r, opts()).await.unwrap();
    let v: String = run
        .record_txn("apply", &FakeTxns::default(), |_| async {
            Ok::<_, String>("x".into())
        })
        .await
        .unwrap();
    assert_eq!(v, "commit-1");
}
