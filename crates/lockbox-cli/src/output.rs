//! Everything the CLI prints goes through [`out!`], [`outln!`], [`eout!`] and [`eoutln!`],
//! never `print!`/`println!`/`eprint!`/`eprintln!` (clippy's `print_stdout` and
//! `print_stderr` lints, denied in `main.rs`, keep it so).
//!
//! The std macros panic when the stream is a closed pipe: `lockbox txn list | true` died with
//! "failed printing to stdout: Broken pipe" (exit 101). Here a closed pipe (`EPIPE`) means
//! the reader left: the rest of that stream's output is dropped quietly, and the command
//! finishes what it was doing (a commit is never cut short by a reader going away) and exits
//! with its own code. Any other failure to write stdout (a full disk behind `> file`) is
//! reported once on stderr at exit, and a success becomes exit [`OUTPUT_FAILED`]
//! ([`finish`]).
//!
//! Why not restore `SIGPIPE`'s default action at start instead (which the Rust runtime sets
//! to ignored on purpose): lockbox would then be killed by the first write to *any* closed
//! pipe or socket, not only stdout: halfway through a commit after printing a line, in
//! `lockbox serve` writing to a sandboxed process's stdin, or in the network supervisor of
//! `--net-allow` performing a sandbox's `sendmsg` on a socket whose peer left. The sandboxed
//! command does not inherit lockbox's disposition either way: `lockbox-confine` resets
//! `SIGPIPE` to its default in the command's process before `execve` (checked by
//! `tests/it/run.rs` `sigpipe_is_not_ignored_inside`).

use crate::error::ExitCode;
use std::fmt;
use std::io::{self, Write};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Mutex;

/// The exit code of a command that succeeded but could not write its output (sysexits.h's
/// `EX_IOERR`; distinct from every code lockbox documents otherwise).
pub const OUTPUT_FAILED: u8 = 74;

/// Set once a stream failed: nothing more is written to it.
static STDOUT_DONE: AtomicBool = AtomicBool::new(false);
static STDERR_DONE: AtomicBool = AtomicBool::new(false);
/// The first stdout failure that was not a closed pipe, reported by [`finish`].
static STDOUT_ERROR: Mutex<Option<io::Error>> = Mutex::new(None);

fn write_with(
    stream: &mut dyn Write,
    done: &AtomicBool,
    write: impl FnOnce(&mut dyn Write) -> io::Result<()>,
) -> Option<io::Error> {
    if done.load(Ordering::Relaxed) {
        return None;
    }
    let result = write(stream).and_then(|()| stream.flush());
    let e = result.err()?;
    done.store(true, Ordering::Relaxed);
    (e.kind() != io::ErrorKind::BrokenPipe).then_some(e)
}

fn stdout_with(write: impl FnOnce(&mut dyn Write) -> io::Result<()>) {
    if let Some(e) = write_with(&mut io::stdout().lock(), &STDOUT_DONE, write) {
        let mut first = STDOUT_ERROR.lock().unwrap_or_else(|p| p.into_inner());
        first.get_or_insert(e);
    }
}

/// Writes to stdout (see the module doc); use [`out!`] / [`outln!`].
pub fn stdout_fmt(args: fmt::Arguments<'_>) {
    stdout_with(|w| w.write_fmt(args));
}

/// Writes raw bytes to stdout (a stage's output), like [`stdout_fmt`].
pub fn stdout_bytes(bytes: &[u8]) {
    stdout_with(|w| w.write_all(bytes));
}

/// Writes to stderr; use [`eout!`] / [`eoutln!`]. A failure has nowhere to be reported:
/// it only stops further writes.
pub fn stderr_fmt(args: fmt::Arguments<'_>) {
    let _ = write_with(&mut io::stderr().lock(), &STDERR_DONE, |w| {
        w.write_fmt(args)
    });
}

/// The process exit code once the command returned `code`: a stdout failure other than a
/// closed pipe is reported here, and turns a success into [`OUTPUT_FAILED`].
pub fn finish(code: ExitCode) -> ExitCode {
    stdout_with(|_| Ok(()));
    let failed = STDOUT_ERROR
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .take();
    match failed {
        Some(e) => {
            stderr_fmt(format_args!("lockbox: writing to stdout: {e}\n"));
            if code == ExitCode::SUCCESS {
                ExitCode::from(OUTPUT_FAILED)
            } else {
                code
            }
        }
        None => code,
    }
}

/// `print!` that never panics (see the module doc).
macro_rules! out {
    ($($arg:tt)*) => { $crate::output::stdout_fmt(format_args!($($arg)*)) };
}

/// `println!` that never panics (see the module doc).
macro_rules! outln {
    () => { $crate::output::stdout_fmt(format_args!("\n")) };
    ($($arg:tt)*) => { $crate::output::stdout_fmt(format_args!("{}\n", format_args!($($arg)*))) };
}

/// `eprint!` that never panics (see the module doc).
macro_rules! eout {
    ($($arg:tt)*) => { $crate::output::stderr_fmt(format_args!($($arg)*)) };
}

/// `eprintln!` that never panics (see the module doc).
macro_rules! eoutln {
    ($($arg:tt)*) => { $crate::output::stderr_fmt(format_args!("{}\n", format_args!($($arg)*))) };
}

pub(crate) use {eout, eoutln, out, outln};

/// `value` as JSON (pretty or one line) that is safe to show on a terminal: serde_json
/// escapes C0 controls in strings, and this also escapes DEL, C1 controls and the Unicode
/// controls that reorder or break lines (`lockbox_policy::name::acts_on_terminal`) as
/// `\uXXXX`. The value a JSON reader gets is the same. (They can only occur inside JSON
/// strings, where `\uXXXX` is valid: the rest of the text is ASCII punctuation, numbers,
/// literals and the pretty form's newlines, which serde_json escapes inside strings.)
pub fn json(value: &impl serde::Serialize, pretty: bool) -> String {
    let escape = |c: char| c != '\n' && lockbox_policy::name::acts_on_terminal(c);
    let text = if pretty {
        serde_json::to_string_pretty(value)
    } else {
        serde_json::to_string(value)
    };
    // Serialising a serde_json::Value or our records cannot fail (paths use the lossless
    // form of lockbox_policy::name); `null` is what a failure would print.
    let text = text.unwrap_or_else(|_| "null".to_owned());
    if !text.chars().any(escape) {
        return text;
    }
    let mut safe = String::with_capacity(text.len() + 16);
    for c in text.chars() {
        if escape(c) {
            safe.push_str(&format!("\\u{:04x}", u32::from(c)));
        } else {
            safe.push(c);
        }
    }
    safe
}

#[cfg(test)]
mod tests {
    #[test]
    fn json_for_terminals_escapes_what_serde_json_leaves_and_keeps_the_value() {
        let v = serde_json::json!({ "path": "a\u{7f}b\u{9b}2J\u{202e}c\n\u{1b}" });
        let text = super::json(&v, false);
        assert_eq!(text, r#"{"path":"a\u007fb\u009b2J\u202ec\n\u001b"}"#);
        let back: serde_json::Value = serde_json::from_str(&text).unwrap();
        assert_eq!(back, v);
        let pretty = super::json(&v, true);
        assert_eq!(pretty.lines().count(), 3, "{pretty}");
        let back: serde_json::Value = serde_json::from_str(&pretty).unwrap();
        assert_eq!(back, v);
    }
}
