//! Transactions of the server's state directory (`lockbox txn pipeline|gather`, prepared or
//! finished): list and show, as `lockbox txn list|show --json` has them; and running
//! sandboxes committed together as one (`POST`, `kind: "gather"`).

use crate::error::ApiError;
use crate::extract::{ApiJson, ApiPath};
use crate::wire::{TransactionRequest, Txn, TxnList, TxnRecordReply};
use crate::AppState;
use axum::extract::State;
use axum::response::IntoResponse;
use axum::Json;
use lockbox_txn::{ListedTxn, TxnError, TxnId};

async fn listed(app: &AppState) -> Result<Vec<ListedTxn>, ApiError> {
    let state_dir = app.runtime.state_dir();
    tokio::task::spawn_blocking(move || lockbox_txn::list(&state_dir))
        .await
        .map_err(|e| ApiError::new(lockbox_policy::ErrorCode::Internal, e.to_string()))?
        .map_err(ApiError::from)
}

#[utoipa::path(
    get,
    path = "/v1/transactions",
    operation_id = "list_transactions",
    summary = "Transactions of the server's state directory (prepared, committed, aborted)",
    responses((status = 200, description = "the transactions", body = TxnList))
)]
pub async fn list(State(app): State<AppState>) -> Result<impl IntoResponse, ApiError> {
    let transactions = listed(&app).await?.iter().map(Txn::from).collect();
    Ok(Json(TxnList { transactions }))
}

#[utoipa::path(
    get,
    path = "/v1/transactions/{id}",
    operation_id = "show_transaction",
    summary = "One transaction's record (as `lockbox txn show --json`)",
    params(crate::openapi::TxnPath),
    responses((status = 200, description = "the record", body = TxnRecordReply))
)]
pub async fn show(
    State(app): State<AppState>,
    ApiPath(id): ApiPath<String>,
) -> Result<impl IntoResponse, ApiError> {
    let id = TxnId::parse(&id)?;
    let found = listed(&app).await?.into_iter().find_map(|t| match t {
        ListedTxn::Ok(r) if r.id == id => Some(r),
        _ => None,
    });
    match found {
        Some(r) => Ok(Json(TxnRecordReply::from(&r))),
        None => Err(TxnError::NotFound {
            id,
            state_dir: app.runtime.state_dir(),
        }
        .into()),
    }
}

/// Commits running sandboxes together (`Runtime::commit_together`).
#[utoipa::path(
    post,
    path = "/v1/transactions",
    operation_id = "gather",
    summary = "Commit running sandboxes together (`kind: gather`)",
    description = "Typically forks of one snapshot, or any sandboxes over one workdir; their branches are merged under a conflict policy and committed as one transaction, all or none. The changes of the snapshot layers all of them share are no conflict and go in once. 400 names the bad field (`kind`, `sandboxes`: none, one named twice, different workdirs; `conflicts`); 404 an unknown sandbox; 409 `CONFLICT` for paths several sandboxes changed under `fail` (`details.conflicts`) or a workdir changed under a sandbox since it began (unless `force`), `WORKDIR_BUSY` for a sandbox whose own commit, abort, restore or snapshot is under way. Afterwards every sandbox keeps running on its branch, as after a single commit",
    request_body = crate::wire::TransactionRequest,
    responses((status = 200, description = "what each sandbox contributed, the conflicts and how they were resolved, the merged changes", body = crate::wire::GatherResult))
)]
pub async fn create(
    State(app): State<AppState>,
    ApiJson(body): ApiJson<TransactionRequest>,
) -> Result<impl IntoResponse, ApiError> {
    let (ids, opts) = body.into_gather()?;
    let outcome = app.runtime.commit_together(&ids, opts).await?;
    Ok(Json(crate::wire::GatherResult::from(outcome)))
}
