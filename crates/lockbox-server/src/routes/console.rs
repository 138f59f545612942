//! The review console: its static files at `/ui` (no auth: they hold no data), login
//! (the server token for a session cookie), logout and the session probe. Every response
//! under `/ui` carries the console's security headers ([`security_headers`]).

use crate::error::ApiError;
use crate::extract::ApiJson;
use crate::sessions::{self, check_same_origin, cookie, SESSION_COOKIE};
use crate::ui;
use crate::AppState;
use axum::extract::{Path, Request, State};
use axum::http::header::{
    CACHE_CONTROL, CONTENT_SECURITY_POLICY, CONTENT_TYPE, ETAG, IF_NONE_MATCH, REFERRER_POLICY,
    SET_COOKIE, X_CONTENT_TYPE_OPTIONS, X_FRAME_OPTIONS,
};
use axum::http::{HeaderMap, HeaderValue, StatusCode};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use axum::Json;
use serde::Deserialize;
use serde_json::json;

/// The console's Content-Security-Policy: its own scripts, styles, images and API only.
pub const CSP: &str = "default-src 'none'; script-src 'self'; style-src 'self'; \
    img-src 'self' data:; connect-src 'self'; font-src 'self'; base-uri 'none'; \
    form-action 'self'; frame-ancestors 'none'";

/// Middleware on `/ui`: CSP, nosniff, no referrer, no framing; nothing stored by caches
/// unless a handler said otherwise (static assets are revalidated, see [`file`]).
pub async fn security_headers(req: Request, next: Next) -> Response {
    let mut response = next.run(req).await;
    let h = response.headers_mut();
    h.insert(CONTENT_SECURITY_POLICY, HeaderValue::from_static(CSP));
    h.insert(X_CONTENT_TYPE_OPTIONS, HeaderValue::from_static("nosniff"));
    h.insert(REFERRER_POLICY, HeaderValue::from_static("no-referrer"));
    h.insert(X_FRAME_OPTIONS, HeaderValue::from_static("DENY"));
    h.entry(CACHE_CONTROL)
        .or_insert(HeaderValue::from_static("no-store"));
    response
}

/// `GET /ui`: the console's page.
pub async fn index() -> Result<Response, ApiError> {
    serve("", &HeaderMap::new()).await
}

/// `GET /ui/{*file}`: a static file, or the page for a client-side route. Files under
/// `/ui/v/VERSION/` of this build are `immutable`; other files carry an `ETag`, so the
/// browser's revalidation (`no-cache`) is a 304.
pub async fn file(Path(file): Path<String>, headers: HeaderMap) -> Result<Response, ApiError> {
    serve(&file, &headers).await
}

/// How long a browser keeps a versioned file: a year, without revalidating.
const IMMUTABLE: &str = "public, max-age=31536000, immutable";

async fn serve(rel: &str, headers: &HeaderMap) -> Result<Response, ApiError> {
    // A versioned address: this build's files are immutable there; an older build's page
    // (open across an upgrade) gets today's files, revalidated.
    let (rel, cache) = match rel.strip_prefix("v/").and_then(|r| r.split_once('/')) {
        Some((v, rest)) if v == ui::version() && v != ui::DEV_VERSION => (rest, IMMUTABLE),
        Some((_, rest)) => (rest, "no-cache"),
        None => (rel, "no-cache"),
    };
    let Some(found) = ui::lookup(rel).await else {
        return Err(ApiError::new(
            lockbox_policy::ErrorCode::NotFound,
            format!("no console file /ui/{rel}"),
        )
        .with_details(json!({ "path": format!("/ui/{rel}") })));
    };
    if found.name == ui::INDEX {
        let reply = [
            (CONTENT_TYPE, found.content_type()),
            (CACHE_CONTROL, "no-store"),
        ];
        let page = String::from_utf8_lossy(&found.body)
            .replace(ui::ASSET_PLACEHOLDER, &ui::asset_prefix());
        return Ok((reply, page).into_response());
    }
    let etag = found.etag();
    if headers
        .get(IF_NONE_MATCH)
        .is_some_and(|v| v.as_bytes() == etag.as_bytes())
    {
        let reply = [(ETAG, etag), (CACHE_CONTROL, cache.to_owned())];
        return Ok((StatusCode::NOT_MODIFIED, reply).into_response());
    }
    let reply = [
        (CONTENT_TYPE, found.content_type().to_owned()),
        (CACHE_CONTROL, cache.to_owned()),
        (ETAG, etag),
    ];
    Ok((reply, found.body.into_owned()).into_response())
}

/// Body of `POST /ui/login`.
#[derive(Debug, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
#[schema(as = LoginRequest)]
pub struct Login {
    token: String,
}

/// `POST /ui/login`: the server token for a session (two cookies); 401 if it is wrong.
#[utoipa::path(
    post,
    path = "/ui/login",
    operation_id = "console_login",
    summary = "Exchange the server token for a console session",
    description = "Sets the HttpOnly, SameSite=Strict `lockbox_session` cookie and the `lockbox_csrf` cookie (send its value as `X-CSRF-Token` on state-changing requests)",
    request_body = Login,
    responses((status = 204, description = "logged in (cookies set)")),
    security(())
)]
pub async fn login(
    State(app): State<AppState>,
    headers: HeaderMap,
    ApiJson(body): ApiJson<Login>,
) -> Result<Response, ApiError> {
    check_same_origin(&headers)?;
    if !app.token.matches(body.token.trim().as_bytes()) {
        return Err(ApiError::new(
            lockbox_policy::ErrorCode::Unauthorized,
            "the token is wrong",
        ));
    }
    let (id, csrf) = app.sessions.create()?;
    with_cookies(sessions::set_cookies(&id, &csrf))
}

/// `POST /ui/logout`: ends the session (if any) and clears both cookies.
#[utoipa::path(
    post,
    path = "/ui/logout",
    operation_id = "console_logout",
    summary = "End the console session and clear its cookies",
    responses((status = 204, description = "logged out (cookies cleared)")),
    security(())
)]
pub async fn logout(State(app): State<AppState>, headers: HeaderMap) -> Result<Response, ApiError> {
    check_same_origin(&headers)?;
    if let Some(id) = cookie(&headers, SESSION_COOKIE) {
        app.sessions.remove(id);
    }
    with_cookies(sessions::clear_cookies())
}

/// `GET /ui/session`: 200 while the session cookie is valid, else 401.
#[utoipa::path(
    get,
    path = "/ui/session",
    operation_id = "console_session",
    summary = "Whether the session cookie is valid (401 if not)",
    responses((status = 200, description = "logged in", body = crate::wire::SessionState)),
    security(())
)]
pub async fn session(
    State(app): State<AppState>,
    headers: HeaderMap,
) -> Result<Response, ApiError> {
    match cookie(&headers, SESSION_COOKIE).and_then(|id| app.sessions.find(id)) {
        Some(_) => Ok(Json(crate::wire::SessionState {
            authenticated: true,
        })
        .into_response()),
        None => Err(ApiError::new(
            lockbox_policy::ErrorCode::Unauthorized,
            "not logged in",
        )),
    }
}

fn with_cookies(cookies: [String; 2]) -> Result<Response, ApiError> {
    let mut response = StatusCode::NO_CONTENT.into_response();
    for c in cookies {
        let value = HeaderValue::try_from(c)
            .map_err(|e| ApiError::new(lockbox_policy::ErrorCode::Internal, e.to_string()))?;
        response.headers_mut().append(SET_COOKIE, value);
    }
    Ok(response)
}
