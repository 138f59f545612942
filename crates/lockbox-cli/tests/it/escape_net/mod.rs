//! The host side of the corpus's allow-list attacks (`n_allow_*`, `n_deny_*`): services on
//! distinct loopback addresses and ports, an `/etc/hosts` the test rewrites after the
//! sandbox started (DNS rebinding), and host sockets handed in with `--pass-fd`. The
//! egress-by-name attacks (`n_name_*`, `n_cred_*`) have a network of their own: [`names`].
#![allow(clippy::unwrap_used, clippy::expect_used)]

pub mod names;

use std::ffi::CString;
use std::io::ErrorKind;
use std::net::{TcpListener, UdpSocket};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

/// The name the rebinding attack's policy allows, pinned at start.
///
/// lockbox resolves it from `/etc/hosts` (glibc), so the test shows lockbox a copy of the
/// host's `/etc` (bound over `/etc` in a mount namespace of lockbox's own) whose `hosts` it
/// rewrites while the sandbox runs. The whole directory, not the one file: lockbox's `/etc`
/// overlay cannot be built over a file bind-mounted inside `/etc`.
pub const REBIND_NAME: &str = "rebind.lockbox.test";
/// Descriptors of the host sockets handed in with `--pass-fd` (TCP, UDP; unconnected).
pub const PASSED_TCP: i32 = 10;
pub const PASSED_UDP: i32 = 11;

/// Host services of one run. `allow_*` are what the attacks' policies allow (they may be
/// reached); every other one must get nothing.
pub struct NetServices {
    allow_tcp: TcpListener,
    /// Accepts (and drops) the allowed TCP service's connections, as a real service would:
    /// the race attack makes hundreds, and a full accept queue would leave its `connect`
    /// waiting for SYN retransmissions until the run times out.
    acceptor: Option<(Arc<AtomicBool>, std::thread::JoinHandle<()>)>,
    allow_udp: UdpSocket,
    /// 127.0.0.2 too, on a port no policy names.
    deny_port: TcpListener,
    deny_tcp: TcpListener,
    deny_udp: UdpSocket,
    udp_any: UdpSocket,
}

fn port(l: &TcpListener) -> u16 {
    l.local_addr().unwrap().port()
}

fn uport(u: &UdpSocket) -> u16 {
    u.local_addr().unwrap().port()
}

impl NetServices {
    pub fn new() -> NetServices {
        let tcp = |a: &str| {
            let l = TcpListener::bind(a).unwrap();
            l.set_nonblocking(true).unwrap();
            l
        };
        let udp = |a: &str| {
            let u = UdpSocket::bind(a).unwrap();
            u.set_nonblocking(true).unwrap();
            u
        };
        let allow_tcp = tcp("127.0.0.2:0");
        let stop = Arc::new(AtomicBool::new(false));
        let (flag, listener) = (stop.clone(), allow_tcp.try_clone().unwrap());
        let acceptor = std::thread::spawn(move || {
            while !flag.load(Ordering::Relaxed) {
                match listener.accept() {
                    Ok(_) => {}
                    Err(_) => std::thread::sleep(Duration::from_millis(2)),
                }
            }
        });
        NetServices {
            allow_tcp,
            acceptor: Some((stop, acceptor)),
            allow_udp: udp("127.0.0.2:0"),
            deny_port: tcp("127.0.0.2:0"),
            deny_tcp: tcp("127.0.0.3:0"),
            deny_udp: udp("127.0.0.3:0"),
            udp_any: udp("0.0.0.0:0"),
        }
    }

    pub fn env(&self) -> Vec<(String, String)> {
        vec![
            ("ALLOW_TCP".into(), port(&self.allow_tcp).to_string()),
            ("ALLOW_UDP".into(), uport(&self.allow_udp).to_string()),
            ("DENY_PORT".into(), port(&self.deny_port).to_string()),
            ("DENY_TCP".into(), port(&self.deny_tcp).to_string()),
            ("DENY_UDP".into(), uport(&self.deny_udp).to_string()),
            ("UDP_ANY".into(), uport(&self.udp_any).to_string()),
            ("REBIND_NAME".into(), REBIND_NAME.into()),
        ]
    }

    /// `{allow_tcp}`, `{allow_udp}`, `{udp_any}` in a manifest option.
    pub fn expand(&self, arg: &str) -> String {
        arg.replace("{allow_tcp}", &port(&self.allow_tcp).to_string())
            .replace("{allow_udp}", &uport(&self.allow_udp).to_string())
            .replace("{udp_any}", &uport(&self.udp_any).to_string())
    }

    /// Reaches every service no policy allows, from the host, as an escape would (for the
    /// test of the checks themselves).
    pub fn reach_the_denied_ones(&self) {
        for l in [&self.deny_port, &self.deny_tcp] {
            let _ = std::net::TcpStream::connect(l.local_addr().unwrap());
        }
        let out = UdpSocket::bind("127.0.0.1:0").unwrap();
        for u in [&self.deny_udp, &self.udp_any] {
            let port = uport(u);
            let ip = u.local_addr().unwrap().ip();
            let ip = if ip.is_unspecified() {
                "127.0.0.1".parse().unwrap()
            } else {
                ip
            };
            out.send_to(b"x", (ip, port)).unwrap();
        }
    }

    /// One message per service that was reached although no policy allows it.
    /// (The allowed ones may be reached: their connections are accepted as they come.)
    pub fn check(&self, problems: &mut Vec<String>) {
        let reached =
            |r: std::io::Result<()>| !matches!(r, Err(e) if e.kind() == ErrorKind::WouldBlock);
        for (l, what) in [
            (
                &self.deny_port,
                "127.0.0.2 TCP service on a port no rule names",
            ),
            (&self.deny_tcp, "127.0.0.3 TCP service"),
        ] {
            if reached(l.accept().map(drop)) {
                problems.push(format!("the host's {what} got a connection"));
            }
        }
        for (u, what) in [
            (&self.deny_udp, "127.0.0.3 UDP service"),
            (&self.udp_any, "0.0.0.0 UDP service"),
        ] {
            if reached(u.recv(&mut [0; 64]).map(drop)) {
                problems.push(format!("the host's {what} got a datagram"));
            }
        }
    }
}

/// What must happen in the child between fork and exec, prepared before the fork (the
/// test is multi-threaded: the child may not allocate).
pub struct PreExec {
    /// Bind this directory over `/etc` in a new mount namespace.
    pub etc: Option<(CString, CString)>,
    pub pass_sockets: bool,
    /// Drop to uid/gid 65534 after the mount (which needs root).
    pub drop_to_nobody: bool,
}

impl PreExec {
    /// Runs in the forked child. Only async-signal-safe calls.
    pub fn apply(&self) -> std::io::Result<()> {
        let check = |rc: libc::c_int| {
            if rc < 0 {
                Err(std::io::Error::last_os_error())
            } else {
                Ok(())
            }
        };
        // SAFETY: plain syscalls on live C strings and owned descriptors of this child.
        unsafe {
            if let Some((src, target)) = &self.etc {
                check(libc::unshare(libc::CLONE_NEWNS))?;
                check(libc::mount(
                    std::ptr::null(),
                    c"/".as_ptr(),
                    std::ptr::null(),
                    libc::MS_REC | libc::MS_PRIVATE,
                    std::ptr::null(),
                ))?;
                check(libc::mount(
                    src.as_ptr(),
                    target.as_ptr(),
                    std::ptr::null(),
                    libc::MS_BIND,
                    std::ptr::null(),
                ))?;
            }
            if self.pass_sockets {
                for (ty, fd) in [
                    (libc::SOCK_STREAM, PASSED_TCP),
                    (libc::SOCK_DGRAM, PASSED_UDP),
                ] {
                    let s = libc::socket(libc::AF_INET, ty, 0);
                    check(s)?;
                    // The socket may already have that number (the lowest free one here
                    // depends on what the test's other threads held at the fork): closing it
                    // then would pass nothing (`lockbox: passing fd 11: Bad file descriptor`).
                    if s != fd {
                        check(libc::dup2(s, fd))?;
                        check(libc::close(s))?;
                    }
                }
            }
            if self.drop_to_nobody {
                check(libc::setgroups(0, std::ptr::null()))?;
                check(libc::setgid(65534))?;
                check(libc::setuid(65534))?;
            }
        }
        Ok(())
    }
}

/// The host side of DNS rebinding: the hosts file lockbox resolves from at start, rewritten
/// (in place: it is bind-mounted) when the attack says it runs, to point the allowed name at
/// another address; then the attack is told to go on.
pub struct Rebinder {
    stop: Arc<AtomicBool>,
    thread: Option<std::thread::JoinHandle<bool>>,
}

/// A copy of the host's `/etc` under `fx` whose `hosts` maps [`REBIND_NAME`] to 127.0.0.2;
/// returns (the copy, its hosts file).
pub fn etc_copy(fx: &Path) -> (PathBuf, PathBuf) {
    let etc = fx.join("etc");
    let status = std::process::Command::new("cp")
        .args(["-a", "/etc"])
        .arg(&etc)
        .status()
        .unwrap();
    assert!(status.success(), "copying /etc");
    let hosts = etc.join("hosts");
    let _ = std::fs::remove_file(&hosts); // in place from here on: it may be a symlink
    std::fs::write(&hosts, format!("127.0.0.2\t{REBIND_NAME}\n")).unwrap();
    (etc, hosts)
}

impl Rebinder {
    pub fn start(hosts: PathBuf, work: PathBuf, new_ip: String) -> Rebinder {
        let stop = Arc::new(AtomicBool::new(false));
        let flag = stop.clone();
        let thread = std::thread::spawn(move || {
            while !flag.load(Ordering::Relaxed) {
                if work.join("rebind-ready").exists() {
                    std::fs::write(&hosts, format!("{new_ip}\t{REBIND_NAME}\n")).unwrap();
                    std::fs::write(work.join("rebind-go"), b"").unwrap();
                    return true;
                }
                std::thread::sleep(Duration::from_millis(10));
            }
            false
        });
        Rebinder {
            stop,
            thread: Some(thread),
        }
    }

    /// Whether the hosts file was rewritten while the sandbox ran.
    pub fn finish(mut self) -> bool {
        self.stop.store(true, Ordering::Relaxed);
        self.thread.take().is_some_and(|t| t.join().unwrap())
    }
}

impl Drop for NetServices {
    fn drop(&mut self) {
        if let Some((stop, thread)) = self.acceptor.take() {
            stop.store(true, Ordering::Relaxed);
            let _ = thread.join();
        }
    }
}
