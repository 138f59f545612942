//! Output bytes in JSON, each byte sent once: as text (`"stdout"`, `"data"`) when the bytes
//! are UTF-8 and their JSON string is no longer than base64 would be, else as base64
//! (`"stdout_b64"`, `"data_b64"`). So a reply is never more than 4/3 of the output plus a
//! few bytes, whatever the output is (a NUL, escaped as `\u0000`, would cost 6 bytes);
//! clients read whichever of the two fields is present.
//!
//! [`exec_reply`] writes the `exec` reply as a stream that encodes the output piece by
//! piece as the client reads, so the server holds the raw output and one piece, never a
//! second, larger copy of it.

use axum::body::Body;
use axum::http::header::{CONTENT_LENGTH, CONTENT_TYPE};
use axum::http::HeaderValue;
use axum::response::{IntoResponse, Response};
use base64::Engine;
use bytes::Bytes;
use lockbox_runtime::ExecResult;
use serde_json::{Map, Value};
use std::convert::Infallible;

const B64: base64::engine::GeneralPurpose = base64::engine::general_purpose::STANDARD;

/// Raw bytes encoded per piece of the streamed reply (a multiple of 3, so base64 pieces
/// join without padding).
const PIECE: usize = 48 * 1024;

/// How a run of bytes is written.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Encoding {
    /// A JSON string of the UTF-8 text (`name`).
    Text,
    /// A base64 string (`name_b64`).
    Base64,
}

/// The length of `b` inside a JSON string as serde_json writes it.
fn escaped_len(b: u8) -> usize {
    match b {
        b'"' | b'\\' | b'\n' | b'\r' | b'\t' | 0x08 | 0x0c => 2,
        0..=0x1f => 6,
        _ => 1,
    }
}

fn base64_len(n: usize) -> usize {
    n.div_ceil(3) * 4
}

/// The encoding of `bytes` and the length of its JSON string's contents (no quotes).
pub fn encoding(bytes: &[u8]) -> (Encoding, usize) {
    let b64 = base64_len(bytes.len());
    if std::str::from_utf8(bytes).is_ok() {
        let text: usize = bytes.iter().map(|&b| escaped_len(b)).sum();
        if text <= b64 {
            return (Encoding::Text, text);
        }
    }
    (Encoding::Base64, b64)
}

/// `{"data": text}` or `{"data_b64": base64}` (see the module documentation).
pub fn data_fields(bytes: &[u8]) -> Map<String, Value> {
    let mut map = Map::new();
    match text_or_base64(bytes) {
        (Some(text), _) => map.insert("data".into(), Value::String(text)),
        (_, Some(b64)) => map.insert("data_b64".into(), Value::String(b64)),
        (None, None) => None,
    };
    map
}

/// `bytes` as text or as base64 (exactly one of the two; see the module documentation).
pub fn text_or_base64(bytes: &[u8]) -> (Option<String>, Option<String>) {
    match encoding(bytes).0 {
        // `encoding` chose text only for valid UTF-8.
        Encoding::Text => (Some(String::from_utf8_lossy(bytes).into_owned()), None),
        Encoding::Base64 => (None, Some(B64.encode(bytes))),
    }
}

/// The JSON string contents of one piece (`piece` is whole UTF-8 characters for text).
fn encode_piece(piece: &[u8], encoding: Encoding) -> Bytes {
    match encoding {
        Encoding::Base64 => Bytes::from(B64.encode(piece)),
        Encoding::Text => {
            let text = String::from_utf8_lossy(piece);
            let quoted = serde_json::to_string(&text).unwrap_or_default();
            let inner = quoted
                .strip_prefix('"')
                .and_then(|q| q.strip_suffix('"'))
                .unwrap_or("");
            Bytes::copy_from_slice(inner.as_bytes())
        }
    }
}

/// The end of the next piece of `bytes` from `at`: [`PIECE`] bytes, shortened for text to
/// end on a character boundary.
fn piece_end(bytes: &[u8], at: usize, encoding: Encoding) -> usize {
    let mut end = (at + PIECE).min(bytes.len());
    if encoding == Encoding::Text {
        // A UTF-8 continuation byte is 0b10xx_xxxx: back up to the start of its character.
        while end < bytes.len() && end > at && bytes[end] & 0xc0 == 0x80 {
            end -= 1;
        }
    }
    end
}

/// One output field of the reply being written.
struct Field {
    /// `,"stdout":"` or `,"stdout_b64":"`.
    opening: Bytes,
    bytes: Bytes,
    encoding: Encoding,
}

/// The parts of the reply still to send: the head, then each field's opening, pieces and
/// closing quote, then `}`.
struct Reply {
    head: Option<Bytes>,
    fields: std::collections::VecDeque<Field>,
    at: Option<usize>,
    closed: bool,
}

impl Iterator for Reply {
    type Item = Result<Bytes, Infallible>;

    fn next(&mut self) -> Option<Self::Item> {
        if let Some(head) = self.head.take() {
            return Some(Ok(head));
        }
        let Some(field) = self.fields.front() else {
            if self.closed {
                return None;
            }
            self.closed = true;
            return Some(Ok(Bytes::from_static(b"}")));
        };
        let Some(at) = self.at else {
            self.at = Some(0);
            return Some(Ok(field.opening.clone()));
        };
        if at >= field.bytes.len() {
            self.fields.pop_front();
            self.at = None;
            return Some(Ok(Bytes::from_static(b"\"")));
        }
        let end = piece_end(&field.bytes, at, field.encoding);
        self.at = Some(end);
        Some(Ok(encode_piece(&field.bytes[at..end], field.encoding)))
    }
}

/// Milliseconds with microsecond precision (a warm exec takes well under one).
pub fn ms(d: std::time::Duration) -> f64 {
    (d.as_micros() as f64) / 1000.0
}

/// The `exec` reply: `{exit_code, timed_out, duration_ms, session, stdout_truncated,
/// stderr_truncated}` and, for each stream, `stdout` or `stdout_b64` (likewise `stderr`),
/// encoded while it is sent, with an exact `Content-Length`.
pub fn exec_reply(result: ExecResult) -> Response {
    let head = match serde_json::to_string(&crate::wire::ExecHead::from(&result)) {
        Ok(head) => head,
        Err(e) => {
            return crate::error::ApiError::new(
                lockbox_policy::ErrorCode::Internal,
                format!("exec reply: {e}"),
            )
            .into_response()
        }
    };
    // The head without its closing brace; the fields follow, then `}`.
    let head = Bytes::from(head.trim_end_matches('}').to_owned());
    let mut length = head.len() + 1;
    let mut fields = std::collections::VecDeque::new();
    for (name, bytes) in [("stdout", result.stdout), ("stderr", result.stderr)] {
        let (encoding, encoded) = encoding(&bytes);
        let suffix = if encoding == Encoding::Base64 {
            "_b64"
        } else {
            ""
        };
        let opening = Bytes::from(format!(",\"{name}{suffix}\":\""));
        length += opening.len() + encoded + 1;
        fields.push_back(Field {
            opening,
            bytes,
            encoding,
        });
    }
    let reply = Reply {
        head: Some(head),
        fields,
        at: None,
        closed: false,
    };
    let mut response = Response::new(Body::from_stream(futures_util::stream::iter(reply)));
    let headers = response.headers_mut();
    headers.insert(CONTENT_TYPE, HeaderValue::from_static("application/json"));
    headers.insert(CONTENT_LENGTH, HeaderValue::from(length));
    response
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use serde_json::json;
    use std::time::Duration;

    fn result(stdout: &[u8], stderr: &[u8]) -> ExecResult {
        ExecResult {
            exit_code: 3,
            stdout: Bytes::copy_from_slice(stdout),
            stderr: Bytes::copy_from_slice(stderr),
            timed_out: false,
            stdout_truncated: true,
            stderr_truncated: false,
            duration: Duration::from_micros(1500),
            session: "s\"1".into(),
        }
    }

    fn body(r: ExecResult) -> (usize, Vec<u8>) {
        let response = exec_reply(r);
        let length: usize = response.headers()[CONTENT_LENGTH]
            .to_str()
            .unwrap()
            .parse()
            .unwrap();
        let bytes = tokio::runtime::Builder::new_current_thread()
            .build()
            .unwrap()
            .block_on(axum::body::to_bytes(response.into_body(), usize::MAX))
            .unwrap();
        (length, bytes.to_vec())
    }

    #[test]
    fn each_stream_is_sent_once_in_the_shorter_exact_form() {
        // Text across piece boundaries with multi-byte characters, and NUL-heavy output.
        let text: Vec<u8> = "é€ \"quoted\" \\ line\n".repeat(10_000).into_bytes();
        let zeros = vec![0u8; 100_000];
        let (length, bytes) = body(result(&text, &zeros));
        assert_eq!(length, bytes.len(), "Content-Length is exact");
        let v: Value = serde_json::from_slice(&bytes).unwrap();
        assert_eq!(v["stdout"].as_str().unwrap().as_bytes(), &text[..]);
        assert!(v.get("stdout_b64").is_none());
        assert!(
            v.get("stderr").is_none(),
            "NULs would cost 6 bytes each as text"
        );
        assert_eq!(
            B64.decode(v["stderr_b64"].as_str().unwrap()).unwrap(),
            zeros
        );
        assert_eq!(v["exit_code"], 3);
        assert_eq!(v["session"], "s\"1");
        assert_eq!(v["stdout_truncated"], true);
        assert_eq!(v["stderr_truncated"], false);
        assert!(bytes.len() <= base64_len(text.len() + zeros.len()) + 200);

        let (length, bytes) = body(result(b"", b"a\xffb"));
        assert_eq!(length, bytes.len());
        let v: Value = serde_json::from_slice(&bytes).unwrap();
        assert_eq!(v["stdout"], "");
        assert_eq!(
            B64.decode(v["stderr_b64"].as_str().unwrap()).unwrap(),
            b"a\xffb"
        );
    }

    #[test]
    fn data_fields_hold_exactly_one_form() {
        assert_eq!(
            Value::Object(data_fields(b"hi\n")),
            json!({ "data": "hi\n" })
        );
        assert_eq!(
            Value::Object(data_fields(b"\0\0\0")),
            json!({ "data_b64": "AAAA" })
        );
        assert_eq!(
            Value::Object(data_fields(b"\xff")),
            json!({ "data_b64": "/w==" })
        );
        assert_eq!(Value::Object(data_fields(b"")), json!({ "data": "" }));
    }
}
