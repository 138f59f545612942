//! Part of a kept branch: `lockbox branch hunks ID PATH` (one file's diff as numbered hunks)
//! and the partial `lockbox branch commit` (`--only`, `--exclude`, `--hunks PATH:N,N`, `-p`),
//! which commits the selection and keeps the rest in the branch (`--drop-rest`: removes it).

use super::workdir::{explain_commit_error, warn_skipped};
use crate::error::CliError;
use crate::output::{json, out, outln};
use lockbox_cow::{
    Branch, BranchId, CommitOptions, CowError, FileDiff, FileHunks, HunkChoice, ReviewedPath, Side,
};
use lockbox_policy::name::{printable_text, quoted};
use lockbox_policy::plural;
use lockbox_server::FileDiffReply;
use serde_json::json;
use std::ffi::{OsStr, OsString};
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};

/// What to commit of a branch, from the command line.
pub struct Part<'a> {
    pub only: &'a [PathBuf],
    pub exclude: &'a [PathBuf],
    pub hunks: &'a [OsString],
    pub drop_rest: bool,
    pub interactive: bool,
    pub force: bool,
    /// `--review TOKEN`.
    pub review: Option<lockbox_cow::ContentDigest>,
}

impl Part<'_> {
    /// Whether this is a partial commit at all (else the whole branch is committed).
    pub fn is_partial(&self) -> bool {
        !(self.only.is_empty() && self.exclude.is_empty() && self.hunks.is_empty())
            || self.interactive
    }
}

/// `--hunks PATH:N,N` (split at the last `:`, so a path may hold one; `PATH:` is no hunk).
pub fn parse_hunks(arg: &OsStr) -> Result<HunkChoice, CliError> {
    let bytes = arg.as_bytes();
    let bad = |why: &str| CliError::usage(format!("--hunks {}: {why}", quoted(arg)));
    let at = bytes
        .iter()
        .rposition(|&b| b == b':')
        .ok_or_else(|| bad("expected PATH:N,N (hunk numbers from `lockbox branch hunks`)"))?;
    let (path, list) = (&bytes[..at], &bytes[at + 1..]);
    if path.is_empty() {
        return Err(bad("no path before `:`"));
    }
    let list = std::str::from_utf8(list).map_err(|_| bad("hunk numbers are digits"))?;
    let accept = list
        .split(',')
        .filter(|n| !n.trim().is_empty())
        .map(|n| n.trim().parse::<usize>())
        .collect::<Result<Vec<_>, _>>()
        .map_err(|_| bad("hunk numbers are comma-separated integers from 0"))?;
    Ok(HunkChoice {
        path: PathBuf::from(OsStr::from_bytes(path)),
        accept,
    })
}

pub fn show_hunks(state_dir: &Path, id: &str, path: &Path, as_json: bool) -> Result<(), CliError> {
    let branch = Branch::open(state_dir, &BranchId::parse(id)?)?;
    let listed = branch.review()?;
    let (diff, digest) = branch.hunks_reviewed(path)?;
    let unchanged = match &diff {
        FileHunks::Text { hunks } => hunks.is_empty(),
        FileHunks::Summary { old, new } => (old, new) == (&Side::Absent, &Side::Absent),
    };
    if unchanged {
        return Err(CliError::from(CowError::NotChanged {
            id: id.to_owned(),
            path: path.to_owned(),
        }));
    }
    if as_json {
        let reply = FileDiffReply::new(path.to_owned(), (diff, digest));
        outln!("{}", json(&reply, false));
        return Ok(());
    }
    print_hunks(path, &diff);
    // The token of what was shown: the listing, with this file as its hunks were made. A
    // commit naming it is refused if anything changed since (these hunks too).
    let mut shown: Vec<ReviewedPath> = lockbox_cow::Review::of(&listed).paths().to_vec();
    shown.push(ReviewedPath {
        path: path.to_owned(),
        digest,
    });
    let token = lockbox_cow::Review::new(shown).token();
    outln!("review token {token} (lockbox branch commit {id} --review {token} --hunks ...)");
    Ok(())
}

/// Numbered hunks, escaped as `lockbox branch diff` escapes them (names quoted, control
/// characters visible).
fn print_hunks(path: &Path, diff: &FileHunks) {
    match diff {
        FileHunks::Text { hunks } => {
            for h in hunks {
                outln!("hunk {} of {}", h.index, quoted(path));
                out!("{}", printable_text(&h.to_patch()));
            }
        }
        FileHunks::Summary { old, new } => {
            let summary = FileDiff::Summary {
                old: old.clone(),
                new: new.clone(),
            };
            outln!(
                "{}: {summary} (no hunks: commit or leave it whole)",
                quoted(path)
            );
        }
    }
}

pub fn commit(state_dir: &Path, id: &str, part: &Part<'_>, as_json: bool) -> Result<(), CliError> {
    let mut branch = Branch::open(state_dir, &BranchId::parse(id)?)?;
    super::txn::recover_sweep(state_dir, branch.workdir());
    let mut sel = lockbox_cow::Selection {
        only: part.only.to_vec(),
        exclude: part.exclude.to_vec(),
        hunks: part
            .hunks
            .iter()
            .map(|h| parse_hunks(h))
            .collect::<Result<_, _>>()?,
        review: part.review.map(lockbox_cow::Reviewed::Token),
    };
    if part.interactive {
        let Some(chosen) = super::branch_prompt::choose(&branch, &sel)? else {
            outln!("nothing chosen; branch {id} is unchanged");
            return Ok(());
        };
        sel = chosen;
    }
    let opts = CommitOptions {
        force: part.force,
        ..CommitOptions::default()
    };
    let report = match branch.commit_selected(&sel, &opts) {
        Ok(report) => report,
        Err(e) if e.exit_code() == 2 => return Err(CliError::from(e)),
        Err(e) => {
            explain_commit_error(&e, id);
            return Err(CliError::reported(e.exit_code()));
        }
    };
    warn_skipped(&report);
    let remaining = if part.drop_rest {
        branch.abort()?;
        0
    } else {
        branch.change_set()?.len()
    };
    if as_json {
        let reply = json!({
            "id": id, "action": "committed", "report": report, "remaining": remaining,
            "dropped": part.drop_rest
        });
        outln!("{}", json(&reply, false));
    } else {
        let done = plural(
            (report.added + report.modified + report.deleted + report.type_changed) as usize,
            "change",
        );
        match (part.drop_rest, remaining) {
            (true, _) => outln!("committed {done}; branch {id} removed with the rest"),
            (false, 0) => outln!(
                "committed {done}; branch {id} has nothing left (`lockbox branch abort {id}` removes it)"
            ),
            (false, n) => outln!(
                "committed {done}; {n} left in branch {id} (`lockbox branch diff {id}`)"
            ),
        }
    }
    Ok(())
}
