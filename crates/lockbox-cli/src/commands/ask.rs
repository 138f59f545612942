//! `lockbox run --net-ask`: the network supervisor's questions, asked on the terminal.
//!
//! Questions are asked on `/dev/tty`, lockbox's controlling terminal, one at a time, oldest
//! first, by a thread of their own; the answer is one line: `o` (once), `a` (always: for
//! this sandbox) or `n` / an empty line (deny). No terminal (`/dev/tty` cannot be opened):
//! `--net-ask` is a usage error, rather than a policy that silently denies everything.
//!
//! The command may use the same terminal: a command reading it while a question is asked
//! may take the answer's keystrokes (give such commands another stdin).

use crate::error::CliError;
use lockbox_confine::{Approvals, NetEventKind, NetProtocol, NetVerdict, Question};
use rustix::event::{poll, PollFd, PollFlags, Timespec};
use std::fs::File;
use std::io::{Read, Write};
use std::os::unix::fs::OpenOptionsExt;
use std::time::{Duration, Instant};

/// Who the log says denied a question (`denied by the terminal`).
const BY: &str = "the terminal";
/// Longest command line shown in a question.
const SHOWN: usize = 60;

/// The terminal prompt of one sandbox's questions.
#[derive(Debug)]
pub struct Prompt {
    tty: File,
    desk: Approvals,
}

impl Prompt {
    /// Opens lockbox's terminal for `--net-ask`; a usage error without one.
    pub fn open(timeout: Duration) -> Result<(Prompt, Approvals), CliError> {
        let tty = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .custom_flags(libc::O_NOCTTY)
            .open("/dev/tty")
            .map_err(|e| {
                CliError::usage(format!(
                    "--net-ask asks on the terminal, and lockbox has none (/dev/tty: {})",
                    super::os_error(&e)
                ))
                .hint("run lockbox from a terminal, or list the destinations with --net-allow")
            })?;
        let desk = Approvals::new(timeout)
            .map_err(|e| CliError::new(125, format!("creating the approvals desk: {e}")))?;
        Ok((
            Prompt {
                tty,
                desk: desk.clone(),
            },
            desk,
        ))
    }

    /// Asks each question as it comes, until the sandbox's supervisor ends.
    pub fn start(self) -> Result<(), CliError> {
        std::thread::Builder::new()
            .name("lockbox-ask".into())
            .spawn(move || self.serve())
            .map(drop)
            .map_err(|e| CliError::new(125, format!("starting the terminal prompt: {e}")))
    }

    fn serve(mut self) {
        let mut last = 0;
        loop {
            let Some(q) = self.desk.next(last, Duration::from_secs(1)) else {
                if self.desk.closed() {
                    return;
                }
                continue;
            };
            last = q.id;
            let deadline = Instant::now() + Duration::from_millis(q.timeout_ms);
            let verdict = self.ask(&q, deadline);
            let said = match verdict {
                Some(v) => match self.desk.decide(q.id, v, BY) {
                    Ok(()) => None,
                    Err(e) => Some(format!("lockbox: {e}\n")),
                },
                None => Some(format!(
                    "lockbox: no answer in time: {} denied\n",
                    destination(&q)
                )),
            };
            if let Some(text) = said {
                let _ = self.tty.write_all(text.as_bytes());
            }
        }
    }

    /// Asks `q` until a valid answer or `deadline`; `None` when time is up.
    fn ask(&mut self, q: &Question, deadline: Instant) -> Option<NetVerdict> {
        let _ = self.tty.write_all(question_text(q).as_bytes());
        loop {
            let line = self.read_line(deadline)?;
            match parse_answer(&line) {
                Some(v) => return Some(v),
                None => {
                    let _ = self
                        .tty
                        .write_all(b"lockbox: answer o (once), a (always) or n (no) ");
                }
            }
        }
    }

    /// One line from the terminal, waiting until `deadline` at most.
    fn read_line(&mut self, deadline: Instant) -> Option<String> {
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return None;
        }
        let timeout = Timespec {
            tv_sec: i64::try_from(left.as_secs()).unwrap_or(i64::MAX),
            tv_nsec: i64::from(left.subsec_nanos()),
        };
        let mut fds = [PollFd::new(&self.tty, PollFlags::IN)];
        match poll(&mut fds, Some(&timeout)) {
            Ok(n) if n > 0 => {}
            _ => return None,
        }
        // A terminal in canonical mode returns one line per read.
        let mut buf = [0u8; 256];
        let n = self.tty.read(&mut buf).ok().filter(|n| *n > 0)?;
        Some(String::from_utf8_lossy(&buf[..n]).into_owned())
    }
}

/// `o`/`once`, `a`/`always`/`s`/`sandbox`, `n`/`no`/`deny`/empty (the default).
pub fn parse_answer(line: &str) -> Option<NetVerdict> {
    match line.trim().to_ascii_lowercase().as_str() {
        "o" | "once" => Some(NetVerdict::Once),
        "a" | "always" | "s" | "sandbox" => Some(NetVerdict::Sandbox),
        "" | "n" | "no" | "d" | "deny" => Some(NetVerdict::Deny),
        _ => None,
    }
}

/// What is asked for: `api.example.org (198.18.0.2):443/tcp`, `the name api.example.org`.
fn destination(q: &Question) -> String {
    let proto = match q.protocol {
        NetProtocol::Tcp => "tcp",
        NetProtocol::Udp => "udp",
    };
    match (q.kind, &q.name, q.address, q.port) {
        (NetEventKind::Dns, Some(name), _, _) => format!("the name {name}"),
        (_, Some(name), Some(ip), Some(port)) => format!("{name} ({ip}):{port}/{proto}"),
        (_, None, Some(std::net::IpAddr::V6(ip)), Some(port)) => format!("[{ip}]:{port}/{proto}"),
        (_, None, Some(ip), Some(port)) => format!("{ip}:{port}/{proto}"),
        _ => "an unknown destination".into(),
    }
}

/// `lockbox: allow python3 client.py (pid 42) to connect to 198.18.0.2:443/tcp? ...`
pub fn question_text(q: &Question) -> String {
    let verb = match q.kind {
        NetEventKind::Dns => "look up",
        NetEventKind::Send => "send to",
        _ => "connect to",
    };
    let mut command: String = q.command.chars().take(SHOWN).collect();
    if q.command.chars().count() > SHOWN {
        command.push_str("...");
    }
    if command.is_empty() {
        command = "a process".into();
    }
    format!(
        "\r\nlockbox: allow {command} (pid {}) to {verb} {}? [o]nce / [a]lways / [N]o ({} s) ",
        q.pid,
        destination(q),
        q.timeout_ms.div_ceil(1000)
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn answers_are_read_leniently_and_default_to_no() {
        assert_eq!(parse_answer("o\n"), Some(NetVerdict::Once));
        assert_eq!(parse_answer(" Always\r\n"), Some(NetVerdict::Sandbox));
        assert_eq!(parse_answer("\n"), Some(NetVerdict::Deny));
        assert_eq!(parse_answer("N"), Some(NetVerdict::Deny));
        assert_eq!(parse_answer("yes"), None);
    }

    #[test]
    fn questions_name_the_process_and_the_destination() {
        let q = Question {
            id: 1,
            ts: String::new(),
            kind: NetEventKind::Connect,
            name: Some("api.test".into()),
            address: Some(
                "198.18.0.2"
                    .parse()
                    .unwrap_or(std::net::Ipv4Addr::LOCALHOST.into()),
            ),
            port: Some(443),
            protocol: NetProtocol::Tcp,
            pid: 42,
            command: "python3 x.py".into(),
            timeout_ms: 30_000,
        };
        let text = question_text(&q);
        assert!(
            text.contains("allow python3 x.py (pid 42) to connect to api.test (198.18.0.2):443/tcp? [o]nce / [a]lways / [N]o (30 s)"),
            "{text}"
        );
    }
}
