//! `lockbox branch commit -p`: choose hunk by hunk on a terminal, like `git add -p`. Each
//! hunk of each text file (and each other change, whole) is shown escaped, then
//! `y` commits it, `n` leaves it in the branch, `q` stops choosing (what is left undecided
//! stays in the branch too). What was not chosen is excluded explicitly, so nothing is
//! committed that was not answered `y`.

use crate::error::CliError;
use crate::output::{eout, out, outln};
use lockbox_cow::{
    Branch, FileDiff, FileHunks, HunkChoice, Review, Reviewed, ReviewedPath, Selection,
};
use lockbox_policy::name::{printable_text, quoted};
use std::io::{BufRead, IsTerminal};

enum Answer {
    Yes,
    No,
    Quit,
}

fn ask(question: &str) -> Result<Answer, CliError> {
    let stdin = std::io::stdin();
    loop {
        eout!("{question} [y,n,q]? ");
        let mut line = String::new();
        let n = stdin
            .lock()
            .read_line(&mut line)
            .map_err(|e| CliError::new(1, format!("reading the answer: {e}")))?;
        if n == 0 {
            return Ok(Answer::Quit);
        }
        match line.trim() {
            "y" | "Y" => return Ok(Answer::Yes),
            "n" | "N" => return Ok(Answer::No),
            "q" | "Q" => return Ok(Answer::Quit),
            _ => eout!("y: commit it, n: leave it in the branch, q: stop (leave the rest)\n"),
        }
    }
}

/// The selection the person chose (`None`: nothing), within `narrow`'s `only`/`exclude`.
pub fn choose(branch: &Branch, narrow: &Selection) -> Result<Option<Selection>, CliError> {
    if !std::io::stdin().is_terminal() {
        return Err(CliError::usage(
            "-p asks on a terminal and stdin is not one; use --hunks PATH:N,N (numbers from `lockbox branch hunks`)",
        ));
    }
    let wanted = |p: &std::path::Path| {
        (narrow.only.is_empty() || narrow.only.iter().any(|o| p.starts_with(o)))
            && !narrow.exclude.iter().any(|e| p.starts_with(e))
    };
    let mut sel = Selection {
        exclude: narrow.exclude.clone(),
        ..Selection::default()
    };
    let mut quit = false;
    // What was shown, with the digest of the content shown: the commit is bound to it.
    let mut shown = Vec::new();
    for change in branch.change_set()?.changes() {
        let path = &change.path;
        if !wanted(path) {
            continue;
        }
        let diff = if quit {
            None
        } else {
            let (diff, digest) = branch.hunks_reviewed(path)?;
            shown.push(ReviewedPath {
                path: path.clone(),
                digest,
            });
            Some(diff)
        };
        match diff {
            Some(FileHunks::Text { hunks }) if !hunks.is_empty() => {
                let mut accept = Vec::new();
                for h in &hunks {
                    if quit {
                        break;
                    }
                    outln!("{} hunk {} of {}", quoted(path), h.index + 1, hunks.len());
                    out!("{}", printable_text(&h.to_patch()));
                    match ask("Commit this hunk")? {
                        Answer::Yes => accept.push(h.index),
                        Answer::No => {}
                        Answer::Quit => quit = true,
                    }
                }
                if !accept.is_empty() {
                    sel.only.push(path.clone());
                }
                sel.hunks.push(HunkChoice {
                    path: path.clone(),
                    accept,
                });
            }
            Some(other) => {
                let what = match other {
                    FileHunks::Summary { old, new } => FileDiff::Summary { old, new }.to_string(),
                    FileHunks::Text { .. } => "no text difference (mode or times)".to_owned(),
                };
                outln!("{} {}: {what}", change.kind.letter(), quoted(path));
                match ask("Commit this change")? {
                    Answer::Yes => sel.only.push(path.clone()),
                    Answer::No => sel.exclude.push(path.clone()),
                    Answer::Quit => {
                        quit = true;
                        sel.exclude.push(path.clone());
                    }
                }
            }
            None => sel.exclude.push(path.clone()),
        }
    }
    sel.review = Some(Reviewed::Paths(Review::new(shown)));
    Ok((!sel.only.is_empty()).then_some(sel))
}
