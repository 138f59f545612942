//! The Connect protocol (connectrpc.com/docs/protocol) as envd speaks it, server side:
//! unary calls (`application/proto` or `application/json`; an error is a JSON
//! `{code, message}` with the code's HTTP status), server streams and client streams
//! (`application/connect+proto` or `application/connect+json`: 5-byte envelopes, the last
//! one flagged end-of-stream carrying `{"error": {code, message}}` on failure, always with
//! status 200), and `Connect-Timeout-Ms` deadlines. Compression is not offered (the SDK
//! disables it), so a compressed envelope is refused.

use axum::body::Body;
use axum::extract::Request;
use axum::response::{IntoResponse, Response};
use bytes::{Buf, BufMut, Bytes, BytesMut};
use futures_util::stream::BoxStream;
use futures_util::{Stream, StreamExt};
use serde::de::DeserializeOwned;
use serde::Serialize;
use std::future::Future;
use std::time::Duration;

/// Largest request message accepted (SendInput carries stdin chunks).
const MAX_MESSAGE: usize = 16 << 20;
/// Envelope flag: the payload is compressed.
const FLAG_COMPRESSED: u8 = 0x01;
/// Envelope flag: the end-of-stream message.
const FLAG_END: u8 = 0x02;

/// Connect's error codes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Code {
    /// `canceled`.
    Canceled,
    /// `unknown`.
    Unknown,
    /// `invalid_argument`.
    InvalidArgument,
    /// `deadline_exceeded`.
    DeadlineExceeded,
    /// `not_found`.
    NotFound,
    /// `already_exists`.
    AlreadyExists,
    /// `permission_denied`.
    PermissionDenied,
    /// `resource_exhausted`.
    ResourceExhausted,
    /// `failed_precondition`.
    FailedPrecondition,
    /// `unimplemented`.
    Unimplemented,
    /// `internal`.
    Internal,
    /// `unavailable`.
    Unavailable,
    /// `unauthenticated`.
    Unauthenticated,
}

impl Code {
    /// The code's name on the wire.
    pub fn as_str(self) -> &'static str {
        match self {
            Code::Canceled => "canceled",
            Code::Unknown => "unknown",
            Code::InvalidArgument => "invalid_argument",
            Code::DeadlineExceeded => "deadline_exceeded",
            Code::NotFound => "not_found",
            Code::AlreadyExists => "already_exists",
            Code::PermissionDenied => "permission_denied",
            Code::ResourceExhausted => "resource_exhausted",
            Code::FailedPrecondition => "failed_precondition",
            Code::Unimplemented => "unimplemented",
            Code::Internal => "internal",
            Code::Unavailable => "unavailable",
            Code::Unauthenticated => "unauthenticated",
        }
    }

    /// The HTTP status of a unary error with this code.
    pub fn status(self) -> http::StatusCode {
        use http::StatusCode as S;
        match self {
            Code::Canceled => S::from_u16(499).unwrap_or(S::BAD_REQUEST),
            Code::Unknown | Code::Internal => S::INTERNAL_SERVER_ERROR,
            Code::InvalidArgument | Code::FailedPrecondition => S::BAD_REQUEST,
            Code::DeadlineExceeded => S::GATEWAY_TIMEOUT,
            Code::NotFound => S::NOT_FOUND,
            Code::AlreadyExists => S::CONFLICT,
            Code::PermissionDenied => S::FORBIDDEN,
            Code::ResourceExhausted => S::TOO_MANY_REQUESTS,
            Code::Unimplemented => S::NOT_IMPLEMENTED,
            Code::Unavailable => S::SERVICE_UNAVAILABLE,
            Code::Unauthenticated => S::UNAUTHORIZED,
        }
    }
}

/// A Connect error: a code and a message for the user.
#[derive(Debug, Clone, thiserror::Error)]
#[error("{}: {message}", code.as_str())]
pub struct ConnectError {
    /// The code.
    pub code: Code,
    /// What went wrong.
    pub message: String,
}

impl ConnectError {
    /// An error with `code` and `message`.
    pub fn new(code: Code, message: impl Into<String>) -> ConnectError {
        ConnectError {
            code,
            message: message.into(),
        }
    }

    fn json(&self) -> serde_json::Value {
        serde_json::json!({"code": self.code.as_str(), "message": self.message})
    }
}

impl IntoResponse for ConnectError {
    fn into_response(self) -> Response {
        (
            self.code.status(),
            [(http::header::CONTENT_TYPE, "application/json")],
            self.json().to_string(),
        )
            .into_response()
    }
}

/// A message both codecs can carry.
pub trait Msg: prost::Message + Default + Serialize + DeserializeOwned + Send + 'static {}
impl<T: prost::Message + Default + Serialize + DeserializeOwned + Send + 'static> Msg for T {}

/// The codec a call uses (from its `Content-Type`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Codec {
    /// Binary protobuf.
    Proto,
    /// proto3 JSON.
    Json,
}

impl Codec {
    fn encode<M: Msg>(self, m: &M) -> Result<Vec<u8>, ConnectError> {
        match self {
            Codec::Proto => Ok(m.encode_to_vec()),
            Codec::Json => serde_json::to_vec(m)
                .map_err(|e| ConnectError::new(Code::Internal, format!("encoding: {e}"))),
        }
    }

    fn decode<M: Msg>(self, data: &[u8]) -> Result<M, ConnectError> {
        let bad = |e: &dyn std::fmt::Display| {
            ConnectError::new(Code::InvalidArgument, format!("unmarshal message: {e}"))
        };
        match self {
            Codec::Proto => M::decode(data).map_err(|e| bad(&e)),
            Codec::Json if data.is_empty() => Ok(M::default()),
            Codec::Json => serde_json::from_slice(data).map_err(|e| bad(&e)),
        }
    }

    fn name(self) -> &'static str {
        match self {
            Codec::Proto => "proto",
            Codec::Json => "json",
        }
    }
}

/// What a handler learns about its call besides the message.
#[derive(Debug, Clone)]
pub struct Call {
    /// The request's headers.
    pub headers: http::HeaderMap,
    /// The client's deadline (`Connect-Timeout-Ms`).
    pub timeout: Option<Duration>,
}

impl Call {
    /// The keepalive interval the client asked for (`Keepalive-Ping-Interval`, seconds).
    pub fn keepalive(&self) -> Option<Duration> {
        let secs: u64 = self
            .headers
            .get("keepalive-ping-interval")?
            .to_str()
            .ok()?
            .trim()
            .parse()
            .ok()?;
        (secs > 0).then(|| Duration::from_secs(secs))
    }
}

fn codec_of(req: &Request, streaming: bool) -> Result<Codec, ConnectError> {
    let ct = req
        .headers()
        .get(http::header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .unwrap_or("");
    let ct = ct
        .split(';')
        .next()
        .unwrap_or("")
        .trim()
        .to_ascii_lowercase();
    let (proto, json) = if streaming {
        ("application/connect+proto", "application/connect+json")
    } else {
        ("application/proto", "application/json")
    };
    if ct == proto {
        Ok(Codec::Proto)
    } else if ct == json {
        Ok(Codec::Json)
    } else {
        Err(ConnectError::new(
            Code::Unimplemented,
            format!("content-type {ct:?} is not supported here: use {proto} or {json}"),
        ))
    }
}

fn call_of(req: &Request) -> Result<Call, ConnectError> {
    let timeout = match req.headers().get("connect-timeout-ms") {
        None => None,
        Some(v) => {
            let ms: u64 = v
                .to_str()
                .ok()
                .and_then(|s| s.trim().parse().ok())
                .ok_or_else(|| {
                    ConnectError::new(
                        Code::InvalidArgument,
                        "Connect-Timeout-Ms: expected a positive number of milliseconds",
                    )
                })?;
            Some(Duration::from_millis(ms))
        }
    };
    if let Some(enc) = req.headers().get("content-encoding") {
        if enc.as_bytes() != b"identity" {
            return Err(ConnectError::new(
                Code::Unimplemented,
                "request compression is not supported: send uncompressed bodies",
            ));
        }
    }
    Ok(Call {
        headers: req.headers().clone(),
        timeout,
    })
}

async fn read_body(req: Request) -> Result<Bytes, ConnectError> {
    axum::body::to_bytes(req.into_body(), MAX_MESSAGE)
        .await
        .map_err(|e| {
            ConnectError::new(
                Code::ResourceExhausted,
                format!("reading the request: {e} (at most {MAX_MESSAGE} bytes)"),
            )
        })
}

async fn with_deadline<T>(
    timeout: Option<Duration>,
    fut: impl Future<Output = Result<T, ConnectError>>,
) -> Result<T, ConnectError> {
    match timeout {
        None => fut.await,
        Some(t) => tokio::time::timeout(t, fut).await.unwrap_or_else(|_| {
            Err(ConnectError::new(
                Code::DeadlineExceeded,
                "the call's deadline (Connect-Timeout-Ms) passed",
            ))
        }),
    }
}

/// Serves a unary call with `handler`.
pub async fn unary<Req, Res, F, Fut>(req: Request, handler: F) -> Response
where
    Req: Msg,
    Res: Msg,
    F: FnOnce(Req, Call) -> Fut,
    Fut: Future<Output = Result<Res, ConnectError>>,
{
    let run = async {
        let codec = codec_of(&req, false)?;
        let call = call_of(&req)?;
        let timeout = call.timeout;
        let body = read_body(req).await?;
        let msg: Req = codec.decode(&body)?;
        let res = with_deadline(timeout, handler(msg, call)).await?;
        let bytes = codec.encode(&res)?;
        let ct = match codec {
            Codec::Proto => "application/proto",
            Codec::Json => "application/json",
        };
        Ok::<_, ConnectError>(([(http::header::CONTENT_TYPE, ct)], bytes).into_response())
    };
    match run.await {
        Ok(r) => r,
        Err(e) => e.into_response(),
    }
}

/// A server stream's messages; an `Err` ends it with that error.
pub type Events<Res> = BoxStream<'static, Result<Res, ConnectError>>;

fn envelope(flags: u8, payload: &[u8]) -> Bytes {
    let mut b = BytesMut::with_capacity(5 + payload.len());
    b.put_u8(flags);
    b.put_u32(u32::try_from(payload.len()).unwrap_or(u32::MAX));
    b.put_slice(payload);
    b.freeze()
}

fn end_of_stream(error: Option<&ConnectError>) -> Bytes {
    let body = match error {
        Some(e) => serde_json::json!({"error": e.json()}),
        None => serde_json::json!({}),
    };
    envelope(FLAG_END, body.to_string().as_bytes())
}

fn stream_response(codec: Codec, frames: impl Stream<Item = Bytes> + Send + 'static) -> Response {
    let body = Body::from_stream(frames.map(Ok::<_, std::convert::Infallible>));
    (
        [(
            http::header::CONTENT_TYPE,
            format!("application/connect+{}", codec.name()),
        )],
        body,
    )
        .into_response()
}

/// Reads envelopes off a request body as they arrive.
#[derive(Debug)]
struct Envelopes {
    body: axum::body::BodyDataStream,
    buf: BytesMut,
}

impl Envelopes {
    /// The next message's payload, `None` at the end of the body.
    async fn next(&mut self) -> Result<Option<Bytes>, ConnectError> {
        loop {
            if self.buf.len() >= 5 {
                let flags = self.buf[0];
                let len = u32::from_be_bytes([self.buf[1], self.buf[2], self.buf[3], self.buf[4]])
                    as usize;
                if len > MAX_MESSAGE {
                    return Err(ConnectError::new(
                        Code::ResourceExhausted,
                        format!("message of {len} bytes (at most {MAX_MESSAGE})"),
                    ));
                }
                if self.buf.len() >= 5 + len {
                    self.buf.advance(5);
                    let payload = self.buf.split_to(len).freeze();
                    if flags & FLAG_COMPRESSED != 0 {
                        return Err(ConnectError::new(
                            Code::Unimplemented,
                            "compressed messages are not supported: send them uncompressed",
                        ));
                    }
                    if flags & FLAG_END != 0 {
                        return Ok(None);
                    }
                    return Ok(Some(payload));
                }
            }
            match self.body.next().await {
                Some(Ok(chunk)) => self.buf.extend_from_slice(&chunk),
                Some(Err(e)) => {
                    return Err(ConnectError::new(
                        Code::Canceled,
                        format!("reading the request stream: {e}"),
                    ))
                }
                None if self.buf.is_empty() => return Ok(None),
                None => {
                    return Err(ConnectError::new(
                        Code::InvalidArgument,
                        "the request stream ended inside a message",
                    ))
                }
            }
        }
    }
}

/// Serves a server-streaming call: `handler` answers the request with a stream of
/// messages. While nothing else is sent for the client's `Keepalive-Ping-Interval`,
/// `keepalive` is. The stream ends at the client's deadline with `deadline_exceeded`; when
/// the client goes away, the handler's stream is dropped.
pub async fn server_stream<Req, Res, F, Fut>(
    req: Request,
    keepalive: impl Fn() -> Res + Send + 'static,
    handler: F,
) -> Response
where
    Req: Msg,
    Res: Msg,
    F: FnOnce(Req, Call) -> Fut,
    Fut: Future<Output = Result<Events<Res>, ConnectError>>,
{
    let codec = match codec_of(&req, true) {
        Ok(c) => c,
        Err(e) => return e.into_response(),
    };
    let call = call_of(&req);
    let mut envelopes = Envelopes {
        body: req.into_body().into_data_stream(),
        buf: BytesMut::new(),
    };
    let opened = async {
        let call = call?;
        let payload = envelopes.next().await?.ok_or_else(|| {
            ConnectError::new(Code::InvalidArgument, "the request carries no message")
        })?;
        let msg: Req = codec.decode(&payload)?;
        let timeout = call.timeout;
        let every = call.keepalive();
        let deadline = timeout.map(|t| tokio::time::Instant::now() + t);
        let events = with_deadline(timeout, handler(msg, call)).await?;
        Ok::<_, ConnectError>((events, every, deadline))
    };
    let opened = opened.await;
    let rest = RequestEnd::read(envelopes);
    let (events, every, deadline) = match opened {
        Ok(v) => v,
        Err(e) => {
            let end = async move {
                rest.reached().await;
                end_of_stream(Some(&e))
            };
            return stream_response(codec, futures_util::stream::once(end));
        }
    };
    let (tx, rx) = tokio::sync::mpsc::channel::<Bytes>(16);
    tokio::spawn(pump(events, codec, tx, keepalive, every, deadline, rest));
    let frames =
        futures_util::stream::unfold(rx, |mut rx| async move { rx.recv().await.map(|b| (b, rx)) });
    stream_response(codec, frames)
}

/// How long a server stream's last frame waits for the end of its request body
/// ([`RequestEnd`]).
const REQUEST_END_WAIT: Duration = Duration::from_secs(2);

/// The end of a server stream's request body, read beside the response.
///
/// The request is one message, but a client may end its body (a chunked body's last
/// chunk) after the server has answered, as the E2B SDK does under load. An HTTP/1.1
/// connection whose request body was not read to its end cannot carry another request, so
/// hyper closes it after the response, with no `Connection: close` the client could see:
/// the client's pool reuses it and its next call fails ("connection closed before message
/// completed"). So the rest of the body is read (and dropped) while the response runs, and
/// the response's last frame waits for its end, for at most [`REQUEST_END_WAIT`]. Beyond
/// [`MAX_MESSAGE`] bytes it stops reading: such a connection is closed.
struct RequestEnd(tokio::task::JoinHandle<()>);

impl RequestEnd {
    fn read(envelopes: Envelopes) -> RequestEnd {
        let mut body = envelopes.body;
        RequestEnd(tokio::spawn(async move {
            let mut read = 0;
            while let Some(Ok(chunk)) = body.next().await {
                read += chunk.len();
                if read > MAX_MESSAGE {
                    break;
                }
            }
        }))
    }

    /// Once the body has ended (or the wait is over).
    async fn reached(mut self) {
        let _ = tokio::time::timeout(REQUEST_END_WAIT, &mut self.0).await;
    }
}

impl Drop for RequestEnd {
    fn drop(&mut self) {
        // The response ended early (the client went away): nothing waits for the body.
        self.0.abort();
    }
}

/// Sends `events` framed into `tx` until they end, fail, the deadline passes or the
/// client goes away (`tx` closed); the last frame once the request body has ended.
async fn pump<Res: Msg>(
    mut events: Events<Res>,
    codec: Codec,
    tx: tokio::sync::mpsc::Sender<Bytes>,
    keepalive: impl Fn() -> Res,
    every: Option<Duration>,
    deadline: Option<tokio::time::Instant>,
    rest: RequestEnd,
) {
    let far = Duration::from_secs(365 * 24 * 3600);
    let deadline_at = deadline.unwrap_or_else(|| tokio::time::Instant::now() + far);
    let end = loop {
        let idle = tokio::time::sleep(every.unwrap_or(far));
        let next = tokio::select! {
            next = events.next() => next,
            _ = idle => Some(Ok(keepalive())),
            _ = tokio::time::sleep_until(deadline_at) => Some(Err(ConnectError::new(
                Code::DeadlineExceeded,
                "the call's deadline (Connect-Timeout-Ms) passed",
            ))),
            _ = tx.closed() => return,
        };
        match next {
            None => break None,
            Some(Err(e)) => break Some(e),
            Some(Ok(msg)) => match codec.encode(&msg) {
                Ok(payload) => {
                    if tx.send(envelope(0, &payload)).await.is_err() {
                        return;
                    }
                }
                Err(e) => break Some(e),
            },
        }
    };
    rest.reached().await;
    let _ = tx.send(end_of_stream(end.as_ref())).await;
}

/// A client stream's messages as the handler reads them.
#[derive(Debug)]
pub struct Incoming<Req> {
    envelopes: Envelopes,
    codec: Codec,
    _msg: std::marker::PhantomData<fn() -> Req>,
}

impl<Req: Msg> Incoming<Req> {
    /// The next message, `None` when the client closed its side.
    pub async fn next(&mut self) -> Result<Option<Req>, ConnectError> {
        match self.envelopes.next().await? {
            Some(payload) => self.codec.decode(&payload).map(Some),
            None => Ok(None),
        }
    }
}

/// Serves a client-streaming call: `handler` reads the client's messages and answers once.
pub async fn client_stream<Req, Res, F, Fut>(req: Request, handler: F) -> Response
where
    Req: Msg,
    Res: Msg,
    F: FnOnce(Incoming<Req>, Call) -> Fut,
    Fut: Future<Output = Result<Res, ConnectError>>,
{
    let codec = match codec_of(&req, true) {
        Ok(c) => c,
        Err(e) => return e.into_response(),
    };
    let run = async {
        let call = call_of(&req)?;
        let timeout = call.timeout;
        let incoming = Incoming {
            envelopes: Envelopes {
                body: req.into_body().into_data_stream(),
                buf: BytesMut::new(),
            },
            codec,
            _msg: std::marker::PhantomData,
        };
        let res = with_deadline(timeout, handler(incoming, call)).await?;
        codec.encode(&res)
    };
    let frames = match run.await {
        Ok(payload) => vec![envelope(0, &payload), end_of_stream(None)],
        Err(e) => vec![end_of_stream(Some(&e))],
    };
    stream_response(codec, futures_util::stream::iter(frames))
}

/// Answers any call of a method lockbox does not implement: `unimplemented`, in the
/// unary or the streaming shape as the request's `Content-Type` asks.
pub fn unimplemented(req: &Request, method: &str) -> Response {
    let e = ConnectError::new(
        Code::Unimplemented,
        format!("{method} is not supported by lockbox's envd (see docs/e2b.md)"),
    );
    match codec_of(req, true) {
        Ok(codec) => stream_response(codec, futures_util::stream::iter([end_of_stream(Some(&e))])),
        Err(_) => e.into_response(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn error_statuses_follow_the_connect_table() {
        assert_eq!(Code::NotFound.status(), 404);
        assert_eq!(Code::AlreadyExists.status(), 409);
        assert_eq!(Code::InvalidArgument.status(), 400);
        assert_eq!(Code::Unimplemented.status(), 501);
        assert_eq!(Code::DeadlineExceeded.status(), 504);
    }

    #[test]
    fn envelopes_carry_flags_and_a_big_endian_length() {
        let e = envelope(0, b"{}");
        assert_eq!(&e[..], b"\x00\x00\x00\x00\x02{}");
        let end = end_of_stream(Some(&ConnectError::new(Code::NotFound, "gone")));
        assert_eq!(end[0], FLAG_END);
        let v: serde_json::Value = serde_json::from_slice(&end[5..]).unwrap();
        assert_eq!(v["error"]["code"], "not_found");
        assert_eq!(v["error"]["message"], "gone");
    }
}
