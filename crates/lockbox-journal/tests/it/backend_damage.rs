//! What each backend does with damaged data: a torn last line (file) is a crash artefact and is
//! dropped; anything else is `JournalCorruption` with the place it was found.
#![allow(clippy::unwrap_used, clippy::expect_used)] // test helpers outside #[test] fns

use std::io::Write;
use std::sync::Arc;

use lockbox_journal::{
    FileStorage, Journal, JournalError, RunId, SqliteStorage, StartOptions, StorageError,
};

async fn two_steps(j: &Journal, r: &RunId) {
    let run = j.start(r, StartOptions::default()).await.unwrap();
    for v in ["one", "two"] {
        let _: String = run
            .record("s", || async move { Ok::<_, ()>(v.to_owned()) })
            .await
            .unwrap();
    }
}

#[tokio::test]
async fn file_torn_last_line_is_ignored_then_truncated_by_next_append() {
    let dir = tempfile::tempdir().unwrap();
    let r = RunId::parse("torn").unwrap();
    let j = Journal::open(Arc::new(FileStorage::open(dir.path()).unwrap()));
    two_steps(&j, &r).await;
    let path = dir.path().join("torn.jsonl");
    let good = std::fs::read(&path).unwrap();
    // A crash in the middle of the next append's write(2).
    let next = std::fs::read_to_string(&path).unwrap();
    let half = &next.lines().nth(1).unwrap()[..40];
    std::fs::OpenOptions::new()
        .append(true)
        .open(&path)
        .unwrap()
        .write_all(half.as_bytes())
        .unwrap();

    // A new process: reads ignore the torn tail, the first append cuts it off.
    let j = Journal::open(Arc::new(FileStorage::open(dir.path()).unwrap()));
    assert_eq!(j.entries(&r, 0).await.unwrap().len(), 3);
    let run = j.start(&r, StartOptions::default()).await.unwrap();
    let one: String = run
        .record("s", || async { Ok::<_, ()>(String::new()) })
        .await
        .unwrap();
    assert_eq!(one, "one");
    let after = std::fs::read(&path).unwrap();
    assert_eq!(&after[..good.len()], &good[..], "valid prefix changed");
    assert!(after.ends_with(b"\n"));
    let lines = after
        .split(|&b| b == b'\n')
        .filter(|l| !l.is_empty())
        .count();
    assert_eq!(lines, 4, "torn bytes survived the append");
    assert_eq!(j.entries(&r, 0).await.unwrap().len(), 4);
}

#[tokio::test]
async fn file_damaged_complete_line_is_corruption_with_byte_offset() {
    let dir = tempfile::tempdir().unwrap();
    let r = RunId::parse("bad").unwrap();
    let j = Journal::open(Arc::new(FileStorage::open(dir.path()).unwrap()));
    two_steps(&j, &r).await;
    let path = dir.path().join("bad.jsonl");
    let text = std::fs::read_to_string(&path).unwrap();
    let second_line_at = text.find('\n').unwrap() + 1;
    let damaged = text.replacen("\"one\"", "\"One\"", 1);
    assert_ne!(damaged, text);
    std::fs::write(&path, damaged).unwrap();

    let j = Journal::open(Arc::new(FileStorage::open(dir.path()).unwrap()));
    for err in [
        j.entries(&r, 0).await.unwrap_err(),
        j.start(&r, StartOptions::default()).await.unwrap_err(),
    ] {
        match err {
            JournalError::Storage(StorageError::Corruption {
                run_id,
                offset,
                detail,
            }) => {
                assert_eq!(run_id, r);
                assert_eq!(offset, second_line_at as u64);
                assert!(detail.contains("checksum"), "{detail}");
            }
            other => panic!("expected JournalCorruption, got {other:?}"),
        }
    }
}

#[tokio::test]
async fn file_complete_last_line_with_bad_checksum_is_not_ignored() {
    let dir = tempfile::tempdir().unwrap();
    let r = RunId::parse("lastbad").unwrap();
    let j = Journal::open(Arc::new(FileStorage::open(dir.path()).unwrap()));
    two_steps(&j, &r).await;
    let path = dir.path().join("lastbad.jsonl");
    let text = std::fs::read_to_string(&path).unwrap();
    let last_at = text.trim_end().rfind('\n').unwrap() + 1;
    std::fs::write(&path, text.replacen("\"two\"", "\"Two\"", 1)).unwrap();
    let err = j.entries(&r, 0).await.unwrap_err();
    assert!(
        matches!(err, JournalError::Storage(StorageError::Corruption { offset, .. }) if offset == last_at as u64),
        "{err:?}"
    );
}

#[tokio::test]
async fn sqlite_damaged_row_is_corruption_with_entry_offset() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("j.db");
    let r = RunId::parse("row").unwrap();
    let j = Journal::open(Arc::new(SqliteStorage::open(&db).unwrap()));
    two_steps(&j, &r).await;
    let conn = rusqlite::Connection::open(&db).unwrap();
    let changed = conn
        .execute(
            "UPDATE lockbox_entries SET line = replace(line, '\"two\"', '\"Two\"') WHERE entry_offset = 2",
            [],
        )
        .unwrap();
    assert_eq!(changed, 1);
    let err = j.entries(&r, 0).await.unwrap_err();
    assert!(
        matches!(&err, JournalError::Storage(StorageError::Corruption { offset: 2, detail, .. }) if detail.contains("checksum")),
        "{err:?}"
    );
    assert_eq!(err.code(), "JOURNAL_CORRUPTION");
    assert!(!err.is_transient());
}
