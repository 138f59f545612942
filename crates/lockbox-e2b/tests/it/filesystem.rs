//! `filesystem.Filesystem` as the E2B SDK uses it: stat, make_dir, move, list with depth,
//! remove, paths relative to the user's home, the errors its exceptions come from, and
//! watching (a WatchDir stream, and polled watchers).

use crate::common::also_as_nobody;
use crate::envd::*;
use serde_json::{json, Value};

fn names(list: &Value) -> Vec<String> {
    let mut n: Vec<String> = list["entries"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e["path"].as_str().unwrap().to_owned())
        .collect();
    n.sort();
    n
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn entries_are_made_moved_listed_and_removed_inside_the_sandbox() {
    also_as_nobody("filesystem::entries_are_made_moved_listed_and_removed_inside_the_sandbox");
    let s = Served::start().await;
    let (status, made) = s
        .unary(
            "filesystem.Filesystem/MakeDir",
            json!({"path": "/tmp/e2b/a/b"}),
        )
        .await;
    assert_eq!(status, 200, "{made}");
    let e = &made["entry"];
    assert_eq!(e["name"], "b");
    assert_eq!(e["path"], "/tmp/e2b/a/b");
    assert_eq!(e["type"], "FILE_TYPE_DIRECTORY");
    assert!(
        e["permissions"].as_str().unwrap().starts_with("drwx"),
        "{e}"
    );
    assert_eq!(e["owner"], "user");
    assert!(e["modifiedTime"].as_str().unwrap().ends_with('Z'));
    // It exists in the sandbox, not on the host.
    assert_eq!(s.sh("test -d /tmp/e2b/a/b && echo yes").await, "yes\n");
    assert!(!std::path::Path::new("/tmp/e2b/a/b").exists());

    s.sh("printf hello > /tmp/e2b/a/f.txt; ln -s f.txt /tmp/e2b/a/link")
        .await;
    let (status, st) = s
        .unary_as(
            "filesystem.Filesystem/Stat",
            json!({"path": "/tmp/e2b/a/f.txt"}),
            Some("root"),
        )
        .await;
    assert_eq!(status, 200);
    let e = &st["entry"];
    assert_eq!(e["type"], "FILE_TYPE_FILE");
    assert_eq!(e["size"], "5", "int64 is a string in proto3 JSON");
    assert_eq!(e["permissions"], "-rw-r--r--");
    assert_eq!(e["mode"], 0o644);
    assert_eq!(e["owner"], "root");
    let (_, st) = s
        .unary(
            "filesystem.Filesystem/Stat",
            json!({"path": "/tmp/e2b/a/link"}),
        )
        .await;
    // As envd: a link reads as its target's type, with the target's absolute path.
    assert_eq!(st["entry"]["type"], "FILE_TYPE_FILE", "{st}");
    assert_eq!(st["entry"]["symlinkTarget"], "/tmp/e2b/a/f.txt");

    let (_, one) = s
        .unary(
            "filesystem.Filesystem/ListDir",
            json!({"path": "/tmp/e2b", "depth": 1}),
        )
        .await;
    assert_eq!(names(&one), ["/tmp/e2b/a"]);
    let (_, three) = s
        .unary(
            "filesystem.Filesystem/ListDir",
            json!({"path": "/tmp/e2b", "depth": 3}),
        )
        .await;
    assert_eq!(
        names(&three),
        [
            "/tmp/e2b/a",
            "/tmp/e2b/a/b",
            "/tmp/e2b/a/f.txt",
            "/tmp/e2b/a/link"
        ]
    );

    // A symlink to a directory lists the directory.
    s.sh("ln -s a /tmp/e2b/alink").await;
    let (status, via) = s
        .unary(
            "filesystem.Filesystem/ListDir",
            json!({"path": "/tmp/e2b/alink"}),
        )
        .await;
    assert_eq!(status, 200, "{via}");
    assert_eq!(
        names(&via),
        ["/tmp/e2b/a/b", "/tmp/e2b/a/f.txt", "/tmp/e2b/a/link"]
    );
    s.sh("rm /tmp/e2b/alink").await;

    let (status, moved) = s
        .unary(
            "filesystem.Filesystem/Move",
            json!({"source": "/tmp/e2b/a/f.txt", "destination": "/tmp/e2b/g.txt"}),
        )
        .await;
    assert_eq!(status, 200, "{moved}");
    assert_eq!(moved["entry"]["path"], "/tmp/e2b/g.txt");
    assert_eq!(
        s.sh("cat /tmp/e2b/g.txt; test -e /tmp/e2b/a/f.txt || echo ' gone'")
            .await,
        "hello gone\n"
    );

    let (status, _) = s
        .unary(
            "filesystem.Filesystem/Remove",
            json!({"path": "/tmp/e2b/a"}),
        )
        .await;
    assert_eq!(status, 200);
    assert_eq!(s.sh("ls /tmp/e2b").await, "g.txt\n");
    // Removing what is not there succeeds (the SDK's remove() of a missing file).
    let (status, _) = s
        .unary(
            "filesystem.Filesystem/Remove",
            json!({"path": "/tmp/e2b/a"}),
        )
        .await;
    assert_eq!(status, 200);
    s.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn relative_paths_are_below_the_users_home() {
    also_as_nobody("filesystem::relative_paths_are_below_the_users_home");
    let s = Served::start().await;
    for (user, home) in [("root", "/root"), ("user", "/home/user")] {
        let home = match s.sb.stat(home).await {
            Ok(st) if st.kind == lockbox_runtime::FileKind::Dir => home,
            _ => "/tmp",
        };
        s.sh(&format!("printf {user} > {home}/mine-{user}")).await;
        let (status, st) = s
            .unary_as(
                "filesystem.Filesystem/Stat",
                json!({"path": format!("mine-{user}")}),
                Some(user),
            )
            .await;
        assert_eq!(status, 200, "{st}");
        assert_eq!(st["entry"]["path"], format!("{home}/mine-{user}"));
        let (_, tilde) = s
            .unary_as(
                "filesystem.Filesystem/Stat",
                json!({"path": format!("~/mine-{user}")}),
                Some(user),
            )
            .await;
        assert_eq!(tilde["entry"]["path"], st["entry"]["path"], "~ is the home");
        assert_eq!(st["entry"]["size"], user.len().to_string());
    }
    s.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn missing_existing_and_wrong_kind_paths_get_the_codes_the_sdk_expects() {
    also_as_nobody(
        "filesystem::missing_existing_and_wrong_kind_paths_get_the_codes_the_sdk_expects",
    );
    let s = Served::start().await;
    let (status, body) = s
        .unary(
            "filesystem.Filesystem/Stat",
            json!({"path": "/tmp/nope/none"}),
        )
        .await;
    assert_eq!((status, body["code"].as_str()), (404, Some("not_found")));
    s.sh("mkdir -p /tmp/there; touch /tmp/file").await;
    let (status, body) = s
        .unary(
            "filesystem.Filesystem/MakeDir",
            json!({"path": "/tmp/there"}),
        )
        .await;
    assert_eq!(
        (status, body["code"].as_str()),
        (409, Some("already_exists"))
    );
    let (status, body) = s
        .unary(
            "filesystem.Filesystem/ListDir",
            json!({"path": "/tmp/file", "depth": 1}),
        )
        .await;
    assert_eq!(
        (status, body["code"].as_str()),
        (400, Some("invalid_argument"))
    );
    let (status, body) = s
        .unary(
            "filesystem.Filesystem/ListDir",
            json!({"path": "/tmp/nope", "depth": 1}),
        )
        .await;
    assert_eq!((status, body["code"].as_str()), (404, Some("not_found")));
    let (status, body) = s
        .unary(
            "filesystem.Filesystem/GetWatcherEvents",
            json!({"watcherId": "w-unknown"}),
        )
        .await;
    assert_eq!((status, body["code"].as_str()), (404, Some("not_found")));
    let mut st = s
        .stream(
            "filesystem.Filesystem/WatchDir",
            json!({"path": "/tmp/nope"}),
            None,
        )
        .await;
    assert_eq!(st.end().await.unwrap()["code"], "not_found");
    s.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_recursive_watch_streams_changes_with_names_relative_to_the_directory() {
    also_as_nobody(
        "filesystem::a_recursive_watch_streams_changes_with_names_relative_to_the_directory",
    );
    let s = Served::start().await;
    s.sh("mkdir -p /tmp/w/sub").await;
    let mut st = s
        .stream(
            "filesystem.Filesystem/WatchDir",
            json!({"path": "/tmp/w", "recursive": true, "includeEntry": true}),
            None,
        )
        .await;
    let first = st.event().await;
    assert!(first.get("start").is_some(), "a start event first: {first}");
    s.sh("printf x > /tmp/w/sub/new.txt").await;
    let mut seen = Vec::new();
    loop {
        let ev = st.event().await["filesystem"].clone();
        seen.push((
            ev["name"].as_str().unwrap().to_owned(),
            ev["type"].as_str().unwrap().to_owned(),
        ));
        if ev["name"] == "sub/new.txt" && ev["type"] == "EVENT_TYPE_CREATE" {
            assert_eq!(ev["entry"]["path"], "/tmp/w/sub/new.txt", "{ev}");
            break;
        }
    }
    assert_eq!(
        seen[0],
        ("sub/new.txt".to_owned(), "EVENT_TYPE_CREATE".to_owned()),
        "{seen:?}"
    );
    s.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_polled_watcher_keeps_events_until_fetched_and_stops_when_removed() {
    also_as_nobody(
        "filesystem::a_polled_watcher_keeps_events_until_fetched_and_stops_when_removed",
    );
    let s = Served::start().await;
    s.sh("mkdir -p /tmp/pw").await;
    let (status, created) = s
        .unary(
            "filesystem.Filesystem/CreateWatcher",
            json!({"path": "/tmp/pw"}),
        )
        .await;
    assert_eq!(status, 200, "{created}");
    let id = created["watcherId"].as_str().unwrap().to_owned();
    s.sh("touch /tmp/pw/a; rm /tmp/pw/a").await;
    let mut got: Vec<(String, String)> = Vec::new();
    let mut done = false;
    for _ in 0..1000 {
        let (_, body) = s
            .unary(
                "filesystem.Filesystem/GetWatcherEvents",
                json!({"watcherId": id}),
            )
            .await;
        for e in body["events"].as_array().cloned().unwrap_or_default() {
            got.push((
                e["name"].as_str().unwrap().into(),
                e["type"].as_str().unwrap().into(),
            ));
        }
        done = got.iter().any(|(_, t)| t == "EVENT_TYPE_REMOVE");
        if done {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(10)).await;
    }
    assert!(done, "events: {got:?}");
    assert_eq!(
        got.first().unwrap(),
        &("a".to_owned(), "EVENT_TYPE_CREATE".to_owned())
    );
    let (status, _) = s
        .unary(
            "filesystem.Filesystem/RemoveWatcher",
            json!({"watcherId": id}),
        )
        .await;
    assert_eq!(status, 200);
    let (status, _) = s
        .unary(
            "filesystem.Filesystem/GetWatcherEvents",
            json!({"watcherId": id}),
        )
        .await;
    assert_eq!(status, 404, "removed");
    s.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_file_written_by_lockbox_reads_as_envds_in_place_write_to_a_poll_right_after() {
    also_as_nobody(
        "filesystem::a_file_written_by_lockbox_reads_as_envds_in_place_write_to_a_poll_right_after",
    );
    let s = Served::start().await;
    s.sh("mkdir -p /tmp/ww").await;
    let (_, created) = s
        .unary(
            "filesystem.Filesystem/CreateWatcher",
            json!({"path": "/tmp/ww", "includeEntry": true}),
        )
        .await;
    let id = created["watcherId"].as_str().unwrap().to_owned();
    // The way REST /files writes: a temporary file renamed over the name.
    s.sb.write_file(
        "/tmp/ww/f.txt",
        Box::pin(std::io::Cursor::new(b"content".to_vec())),
        lockbox_runtime::WriteOptions::default(),
    )
    .await
    .unwrap();
    let (_, body) = s
        .unary(
            "filesystem.Filesystem/GetWatcherEvents",
            json!({"watcherId": id}),
        )
        .await;
    let events: Vec<(String, String)> = body["events"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| {
            (
                e["name"].as_str().unwrap().into(),
                e["type"].as_str().unwrap().into(),
            )
        })
        .collect();
    let want = |t: &str| ("f.txt".to_owned(), t.to_owned());
    assert_eq!(
        events,
        [
            want("EVENT_TYPE_CREATE"),
            want("EVENT_TYPE_CHMOD"),
            want("EVENT_TYPE_WRITE")
        ],
        "no temporary file, the whole write at once"
    );
    assert_eq!(body["events"][2]["entry"]["size"], "7");
    s.stop().await;
}
