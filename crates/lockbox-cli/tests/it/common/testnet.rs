//! A network namespace for network tests: a veth pair to the host with a /30 of the
//! benchmarking range 198.18.0.0/15 (so test names never resolve to the host's loopback,
//! and nothing else outside is used), plus the small helpers those tests share.
//!
//! ```ignore
//! use common::testnet::{skip_unless_root, Netns, Range};
//! if skip_unless_root() {
//!     return;
//! }
//! // One range per test file, so test binaries running side by side never share a /30.
//! const MINE: Range = Range::new([198, 18, 64, 0], 4096);
//! let ns = Netns::new("x", MINE);
//! let server = ns.command("python3").arg("server.py").arg(&ns.ip).spawn().unwrap();
//! // ... the sandbox connects to ns.ip; the host side is ns.host_ip.
//! // Dropping `ns` deletes the namespace and the veth pair (kill servers in it first).
//! ```
//!
//! Ranges taken: `tests/net_names.rs` 198.19.0.0 (240 /30s), `tests/net_credentials.rs`
//! 198.18.128.0/17. Making a namespace needs root: tests call [`skip_unless_root`] first
//! (as another user they say so and pass).

use super::text;
use std::net::Ipv4Addr;
use std::path::Path;
use std::process::Command;
use std::sync::atomic::{AtomicU32, Ordering};

/// Whether the test runs as root.
pub fn root() -> bool {
    std::fs::read_to_string("/proc/self/status")
        .unwrap()
        .lines()
        .find_map(|l| l.strip_prefix("Uid:"))
        .and_then(|v| v.split_whitespace().next().map(|u| u == "0"))
        .unwrap()
}

/// True when the test cannot make a namespace (not root): call first and return when it
/// says so. A skip is recorded ([`lockbox_testkit::requirement`]), or under
/// `LOCKBOX_TEST_REQUIRE=all` fails the test.
pub fn skip_unless_root() -> bool {
    !lockbox_testkit::requirement(root(), "making a network namespace needs root")
}

/// Runs `args[0]` with the rest as arguments; panics with its output unless it succeeds.
pub fn sh(args: &[&str]) {
    let out = Command::new(args[0]).args(&args[1..]).output().unwrap();
    assert!(out.status.success(), "{args:?}: {}", text(&out));
}

/// Runs `openssl` with the whitespace-separated `args` in `dir`; panics unless it succeeds.
pub fn openssl(args: &str, dir: &Path) {
    let out = Command::new("openssl")
        .args(args.split_whitespace())
        .current_dir(dir)
        .output()
        .unwrap();
    assert!(out.status.success(), "openssl {args:?}: {}", text(&out));
}

/// The events of an `--audit` file, one JSON object per line (none if it does not exist).
pub fn audit_events(path: &Path) -> Vec<serde_json::Value> {
    std::fs::read_to_string(path)
        .unwrap_or_default()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("{e}: {l}")))
        .collect()
}

/// Where a test file's namespaces take their /30s: `slots` consecutive /30s from `first`
/// (which must lie in 198.18.0.0/15, as must the last of them).
#[derive(Debug, Clone, Copy)]
pub struct Range {
    first: Ipv4Addr,
    slots: u32,
}

impl Range {
    pub const fn new(first: [u8; 4], slots: u32) -> Range {
        Range {
            first: Ipv4Addr::new(first[0], first[1], first[2], first[3]),
            slots,
        }
    }

    /// The /30 of this process's namespace in `local` (one of [`LOCAL_SLOTS`] a process has
    /// in use at a time), the process id spreading test binaries running side by side.
    fn slot(self, local: u32) -> u32 {
        let slot = (std::process::id().wrapping_mul(LOCAL_SLOTS) + local) % self.slots;
        u32::from(self.first) + slot * 4
    }
}

/// Namespaces one test process has at once, at most. A namespace takes the next local slot
/// no live one holds, round robin, so a slot just given back (whose veth the kernel may still
/// be removing) is the last one taken again. (It used to be the creation count modulo 4: a
/// long test's namespace shared its /30 with the fifth one made beside it, and its client
/// reached the other's server: `BadSignature` from another test's CA.)
const LOCAL_SLOTS: u32 = 16;

/// The local slots of this process's live namespaces, and where the next search starts.
static IN_USE: std::sync::Mutex<([bool; LOCAL_SLOTS as usize], usize)> =
    std::sync::Mutex::new(([false; LOCAL_SLOTS as usize], 0));

fn take_local_slot() -> u32 {
    let mut guard = IN_USE
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    let (used, next) = &mut *guard;
    let free = (0..used.len())
        .map(|i| (*next + i) % used.len())
        .find(|&i| !used[i])
        .expect("more than 16 test namespaces at once in one process");
    used[free] = true;
    *next = free + 1;
    free as u32
}

/// A network namespace linked to the host by a veth pair: the host side has `host_ip`, the
/// namespace `ip` (a /30 between them); the namespace's `lo` is up. Deleted on drop, which
/// deletes the veth pair too.
pub struct Netns {
    /// The namespace's name (`ip netns exec NAME ...`).
    pub name: String,
    /// The host side's address.
    pub host_ip: String,
    /// The namespace side's address: where servers in it listen.
    pub ip: String,
    /// Its local slot ([`take_local_slot`]), given back on drop.
    local: u32,
}

impl Netns {
    /// Makes a namespace named `lbx{tag}ns…` with interfaces `lbx{tag}h…`/`lbx{tag}p…`
    /// (keep `tag` to one or two characters: interface names have at most 15) and a /30 of
    /// `range`.
    pub fn new(tag: &str, range: Range) -> Netns {
        static N: AtomicU32 = AtomicU32::new(0);
        let n = N.fetch_add(1, Ordering::SeqCst);
        let id = format!("{}{}", std::process::id() % 100_000, n);
        let name = format!("lbx{tag}ns{id}");
        let (host_if, peer_if) = (format!("lbx{tag}h{id}"), format!("lbx{tag}p{id}"));
        let local = take_local_slot();
        let net = range.slot(local);
        let (host_ip, ip) = (
            Ipv4Addr::from(net + 1).to_string(),
            Ipv4Addr::from(net + 2).to_string(),
        );
        sh(&["ip", "netns", "add", &name]);
        let ns = Netns {
            name,
            host_ip,
            ip,
            local,
        };
        sh(&[
            "ip", "link", "add", &host_if, "type", "veth", "peer", "name", &peer_if,
        ]);
        sh(&["ip", "link", "set", &peer_if, "netns", &ns.name]);
        sh(&[
            "ip",
            "addr",
            "add",
            &format!("{}/30", ns.host_ip),
            "dev",
            &host_if,
        ]);
        sh(&["ip", "link", "set", &host_if, "up"]);
        ns.exec(&[
            "ip",
            "addr",
            "add",
            &format!("{}/30", ns.ip),
            "dev",
            &peer_if,
        ]);
        ns.exec(&["ip", "link", "set", &peer_if, "up"]);
        ns.exec(&["ip", "link", "set", "lo", "up"]);
        ns
    }

    /// `program` to be run inside the namespace (add arguments, then spawn it).
    pub fn command(&self, program: &str) -> Command {
        let mut cmd = Command::new("ip");
        cmd.args(["netns", "exec", &self.name, program]);
        cmd
    }

    /// Runs `args` inside the namespace; panics with its output unless it succeeds.
    pub fn exec(&self, args: &[&str]) {
        let mut all = vec!["ip", "netns", "exec", self.name.as_str()];
        all.extend_from_slice(args);
        sh(&all);
    }
}

impl Drop for Netns {
    fn drop(&mut self) {
        let _ = Command::new("ip")
            .args(["netns", "del", &self.name])
            .status();
        IN_USE
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .0[self.local as usize] = false;
    }
}
