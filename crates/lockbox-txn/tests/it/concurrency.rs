//! Concurrency between transactions on one workdir, end to end (real sandboxes): optimistic
//! (first committer wins, stale bases refused with exit 5, no lost update) and locked
//! (serialised). `src/history.rs` checks many more rounds, cheaply, in-process.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use crate::common;

use common::{dirs, rerun_as_nobody, stage};
use lockbox_txn::{LockPolicy, Pipeline};

const RACERS: usize = 8;

/// Each transaction reads the counter, writes counter + 1 with a fixed mtime and writes a
/// log file of its own: racers that read the same value write the *same bytes and mtime*
/// (issue 15's lost update). Returns (committed, refused with exit 5).
fn race(lock: LockPolicy) -> (usize, usize, std::path::PathBuf, tempfile::TempDir) {
    let (tmp, state, work) = dirs();
    std::fs::write(work.join("counter"), "0\n").unwrap();
    let results: Vec<_> = std::thread::scope(|s| {
        let handles: Vec<_> = (0..RACERS)
            .map(|i| {
                let (state, work) = (&state, &work);
                s.spawn(move || {
                    Pipeline::new(state, work)
                        .lock(lock)
                        .stage(stage(
                            work,
                            &format!(
                                "n=$(cat counter) && echo $((n+1)) > counter && \
                                 touch -d @1700000000 counter && echo {i} > log_{i}"
                            ),
                        ))
                        .run()
                })
            })
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    });
    let mut committed = 0;
    let mut refused = 0;
    for r in results {
        match r {
            Ok(o) => {
                assert!(o.committed, "{:?}", o.stages);
                committed += 1;
            }
            Err(e) => {
                assert_eq!(e.exit_code(), 5, "{e}");
                refused += 1;
            }
        }
    }
    (committed, refused, work, tmp)
}

/// The counter equals the number of transactions that exited 0, one log each.
fn check_serial_history(work: &std::path::Path, committed: usize) {
    let counter: usize = std::fs::read_to_string(work.join("counter"))
        .unwrap()
        .trim()
        .parse()
        .unwrap();
    let logs = std::fs::read_dir(work)
        .unwrap()
        .filter(|e| {
            e.as_ref()
                .unwrap()
                .file_name()
                .to_string_lossy()
                .starts_with("log_")
        })
        .count();
    assert_eq!(
        (counter, logs),
        (committed, committed),
        "lost update: {committed} transactions exited 0"
    );
}

#[test]
fn optimistic_racers_form_a_serial_history_without_lost_updates() {
    for _ in 0..2 {
        let (committed, refused, work, _tmp) = race(LockPolicy::Optimistic);
        assert!(committed >= 1);
        assert_eq!(committed + refused, RACERS);
        check_serial_history(&work, committed);
    }
    rerun_as_nobody(&lockbox_testkit::test_name!(
        "optimistic_racers_form_a_serial_history_without_lost_updates"
    ));
}

#[test]
fn locked_racers_serialise_and_all_commit() {
    let (committed, refused, work, _tmp) = race(LockPolicy::Wait(None));
    assert_eq!((committed, refused), (RACERS, 0));
    check_serial_history(&work, RACERS);
}
