//! Transactions of the server's state directory (`lockbox txn pipeline|gather`, prepared or
//! finished): list and show, as `lockbox txn list|show --json` has them; and running
//! sandboxes committed together as one (`POST`, `kind: "gather"`).

use crate::error::ApiError;
use crate::extract::{ApiJson, ApiPath};
use crate::wire::{gather_json, txn_json, TransactionRequest};
use crate::AppState;
use axum::extract::State;
use axum::response::IntoResponse;
use axum::Json;
use lockbox_txn::{ListedTxn, TxnError, TxnId};
use serde_json::json;

async fn listed(app: &AppState) -> Result<Vec<ListedTxn>, ApiError> {
    let state_dir = app.runtime.state_dir();
    tokio::task::spawn_blocking(move || lockbox_txn::list(&state_dir))
        .await
        .map_err(|e| ApiError::new(lockbox_policy::ErrorCode::Internal, e.to_string()))?
        .map_err(ApiError::from)
}

pub async fn list(State(app): State<AppState>) -> Result<impl IntoResponse, ApiError> {
    let all: Vec<_> = listed(&app).await?.iter().map(txn_json).collect();
    Ok(Json(json!({ "transactions": all })))
}

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
        Some(r) => Ok(Json(txn_json(&ListedTxn::Ok(r)))),
        None => Err(TxnError::NotFound {
            id,
            state_dir: app.runtime.state_dir(),
        }
        .into()),
    }
}

/// Commits running sandboxes together (`Runtime::commit_together`).
pub async fn create(
    State(app): State<AppState>,
    ApiJson(body): ApiJson<TransactionRequest>,
) -> Result<impl IntoResponse, ApiError> {
    let (ids, opts) = body.into_gather()?;
    let outcome = app.runtime.commit_together(&ids, opts).await?;
    Ok(Json(gather_json(&outcome)))
}
