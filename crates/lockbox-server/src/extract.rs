//! Extractors whose rejections are [`ApiError`]s naming the field, instead of axum's
//! plain-text ones: [`ApiJson`] (body), [`ApiQuery`] (query string), [`ApiPath`] (path).

use crate::error::ApiError;
use axum::extract::rejection::{BytesRejection, PathRejection};
use axum::extract::{FromRequest, FromRequestParts, Path, Request};
use axum::http::header::CONTENT_TYPE;
use axum::http::request::Parts;
use bytes::Bytes;
use serde::de::DeserializeOwned;
use serde_json::json;

/// A JSON body. An empty body reads as `{}` (every body with only optional fields may be
/// left out); any other content type than JSON is refused.
#[derive(Debug)]
pub struct ApiJson<T>(pub T);

impl<T: DeserializeOwned, S: Send + Sync> FromRequest<S> for ApiJson<T> {
    type Rejection = ApiError;

    async fn from_request(req: Request, state: &S) -> Result<Self, ApiError> {
        if let Some(ct) = req.headers().get(CONTENT_TYPE) {
            let ct = ct.to_str().unwrap_or("");
            let essence = ct.split(';').next().unwrap_or("").trim();
            let is_json = essence.eq_ignore_ascii_case("application/json")
                || essence.to_ascii_lowercase().ends_with("+json");
            if !is_json {
                return Err(ApiError::new(
                    lockbox_policy::ErrorCode::UnsupportedMediaType,
                    format!("expected a JSON body (Content-Type: application/json), got {ct:?}"),
                ));
            }
        }
        let bytes = Bytes::from_request(req, state)
            .await
            .map_err(body_rejection)?;
        parse_json(&bytes).map(ApiJson)
    }
}

/// Parses a JSON document, naming the offending field on error.
pub fn parse_json<T: DeserializeOwned>(bytes: &[u8]) -> Result<T, ApiError> {
    let text: &[u8] = if bytes.iter().all(u8::is_ascii_whitespace) {
        b"{}"
    } else {
        bytes
    };
    // serde would read a struct from an array too; the API's bodies are objects only.
    if text.iter().find(|b| !b.is_ascii_whitespace()) != Some(&b'{') {
        return Err(ApiError::invalid(
            "",
            "invalid JSON body: expected a JSON object",
        ));
    }
    let mut de = serde_json::Deserializer::from_slice(text);
    let value = serde_path_to_error::deserialize(&mut de).map_err(|e| {
        let field = field_of(&e.path().to_string(), &e.inner().to_string());
        let inner = e.into_inner();
        let message = if field.is_empty() {
            format!("invalid JSON body: {inner}")
        } else {
            format!("invalid JSON body: {field}: {inner}")
        };
        ApiError::invalid(&field, message).with_details(json!({
            "field": field, "line": inner.line(), "column": inner.column(),
        }))
    })?;
    de.end().map_err(|e| {
        ApiError::invalid("", format!("invalid JSON body: {e}"))
            .with_details(json!({ "field": "", "line": e.line(), "column": e.column() }))
    })?;
    Ok(value)
}

/// The field a deserialisation error is about: the path serde_path_to_error tracked, or,
/// for `missing field` / `unknown field` errors reported on the parent, the parent's path
/// plus the name in backquotes.
pub(crate) fn field_of(path: &str, message: &str) -> String {
    // `?` marks a position serde_path_to_error could not name (a syntax error).
    let known: Vec<&str> = path
        .split('.')
        .filter(|s| !s.is_empty() && *s != "?")
        .collect();
    let joined = known.join(".");
    let parent = joined.as_str();
    let named = ["missing field `", "unknown field `"]
        .iter()
        .find_map(|prefix| message.strip_prefix(prefix))
        .and_then(|rest| rest.split('`').next());
    match named {
        Some(name) if !parent.ends_with(name) => {
            if parent.is_empty() {
                name.to_owned()
            } else {
                format!("{parent}.{name}")
            }
        }
        _ => parent.to_owned(),
    }
}

/// Maps a failure to read the body (too large, stalled, connection broken) to our error
/// format.
pub fn body_rejection(e: BytesRejection) -> ApiError {
    if body_stalled(&e) {
        ApiError::body_stalled()
    } else if e.status() == axum::http::StatusCode::PAYLOAD_TOO_LARGE {
        ApiError::new(
            lockbox_policy::ErrorCode::PayloadTooLarge,
            "the request body exceeds the server's limit (--max-body)",
        )
    } else {
        ApiError::new(
            lockbox_policy::ErrorCode::InvalidRequest,
            format!("reading the body: {}", e.body_text()),
        )
    }
}

/// Whether the body failed because it stopped arriving (`--io-timeout`).
pub fn body_stalled(e: &(dyn std::error::Error + 'static)) -> bool {
    let mut cause = Some(e);
    while let Some(e) = cause {
        if e.is::<tower_http::timeout::TimeoutError>() {
            return true;
        }
        cause = e.source();
    }
    false
}

/// A query string. Unknown parameters are refused when `T` says `deny_unknown_fields`.
#[derive(Debug)]
pub struct ApiQuery<T>(pub T);

impl<T: DeserializeOwned, S: Send + Sync> FromRequestParts<S> for ApiQuery<T> {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, _: &S) -> Result<Self, ApiError> {
        let query = parts.uri.query().unwrap_or("");
        let de = serde_urlencoded::Deserializer::new(form_urlencoded::parse(query.as_bytes()));
        serde_path_to_error::deserialize(de)
            .map(ApiQuery)
            .map_err(|e| {
                let field = field_of(&e.path().to_string(), &e.inner().to_string());
                let message = format!("invalid query parameter {field}: {}", e.inner());
                ApiError::invalid(&field, message)
            })
    }
}

/// Path parameters.
#[derive(Debug)]
pub struct ApiPath<T>(pub T);

impl<T: DeserializeOwned + Send, S: Send + Sync> FromRequestParts<S> for ApiPath<T> {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, state: &S) -> Result<Self, ApiError> {
        Path::<T>::from_request_parts(parts, state)
            .await
            .map(|Path(v)| ApiPath(v))
            .map_err(|e: PathRejection| {
                ApiError::new(
                    lockbox_policy::ErrorCode::InvalidRequest,
                    format!("invalid path: {}", e.body_text()),
                )
            })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde::Deserialize;

    #[derive(Debug, Deserialize)]
    #[serde(deny_unknown_fields)]
    #[allow(dead_code)]
    struct Body {
        command: String,
        timeout_ms: Option<u64>,
        inner: Option<Inner>,
    }

    #[derive(Debug, Deserialize)]
    #[serde(deny_unknown_fields)]
    #[allow(dead_code)]
    struct Inner {
        cols: u16,
    }

    fn field(json: &str) -> String {
        let e = parse_json::<Body>(json.as_bytes()).unwrap_err();
        assert_eq!(e.code, "INVALID_REQUEST");
        e.details["field"].as_str().unwrap().to_owned()
    }

    #[test]
    fn bad_bodies_name_the_field() {
        assert_eq!(
            field(r#"{"command": "x", "timeout_ms": "soon"}"#),
            "timeout_ms"
        );
        assert_eq!(field(r#"{"timeout_ms": 5}"#), "command");
        assert_eq!(field(r#"{"command": "x", "bogus": 1}"#), "bogus");
        assert_eq!(
            field(r#"{"command": "x", "inner": {"cols": -1}}"#),
            "inner.cols"
        );
        assert_eq!(field(r#"{"command": "x", "inner": {}}"#), "inner.cols");
        assert_eq!(field(r#"{"command": "x""#), "");
        assert_eq!(field(r#"{"command": "x"} trailing"#), "");
    }

    #[test]
    fn empty_body_reads_as_empty_object() {
        assert_eq!(field(""), "command");
    }
}
