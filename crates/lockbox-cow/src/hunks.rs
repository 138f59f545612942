//! A file's text diff as numbered [`Hunk`]s, and [`apply_hunks`]: the old text with a subset
//! of them applied. What a person accepts or rejects hunk by hunk (`lockbox branch hunks`,
//! the review console) and what a commit of a hunk subset writes ([`crate::Selection`]).
//!
//! The hunks are the groups of `similar`'s line diff with 3 lines of context, the same groups
//! and headers `lockbox branch diff` prints ([`crate::FileDiff::Text`]), numbered from 0 in
//! file order. The diff is deterministic (no deadline), so the numbering a reviewer saw is
//! the numbering a commit applies, as long as neither side changed in between (and a change
//! of the workdir side since the branch began is refused anyway: the stale-base rule).
//!
//! Applying a subset works on the texts, not on a patch: each accepted hunk's old lines are
//! replaced by its new lines, everything else is kept byte for byte (line endings and a
//! missing final newline included). The result is what `patch` gives for those hunks
//! (property-tested against the real `patch` in `tests/it/hunks.rs`).

use std::ops::Range;

use similar::{DiffOp, TextDiff};

/// Lines of context around each hunk (as `diff -u` and `lockbox branch diff`).
pub const CONTEXT_LINES: usize = 3;

/// What a line of a hunk does.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum LineOp {
    /// On both sides (` `).
    Context,
    /// Only on the old (workdir) side (`-`).
    Delete,
    /// Only on the new (branch) side (`+`).
    Insert,
}

impl LineOp {
    /// The unified-diff prefix: `' '`, `'-'` or `'+'`.
    pub fn symbol(self) -> char {
        match self {
            LineOp::Context => ' ',
            LineOp::Delete => '-',
            LineOp::Insert => '+',
        }
    }
}

/// One line of a hunk.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HunkLine {
    /// Context, deleted or inserted.
    pub op: LineOp,
    /// The line without its newline, raw (a `\r` of a CRLF line stays; shown to a person,
    /// escape it: `lockbox_policy::name::printable_text`).
    pub text: String,
}

/// One hunk of a unified diff. Line numbers are as in the `@@` header: 1-based, and for an
/// empty side the line *before* the hunk (0 at the top of the file).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Hunk {
    /// Its number, from 0 in file order.
    pub index: usize,
    /// First old line (see the type's doc).
    pub old_start: usize,
    /// Number of old lines (context and deleted).
    pub old_lines: usize,
    /// First new line.
    pub new_start: usize,
    /// Number of new lines (context and inserted).
    pub new_lines: usize,
    /// The lines, in order.
    pub lines: Vec<HunkLine>,
    /// The old side's last line in this hunk has no newline (the end of a file without one).
    pub no_newline_old: bool,
    /// The new side's last line in this hunk has no newline.
    pub no_newline_new: bool,
}

impl Hunk {
    /// The `@@ -a,b +c,d @@` header (`,1` omitted, as `diff -u` and `similar` do).
    pub fn header(&self) -> String {
        let range = |start: usize, len: usize| {
            if len == 1 {
                format!("{start}")
            } else {
                format!("{start},{len}")
            }
        };
        format!(
            "@@ -{} +{} @@",
            range(self.old_start, self.old_lines),
            range(self.new_start, self.new_lines)
        )
    }

    /// The hunk as unified-diff text (header, lines, `\ No newline at end of file` markers),
    /// raw: what `patch` reads.
    pub fn to_patch(&self) -> String {
        const MARK: &str = "\\ No newline at end of file\n";
        let last = |side: LineOp| {
            self.lines
                .iter()
                .rposition(|l| l.op == LineOp::Context || l.op == side)
        };
        let (last_old, last_new) = (last(LineOp::Delete), last(LineOp::Insert));
        let mut out = self.header();
        out.push('\n');
        for (i, line) in self.lines.iter().enumerate() {
            out.push(line.op.symbol());
            out.push_str(&line.text);
            out.push('\n');
            let old_end = self.no_newline_old && last_old == Some(i);
            let new_end = self.no_newline_new && last_new == Some(i);
            if old_end || new_end {
                out.push_str(MARK);
            }
        }
        out
    }
}

fn line_diff<'a>(old: &'a str, new: &'a str) -> TextDiff<'a, 'a, 'a, str> {
    TextDiff::configure().diff_lines(old, new)
}

/// The hunks' (old, new) line ranges, 0-based, in order.
fn groups(diff: &TextDiff<'_, '_, '_, str>) -> Vec<(Range<usize>, Range<usize>)> {
    diff.grouped_ops(CONTEXT_LINES)
        .into_iter()
        .filter(|ops| !ops.is_empty())
        .map(|ops| span(&ops))
        .collect()
}

/// The (old, new) line ranges a group of ops covers. From the smallest start to the largest
/// end, not from the first and last op: `similar` can give a deletion that opens a group the
/// new index *after* the equal lines that follow it.
fn span(ops: &[DiffOp]) -> (Range<usize>, Range<usize>) {
    let cover = |ranges: &mut dyn Iterator<Item = Range<usize>>| {
        ranges.fold(None::<Range<usize>>, |acc, r| match acc {
            None => Some(r),
            Some(a) => Some(a.start.min(r.start)..a.end.max(r.end)),
        })
    };
    (
        cover(&mut ops.iter().map(DiffOp::old_range)).unwrap_or(0..0),
        cover(&mut ops.iter().map(DiffOp::new_range)).unwrap_or(0..0),
    )
}

/// The hunks that turn `old` into `new` (none if they are equal).
pub fn text_hunks(old: &str, new: &str) -> Vec<Hunk> {
    let diff = line_diff(old, new);
    let (olds, news) = (diff.old_slices(), diff.new_slices());
    let header_start = |r: &Range<usize>| if r.is_empty() { r.start } else { r.start + 1 };
    // The side's last line is in the hunk and has no newline.
    let ends_bare = |slices: &[&str], r: &Range<usize>| {
        !r.is_empty() && r.end == slices.len() && slices.last().is_some_and(|l| !l.ends_with('\n'))
    };
    diff.grouped_ops(CONTEXT_LINES)
        .into_iter()
        .filter(|ops| !ops.is_empty())
        .enumerate()
        .map(|(index, ops)| {
            let (o, n) = span(&ops);
            let lines = ops
                .iter()
                .flat_map(|op| diff.iter_changes(op))
                .map(|change| HunkLine {
                    op: match change.tag() {
                        similar::ChangeTag::Equal => LineOp::Context,
                        similar::ChangeTag::Delete => LineOp::Delete,
                        similar::ChangeTag::Insert => LineOp::Insert,
                    },
                    text: change
                        .value()
                        .strip_suffix('\n')
                        .unwrap_or(change.value())
                        .to_owned(),
                })
                .collect();
            Hunk {
                index,
                old_start: header_start(&o),
                old_lines: o.len(),
                new_start: header_start(&n),
                new_lines: n.len(),
                no_newline_old: ends_bare(olds, &o),
                no_newline_new: ends_bare(news, &n),
                lines,
            }
        })
        .collect()
}

/// A hunk number that is not one of the diff's.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct NoSuchHunk {
    /// The number asked for.
    pub index: usize,
    /// How many hunks the diff has.
    pub count: usize,
}

/// `old` with the hunks numbered in `accept` (of [`text_hunks`]`(old, new)`) applied: all of
/// them gives `new`, none gives `old`. Duplicates are ignored; a number out of range is an
/// error.
pub fn apply_hunks(old: &str, new: &str, accept: &[usize]) -> Result<String, NoSuchHunk> {
    let diff = line_diff(old, new);
    let groups = groups(&diff);
    if let Some(&index) = accept.iter().find(|&&i| i >= groups.len()) {
        return Err(NoSuchHunk {
            index,
            count: groups.len(),
        });
    }
    let (olds, news) = (diff.old_slices(), diff.new_slices());
    let mut out = String::with_capacity(old.len().max(new.len()));
    let mut pos = 0;
    for (i, (o, n)) in groups.iter().enumerate() {
        olds[pos..o.start].iter().for_each(|l| out.push_str(l));
        let take = if accept.contains(&i) {
            &news[n.clone()]
        } else {
            &olds[o.clone()]
        };
        take.iter().for_each(|l| out.push_str(l));
        pos = o.end;
    }
    olds[pos..].iter().for_each(|l| out.push_str(l));
    Ok(out)
}

/// The number of hunks of [`text_hunks`]`(old, new)`, without building them.
pub(crate) fn hunk_count(old: &str, new: &str) -> usize {
    groups(&line_diff(old, new)).len()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn headers_and_numbering_match_the_unified_diff() {
        let old: String = (1..=30).map(|i| format!("l{i}\n")).collect();
        let new = old.replace("l2\n", "L2\n").replace("l25\n", "");
        let hunks = text_hunks(&old, &new);
        let unified = TextDiff::from_lines(&old, &new)
            .unified_diff()
            .context_radius(CONTEXT_LINES)
            .to_string();
        let rendered: String = hunks.iter().map(Hunk::to_patch).collect();
        assert_eq!(rendered, unified);
        assert_eq!(hunks.len(), 2);
        assert_eq!(hunks[1].index, 1);
    }

    #[test]
    fn subsets_apply_exactly() {
        let old = "a\nb\nc\nd\ne\nf\ng\nh\ni\nj\nk";
        let new = "A\nb\nc\nd\ne\nf\ng\nh\ni\nj\nK\n";
        assert_eq!(apply_hunks(old, new, &[0, 1]).unwrap(), new);
        assert_eq!(apply_hunks(old, new, &[]).unwrap(), old);
        assert_eq!(
            apply_hunks(old, new, &[1]).unwrap(),
            "a\nb\nc\nd\ne\nf\ng\nh\ni\nj\nK\n"
        );
        assert_eq!(
            apply_hunks(old, new, &[2]),
            Err(NoSuchHunk { index: 2, count: 2 })
        );
        let h = text_hunks(old, new);
        assert!(h[1].no_newline_old && !h[1].no_newline_new);
    }
}
