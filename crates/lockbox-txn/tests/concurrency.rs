//! Concurrency between transactions on one workdir: optimistic (first committer wins, stale
//! bases refused with exit 5, no lost update) and locked (serialised).
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use common::{dirs, rerun_as_nobody, stage};
use lockbox_txn::{LockPolicy, Pipeline};

const RACERS: usize = 8;

/// Each transaction reads the counter, writes counter + 1 and appends a line to a shared
/// log. Returns (committed, refused with exit 5).
fn race(lock: LockPolicy) -> (usize, usize, std::path::PathBuf, tempfile::TempDir) {
    let (tmp, state, work) = dirs();
    std::fs::write(work.join("counter"), "0\n").unwrap();
    std::fs::write(work.join("log"), "").unwrap();
    common::settle();
    let results: Vec<_> = std::thread::scope(|s| {
        let handles: Vec<_> = (0..RACERS)
            .map(|i| {
                let (state, work) = (&state, &work);
                s.spawn(move || {
                    Pipeline::new(state, work)
                        .lock(lock)
                        .stage(stage(
                            work,
                            &format!("n=$(cat counter) && echo $((n+1)) > counter && echo racer-{i} >> log"),
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

fn check_serial_history(work: &std::path::Path, committed: usize) {
    let counter: usize = std::fs::read_to_string(work.join("counter"))
        .unwrap()
        .trim()
        .parse()
        .unwrap();
    let log = std::fs::read_to_string(work.join("log")).unwrap();
    assert_eq!(counter, committed, "lost update: log {log:?}");
    assert_eq!(log.lines().count(), committed, "log {log:?}");
}

#[test]
fn optimistic_racers_form_a_serial_history_without_lost_updates() {
    let (committed, refused, work, _tmp) = race(LockPolicy::Optimistic);
    assert!(committed >= 1);
    assert_eq!(committed + refused, RACERS);
    check_serial_history(&work, committed);
    rerun_as_nobody("optimistic_racers_form_a_serial_history_without_lost_updates");
}

#[test]
fn locked_racers_serialise_and_all_commit() {
    let (committed, refused, work, _tmp) = race(LockPolicy::Wait(None));
    assert_eq!((committed, refused), (RACERS, 0));
    check_serial_history(&work, RACERS);
}
