//! Run lifecycle: terminal runs, fencing, suspend/resume, fork.

use super::*;

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
        StepError::Journal(JournalError::Storage(StorageError::Fenced {
            run_id,
            session,
            current,
        })) => {
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
        j.fork(&other, &ForkPoint::Offset(1), Some(&live))
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

    let fork = j
        .fork(
            &src,
            &ForkPoint::Step(StepId::parse("llm#3").unwrap()),
            None,
        )
        .await
        .unwrap();
    assert!(fork.as_str().starts_with("src.fork-"), "{fork}");
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
    let named = j
        .fork(&src, &ForkPoint::Offset(2), Some(&at_offset))
        .await
        .unwrap();
    assert_eq!(named, at_offset);
    assert_eq!(j.entries(&at_offset, 0).await.unwrap().len(), 2);
    assert_eq!(
        j.fork(&src, &ForkPoint::Offset(2), Some(&at_offset))
            .await
            .unwrap_err()
            .code(),
        "RUN_EXISTS"
    );
    assert_eq!(
        j.fork(&src, &ForkPoint::Offset(99), Some(&id("x")))
            .await
            .unwrap_err()
            .code(),
        "OFFSET_OUT_OF_RANGE"
    );
    assert_eq!(
        j.fork(
            &src,
            &ForkPoint::Step(StepId::parse("nope").unwrap()),
            Some(&id("y"))
        )
        .await
        .unwrap_err()
        .code(),
        "STEP_NOT_FOUND"
    );
}
