//! The spec's concurrency scenarios and `parallel`.

use super::*;

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

/// Spec, "microtask yield on replay": memo hits yield, so branches replaying together take
/// turns as they did when the steps ran, instead of the first branch replaying to its end.
pub async fn replay_yields_so_branches_interleave(f: &Fixture) {
    let j = journal(f);
    let r = id("yield");
    let branches = |log: Arc<Mutex<Vec<String>>>| {
        ["a", "b"]
            .into_iter()
            .map(move |key| {
                let log = Arc::clone(&log);
                (key, move |ctx: lockbox_journal::Run| async move {
                    for _ in 0..3 {
                        let _: u8 = ctx
                            .record("step", || async {
                                tokio::task::yield_now().await;
                                Ok::<_, ()>(1)
                            })
                            .await
                            .unwrap();
                        log.lock().unwrap().push(key.to_owned());
                    }
                })
            })
            .collect::<Branches<'_, ()>>()
    };
    let run = j.start(&r, opts()).await.unwrap();
    let first = Arc::new(Mutex::new(Vec::new()));
    run.parallel(branches(Arc::clone(&first))).await.unwrap();
    drop(run);
    let run = j.start(&r, opts()).await.unwrap();
    let replayed = Arc::new(Mutex::new(Vec::new()));
    run.parallel(branches(Arc::clone(&replayed))).await.unwrap();
    let replayed = replayed.lock().unwrap().clone();
    assert_eq!(replayed, ["a", "b", "a", "b", "a", "b"]);
    assert_eq!(replayed, *first.lock().unwrap());
}
