//! `lockbox run --net-ask`: the network supervisor's questions, asked on lockbox's terminal
//! (`/dev/tty`), one at a time, oldest first; the answer is one line: `o` (once), `a`
//! (always: for this sandbox) or `n` / an empty line (deny). No terminal: `--net-ask` is a
//! usage error, rather than a policy that silently denies everything.
//!
//! **The sandbox cannot forge a question** (issue 32): the terminal the question is asked on
//! is out of its reach, and nothing it chose reaches that terminal raw.
//!
//! - The command runs in a session of its own ([`lockbox_confine::Spawn::own_session`]):
//!   `/dev/tty` inside is not lockbox's terminal, and the terminal's signals reach lockbox,
//!   which forwards them.
//! - Where lockbox's stdin, stdout or stderr is that terminal, the sandbox gets a
//!   pseudo-terminal of lockbox's instead (its controlling terminal, sized as the real one),
//!   and lockbox relays between the two with the real terminal in raw mode, as `ssh -t` does.
//!   While a question is open the relay stops: the sandbox's output waits in the
//!   pseudo-terminal's bounded buffer (a writer blocks when it is full) and keystrokes go to
//!   the question, not the sandbox. Type-ahead not yet read when the question opens is
//!   discarded, so a keystroke meant for the command cannot answer it.
//! - The question is lockbox's own text: it first ends any escape sequence the sandbox's
//!   output left open and resets colours and character set ([`PLAIN`]), then names the
//!   process and destination with every byte the sandbox chose (command line, name)
//!   escaped to printable ASCII ([`ascii_line`]) and bounded.
//! - The answer is echoed with what it decided: `lockbox: allowed once 198.18.0.3:443/tcp`.

use crate::error::CliError;
use lockbox_confine::Stdio;
use lockbox_netsup::{
    Approvals, EventKind as NetEventKind, Protocol as NetProtocol, Question, Verdict as NetVerdict,
};
use lockbox_policy::name::ascii_line;
use rustix::event::{poll, PollFd, PollFlags, Timespec};
use rustix::termios::{OptionalActions, QueueSelector, Termios};
use std::fs::File;
use std::io::{ErrorKind, Read, Write};
use std::os::fd::{AsFd, OwnedFd};
use std::os::unix::fs::OpenOptionsExt;
use std::sync::mpsc::{Receiver, Sender};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// Who the log says denied a question (`denied by the terminal`).
const BY: &str = "the terminal";
/// Longest command line shown in a question, in bytes of its escaped form.
const SHOWN: usize = 120;
/// Longest name shown, in bytes of its escaped form (a DNS name has at most 253).
const SHOWN_NAME: usize = 300;
/// Ends any string or escape sequence the sandbox's output left open (ST: an unterminated
/// `ESC ]0;` would swallow the question), then plain text: attributes off (no invisible
/// or same-colour-as-background question), ASCII character set, cursor visible.
const PLAIN: &str = "\x1b\\\x1b[0m\x1b(B\x0f\x1b[?25h";
/// Bytes read from one side of the relay at a time; input from the terminal waiting for
/// the sandbox is held up to this much, then the terminal is not read until there is room.
const CHUNK: usize = 4096;
/// How long the output the sandbox left is read after it ended.
const DRAIN: Duration = Duration::from_secs(2);

/// The terminal of one sandbox's questions, before the sandbox starts.
#[derive(Debug)]
pub struct Prompt {
    tty: File,
    desk: Approvals,
    pty: Option<OwnedFd>,
}

impl Prompt {
    /// Opens lockbox's terminal for `--net-ask` (a usage error without one); the [`Stdio`]
    /// gives the sandbox a pseudo-terminal of lockbox's where lockbox's own stdio is that
    /// terminal.
    pub fn open(timeout: Duration) -> Result<(Prompt, Approvals, Stdio), CliError> {
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
        let (pty, stdio) = stand_in(&tty)
            .map_err(|e| CliError::new(125, format!("creating the sandbox's terminal: {e}")))?;
        let prompt = Prompt {
            tty,
            desk: desk.clone(),
            pty,
        };
        Ok((prompt, desk, stdio))
    }

    /// Puts the terminal in raw mode if it relays, and asks each question as it comes
    /// until [`Asking::finish`].
    pub fn start(self) -> Result<Asking, CliError> {
        let failed = |what: &str, e: std::io::Error| CliError::new(125, format!("{what}: {e}"));
        let raw = match &self.pty {
            None => None,
            Some(_) => {
                let cooked = rustix::termios::tcgetattr(&self.tty)
                    .map_err(|e| failed("reading the terminal's mode", e.into()))?;
                let mut raw = cooked.clone();
                raw.make_raw();
                rustix::termios::tcsetattr(&self.tty, OptionalActions::Now, &raw)
                    .map_err(|e| failed("setting the terminal's mode", e.into()))?;
                Some(Modes { cooked, raw })
            }
        };
        // From here on the terminal is restored when `Asking` goes, whatever happens.
        let mut asking = Asking {
            thread: None,
            stop: None,
            restore: match &raw {
                Some(m) => Some((
                    self.tty
                        .try_clone()
                        .map_err(|e| failed("the terminal", e))?,
                    m.cooked.clone(),
                )),
                None => None,
            },
            master: match &self.pty {
                Some(m) => Some(m.try_clone().map_err(|e| failed("the terminal", e))?),
                None => None,
            },
        };
        let pipe = || rustix::pipe::pipe_with(rustix::pipe::PipeFlags::CLOEXEC);
        let (stop_rx, stop_tx) = pipe().map_err(|e| failed("a pipe", e.into()))?;
        let (wake_rx, wake_tx) = pipe().map_err(|e| failed("a pipe", e.into()))?;
        if let Some(master) = &self.pty {
            // The relay never waits on the sandbox's input side (it may not read it).
            let flags = rustix::fs::fcntl_getfl(master).map_err(|e| failed("the pty", e.into()))?;
            rustix::fs::fcntl_setfl(master, flags | rustix::fs::OFlags::NONBLOCK)
                .map_err(|e| failed("the pty", e.into()))?;
        }
        let (tx, rx) = std::sync::mpsc::channel();
        let desk = self.desk.clone();
        std::thread::Builder::new()
            .name("lockbox-questions".into())
            .spawn(move || fetch(&desk, &tx, wake_tx))
            .map_err(|e| failed("starting the terminal prompt", e))?;
        let terminal = Terminal {
            tty: self.tty,
            desk: self.desk,
            master: self.pty,
            modes: raw,
            questions: rx,
            wake: Some(wake_rx),
            stop: stop_rx,
            input: Vec::new(),
            tty_open: true,
        };
        let thread = std::thread::Builder::new()
            .name("lockbox-terminal".into())
            .spawn(move || terminal.serve())
            .map_err(|e| failed("starting the terminal prompt", e))?;
        asking.thread = Some(thread);
        asking.stop = Some(stop_tx);
        Ok(asking)
    }
}

/// The sandbox's pseudo-terminal, if some of lockbox's stdio is the terminal `tty`: its
/// master, and the [`Stdio`] that puts its slave where lockbox has `tty`.
fn stand_in(tty: &File) -> std::io::Result<(Option<OwnedFd>, Stdio)> {
    use rustix::pty::{grantpt, openpt, ptsname, unlockpt, OpenptFlags};
    // `/dev/tty` is lockbox's controlling terminal: a descriptor is that terminal if the
    // terminal's session is lockbox's (an `fstat` of `/dev/tty` names `/dev/tty`, not it).
    let session = rustix::process::getsid(None)?;
    let is_terminal = |fd: std::os::fd::BorrowedFd<'_>| {
        rustix::termios::isatty(fd) && rustix::termios::tcgetsid(fd).is_ok_and(|s| s == session)
    };
    let ours = [
        is_terminal(std::io::stdin().as_fd()),
        is_terminal(std::io::stdout().as_fd()),
        is_terminal(std::io::stderr().as_fd()),
    ];
    if !ours.contains(&true) {
        return Ok((None, Stdio::default()));
    }
    let master = openpt(OpenptFlags::RDWR | OpenptFlags::NOCTTY | OpenptFlags::CLOEXEC)?;
    grantpt(&master)?;
    unlockpt(&master)?;
    let name = ptsname(&master, Vec::new())?;
    let slave = rustix::fs::open(
        name.as_c_str(),
        rustix::fs::OFlags::RDWR | rustix::fs::OFlags::NOCTTY | rustix::fs::OFlags::CLOEXEC,
        rustix::fs::Mode::empty(),
    )?;
    // The command sees the terminal it would have seen: its mode and size.
    rustix::termios::tcsetattr(
        &slave,
        OptionalActions::Now,
        &rustix::termios::tcgetattr(tty)?,
    )?;
    if let Ok(size) = rustix::termios::tcgetwinsize(tty) {
        rustix::termios::tcsetwinsize(&master, size)?;
    }
    let slot = |on: bool| -> std::io::Result<Option<OwnedFd>> {
        Ok(if on { Some(slave.try_clone()?) } else { None })
    };
    let stdio = Stdio {
        stdin: slot(ours[0])?,
        stdout: slot(ours[1])?,
        stderr: slot(ours[2])?,
    };
    Ok((Some(master), stdio))
}

/// The terminal's own mode and the raw mode of the relay.
#[derive(Debug)]
struct Modes {
    cooked: Termios,
    raw: Termios,
}

/// Questions being asked; the terminal's mode is restored when this goes.
#[derive(Debug)]
pub struct Asking {
    thread: Option<JoinHandle<()>>,
    stop: Option<OwnedFd>,
    restore: Option<(File, Termios)>,
    master: Option<OwnedFd>,
}

impl Asking {
    /// Gives the sandbox's terminal the real one's size (on `SIGWINCH`).
    pub fn resize(&self) {
        if let (Some((tty, _)), Some(master)) = (&self.restore, &self.master) {
            if let Ok(size) = rustix::termios::tcgetwinsize(tty) {
                let _ = rustix::termios::tcsetwinsize(master, size);
            }
        }
    }

    /// Once the sandbox has ended: withdraws an open question, relays what the sandbox's
    /// output left, and gives the terminal its mode back.
    pub fn finish(mut self) {
        self.stop = None;
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

impl Drop for Asking {
    fn drop(&mut self) {
        if let Some((tty, cooked)) = &self.restore {
            let _ = rustix::termios::tcsetattr(tty, OptionalActions::Drain, cooked);
        }
    }
}

/// Passes the desk's questions on to the terminal thread, waking it through `wake`, until
/// the sandbox's supervisor ends.
fn fetch(desk: &Approvals, to: &Sender<Question>, wake: OwnedFd) {
    let mut last = 0;
    loop {
        let Some(q) = desk.next(last, Duration::from_secs(1)) else {
            if desk.closed() {
                return;
            }
            continue;
        };
        last = q.id;
        if to.send(q).is_err() || rustix::io::write(&wake, &[1]).is_err() {
            return;
        }
    }
}

/// The thread that owns the terminal: relays (if the sandbox has a pseudo-terminal of
/// lockbox's) and asks.
struct Terminal {
    tty: File,
    desk: Approvals,
    master: Option<OwnedFd>,
    modes: Option<Modes>,
    questions: Receiver<Question>,
    /// Readable when questions came; `None` once the desk is closed.
    wake: Option<OwnedFd>,
    /// Hangs up when lockbox is done with the sandbox.
    stop: OwnedFd,
    /// Keystrokes for the sandbox not yet written to it.
    input: Vec<u8>,
    /// False once the terminal hung up (its end is not polled again).
    tty_open: bool,
}

impl Terminal {
    fn serve(mut self) {
        while self.step() {}
        self.drain();
    }

    /// Waits for something to do and does it; false once stopped.
    fn step(&mut self) -> bool {
        let mut fds = vec![PollFd::new(&self.stop, PollFlags::IN)];
        let wake_at = self.wake.as_ref().map(|w| {
            fds.push(PollFd::new(w, PollFlags::IN));
            fds.len() - 1
        });
        let (mut tty_at, mut master_at) = (None, None);
        if let Some(master) = &self.master {
            if self.input.len() < CHUNK && self.tty_open {
                fds.push(PollFd::new(&self.tty, PollFlags::IN));
                tty_at = Some(fds.len() - 1);
            }
            let out = if self.input.is_empty() {
                PollFlags::empty()
            } else {
                PollFlags::OUT
            };
            fds.push(PollFd::new(master, PollFlags::IN | out));
            master_at = Some(fds.len() - 1);
        }
        if poll(&mut fds, None).is_err() {
            return true;
        }
        let ready = |at: Option<usize>| at.map_or(PollFlags::empty(), |i| fds[i].revents());
        let (stop, wake, tty, master) = (
            fds[0].revents(),
            ready(wake_at),
            ready(tty_at),
            ready(master_at),
        );
        drop(fds);
        if !stop.is_empty() {
            return false;
        }
        if !wake.is_empty() && !self.asked() {
            return false;
        }
        if master.contains(PollFlags::OUT) {
            self.feed();
        }
        if master.intersects(PollFlags::IN | PollFlags::HUP | PollFlags::ERR) {
            self.relay_output();
        }
        if !tty.is_empty() {
            let mut buf = [0u8; CHUNK];
            let room = CHUNK - self.input.len();
            match self.tty.read(&mut buf[..room]) {
                Ok(n) if n > 0 => self.input.extend_from_slice(&buf[..n]),
                Err(e) if e.kind() == ErrorKind::Interrupted => {}
                // Hung up: polling it again would return at once, forever.
                _ => self.tty_open = false,
            }
        }
        true
    }

    /// Asks the questions that came; false if stopped meanwhile.
    fn asked(&mut self) -> bool {
        if let Some(wake) = &self.wake {
            let mut buf = [0u8; 64];
            // End of file: the desk is closed, no more questions.
            if let Ok(0) = rustix::io::read(wake, &mut buf) {
                self.wake = None;
            }
        }
        while let Ok(q) = self.questions.try_recv() {
            if !self.ask(&q) {
                return false;
            }
        }
        true
    }

    /// Writes held keystrokes to the sandbox, as much as it takes.
    fn feed(&mut self) {
        if let Some(master) = &self.master {
            if let Ok(n) = rustix::io::write(master, &self.input) {
                self.input.drain(..n);
            }
        }
    }

    /// Relays one chunk of the sandbox's output; at its end (no slave left), stops
    /// watching it.
    fn relay_output(&mut self) {
        let Some(master) = &self.master else { return };
        let mut buf = [0u8; CHUNK];
        match rustix::io::read(master, &mut buf) {
            Ok(n) if n > 0 => {
                let _ = self.tty.write_all(&buf[..n]);
            }
            Err(rustix::io::Errno::AGAIN | rustix::io::Errno::INTR) => {}
            _ => self.master = None,
        }
    }

    /// After the sandbox ended: what its output left, until the pseudo-terminal's end.
    fn drain(&mut self) {
        let deadline = Instant::now() + DRAIN;
        while let Some(master) = &self.master {
            let left = deadline.saturating_duration_since(Instant::now());
            let mut fds = [PollFd::new(master, PollFlags::IN)];
            match poll(&mut fds, Some(&timespec(left))) {
                Ok(n) if n > 0 => self.relay_output(),
                _ => break,
            }
        }
    }

    /// Asks `q` until a valid answer, its deadline, or the stop; false if stopped.
    fn ask(&mut self, q: &Question) -> bool {
        let deadline = Instant::now() + Duration::from_millis(q.timeout_ms);
        // Type-ahead is the command's, never an answer; the terminal cooks the answer's line.
        match &self.modes {
            Some(m) => {
                let _ = rustix::termios::tcsetattr(&self.tty, OptionalActions::Flush, &m.cooked);
            }
            None => {
                let _ = rustix::termios::tcflush(&self.tty, QueueSelector::IFlush);
            }
        }
        let _ = self
            .tty
            .write_all(format!("{PLAIN}{}", question_text(q)).as_bytes());
        let answer = loop {
            match self.read_line(deadline) {
                Line::Read(line) => match parse_answer(&line) {
                    Some(v) => break Some(v),
                    None => {
                        let _ = self
                            .tty
                            .write_all(b"lockbox: answer o (once), a (always) or n (no) ");
                    }
                },
                Line::TimedOut => break None,
                Line::Stopped => {
                    let _ = self.tty.write_all(
                        format!("\r\n{PLAIN}lockbox: the sandbox ended: not asked any more\r\n")
                            .as_bytes(),
                    );
                    return false;
                }
            }
        };
        let said = match answer {
            Some(v) => match self.desk.decide(q.id, v, BY) {
                Ok(()) => format!("lockbox: {} {}", decided(v), destination(q)),
                Err(e) => format!("lockbox: {e}: nothing allowed"),
            },
            None => format!("lockbox: no answer in time: denied {}", destination(q)),
        };
        let _ = self
            .tty
            .write_all(format!("\r{PLAIN}{said}\r\n").as_bytes());
        if let Some(m) = &self.modes {
            let _ = rustix::termios::tcsetattr(&self.tty, OptionalActions::Now, &m.raw);
        }
        true
    }

    /// One line from the terminal, waiting until `deadline` at most.
    fn read_line(&mut self, deadline: Instant) -> Line {
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return Line::TimedOut;
            }
            let mut fds = [
                PollFd::new(&self.tty, PollFlags::IN),
                PollFd::new(&self.stop, PollFlags::IN),
            ];
            match poll(&mut fds, Some(&timespec(left))) {
                Ok(n) if n > 0 => {}
                Ok(_) => return Line::TimedOut,
                Err(rustix::io::Errno::INTR) => continue,
                Err(_) => return Line::TimedOut,
            }
            if !fds[1].revents().is_empty() {
                return Line::Stopped;
            }
            // A terminal in canonical mode returns one line per read.
            let mut buf = [0u8; 256];
            return match self.tty.read(&mut buf) {
                Ok(n) if n > 0 => Line::Read(String::from_utf8_lossy(&buf[..n]).into_owned()),
                Err(e) if e.kind() == ErrorKind::Interrupted => continue,
                _ => Line::TimedOut,
            };
        }
    }
}

/// What [`Terminal::read_line`] got.
enum Line {
    Read(String),
    TimedOut,
    Stopped,
}

fn timespec(d: Duration) -> Timespec {
    Timespec {
        tv_sec: i64::try_from(d.as_secs()).unwrap_or(i64::MAX),
        tv_nsec: i64::from(d.subsec_nanos()),
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

/// How an answer is echoed: `allowed once`, `allowed for the sandbox`, `denied`.
fn decided(v: NetVerdict) -> &'static str {
    match v {
        NetVerdict::Once => "allowed once",
        NetVerdict::Sandbox => "allowed for the sandbox",
        NetVerdict::Deny => "denied",
    }
}

/// What is asked for: `api.example.org (198.18.0.2):443/tcp`, `the name api.example.org`;
/// the name escaped (the sandbox chose it).
fn destination(q: &Question) -> String {
    let proto = match q.protocol {
        NetProtocol::Tcp => "tcp",
        NetProtocol::Udp => "udp",
    };
    let name = q
        .name
        .as_deref()
        .map(|n| ascii_line(n.as_bytes(), SHOWN_NAME));
    match (q.kind, name, q.address, q.port) {
        (NetEventKind::Dns, Some(name), _, _) => format!("the name {name}"),
        (_, Some(name), Some(ip), Some(port)) => format!("{name} ({ip}):{port}/{proto}"),
        (_, None, Some(std::net::IpAddr::V6(ip)), Some(port)) => format!("[{ip}]:{port}/{proto}"),
        (_, None, Some(ip), Some(port)) => format!("{ip}:{port}/{proto}"),
        _ => "an unknown destination".into(),
    }
}

/// `lockbox: allow python3 client.py (pid 42) to connect to 198.18.0.2:443/tcp? ...`,
/// the command line escaped (the sandbox chose it).
pub fn question_text(q: &Question) -> String {
    let verb = match q.kind {
        NetEventKind::Dns => "look up",
        NetEventKind::Send => "send to",
        _ => "connect to",
    };
    let command = match q.command.as_str() {
        "" => "a process".into(),
        c => ascii_line(c.as_bytes(), SHOWN),
    };
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

    fn question(command: &str, name: Option<&str>) -> Question {
        Question {
            id: 1,
            ts: String::new(),
            kind: NetEventKind::Connect,
            name: name.map(str::to_owned),
            address: Some(std::net::Ipv4Addr::new(198, 18, 0, 2).into()),
            port: Some(443),
            protocol: NetProtocol::Tcp,
            pid: 42,
            command: command.into(),
            timeout_ms: 30_000,
        }
    }

    #[test]
    fn questions_name_the_process_and_the_destination() {
        let text = question_text(&question("python3 x.py", Some("api.test")));
        assert!(
            text.contains("allow python3 x.py (pid 42) to connect to api.test (198.18.0.2):443/tcp? [o]nce / [a]lways / [N]o (30 s)"),
            "{text}"
        );
    }

    #[test]
    fn issue_32_questions_show_sandbox_chosen_bytes_escaped() {
        let q = question(
            "\x1b]0;\r\x1b[2Klockbox: allow pip install requests \u{9b}2J\u{202e}",
            Some("a\x1b[8m.test"),
        );
        let text = question_text(&q);
        assert!(
            text.contains(r"allow \033]0;\015\033[2Klockbox: allow pip install requests \302\2332J\342\200\256 (pid 42) to connect to a\033[8m.test (198.18.0.2):443/tcp?"),
            "{text}"
        );
        // Lockbox's own line breaks only, and no escape byte at all.
        let inner = &text[2..];
        assert!(
            inner.bytes().all(|b| (0x20..=0x7e).contains(&b)),
            "{text:?}"
        );
        let long = question(&"x".repeat(1000), None);
        assert!(question_text(&long).len() < 300);
    }
}
