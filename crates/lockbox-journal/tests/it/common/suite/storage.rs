//! Durability and storage invariants, concurrent runs, exactly-once transactions.

use super::*;

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

/// A writer appends as fast as it can while a second handle takes a new session: every append
/// the writer saw succeed is in the run, and none lands after the new session read it.
pub async fn fencing_is_atomic_with_appends(f: &Fixture) {
    let other = f.reopen().await;
    for round in 0..8u64 {
        let r = id(&format!("race{round}"));
        let s1 = Arc::clone(&f.storage);
        let session = s1.acquire_session(&r).await.unwrap();
        let (r1, started) = (r.clone(), Arc::new(tokio::sync::Notify::new()));
        let notify = Arc::clone(&started);
        let writer = tokio::spawn(async move {
            let mut offset = 0;
            loop {
                match s1.append(&r1, raw(&r1, offset, session)).await {
                    Ok(()) => offset += 1,
                    Err(e) => {
                        assert_eq!(e.code(), "FENCED", "{e}");
                        return offset;
                    }
                }
                if offset == 1 {
                    notify.notify_one();
                }
            }
        });
        started.notified().await;
        tokio::time::sleep(Duration::from_millis(round * 3)).await;
        let newer = other.acquire_session(&r).await.unwrap();
        assert!(newer > session);
        let seen = other.read(&r, 0).await.unwrap();
        let acknowledged = writer.await.unwrap();
        assert!(acknowledged >= 1);
        assert_eq!(seen.len() as u64, acknowledged, "round {round}");
        let after = other.read(&r, 0).await.unwrap();
        assert_eq!(
            after, seen,
            "an append landed after the fence (round {round})"
        );
        assert!(after.iter().all(|e| e.session == session));
    }
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
