//! The agent's one privilege over its commands: only it may call `openat2` (whose mode the
//! seccomp filter cannot read). Commands it starts get `ENOSYS`, cannot reach the agent by
//! ptrace, `/proc/PID/mem` or `pidfd_getfd`, nor the sandbox's init, while the files API
//! (which resolves with `openat2`) keeps working. The init, re-executed once the agent runs,
//! carries nothing of the runtime's memory.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use crate::common;
use common::*;
use futures_util::StreamExt;
use lockbox_runtime::{ProcessCommand, ProcessSpec, WriteOptions};
use std::os::unix::fs::MetadataExt;
use tokio::io::AsyncReadExt;

/// Tries `openat2(O_CREAT, 04755)` and every way into the agent; prints one `name=errno`
/// per attempt (0 means it worked).
// No single quote in it: the session test passes it inside one.
const PROBE: &str = r#"
import ctypes, os, struct
libc = ctypes.CDLL(None, use_errno=True)
libc.syscall.restype = ctypes.c_long
def call(*args):
    r = libc.syscall(*args)
    return 0 if r >= 0 else ctypes.get_errno()
how = struct.pack("QQQ", os.O_CREAT | os.O_WRONLY, 0o4755, 0)
print("openat2=%d" % call(437, -100, b"/tmp/planted", how, 24))
needle = b"__lockbox" + b"_agent"
def ppid(p):
    return int(open("/proc/%s/stat" % p).read().rsplit(")", 1)[1].split()[1])
# The agent is the child of the init; its shims (forks of it) share its command line.
agent = [int(p) for p in os.listdir("/proc") if p.isdigit() and int(p) != os.getpid()
         and needle in open("/proc/%s/cmdline" % p, "rb").read() and ppid(p) == 1]
print("agents=%d" % len(agent))
pid = agent[0]
print("ptrace=%d" % call(101, 0x4206, pid, 0, 0))  # PTRACE_SEIZE
try:
    open("/proc/%d/mem" % pid, "rb").close()
    print("mem=0")
except OSError as e:
    print("mem=%d" % e.errno)
# A root caller can list the numbers (the directory is its uid), not reopen them.
try:
    fds = os.listdir("/proc/%d/fd" % pid)
    res = []
    for fd in fds:
        try:
            os.close(os.open("/proc/%d/fd/%s" % (pid, fd), os.O_RDONLY))
            res.append(0)
        except OSError as e:
            res.append(e.errno)
    print("fd=%d" % (min(res) if res else -1))
except OSError as e:
    print("fd=%d" % e.errno)
pidfd = libc.syscall(434, pid, 0)
print("pidfd_getfd=%d" % call(438, pidfd, 3, 0))
# The sandbox init, re-executed once the agent runs (lean_init in lockbox-confine): beside
# the first answers of the agent, not before them: a loaded machine may show it a moment later.
import time
deadline = time.monotonic() + 10
while open("/proc/1/cmdline", "rb").read() != b"lockbox-init\0" and time.monotonic() < deadline:
    time.sleep(0.01)
print("init_title=%d" % (open("/proc/1/cmdline", "rb").read() == b"lockbox-init\0"))
print("init_ptrace=%d" % call(101, 0x4206, 1, 0, 0))
try:
    open("/proc/1/mem", "rb").close()
    print("init_mem=0")
except OSError as e:
    print("init_mem=%d" % e.errno)
"#;

fn field(text: &str, name: &str) -> i32 {
    let line = text
        .lines()
        .find_map(|l| l.strip_prefix(&format!("{name}=")))
        .unwrap_or_else(|| panic!("no {name} in {text:?}"));
    line.trim().parse().unwrap()
}

fn assert_walled(text: &str) {
    assert_eq!(field(text, "openat2"), libc::ENOSYS, "{text}");
    assert_eq!(field(text, "agents"), 1, "{text}");
    assert_eq!(field(text, "ptrace"), libc::EPERM, "{text}");
    assert_eq!(field(text, "mem"), libc::EACCES, "{text}");
    // Its descriptors (the control socket), reopened through /proc.
    assert_eq!(field(text, "fd"), libc::EACCES, "{text}");
    assert_eq!(field(text, "pidfd_getfd"), libc::EPERM, "{text}");
    assert_eq!(field(text, "init_title"), 1, "{text}");
    assert_eq!(field(text, "init_ptrace"), libc::EPERM, "{text}");
    assert_eq!(field(text, "init_mem"), libc::EACCES, "{text}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn commands_get_enosys_from_openat2_and_cannot_reach_the_agent_while_files_work() {
    also_as_nobody(&lockbox_testkit::test_name!(
        "commands_get_enosys_from_openat2_and_cannot_reach_the_agent_while_files_work"
    ));
    let state = scratch();
    let (rt, sb) = sandbox(state.path()).await;
    // A session command.
    let r = sb
        .exec(req(&format!("/usr/bin/python3 -c '{PROBE}'")))
        .await
        .unwrap();
    assert_eq!(r.exit_code, 0, "{}", String::from_utf8_lossy(&r.stderr));
    assert_walled(&out(&r));
    // A background process, started without a shell.
    let p = sb
        .start_process(ProcessSpec {
            command: ProcessCommand::Argv(vec![
                "/usr/bin/python3".into(),
                "-c".into(),
                PROBE.into(),
            ]),
            cwd: None,
            env: Default::default(),
            pty: None,
            log_bytes: None,
            stdin: false,
        })
        .await
        .unwrap();
    let mut logs = sb.follow_logs(&p.id, 0).unwrap();
    let mut text = Vec::new();
    while let Some(chunk) = logs.next().await {
        text.extend(chunk.segments.iter().flat_map(|s| s.data.to_vec()));
    }
    assert_walled(&String::from_utf8_lossy(&text));
    // Nothing was planted, and the agent's own openat2 still serves the files API.
    assert_eq!(
        sb.read_file("/tmp/planted", None).await.unwrap_err().code(),
        "FILE_NOT_FOUND"
    );
    let body = Box::pin(std::io::Cursor::new(b"kept".to_vec()));
    sb.write_file("/tmp/d/f.txt", body, WriteOptions::default())
        .await
        .unwrap();
    let mut f = sb.read_file("/tmp/d/f.txt", None).await.unwrap();
    let mut data = Vec::new();
    f.body.read_to_end(&mut data).await.unwrap();
    assert_eq!(data, b"kept");
    assert_eq!(sb.stat("/tmp/d/f.txt").await.unwrap().size, 4);
    rt.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_allow_list_sandbox_reaches_only_the_allowed_server_and_its_agent_still_works() {
    also_as_nobody(&lockbox_testkit::test_name!(
        "an_allow_list_sandbox_reaches_only_the_allowed_server_and_its_agent_still_works"
    ));
    let allowed = std::net::TcpListener::bind("127.0.0.2:0").unwrap();
    let other = std::net::TcpListener::bind("127.0.0.2:0").unwrap();
    other.set_nonblocking(true).unwrap();
    let (a, o) = (
        allowed.local_addr().unwrap().port(),
        other.local_addr().unwrap().port(),
    );
    let spec = lockbox_policy::NetSpec::parse(&format!("tcp://127.0.0.2:{a}")).unwrap();
    let policy = lockbox_policy::Policy {
        net: lockbox_policy::Net::Allow(vec![spec]),
        ..Default::default()
    };
    let state = scratch();
    let spec = lockbox_runtime::SandboxSpec {
        policy,
        ..Default::default()
    };
    let (rt, sb) = sandbox_with(state.path(), spec).await;
    let probe = format!(
        "/usr/bin/python3 -c \"import socket\nfor p in ({a}, {o}):\n    try:\n        socket.create_connection(('127.0.0.2', p), 5); print(p, 'ok')\n    except OSError as e: print(p, e.errno)\""
    );
    let r = run(&sb, &probe).await;
    assert_eq!(
        out(&r),
        format!("{a} ok\n{o} {}\n", libc::ECONNREFUSED),
        "{}",
        String::from_utf8_lossy(&r.stderr)
    );
    assert!(other.accept().is_err(), "the other port got a connection");
    let body = Box::pin(std::io::Cursor::new(b"net".to_vec()));
    sb.write_file("/tmp/n.txt", body, WriteOptions::default())
        .await
        .unwrap();
    assert_eq!(sb.stat("/tmp/n.txt").await.unwrap().size, 3);
    rt.shutdown().await;
}

/// The init of a long-lived sandbox is a fork of the runtime's process: once the agent runs
/// it re-executes itself small, so an idle sandbox does not hold the page tables (and a
/// copy) of a runtime that grows with every sandbox (issue 34: page tables grew as N²).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_idle_sandboxs_init_carries_nothing_of_the_runtimes_memory() {
    let name =
        lockbox_testkit::test_name!("an_idle_sandboxs_init_carries_nothing_of_the_runtimes_memory");
    also_as_nobody(&name);
    if !in_own_process(&name) {
        return;
    }
    // A runtime process with 256 MiB of its own, touched: a fork would map all of it.
    let ballast = vec![1u8; 256 << 20];
    let state = scratch();
    let (rt, sb) = sandbox(state.path()).await;
    assert_eq!(out(&run(&sb, "echo ok").await), "ok\n");
    // The init re-executes itself beside the agent's first answers, not before them: wait
    // (up to 10 s) until it has, and is named as an init again.
    let agent = std::fs::metadata(agent_exe()).unwrap();
    let is_agent = |pid: u32| {
        std::fs::metadata(format!("/proc/{pid}/exe"))
            .is_ok_and(|exe| (exe.dev(), exe.ino()) == (agent.dev(), agent.ino()))
    };
    let mut lean = inits();
    for _ in 0..1000 {
        if lean.len() == 1 && is_agent(lean[0]) {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(10)).await;
        lean = inits();
    }
    assert_eq!(lean.len(), 1, "one init: {lean:?}");
    // Its executable is the agent's (bound inside the sandbox: the same file).
    let exe = std::fs::metadata(format!("/proc/{}/exe", lean[0])).unwrap();
    assert_eq!(
        (exe.dev(), exe.ino()),
        (agent.dev(), agent.ino()),
        "the init is the agent's executable, re-executed"
    );
    let rss_anon_kb = status_kb(lean[0], "RssAnon");
    assert!(
        rss_anon_kb < 64 << 10,
        "the init maps {rss_anon_kb} kB of anonymous memory"
    );
    // It is still the sandbox's init: a delete ends it and everything under it.
    let id = sb.id().to_owned();
    rt.delete_sandbox(&id).await.unwrap();
    assert!(
        inits_gone().await,
        "the init outlived its sandbox: {:?}",
        inits()
    );
    assert_eq!(host_agents(), 0, "an agent outlived its sandbox");
    rt.shutdown().await;
    drop(ballast);
}

/// Issue 34: a long-lived sandbox's init was a fork of the runtime's process, so each create
/// copied the page tables of all of the runtime's memory (and the init's exec tore them
/// down): a server's create slowed as it held more sandboxes (11 ms of server CPU per create
/// at 10,000 against 3.4 at 1,000). The init now shares the runtime's memory until its lean
/// exec. A fork write-protects every page of its parent for copy-on-write, so the parent's
/// next write to each faults; after a create that shares, none does. And sharing, the init
/// changes nothing the runtime's memory map carries: its command line and environment,
/// and its dumpability (as uid 65534, `/proc/self` files are the process's own only while
/// it is dumpable), a network allow-list's handover included.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn creating_a_long_lived_sandbox_copies_nothing_of_the_runtime_and_changes_nothing_of_it() {
    let name = lockbox_testkit::test_name!(
        "creating_a_long_lived_sandbox_copies_nothing_of_the_runtime_and_changes_nothing_of_it"
    );
    also_as_nobody(&name);
    if !in_own_process(&name) {
        return;
    }
    let cmdline = std::fs::read("/proc/self/cmdline").unwrap();
    let environ = std::fs::read("/proc/self/environ").unwrap();
    let owner = std::fs::metadata("/proc/self/environ").unwrap().uid();
    let listener = std::net::TcpListener::bind("127.0.0.2:0").unwrap();
    let allowed = format!("tcp://127.0.0.2:{}", listener.local_addr().unwrap().port());
    let spec = lockbox_runtime::SandboxSpec {
        policy: lockbox_policy::Policy {
            net: lockbox_policy::Net::Allow(
                vec![lockbox_policy::NetSpec::parse(&allowed).unwrap()],
            ),
            ..Default::default()
        },
        ..Default::default()
    };
    let state = scratch();
    let rt = runtime(state.path()).await;
    // 256 MiB of the runtime's, touched (64 faults would be 64 huge pages of 2 MiB).
    let mut ballast = vec![1u8; 256 << 20];
    let info = rt.create_sandbox(spec).await.unwrap();
    // Counted on this thread, with no await in between.
    let before = thread_minor_faults();
    ballast.iter_mut().for_each(|b| *b = 2);
    let faults = thread_minor_faults() - before;
    assert!(
        faults < 64,
        "writing the runtime's memory after a create took {faults} page faults: it was \
         write-protected, as a fork does"
    );
    std::hint::black_box(&ballast);
    let sb = rt.sandbox(&info.id).unwrap();
    assert_eq!(out(&run(&sb, "echo ok").await), "ok\n");
    assert_eq!(std::fs::read("/proc/self/cmdline").unwrap(), cmdline);
    assert_eq!(std::fs::read("/proc/self/environ").unwrap(), environ);
    assert_eq!(
        std::fs::metadata("/proc/self/environ").unwrap().uid(),
        owner,
        "the runtime's dumpability changed"
    );
    rt.shutdown().await;
}

/// Minor page faults of the calling thread so far (`/proc/thread-self/stat`, field 10).
fn thread_minor_faults() -> u64 {
    let stat = std::fs::read_to_string("/proc/thread-self/stat").unwrap();
    // The fields after the command name, which ends at the last ')': state is field 3.
    let after = &stat[stat.rfind(')').unwrap() + 2..];
    after.split(' ').nth(7).unwrap().parse().unwrap()
}

/// A sandbox's init has a descriptor table sized to what it holds, not to its runtime's: it
/// is cloned from the runtime's process, whose table grows by 8 slots with every sandbox a
/// server holds, and kept that copy (issue 34: 64 KB at 1,000 sandboxes, so memory per
/// sandbox grew with N).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sandboxs_init_does_not_carry_its_runtimes_descriptor_table() {
    let name =
        lockbox_testkit::test_name!("a_sandboxs_init_does_not_carry_its_runtimes_descriptor_table");
    also_as_nobody(&name);
    if !in_own_process(&name) {
        return;
    }
    let state = scratch();
    let rt = runtime(state.path()).await;
    // The process holds 900 descriptors more, as a server with about 110 sandboxes does.
    let null = std::fs::File::open("/dev/null").unwrap();
    let held: Vec<std::fs::File> = (0..900).map(|_| null.try_clone().unwrap()).collect();
    assert!(fd_size(std::process::id()) >= 1024);
    let info = rt
        .create_sandbox(lockbox_runtime::SandboxSpec::default())
        .await
        .unwrap();
    let sb = rt.sandbox(&info.id).unwrap();
    assert_eq!(out(&run(&sb, "echo ok").await), "ok\n");
    let agent = std::fs::metadata(agent_exe()).unwrap();
    let is_agent = |pid: u32| {
        std::fs::metadata(format!("/proc/{pid}/exe"))
            .is_ok_and(|exe| (exe.dev(), exe.ino()) == (agent.dev(), agent.ino()))
    };
    // The init re-executes itself once the agent answers: wait (up to 10 s) for it.
    let mut init = None;
    for _ in 0..1000 {
        init = inits().into_iter().find(|p| is_agent(*p));
        if init.is_some() {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(10)).await;
    }
    let init = init.expect("the sandbox's init, re-executed");
    assert!(
        fd_size(init) <= 64,
        "the init's FDSize is {}",
        fd_size(init)
    );
    drop(held);
    rt.delete_sandbox(&info.id).await.unwrap();
    rt.shutdown().await;
}

/// The slots of a process's descriptor table (`FDSize` in `/proc/PID/status`).
fn fd_size(pid: u32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    status
        .lines()
        .find_map(|l| l.strip_prefix("FDSize:"))
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or_else(|| panic!("no FDSize in {status}"))
}

/// The sandbox inits among this process's children (the runtime's spawner threads are the
/// parents of those they cloned).
fn inits() -> Vec<u32> {
    let mut children = std::collections::BTreeSet::new();
    for task in std::fs::read_dir("/proc/self/task").unwrap().flatten() {
        let listed = std::fs::read_to_string(task.path().join("children")).unwrap_or_default();
        children.extend(
            listed
                .split_whitespace()
                .filter_map(|p| p.parse::<u32>().ok()),
        );
    }
    children
        .into_iter()
        .filter(|pid| {
            std::fs::read_to_string(format!("/proc/{pid}/comm"))
                .is_ok_and(|n| n.trim() == "lockbox-init")
        })
        .collect()
}

/// Waits (up to 10 s) until no sandbox init of this process is left.
async fn inits_gone() -> bool {
    for _ in 0..1000 {
        if inits().is_empty() {
            return true;
        }
        tokio::time::sleep(std::time::Duration::from_millis(10)).await;
    }
    false
}

/// A `kB` field of `/proc/PID/status`.
fn status_kb(pid: u32, name: &str) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    status
        .lines()
        .find_map(|l| l.strip_prefix(&format!("{name}:")))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .unwrap_or_else(|| panic!("no {name} in {status}"))
}
