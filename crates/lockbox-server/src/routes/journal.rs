//! Runs of the step journal given to `lockbox serve --journal URL`: list with each run's
//! status, and one run's status and entries (as `lockbox journal status|dump`).

use crate::error::ApiError;
use crate::extract::ApiPath;
use crate::wire::{JournalRun, JournalRunStatus, JournalRuns};
use crate::{AppState, JournalSource};
use axum::extract::State;
use axum::response::IntoResponse;
use axum::Json;
use lockbox_journal::RunId;

fn source(app: &AppState) -> Result<&JournalSource, ApiError> {
    app.config.journal.as_ref().ok_or_else(|| {
        ApiError::new(
            lockbox_policy::ErrorCode::NoJournal,
            "this server has no journal (start it with --journal URL)",
        )
    })
}

#[utoipa::path(
    get,
    path = "/v1/journal/runs",
    operation_id = "list_journal_runs",
    summary = "Runs of the journal given to `lockbox serve --journal` (none: an empty list)",
    responses((status = 200, description = "the runs", body = JournalRuns))
)]
pub async fn runs(State(app): State<AppState>) -> Result<impl IntoResponse, ApiError> {
    let Ok(src) = source(&app) else {
        return Ok(Json(JournalRuns {
            journal: None,
            runs: Vec::new(),
        }));
    };
    let mut runs = Vec::new();
    for id in src.journal.list().await? {
        runs.push(JournalRunStatus::from(src.journal.status(&id).await?));
    }
    Ok(Json(JournalRuns {
        journal: Some(src.url.clone()),
        runs,
    }))
}

#[utoipa::path(
    get,
    path = "/v1/journal/runs/{id}",
    operation_id = "show_journal_run",
    summary = "One journal run: its status and entries",
    params(crate::openapi::RunPath),
    responses((status = 200, description = "the run", body = JournalRun))
)]
pub async fn run(
    State(app): State<AppState>,
    ApiPath(id): ApiPath<String>,
) -> Result<impl IntoResponse, ApiError> {
    let src = source(&app)?;
    let id = RunId::parse(&id)?;
    let status = src.journal.status(&id).await?;
    Ok(Json(JournalRun::new(
        status,
        src.journal.entries(&id, 0).await?,
    )))
}
