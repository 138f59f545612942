//! The outside world of the corpus's egress-by-name attacks (`names = true` in
//! `corpus.toml`): a network namespace of the test's (`common::testnet::Netns`, a veth pair
//! in 198.18.0.0/15, so no allowed name resolves to the host's loopback) running
//! `services.py`: a TLS server on 443 (a certificate of the test's CA for `allowed.test`), an
//! HTTP server on 80 and a DNS server on 53 (UDP and TCP), each logging what reached it.
//!
//! lockbox sees the outside as a host would: its `/etc` is a copy of the host's (bound over
//! `/etc` in a mount namespace of lockbox's own, as for rebinding) whose `resolv.conf` names
//! the namespace's DNS server, so a name lockbox resolves is asked there — and the log shows
//! every name lockbox let out. `LOCKBOX_NET_HOSTS_FILE` adds the rebinding names (`loop.test`
//! → 127.0.0.1, `ll.test` → 169.254.169.254). One namespace serves the whole test; the runs
//! that use it take turns (its log is per run).
#![allow(clippy::unwrap_used, clippy::expect_used)]

use crate::common::testnet::{openssl, Netns, Range};
use std::io::{BufRead, BufReader, Read};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::{Mutex, MutexGuard};

/// This test's /30s: 198.18.32.0–198.18.47.255 (see `common/testnet.rs` for the others').
const RANGE: Range = Range::new([198, 18, 32, 0], 1024);

/// The variable lockbox reads the credential from (`--credential API=env:LBX_ESCAPE_CRED`).
pub const CRED_VAR: &str = "LBX_ESCAPE_CRED";

pub struct NamesNet {
    ns: Netns,
    services: Child,
    /// Readable by every test user: the CA's certificate, the hosts file, the `/etc` copy.
    public: crate::common::Scratch,
    /// The keys, the credential's value, the services' log.
    private: crate::common::Scratch,
    secret: String,
    turn: Mutex<()>,
}

impl NamesNet {
    pub fn new() -> NamesNet {
        let ns = Netns::new("e", RANGE);
        let public = crate::common::scratch();
        let private = crate::common::scratch();
        let (d, p) = (public.path(), private.path());
        let ec = "-newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes";
        openssl(
            &format!(
                "req -x509 {ec} -days 1 -subj /CN=lockbox-escape-CA -keyout ca.key -out ca.pem"
            ),
            p,
        );
        openssl(
            &format!("req -new {ec} -subj /CN=allowed.test -keyout server.key -out server.csr"),
            p,
        );
        std::fs::write(
            p.join("ext.cnf"),
            "subjectAltName=DNS:allowed.test,DNS:other.test\nbasicConstraints=CA:FALSE\n\
             extendedKeyUsage=serverAuth\n",
        )
        .unwrap();
        openssl(
            "x509 -req -in server.csr -CA ca.pem -CAkey ca.key -CAcreateserial -days 1 \
             -extfile ext.cnf -out server.pem",
            p,
        );
        std::fs::copy(p.join("ca.pem"), d.join("ca.pem")).unwrap();
        let mut random = [0u8; 16];
        std::fs::File::open("/dev/urandom")
            .unwrap()
            .read_exact(&mut random)
            .unwrap();
        let secret = format!(
            "lbxcred-{}",
            random
                .iter()
                .map(|b| format!("{b:02x}"))
                .collect::<String>()
        );
        std::fs::write(p.join("secret"), &secret).unwrap();
        std::fs::write(
            d.join("hosts"),
            "127.0.0.1 loop.test\n169.254.169.254 ll.test\n",
        )
        .unwrap();
        let etc = d.join("etc");
        let status = Command::new("cp")
            .args(["-a", "/etc"])
            .arg(&etc)
            .status()
            .unwrap();
        assert!(status.success(), "copying /etc");
        let resolv = etc.join("resolv.conf");
        let _ = std::fs::remove_file(&resolv); // it may be a symlink
        std::fs::write(
            &resolv,
            format!("nameserver {}\noptions attempts:1 timeout:2\n", ns.ip),
        )
        .unwrap();
        let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/it/escape_net/services.py");
        let mut services = ns
            .command("python3")
            .arg(&script)
            .arg(&ns.ip)
            .arg(p.join("outside.log"))
            .arg(p.join("server.pem"))
            .arg(p.join("server.key"))
            .arg(p.join("secret"))
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        let mut line = String::new();
        BufReader::new(services.stdout.as_mut().unwrap())
            .read_line(&mut line)
            .unwrap();
        assert_eq!(
            line.trim(),
            "ready",
            "the test network's services did not start"
        );
        NamesNet {
            ns,
            services,
            public,
            private,
            secret,
            turn: Mutex::new(()),
        }
    }

    /// Held for a whole run: the runs using the namespace take turns.
    pub fn turn(&self) -> MutexGuard<'_, ()> {
        let guard = self.turn.lock().unwrap_or_else(|e| e.into_inner());
        let _ = std::fs::remove_file(self.private.path().join("outside.log"));
        guard
    }

    /// The `/etc` lockbox runs with.
    pub fn etc(&self) -> PathBuf {
        self.public.path().join("etc")
    }

    /// What the attacks get: the namespace's address (`NSIP`), the host's side of the veth
    /// (`NSHOST`), and the SHA-256 of the credential's value (`CRED_SHA256`), which they
    /// look for and must never find.
    pub fn env(&self) -> Vec<(String, String)> {
        let out = Command::new("sha256sum")
            .arg(self.private.path().join("secret"))
            .output()
            .unwrap();
        let sum = String::from_utf8_lossy(&out.stdout);
        vec![
            ("NSIP".into(), self.ns.ip.clone()),
            ("NSHOST".into(), self.ns.host_ip.clone()),
            (
                "CRED_SHA256".into(),
                sum.split_whitespace().next().unwrap().to_owned(),
            ),
        ]
    }

    /// lockbox's own environment: the rebinding names and the credential's variable.
    pub fn lockbox_env(&self) -> Vec<(String, String)> {
        vec![
            (
                "LOCKBOX_NET_HOSTS_FILE".into(),
                self.public.path().join("hosts").to_str().unwrap().into(),
            ),
            (CRED_VAR.into(), self.secret.clone()),
        ]
    }

    /// `{ca}` (the CA of the TLS server's certificate, for `--upstream-ca`).
    pub fn expand(&self, arg: &str) -> String {
        arg.replace("{ca}", self.public.path().join("ca.pem").to_str().unwrap())
    }

    /// The credential's value, which must appear in no output.
    pub fn secret(&self) -> &str {
        &self.secret
    }

    /// Waits (10 s at most) until the services have logged `line`: a service may answer
    /// before it writes its log line.
    pub fn wait_for_line(&self, line: &str) {
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
        let path = self.private.path().join("outside.log");
        while std::time::Instant::now() < deadline {
            let log = std::fs::read_to_string(&path).unwrap_or_default();
            if log.lines().any(|l| l == line) {
                return;
            }
            std::thread::sleep(std::time::Duration::from_millis(20));
        }
    }

    /// Checks what reached the outside during this run: every line of the services' log
    /// must start with one of `allowed` (what the attack's policy lets out, as its control
    /// steps do) and every line of `seen` must be there.
    pub fn check(&self, allowed: &[String], seen: &[String], problems: &mut Vec<String>) {
        // The server logs a connection when it ends; give the last one a moment.
        std::thread::sleep(std::time::Duration::from_millis(300));
        let log =
            std::fs::read_to_string(self.private.path().join("outside.log")).unwrap_or_default();
        for line in log.lines() {
            if !allowed.iter().any(|a| line.starts_with(a.as_str())) {
                problems.push(format!("the outside got what no rule allows: {line}"));
            }
        }
        for want in seen {
            if !log.lines().any(|l| l == want) {
                problems.push(format!(
                    "the outside never got {want:?} (a control step's): {log:?}"
                ));
            }
        }
    }
}

impl Drop for NamesNet {
    fn drop(&mut self) {
        let _ = self.services.kill();
        let _ = self.services.wait();
    }
}
