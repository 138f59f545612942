//! The agent's one privilege over its commands: only it may call `openat2` (whose mode the
//! seccomp filter cannot read). Commands it starts get `ENOSYS`, cannot reach the agent by
//! ptrace, `/proc/PID/mem` or `pidfd_getfd`, while the files API (which resolves with
//! `openat2`) keeps working.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use crate::common;
use common::*;
use futures_util::StreamExt;
use lockbox_runtime::{ProcessCommand, ProcessSpec, WriteOptions};
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
