//! Branches: changes, review, diff, commit, abort.

use super::{each, time};
use crate::error::ApiError;
use base64::Engine;
use lockbox_policy::name::Decoded;
use lockbox_runtime::Selection;
use serde::{Deserialize, Serialize};
use std::path::PathBuf;
use utoipa::{IntoParams, ToSchema};

/// A kept branch as `GET /v1/branches` lists it ([`lockbox_runtime::KeptBranch`]).
#[derive(Debug, Serialize, ToSchema)]
#[schema(as = Branch)]
pub struct KeptBranch {
    pub id: String,
    #[serde(serialize_with = "lockbox_policy::name::json::option::serialize")]
    #[schema(value_type = Option<Decoded>)]
    pub workdir: Option<PathBuf>,
    /// `kept`, `stale`, `commit_failed`, `committing`, `active` (an orphan), or `damaged`
    /// (its record is unreadable).
    pub state: &'static str,
    pub status: String,
    pub created: Option<String>,
    /// The command the branch was made by, as its record has it.
    #[schema(value_type = Option<Value>)]
    pub command: Option<serde_json::Value>,
    pub changes: Option<usize>,
}

impl From<lockbox_runtime::KeptBranch> for KeptBranch {
    fn from(b: lockbox_runtime::KeptBranch) -> KeptBranch {
        KeptBranch {
            id: b.id.to_string(),
            workdir: b.workdir,
            state: b
                .state
                .map_or("damaged", lockbox_runtime::BranchState::name),
            status: b.status,
            created: b.created.map(time),
            command: b.command,
            changes: b.changes,
        }
    }
}

/// One change of a branch (`lockbox_cow::Change`), `mode` as octal text.
// As `FileInfo` has it. Fields in the order of their names, as the `json!` value this
// replaced wrote them.
#[derive(Debug, Serialize, ToSchema)]
pub struct Change<'a> {
    /// In a review (`GET changes`, `GET /v1/branches/{id}`): the digest of what the branch
    /// has at the path, which a commit's `review` names.
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schema(value_type = Option<String>, pattern = "^sha256:[0-9a-f]{64}$")]
    pub digest: Option<&'a lockbox_runtime::ContentDigest>,
    /// The type of the new entry (for `deleted`, of the old one).
    pub file_type: lockbox_cow::FileType,
    /// What happens to it.
    pub kind: lockbox_cow::ChangeKind,
    /// Permission bits, octal (`"0644"`).
    #[schema(pattern = "^[0-7]{4}$")]
    pub mode: String,
    /// The path relative to the workdir.
    #[serde(serialize_with = "lockbox_policy::name::json::serialize")]
    #[schema(value_type = Decoded)]
    pub path: &'a std::path::Path,
    /// Its size in bytes.
    pub size: u64,
}

impl<'a> Change<'a> {
    /// `change` in its wire form, with the digest a review showed.
    pub fn new(
        change: &'a lockbox_runtime::Change,
        digest: Option<&'a lockbox_runtime::ContentDigest>,
    ) -> Change<'a> {
        Change {
            digest,
            file_type: change.file_type,
            kind: change.kind,
            mode: format!("{:04o}", change.mode & 0o7777),
            path: &change.path,
            size: change.size,
        }
    }
}

/// Changes in their wire form ([`Change`]). Serialised one change at a time: a copy of the
/// whole list in its wire form would be a second, larger copy of every change.
#[derive(Debug)]
pub struct ChangeList(pub Vec<lockbox_runtime::Change>);

impl Serialize for ChangeList {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.collect_seq(self.0.iter().map(|c| Change::new(c, None)))
    }
}

/// A review: the changes of [`ChangeList`], each with the `digest` of what the branch has at
/// its path, and `review_token`, the digest of the whole listing. A commit that follows it
/// names it ([`ReviewArg`]).
#[derive(Debug)]
pub struct ReviewList(pub Vec<lockbox_runtime::ReviewedChange>);

impl ReviewList {
    /// The listing's token (`lockbox_cow::Review::token`).
    pub fn token(&self) -> String {
        lockbox_runtime::Review::of(&self.0).token().to_string()
    }
}

impl Serialize for ReviewList {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.collect_seq(
            self.0
                .iter()
                .map(|row| Change::new(&row.change, Some(&row.digest))),
        )
    }
}

/// The changes of a list reply: a review's (each with its `digest`) or plain ones.
#[derive(Debug, Serialize)]
#[serde(untagged)]
pub enum ChangeRows {
    /// A review's.
    Reviewed(ReviewList),
    /// Without digests (a snapshot's diff).
    Plain(ChangeList),
}

/// The changes of a branch, sorted by path.
// `GET changes` (and MCP's `changes`): `{"changes": [... each with "digest"],
// "review_token"}`; a snapshot's diff: `{"changes": [...]}`.
#[derive(Debug, Serialize, ToSchema)]
#[schema(as = ChangeList)]
pub struct ReviewReply {
    /// The changes.
    #[schema(value_type = Vec<Change>)]
    pub changes: ChangeRows,
    /// In a review (`GET changes`): the digest of the whole listing, which a commit's
    /// `review` may name.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub review_token: Option<String>,
}

impl From<Vec<lockbox_runtime::ReviewedChange>> for ReviewReply {
    fn from(rows: Vec<lockbox_runtime::ReviewedChange>) -> ReviewReply {
        let changes = ReviewList(rows);
        ReviewReply {
            review_token: Some(changes.token()),
            changes: ChangeRows::Reviewed(changes),
        }
    }
}

impl From<Vec<lockbox_runtime::Change>> for ReviewReply {
    fn from(changes: Vec<lockbox_runtime::Change>) -> ReviewReply {
        ReviewReply {
            changes: ChangeRows::Plain(ChangeList(changes)),
            review_token: None,
        }
    }
}

/// `review` of a commit: the review it follows, either the paths shown with their digests
/// (`[{"path": P, "digest": "sha256:..."}]`, as `GET changes` / `GET diff` gave them) or the
/// `review_token` of a whole listing. The commit then writes nothing the review did not show
/// as it is now (else `409 STALE_REVIEW`, `details.paths`).
#[derive(Debug, Clone)]
pub struct ReviewArg(pub lockbox_runtime::Reviewed);

impl<'de> Deserialize<'de> for ReviewArg {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<ReviewArg, D::Error> {
        use serde::de::Error;
        match serde_json::Value::deserialize(d)? {
            serde_json::Value::String(token) => token
                .parse()
                .map(|t| ReviewArg(lockbox_runtime::Reviewed::Token(t)))
                .map_err(D::Error::custom),
            list @ serde_json::Value::Array(_) => {
                Vec::<lockbox_runtime::ReviewedPath>::deserialize(list)
                    .map(|paths| {
                        ReviewArg(lockbox_runtime::Reviewed::Paths(
                            lockbox_runtime::Review::new(paths),
                        ))
                    })
                    .map_err(D::Error::custom)
            }
            _ => Err(D::Error::custom(
                "review: expected a review_token (string) or [{\"path\", \"digest\"}]",
            )),
        }
    }
}

/// What [`ReviewArg`]'s `Deserialize` takes: component `ReviewSchema`.
impl utoipa::PartialSchema for ReviewArg {
    fn schema() -> utoipa::openapi::RefOr<utoipa::openapi::schema::Schema> {
        use utoipa::openapi::schema::{ArrayBuilder, OneOfBuilder, Schema};
        use utoipa::openapi::RefOr;
        let mut token = <lockbox_runtime::ContentDigest as utoipa::PartialSchema>::schema();
        if let RefOr::T(Schema::Object(object)) = &mut token {
            object.description = Some(
                "The whole listing's digest (`review_token`: `sha256:` and 64 hex digits).".into(),
            );
        }
        OneOfBuilder::new()
            .item(token)
            .item(
                ArrayBuilder::new()
                    .items(utoipa::openapi::Ref::from_schema_name(
                        <lockbox_runtime::ReviewedPath as ToSchema>::name(),
                    ))
                    .description(Some("The paths shown, each with the digest it had.")),
            )
            .description(Some(
                "The review a commit follows (`wire::ReviewArg`): `changes`' `review_token`, or the\n\
                 paths shown with their digests.",
            ))
            .into()
    }
}

impl ToSchema for ReviewArg {
    fn name() -> std::borrow::Cow<'static, str> {
        "ReviewSchema".into()
    }

    fn schemas(
        schemas: &mut Vec<(
            String,
            utoipa::openapi::RefOr<utoipa::openapi::schema::Schema>,
        )>,
    ) {
        use lockbox_runtime::ReviewedPath;
        schemas.push((
            <ReviewedPath as ToSchema>::name().into(),
            <ReviewedPath as utoipa::PartialSchema>::schema(),
        ));
        <ReviewedPath as ToSchema>::schemas(schemas);
    }
}

/// What a commit did ([`lockbox_runtime::CommitSummary`]).
#[derive(Debug, Serialize, ToSchema)]
pub struct CommitSummary {
    /// What was applied (`lockbox_cow::CommitReport`: counts and paths).
    #[schema(value_type = Object)]
    pub report: lockbox_runtime::CommitReport,
    pub remaining: usize,
}

impl From<lockbox_runtime::CommitSummary> for CommitSummary {
    fn from(c: lockbox_runtime::CommitSummary) -> CommitSummary {
        CommitSummary {
            report: c.report,
            remaining: c.remaining,
        }
    }
}

/// `POST commit`.
#[derive(Debug, Default, Deserialize, ToSchema)]
#[serde(default, deny_unknown_fields)]
#[schema(as = CommitRequest)]
pub struct Commit {
    /// Only these paths (relative to the workdir; a directory covers what is below it). A
    /// name that is not UTF-8 is `{"bytes": base64}` (`lockbox_policy::name`).
    #[serde(with = "lockbox_policy::name::json::vec")]
    #[schema(value_type = Vec<Decoded>)]
    pub only: Vec<PathBuf>,
    /// Not these paths.
    #[serde(with = "lockbox_policy::name::json::vec")]
    #[schema(value_type = Vec<Decoded>)]
    pub exclude: Vec<PathBuf>,
    /// Commit even where the workdir changed under the branch at those paths.
    pub force: bool,
    /// Files committed with only some of their hunks: `[{"path": P, "accept": [0, 2]}]`
    /// (numbered as `GET diff?path=P` gives them; `accept: []` leaves the file untouched).
    pub hunks: Vec<HunkChoice>,
    /// The review this commit follows: `[{"path", "digest"}]` of the paths shown (from `GET
    /// changes` / `GET diff`) or a `review_token`. Every path the commit writes must have
    /// been shown with the digest it has now, else `409 STALE_REVIEW` (nothing applied).
    #[schema(default = serde_json::Value::default)]
    pub review: Option<ReviewArg>,
}

/// Some hunks of one file: `{"path": P, "accept": [0, 2]}`.
#[derive(Debug, Default, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct HunkChoice {
    /// The file, relative to the workdir (a string, or `{"bytes": base64}`).
    #[serde(deserialize_with = "lockbox_policy::name::json::deserialize")]
    #[schema(value_type = Decoded)]
    pub path: PathBuf,
    /// Hunk numbers (from 0, as the diff numbers them); empty: the file is not touched.
    pub accept: Vec<usize>,
}

impl From<HunkChoice> for lockbox_runtime::HunkSelection {
    fn from(h: HunkChoice) -> lockbox_runtime::HunkSelection {
        lockbox_runtime::HunkSelection {
            path: h.path,
            accept: h.accept,
        }
    }
}

/// What happens to the part of a kept branch a commit did not take.
#[derive(Debug, Clone, Copy, Default, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum RestName {
    /// It stays in the branch (default).
    #[default]
    Keep,
    /// The branch is removed after the commit.
    Drop,
}

impl From<RestName> for lockbox_runtime::Rest {
    fn from(r: RestName) -> lockbox_runtime::Rest {
        match r {
            RestName::Keep => lockbox_runtime::Rest::Keep,
            RestName::Drop => lockbox_runtime::Rest::Drop,
        }
    }
}

impl Commit {
    /// The runtime's selection.
    pub fn into_selection(self) -> Selection {
        Selection {
            only: self.only,
            exclude: self.exclude,
            force: self.force,
            hunks: each(self.hunks),
            review: self.review.map(|r| r.0),
        }
    }
}

/// `POST /v1/branches/{id}/commit`: [`Commit`] and what happens to the rest.
#[derive(Debug, Default, Deserialize, ToSchema)]
#[serde(default, deny_unknown_fields)]
#[schema(as = BranchCommitRequest)]
pub struct BranchCommit {
    /// Only these paths.
    #[serde(with = "lockbox_policy::name::json::vec")]
    #[schema(value_type = Vec<Decoded>)]
    pub only: Vec<PathBuf>,
    /// Not these paths.
    #[serde(with = "lockbox_policy::name::json::vec")]
    #[schema(value_type = Vec<Decoded>)]
    pub exclude: Vec<PathBuf>,
    /// Files committed with only some of their hunks.
    pub hunks: Vec<HunkChoice>,
    /// Commit even where the workdir changed under the branch at those paths.
    pub force: bool,
    /// `keep` (default): what is not committed stays in the branch; `drop`: the branch is
    /// removed after the commit.
    pub rest: RestName,
    /// The review this commit follows (as [`Commit::review`]).
    #[schema(default = serde_json::Value::default)]
    pub review: Option<ReviewArg>,
}

impl BranchCommit {
    /// The runtime's selection and the fate of the rest.
    pub fn into_parts(self) -> (Selection, lockbox_runtime::Rest) {
        (
            Selection {
                only: self.only,
                exclude: self.exclude,
                force: self.force,
                hunks: each(self.hunks),
                review: self.review.map(|r| r.0),
            },
            self.rest.into(),
        )
    }
}

/// `?path=` (or `?path_bytes=` with the base64 of a name that is not UTF-8) of `GET diff`.
#[derive(Debug, Deserialize, IntoParams, ToSchema)]
#[serde(deny_unknown_fields)]
#[into_params(parameter_in = Query)]
pub struct DiffQuery {
    /// A changed path, relative to the workdir (as `changes` lists it).
    pub path: Option<String>,
    /// The path's bytes, base64 (standard alphabet, as `{"bytes": ...}` names are), for a
    /// name that is not UTF-8 (instead of `path`).
    #[param(format = Byte)]
    #[schema(format = Byte)]
    pub path_bytes: Option<String>,
}

impl DiffQuery {
    /// The path asked for.
    pub fn path(self) -> Result<PathBuf, ApiError> {
        use std::os::unix::ffi::OsStringExt;
        match (self.path, self.path_bytes) {
            (Some(p), None) => Ok(PathBuf::from(p)),
            (None, Some(b)) => base64::engine::general_purpose::STANDARD
                .decode(b.as_bytes())
                .map(|v| PathBuf::from(std::ffi::OsString::from_vec(v)))
                .map_err(|e| ApiError::invalid("path_bytes", format!("not base64: {e}"))),
            _ => Err(ApiError::invalid(
                "path",
                "give exactly one of `path` and `path_bytes`",
            )),
        }
    }
}

/// One path's diff as numbered hunks, or a summary of both sides, in the wire shape of `GET
/// diff` (docs/server.md), `lockbox branch hunks --json` and the Python SDK:
/// `{"path", "kind": "text", "hunks": [{"index", "old_start", "old_lines", "new_start",
/// "new_lines", "header", "lines": [{"op": " "|"-"|"+", "text"}], "no_newline_old",
/// "no_newline_new"}]}` or `{"path", "kind": "summary", "old": Side, "new": Side}`, each
/// with `digest`: that of the branch side the diff was made from (what a commit's `review`
/// names for this path).
#[derive(Debug, Clone)]
pub struct FileDiffReply {
    /// The path asked for.
    pub path: PathBuf,
    /// The diff.
    pub diff: lockbox_runtime::FileHunks,
    /// The digest of the branch side.
    pub digest: lockbox_runtime::ContentDigest,
}

impl FileDiffReply {
    /// The reply for `path` from the runtime's diff and digest.
    pub fn new(
        path: PathBuf,
        (diff, digest): (lockbox_runtime::FileHunks, lockbox_runtime::ContentDigest),
    ) -> FileDiffReply {
        FileDiffReply { path, diff, digest }
    }
}

impl Serialize for FileDiffReply {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        FileDiff::from(self).serialize(serializer)
    }
}

/// One path's diff (`wire::FileDiffReply`): numbered hunks (`kind: text`), or a summary of
/// both sides.
// [`FileDiffReply`] as it is sent. Fields (here and below) in the order of their names, as
// the `json!` value this replaced wrote them.
#[derive(Debug, Serialize, ToSchema)]
pub struct FileDiff<'a> {
    /// The digest of the branch side the diff was made from: what a commit's `review` names
    /// for this path.
    #[schema(value_type = String, pattern = "^sha256:[0-9a-f]{64}$")]
    pub digest: &'a lockbox_runtime::ContentDigest,
    /// `text`: the hunks, numbered from 0 (none if both sides are equal).
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schema(nullable = false)]
    pub hunks: Option<Vec<Hunk<'a>>>,
    #[schema(inline)]
    pub kind: DiffKind,
    /// `summary`: the branch side.
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schema(nullable = false)]
    pub new: Option<Side<'a>>,
    /// `summary`: the workdir side.
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schema(nullable = false)]
    pub old: Option<Side<'a>>,
    /// The path asked for.
    #[schema(value_type = Decoded)]
    pub path: lockbox_policy::name::Encoded<'a>,
}

impl<'a> From<&'a FileDiffReply> for FileDiff<'a> {
    fn from(reply: &'a FileDiffReply) -> FileDiff<'a> {
        use lockbox_runtime::FileHunks;
        let (kind, hunks, old, new) = match &reply.diff {
            FileHunks::Text { hunks } => (
                DiffKind::Text,
                Some(hunks.iter().map(Hunk::from).collect()),
                None,
                None,
            ),
            FileHunks::Summary { old, new } => (
                DiffKind::Summary,
                None,
                Some(Side::from(old)),
                Some(Side::from(new)),
            ),
        };
        FileDiff {
            digest: &reply.digest,
            hunks,
            kind,
            new,
            old,
            path: lockbox_policy::name::Encoded(&reply.path),
        }
    }
}

/// `text` (hunks) or `summary` (both sides).
#[derive(Debug, Clone, Copy, Serialize, ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum DiffKind {
    /// Both sides are text (or absent): hunks.
    Text,
    /// At least one side is binary, too large, or not a regular file: both sides.
    Summary,
}

/// One hunk of a text diff.
#[derive(Debug, Serialize, ToSchema)]
pub struct Hunk<'a> {
    /// `@@ -a,b +c,d @@`.
    pub header: String,
    /// Its number (what `hunks[].accept` of a commit takes).
    #[schema(value_type = u64)]
    pub index: usize,
    /// The lines, in order.
    pub lines: Vec<HunkLine<'a>>,
    /// Number of new lines (context and inserted).
    #[schema(value_type = u64)]
    pub new_lines: usize,
    /// First new line.
    #[schema(value_type = u64)]
    pub new_start: usize,
    /// The new side's last line in this hunk has no newline.
    pub no_newline_new: bool,
    /// The old side's last line in this hunk has no newline (the end of a file without one).
    pub no_newline_old: bool,
    /// Number of old lines (context and deleted).
    #[schema(value_type = u64)]
    pub old_lines: usize,
    /// First old line (1-based; for an empty side the line before the hunk).
    #[schema(value_type = u64)]
    pub old_start: usize,
}

impl<'a> From<&'a lockbox_runtime::Hunk> for Hunk<'a> {
    fn from(h: &'a lockbox_runtime::Hunk) -> Hunk<'a> {
        Hunk {
            header: h.header(),
            index: h.index,
            lines: h
                .lines
                .iter()
                .map(|l| HunkLine {
                    op: LineOp::from(l.op),
                    text: &l.text,
                })
                .collect(),
            new_lines: h.new_lines,
            new_start: h.new_start,
            no_newline_new: h.no_newline_new,
            no_newline_old: h.no_newline_old,
            old_lines: h.old_lines,
            old_start: h.old_start,
        }
    }
}

/// A line of a hunk.
#[derive(Debug, Serialize, ToSchema)]
pub struct HunkLine<'a> {
    #[schema(inline)]
    pub op: LineOp,
    /// The line without its newline, raw.
    pub text: &'a str,
}

/// What a line of a hunk does, as its unified-diff prefix: ` ` (both sides), `-` (workdir
/// only) or `+` (branch only).
#[derive(Debug, Clone, Copy, Serialize, ToSchema)]
pub enum LineOp {
    /// On both sides.
    #[serde(rename = " ")]
    Context,
    /// Only on the old (workdir) side.
    #[serde(rename = "-")]
    Delete,
    /// Only on the new (branch) side.
    #[serde(rename = "+")]
    Insert,
}

impl From<lockbox_runtime::LineOp> for LineOp {
    fn from(op: lockbox_runtime::LineOp) -> LineOp {
        match op {
            lockbox_runtime::LineOp::Context => LineOp::Context,
            lockbox_runtime::LineOp::Delete => LineOp::Delete,
            lockbox_runtime::LineOp::Insert => LineOp::Insert,
        }
    }
}

/// One side of a summary diff.
#[derive(Debug, Serialize, ToSchema)]
pub struct Side<'a> {
    /// A file's size in bytes.
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schema(nullable = false)]
    pub size: Option<u64>,
    /// A symlink's target.
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schema(value_type = Option<Decoded>, nullable = false)]
    pub target: Option<lockbox_policy::name::Encoded<'a>>,
    #[serde(rename = "type")]
    #[schema(inline)]
    pub kind: SideKind,
}

impl<'a> From<&'a lockbox_runtime::Side> for Side<'a> {
    fn from(side: &'a lockbox_runtime::Side) -> Side<'a> {
        use lockbox_runtime::Side as S;
        let (kind, size, target) = match side {
            S::Absent => (SideKind::Absent, None, None),
            S::File { size } => (SideKind::File, Some(*size), None),
            S::Dir => (SideKind::Dir, None, None),
            S::Symlink { target } => (
                SideKind::Symlink,
                None,
                Some(lockbox_policy::name::Encoded(target)),
            ),
            S::Special => (SideKind::Special, None, None),
        };
        Side { size, target, kind }
    }
}

/// What one side of a summary diff is.
#[derive(Debug, Clone, Copy, Serialize, ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum SideKind {
    /// Nothing at this path.
    Absent,
    /// A regular file.
    File,
    /// A directory.
    Dir,
    /// A symbolic link.
    Symlink,
    /// A device, FIFO or socket.
    Special,
}

/// `GET /v1/branches/{id}`: the branch object and its changes.
#[derive(Serialize, ToSchema)]
pub struct BranchDetail {
    /// The branch object of `GET /v1/branches`.
    #[serde(flatten)]
    pub branch: KeptBranch,
    /// Its changes (as `GET /v1/sandboxes/{id}/changes` gives them, each with its `digest`).
    #[schema(value_type = Vec<Change>)]
    pub change_list: ReviewList,
    /// The digest of the whole listing (a commit's `review` may name it).
    pub review_token: String,
}

/// `GET /v1/branches`.
#[derive(Debug, Serialize, ToSchema)]
pub struct BranchList {
    /// The kept branches.
    pub branches: Vec<KeptBranch>,
}

/// `POST abort`.
#[derive(Debug, Serialize, ToSchema)]
pub struct AbortResult {
    /// Always true.
    pub aborted: bool,
}
