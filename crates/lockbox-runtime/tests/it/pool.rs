//! The pool of pre-armed sandboxes: a creation of the default spec takes one, which is as
//! fresh as a started one (nothing of an earlier sandbox, no session listed, its default
//! session working); any other spec is armed after its first creation and its pooled
//! sandboxes show exactly what started ones do (variables, cwd, hostname, network, image
//! root; a workdir's view, commit and stale-base refusals, a change made before the take
//! seen as a started one sees it); an image is keyed by its id, so a moved tag never gets a
//! stale one; the bound evicts the least recently used spec; the pool refills, and
//! shutdown leaves no process, image hold, image root or branch. The tests count their
//! sandbox agents.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use crate::common;
use common::*;
use lockbox_image::PullPolicy;
use lockbox_policy::{Net, NetSpec, Policy};
use lockbox_runtime::{OnExit, PoolKeyStats, Runtime, RuntimeConfig, SandboxSpec, Selection};
use lockbox_testkit::oci;
use std::path::Path;
use std::time::Duration;

/// Each test runs in a process of its own, where it counts its sandbox agents; they arm many
/// sandboxes each, so they run one at a time, not all beside the rest of the suite.
static SERIAL: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

async fn until_ready(rt: &Runtime, n: usize) {
    for _ in 0..1500 {
        if rt.pool_ready() >= n {
            return;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    panic!("the pool did not refill to {n}: {}", rt.pool_ready());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pooled_sandboxes_are_as_fresh_as_started_ones_and_shutdown_stops_the_pool() {
    let _serial = SERIAL.lock().await;
    let name = lockbox_testkit::test_name!(
        "pooled_sandboxes_are_as_fresh_as_started_ones_and_shutdown_stops_the_pool"
    );
    also_as_nobody(&name);
    if !in_own_process(&name) {
        return;
    }
    let before = host_agents();
    let state = scratch();
    let mut config = RuntimeConfig::new(state.path());
    config.agent_exe = Some(agent_exe().to_owned());
    config.pool_size = 2;
    let rt = Runtime::open(config).unwrap();
    until_ready(&rt, 2).await;
    // The pooled sandboxes run (each is its agent, and a shim over its spare shell).
    assert!(host_agents() >= before + 2, "{} agents", host_agents());

    let mut pids = Vec::new();
    for round in 0..4 {
        until_ready(&rt, 2).await;
        let info = rt.create_sandbox(SandboxSpec::default()).await.unwrap();
        assert_eq!(info.sessions, 0, "a pooled sandbox lists no session yet");
        let sb = rt.sandbox(&info.id).unwrap();
        // Nothing of the sandbox before it: its own /tmp, no leftover file.
        let r = run(
            &sb,
            "ls /tmp; echo $$; touch /tmp/mark-$RANDOM; cd /tmp; export R=1",
        )
        .await;
        let text = out(&r);
        let mut lines: Vec<&str> = text.lines().collect();
        let pid = lines.pop().unwrap().to_owned();
        assert!(lines.is_empty(), "round {round}: /tmp holds {lines:?}");
        pids.push(pid);
        // The default session keeps its state as a started one does.
        assert_eq!(out(&run(&sb, "echo $PWD $R").await), "/tmp 1\n");
        assert_eq!(rt.sandbox_info(&info.id).unwrap().sessions, 1);
        rt.delete_sandbox(&info.id).await.unwrap();
    }
    // A workdir's spec starts the first time (and is armed from then on).
    let work = scratch();
    let spec = SandboxSpec {
        workdir: Some(work.path().to_owned()),
        ..SandboxSpec::default()
    };
    let info = rt.create_sandbox(spec).await.unwrap();
    let sb = rt.sandbox(&info.id).unwrap();
    assert_eq!(out(&run(&sb, "echo ok").await), "ok\n");
    rt.delete_sandbox(&info.id).await.unwrap();

    // The default's two and the workdir's two.
    until_ready(&rt, 4).await;
    rt.shutdown().await;
    assert_eq!(rt.pool_ready(), 0);
    for _ in 0..200 {
        if host_agents() == before {
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert_eq!(
        host_agents(),
        before,
        "pooled sandboxes left running after shutdown"
    );
    assert_eq!(branches(state.path()), 0, "ready sandboxes' branches left");
}

/// Branches of spare forks (over a snapshot's layers) in a state directory.
fn fork_branches(state: &Path) -> usize {
    lockbox_cow::list(state)
        .unwrap()
        .iter()
        .filter(|b| b.meta.as_ref().is_ok_and(|m| !m.layers.is_empty()))
        .count()
}

/// Branches of workdir `dir` in a state directory: (those of ready sandboxes, the others).
fn branches_of(state: &Path, dir: &Path) -> (usize, usize) {
    let dir = std::fs::canonicalize(dir).unwrap();
    let listed = lockbox_cow::list(state).unwrap();
    let of: Vec<_> = listed
        .iter()
        .filter_map(|b| b.meta.as_ref().ok())
        .filter(|m| m.workdir == dir)
        .collect();
    let spares = of
        .iter()
        .filter(|m| lockbox_cow::is_spare(&m.context))
        .count();
    (spares, of.len() - spares)
}

/// Branches of a state directory (not its staging directory).
fn branches(state: &std::path::Path) -> usize {
    std::fs::read_dir(state.join("branches")).map_or(0, |rd| {
        rd.flatten()
            .filter(|e| !e.file_name().to_string_lossy().starts_with('.'))
            .count()
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn spare_forks_of_a_snapshot_are_whole_forks_and_never_hold_it_or_outlive_the_runtime() {
    let _serial = SERIAL.lock().await;
    let name = lockbox_testkit::test_name!(
        "spare_forks_of_a_snapshot_are_whole_forks_and_never_hold_it_or_outlive_the_runtime"
    );
    also_as_nobody(&name);
    if !in_own_process(&name) {
        return;
    }
    let before = host_agents();
    let state = scratch();
    let work = scratch();
    let open = || {
        let mut config = RuntimeConfig::new(state.path());
        config.agent_exe = Some(agent_exe().to_owned());
        config.pool_size = 2;
        Runtime::open(config).unwrap()
    };
    let rt = open();
    let spec = SandboxSpec {
        workdir: Some(work.path().to_owned()),
        on_exit: lockbox_runtime::OnExit::Abort,
        ..SandboxSpec::default()
    };
    let info = rt.create_sandbox(spec).await.unwrap();
    let sb = rt.sandbox(&info.id).unwrap();
    let r = run(
        &sb,
        "echo base > f; mkdir d; echo t > /tmp/t; cd d; export V=7",
    )
    .await;
    assert_eq!(r.exit_code, 0, "{r:?}");
    let snap = sb
        .snapshot_with(lockbox_runtime::SnapshotOptions {
            name: None,
            include_tmp: true,
        })
        .await
        .unwrap();
    // The first fork arms spares of the snapshot: two besides the two default sandboxes and
    // the two of the workdir's spec.
    let first = rt.fork_snapshot(snap.id.as_str(), 1).await.unwrap();
    until_ready(&rt, 6).await;
    // Taken from the spares, forks are as whole as the first: the snapshot's files, its
    // /tmp, the session's cwd and variables; each its own sandbox, writing its own layer.
    let forks = rt.fork_snapshot(snap.id.as_str(), 3).await.unwrap();
    let mut ids: Vec<&str> = forks.iter().map(|f| f.id.as_str()).collect();
    ids.push(first[0].id.as_str());
    ids.sort_unstable();
    ids.dedup();
    assert_eq!(ids.len(), 4, "{ids:?}");
    for (n, f) in forks.iter().enumerate() {
        let fork = rt.sandbox(&f.id).unwrap();
        let seen = run(
            &fork,
            &format!("echo $PWD $V; cat ../f /tmp/t; echo {n} > ../own"),
        )
        .await;
        assert_eq!(
            out(&seen),
            format!("{}/d 7\nbase\nt\n", work.path().display()),
            "fork {n}"
        );
    }
    for f in &forks {
        let fork = rt.sandbox(&f.id).unwrap();
        let changes = fork.changes().await.unwrap();
        let own: Vec<String> = changes
            .iter()
            .map(|c| c.path.display().to_string())
            .filter(|p| p == "own")
            .collect();
        assert_eq!(own.len(), 1, "{changes:?}");
    }
    assert!(std::fs::read_dir(work.path()).unwrap().next().is_none());
    // Spares never keep a snapshot from being deleted once its forks are gone, and go with it.
    until_ready(&rt, 6).await;
    for f in forks.iter().chain(&first) {
        rt.delete_sandbox(&f.id).await.unwrap();
    }
    rt.delete_snapshot(snap.id.as_str()).await.unwrap();
    rt.delete_sandbox(&info.id).await.unwrap();
    assert_eq!(fork_branches(state.path()), 0, "spare forks' branches left");

    // A runtime that dies with spares armed leaves branches its successor sweeps.
    let info = rt
        .create_sandbox(SandboxSpec {
            workdir: Some(work.path().to_owned()),
            on_exit: lockbox_runtime::OnExit::Abort,
            ..SandboxSpec::default()
        })
        .await
        .unwrap();
    let sb = rt.sandbox(&info.id).unwrap();
    let snap = sb.snapshot(None).await.unwrap();
    let fork = rt.fork_snapshot(snap.id.as_str(), 1).await.unwrap();
    until_ready(&rt, 6).await;
    // The runtime dies without its shutdown: what a kill leaves (the sandboxes die with
    // their handles; the branches stay).
    drop(sb);
    drop(rt);
    let listed = lockbox_cow::list(state.path()).unwrap();
    assert_eq!(
        listed.len(),
        6,
        "the sandbox's, the fork's, two spare forks' and two ready sandboxes' branches"
    );
    // Each names its sandbox's init (issue 32: an orphan only once that is gone too).
    for b in &listed {
        let meta = b.meta.as_ref().unwrap();
        assert!(meta.sandbox_init.is_some(), "{meta:?}");
    }
    let rt = open();
    let kept: Vec<String> = lockbox_cow::list(state.path())
        .unwrap()
        .iter()
        .map(|b| {
            b.meta.as_ref().unwrap().context["sandbox"]
                .as_str()
                .unwrap()
                .to_owned()
        })
        .collect();
    let mut expected = vec![info.id.to_string(), fork[0].id.to_string()];
    expected.sort();
    let mut kept = kept;
    kept.sort();
    assert_eq!(
        kept, expected,
        "only the spares are swept; sandboxes' branches stay"
    );
    rt.shutdown().await;
    for _ in 0..200 {
        if host_agents() == before {
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert_eq!(host_agents(), before, "sandboxes left running");
}

/// Waits until the pool keeps a spec other than the default one with `image` (a store id)
/// and has `n` of it ready; returns its stats.
async fn until_key_ready(rt: &Runtime, image: Option<&str>, n: usize) -> PoolKeyStats {
    let find = || {
        rt.pool_stats()
            .into_iter()
            .find(|k| !k.default && k.image.as_deref() == image)
    };
    for _ in 0..1000 {
        if let Some(k) = find().filter(|k| k.ready >= n) {
            return k;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    panic!("no {n} ready of image {image:?}: {:?}", rt.pool_stats());
}

/// An OCI layout at `dir`, tag `v1`, of a busybox root (and a static bash) made at `root`: Env `PATH=/bin`
/// and `GREETING=greeting`, WorkingDir `/work`. Returns the image's id.
fn busybox_layout(dir: &Path, root: &Path, greeting: &str) -> String {
    oci::busybox_root(
        root,
        &[
            "sh", "cat", "echo", "ls", "env", "pwd", "sort", "hostname", "grep", "touch",
        ],
    );
    std::fs::create_dir_all(root.join("work")).unwrap();
    // Sessions run bash.
    std::fs::copy("/bin/bash-static", root.join("bin/bash")).unwrap();
    oci::layout(
        dir,
        root,
        serde_json::json!({
            "Env": ["PATH=/bin", format!("GREETING={greeting}")],
            "Cmd": ["sh"],
            "WorkingDir": "/work",
        }),
        "v1",
    )
}

/// What a sandbox shows of its spec: its variables, cwd, hostname and root, and (`probe`)
/// what its network lets through.
async fn seen(rt: &Runtime, id: &str, probe: &str) -> String {
    let sb = rt.sandbox(id).unwrap();
    let r = run(
        &sb,
        &format!("env | sort; pwd; hostname; ls /; touch /mine-$$ && echo wrote; {probe}"),
    )
    .await;
    assert_eq!(r.exit_code, 0, "{r:?}");
    out(&r)
}

/// Images in the store and who holds them.
fn holders(state: &Path) -> Vec<(String, Vec<String>)> {
    let store = lockbox_image::Store::in_state_dir(state).unwrap();
    store
        .list()
        .unwrap()
        .into_iter()
        .map(|i| (i.id, i.holders))
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pooled_sandbox_of_any_spec_is_indistinguishable_from_a_started_one() {
    let _serial = SERIAL.lock().await;
    let name = lockbox_testkit::test_name!(
        "a_pooled_sandbox_of_any_spec_is_indistinguishable_from_a_started_one"
    );
    also_as_nobody(&name);
    if !in_own_process(&name) {
        return;
    }
    let before = host_agents();
    let work = scratch();
    let state = work.path().join("state");
    let mut config = RuntimeConfig::new(&state);
    config.agent_exe = Some(agent_exe().to_owned());
    config.pool_size = 1;
    let rt = Runtime::open(config).unwrap();
    until_ready(&rt, 1).await;

    // A host-userland spec of its own (variables, cwd, hostname, an allow-list: a network
    // supervisor whose audit log is the sandbox's), and one on an image.
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    let mut host = Policy {
        net: Net::Allow(vec![
            NetSpec::parse(&format!("tcp://127.0.0.1:{port}")).unwrap()
        ]),
        cwd: Some("/tmp".into()),
        hostname: "pooled".into(),
        ..Policy::default()
    };
    host.env.set.insert("TASK".into(), "one".into());
    let lay = work.path().join("lay");
    let image_id = busybox_layout(&lay, &work.path().join("root1"), "from-image");
    let mut image = Policy {
        image: Some(format!("oci:{}:v1", lay.display())),
        ..Policy::default()
    };
    image.env.set.insert("TASK".into(), "two".into());
    let connect = format!(
        "python3 -c \"import socket\nfor a in [('127.0.0.1', {port}), ('192.0.2.1', 80)]:\n  \
         try:\n    socket.create_connection(a, timeout=5); print('open')\n  \
         except OSError as e:\n    print(e.errno)\""
    );
    let no_net = "cat /proc/net/dev | grep -c :";
    for (policy, probe, image) in [
        (host, connect.as_str(), None),
        (image, no_net, Some(image_id.as_str())),
    ] {
        let spec = |label: &str| SandboxSpec {
            policy: policy.clone(),
            labels: [("n".to_owned(), label.to_owned())].into(),
            ..SandboxSpec::default()
        };
        // Its first creation misses the pool and starts a sandbox; the spec is then armed.
        let started = rt.create_sandbox(spec("started")).await.unwrap();
        let direct = seen(&rt, &started.id, probe).await;
        let armed = until_key_ready(&rt, image, 1).await;
        assert_eq!((armed.hits, armed.misses), (0, 1), "{armed:?}");
        // The next takes a ready one, which shows exactly what a started one does.
        let taken = rt.create_sandbox(spec("taken")).await.unwrap();
        let key = until_key_ready(&rt, image, 0).await;
        assert_eq!((key.hits, key.misses), (1, 1), "{key:?}");
        assert_eq!(taken.labels["n"], "taken", "the taker's labels");
        let pooled = seen(&rt, &taken.id, probe).await;
        assert_eq!(pooled, direct, "a pooled sandbox against a started one");
        assert!(pooled.contains("TASK="), "{pooled}");
        if image.is_none() {
            assert!(pooled.contains("\n/tmp\npooled\n"), "{pooled}");
            assert!(
                pooled.ends_with("0\n13\n") || pooled.ends_with("open\n13\n"),
                "{pooled}"
            );
            // Its network decisions are in its own audit log, under its own id.
            // (The supervisor records a decision after answering the connection: wait for it.)
            let sb = rt.sandbox(&taken.id).unwrap();
            let deadline = std::time::Instant::now() + Duration::from_secs(10);
            let mut events = sb.audit_log();
            while events.is_empty() && std::time::Instant::now() < deadline {
                tokio::time::sleep(Duration::from_millis(20)).await;
                events = sb.audit_log();
            }
            assert!(!events.is_empty(), "no network decision recorded");
            assert!(events
                .iter()
                .all(|e| e.sandbox.as_deref() == Some(taken.id.as_str())));
        } else {
            assert!(pooled.contains("GREETING=from-image\n"), "{pooled}");
            assert!(pooled.contains("\n/work\n"), "{pooled}");
        }
        for id in [&started.id, &taken.id] {
            rt.delete_sandbox(id).await.unwrap();
        }
    }

    rt.shutdown().await;
    assert_eq!(rt.pool_ready(), 0);
    for _ in 0..200 {
        if host_agents() == before {
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert_eq!(host_agents(), before, "sandboxes left running");
    for (id, held) in holders(&state) {
        assert!(held.is_empty(), "{id} held by {held:?} after shutdown");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_moved_tag_never_gets_a_stale_pooled_sandbox_and_evicted_keys_leave_nothing() {
    let _serial = SERIAL.lock().await;
    let name = lockbox_testkit::test_name!(
        "a_moved_tag_never_gets_a_stale_pooled_sandbox_and_evicted_keys_leave_nothing"
    );
    also_as_nobody(&name);
    if !in_own_process(&name) {
        return;
    }
    let before = host_agents();
    let work = scratch();
    let state = work.path().join("state");
    let mut config = RuntimeConfig::new(&state);
    config.agent_exe = Some(agent_exe().to_owned());
    // The default spec's one and one of one other spec.
    config.pool_size = 1;
    config.pool_max_spares = 2;
    let rt = Runtime::open(config).unwrap();
    let lay = work.path().join("lay");
    let old = busybox_layout(&lay, &work.path().join("root1"), "old");
    let reference = format!("oci:{}:v1", lay.display());
    let spec = |pull| SandboxSpec {
        policy: Policy {
            image: Some(reference.clone()),
            ..Policy::default()
        },
        image_pull: pull,
        ..SandboxSpec::default()
    };
    let greeting = |id: lockbox_runtime::SandboxId| {
        let rt = rt.clone();
        async move {
            let sb = rt.sandbox(&id).unwrap();
            let text = out(&run(&sb, "echo $GREETING").await);
            rt.delete_sandbox(&id).await.unwrap();
            text
        }
    };
    let first = rt.create_sandbox(spec(PullPolicy::Missing)).await.unwrap();
    assert_eq!(greeting(first.id).await, "old\n");
    until_key_ready(&rt, Some(&old), 1).await;
    // The ready sandbox holds its image as a sandbox does: it cannot go from under it.
    let held = holders(&state);
    assert_eq!(held.len(), 1);
    assert_eq!(held[0].1.len(), 1, "{held:?}");

    // A spec that cannot start takes no key's place.
    let unstartable = SandboxSpec {
        net_ask: Some(Duration::from_secs(1)),
        ..SandboxSpec::default()
    };
    assert!(rt.create_sandbox(unstartable).await.is_err());
    until_key_ready(&rt, Some(&old), 1).await;

    // The tag moves: a creation that pulls it again runs the new image, never the ready
    // sandbox of the old one; the new spec evicts the old one's (the bound is 2), which
    // releases the old image: it can be removed.
    let new = busybox_layout(&lay, &work.path().join("root2"), "new");
    assert_ne!(new, old);
    let moved = rt.create_sandbox(spec(PullPolicy::Always)).await.unwrap();
    assert_eq!(greeting(moved.id).await, "new\n");
    let stats = rt.pool_stats();
    assert_eq!(stats.len(), 2, "{stats:?}");
    assert_eq!(stats[1].image.as_deref(), Some(new.as_str()), "{stats:?}");
    until_key_ready(&rt, Some(&new), 1).await;
    let taken = rt.create_sandbox(spec(PullPolicy::Missing)).await.unwrap();
    assert_eq!(greeting(taken.id).await, "new\n");
    let store = lockbox_image::Store::in_state_dir(&state).unwrap();
    let mut removed = None;
    for _ in 0..200 {
        match store.remove(&old) {
            Ok(r) => {
                removed = Some(r);
                break;
            }
            Err(_) => tokio::time::sleep(Duration::from_millis(10)).await,
        }
    }
    assert!(
        removed.is_some(),
        "the evicted spec's image stayed held: {:?}",
        holders(&state)
    );

    // Shutdown stops every ready sandbox: no agent, image hold or image root is left.
    until_key_ready(&rt, Some(&new), 1).await;
    until_ready(&rt, 2).await;
    rt.shutdown().await;
    for _ in 0..200 {
        if host_agents() == before {
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert_eq!(host_agents(), before, "sandboxes left running");
    for (id, held) in holders(&state) {
        assert!(held.is_empty(), "{id} held by {held:?} after shutdown");
    }
    let roots = std::fs::read_dir(state.join("image-roots")).map_or(0, |d| d.count());
    assert_eq!(roots, 0, "image roots' writable layers left");
    assert_eq!(branches(&state), 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pooled_workdir_sandbox_is_the_one_a_start_would_make_and_unused_leaves_no_branch() {
    let _serial = SERIAL.lock().await;
    let name = lockbox_testkit::test_name!(
        "a_pooled_workdir_sandbox_is_the_one_a_start_would_make_and_unused_leaves_no_branch"
    );
    also_as_nobody(&name);
    if !in_own_process(&name) {
        return;
    }
    let before = host_agents();
    let state = scratch();
    let work = scratch();
    let other = scratch();
    let file = |name: &str| std::fs::read_to_string(work.path().join(name)).unwrap();
    std::fs::write(work.path().join("f"), "base\n").unwrap();
    std::fs::create_dir(work.path().join("d")).unwrap();
    std::fs::write(work.path().join("d/g"), "g\n").unwrap();
    let mut config = RuntimeConfig::new(state.path());
    config.agent_exe = Some(agent_exe().to_owned());
    // The default spec's one and one of one workdir's.
    config.pool_size = 1;
    config.pool_max_spares = 2;
    let rt = Runtime::open(config).unwrap();
    let spec = |dir: &Path, on_exit| SandboxSpec {
        workdir: Some(dir.to_owned()),
        on_exit,
        ..SandboxSpec::default()
    };
    let key = |rt: &Runtime| rt.pool_stats().into_iter().find(|k| !k.default).unwrap();
    let view = "cat f d/g; ls -a; echo $PWD";

    // The first creation starts; the workdir's spec is then armed: its branch made, a
    // spare's until the take.
    let started = rt
        .create_sandbox(spec(work.path(), OnExit::Abort))
        .await
        .unwrap();
    let direct = rt.sandbox(&started.id).unwrap();
    let seen_direct = out(&run(&direct, view).await);
    assert!(seen_direct.starts_with("base\ng\n"), "{seen_direct}");
    let armed = until_key_ready(&rt, None, 1).await;
    assert_eq!((armed.hits, armed.misses), (0, 1), "{armed:?}");
    assert_eq!(branches_of(state.path(), work.path()), (1, 1));

    // The next takes it (another `on_exit`: the taker's): the same view of the workdir.
    let taken = rt
        .create_sandbox(spec(work.path(), OnExit::Commit))
        .await
        .unwrap();
    assert_eq!((key(&rt).hits, key(&rt).misses), (1, 1));
    assert_eq!(
        branches_of(state.path(), work.path()).1,
        2,
        "named at the take"
    );
    let pooled = rt.sandbox(&taken.id).unwrap();
    assert_eq!(out(&run(&pooled, view).await), seen_direct);

    // The same commits: each its own file; and the same refusal of a path the host changed
    // after the sandbox began, committed only when forced.
    for (sb, name) in [(&direct, "from-direct"), (&pooled, "from-pooled")] {
        run(sb, &format!("echo {name} > {name}")).await;
        sb.commit(Selection::default()).await.unwrap();
        assert_eq!(file(name), format!("{name}\n"));
    }
    std::thread::sleep(Duration::from_millis(20));
    std::fs::write(work.path().join("d/g"), "host\n").unwrap();
    for (sb, name) in [(&direct, "direct"), (&pooled, "pooled")] {
        run(sb, &format!("echo {name} > d/g")).await;
        let err = sb.commit(Selection::default()).await.unwrap_err();
        assert_eq!(err.code(), "CONFLICT", "{name}: {err}");
        assert_eq!(file("d/g"), "host\n");
    }
    pooled
        .commit(Selection {
            force: true,
            ..Selection::default()
        })
        .await
        .unwrap();
    assert_eq!(file("d/g"), "pooled\n");
    // The taker's `on_exit` applies: committed at the end.
    run(&pooled, "echo last > last").await;
    let ended = rt.delete_sandbox(&taken.id).await.unwrap();
    assert_eq!(
        ended.branch_action,
        Some(lockbox_runtime::BranchAction::Committed)
    );
    assert_eq!(file("last"), "last\n");

    // A change to the workdir after the arming and before the take is part of what the
    // sandbox begins with, as for one started at the take: seen, and not stale.
    until_key_ready(&rt, None, 1).await;
    std::thread::sleep(Duration::from_millis(20));
    std::fs::write(work.path().join("f"), "host\n").unwrap();
    let after = rt
        .create_sandbox(spec(work.path(), OnExit::Abort))
        .await
        .unwrap();
    let sb = rt.sandbox(&after.id).unwrap();
    assert_eq!(out(&run(&sb, "cat f").await), "host\n");
    run(&sb, "echo after > f").await;
    sb.commit(Selection::default()).await.unwrap();
    assert_eq!(file("f"), "after\n");
    for id in [&started.id, &after.id] {
        rt.delete_sandbox(id).await.unwrap();
    }

    // Another workdir's spec evicts this one (the bound is 2): its ready sandbox's branch
    // is removed, not kept for review.
    until_key_ready(&rt, None, 1).await;
    assert_eq!(branches_of(state.path(), work.path()), (1, 0));
    let elsewhere = rt
        .create_sandbox(spec(other.path(), OnExit::Abort))
        .await
        .unwrap();
    assert_eq!(branches_of(state.path(), work.path()), (0, 0));
    rt.delete_sandbox(&elsewhere.id).await.unwrap();

    // Shutdown stops the other's: no sandbox and no branch left.
    until_key_ready(&rt, None, 1).await;
    rt.shutdown().await;
    for _ in 0..200 {
        if host_agents() == before {
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert_eq!(host_agents(), before, "sandboxes left running");
    assert_eq!(branches(state.path()), 0, "branches left");
    assert!(lockbox_cow::list(state.path()).unwrap().is_empty());
}
