//! A Connect client for envd's routes, as the E2B SDK speaks it, over a served runtime.
#![allow(dead_code)]

use crate::common;
use base64::Engine;
use bytes::{Buf, Bytes, BytesMut};
use futures_util::StreamExt;
use lockbox_runtime::{Runtime, Sandbox};
use serde_json::{json, Value};
use std::time::Duration;

/// A runtime with one sandbox, served with E2B's planes on a local port.
pub struct Served {
    pub rt: Runtime,
    pub sb: Sandbox,
    pub base: String,
    pub client: reqwest::Client,
    pub e2b: lockbox_e2b::E2b,
    _state: common::Scratch,
}

impl Served {
    pub async fn start() -> Served {
        let state = common::scratch();
        let (rt, sb) = common::sandbox(state.path()).await;
        let e2b = lockbox_e2b::E2b::new(rt.clone(), "test-key");
        // As E2B's create would: the sandbox plane serves only sandboxes E2B knows.
        e2b.registry
            .insert(sb.id(), lockbox_e2b::E2bSandbox::default());
        let app = lockbox_e2b::wrap(e2b.clone(), axum::Router::new(), None);
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        // As `lockbox serve`: no Nagle delay on streamed responses' small writes.
        use axum::serve::ListenerExt;
        let listener = listener.tap_io(|tcp| {
            let _ = tcp.set_nodelay(true);
        });
        tokio::spawn(async move { axum::serve(listener, app).await });
        Served {
            rt,
            sb,
            base: format!("http://{addr}"),
            client: reqwest::Client::new(),
            e2b,
            _state: state,
        }
    }

    pub async fn stop(self) {
        self.rt.shutdown().await;
    }

    fn post(&self, method: &str, user: Option<&str>) -> reqwest::RequestBuilder {
        let mut req = self
            .client
            .post(format!("{}/{method}", self.base))
            .header("E2b-Sandbox-Id", self.sb.id())
            .header("E2b-Sandbox-Port", "49983")
            .header("Connect-Protocol-Version", "1");
        if let Some(user) = user {
            let basic = base64::engine::general_purpose::STANDARD.encode(format!("{user}:"));
            req = req.header("Authorization", format!("Basic {basic}"));
        }
        req
    }

    /// A unary call with the JSON codec: the status and the body.
    pub async fn unary(&self, method: &str, body: Value) -> (u16, Value) {
        self.unary_as(method, body, None).await
    }

    pub async fn unary_as(&self, method: &str, body: Value, user: Option<&str>) -> (u16, Value) {
        let resp = self
            .post(method, user)
            .header("Content-Type", "application/json")
            .body(body.to_string())
            .send()
            .await
            .unwrap();
        let status = resp.status().as_u16();
        let text = resp.text().await.unwrap();
        let value = serde_json::from_str(&text).unwrap_or_else(|_| json!({"raw": text}));
        (status, value)
    }

    /// Opens a server stream with the JSON codec (and the SDK's keepalive header).
    pub async fn stream(&self, method: &str, body: Value, user: Option<&str>) -> Stream {
        self.stream_with(method, body, user, &[]).await
    }

    pub async fn stream_with(
        &self,
        method: &str,
        body: Value,
        user: Option<&str>,
        headers: &[(&str, &str)],
    ) -> Stream {
        let mut req = self
            .post(method, user)
            .header("Content-Type", "application/connect+json")
            .header("Keepalive-Ping-Interval", "50")
            .body(frame(0, body.to_string().as_bytes()));
        for (k, v) in headers {
            req = req.header(*k, *v);
        }
        let resp = req.send().await.unwrap();
        assert_eq!(resp.status(), 200);
        assert_eq!(
            resp.headers()["content-type"].to_str().unwrap(),
            "application/connect+json"
        );
        Stream {
            body: Box::pin(resp.bytes_stream()),
            buf: BytesMut::new(),
        }
    }

    /// A client-streaming call with the JSON codec: the frames the server answered.
    pub async fn client_stream(&self, method: &str, messages: Vec<Value>) -> Vec<Frame> {
        let frames: Vec<Result<Bytes, std::io::Error>> = messages
            .iter()
            .map(|m| Ok(frame(0, m.to_string().as_bytes())))
            .collect();
        let resp = self
            .post(method, None)
            .header("Content-Type", "application/connect+json")
            .body(reqwest::Body::wrap_stream(futures_util::stream::iter(
                frames,
            )))
            .send()
            .await
            .unwrap();
        assert_eq!(resp.status(), 200);
        let mut s = Stream {
            body: Box::pin(resp.bytes_stream()),
            buf: BytesMut::new(),
        };
        let mut out = Vec::new();
        while let Some(f) = s.next().await {
            out.push(f);
        }
        out
    }

    /// Runs `script` in the sandbox through the runtime (not through envd).
    pub async fn sh(&self, script: &str) -> String {
        common::out(&common::run(&self.sb, script).await)
    }
}

pub fn frame(flags: u8, payload: &[u8]) -> Bytes {
    let mut b = Vec::with_capacity(5 + payload.len());
    b.push(flags);
    b.extend_from_slice(&(payload.len() as u32).to_be_bytes());
    b.extend_from_slice(payload);
    Bytes::from(b)
}

/// One envelope of a stream: a message, or the end of the stream (with its error, if any).
#[derive(Debug, Clone)]
pub enum Frame {
    Msg(Bytes),
    End(Value),
}

impl Frame {
    pub fn json(&self) -> Value {
        match self {
            Frame::Msg(b) => serde_json::from_slice(b).unwrap(),
            Frame::End(v) => panic!("expected a message, got the end {v}"),
        }
    }
}

pub struct Stream {
    body: std::pin::Pin<Box<dyn futures_util::Stream<Item = reqwest::Result<Bytes>> + Send>>,
    buf: BytesMut,
}

impl Stream {
    /// The next envelope (`None` once the body ended).
    pub async fn next(&mut self) -> Option<Frame> {
        loop {
            if self.buf.len() >= 5 {
                let len = u32::from_be_bytes(self.buf[1..5].try_into().unwrap()) as usize;
                if self.buf.len() >= 5 + len {
                    let flags = self.buf[0];
                    self.buf.advance(5);
                    let payload = self.buf.split_to(len).freeze();
                    return Some(if flags & 2 != 0 {
                        Frame::End(serde_json::from_slice(&payload).unwrap())
                    } else {
                        Frame::Msg(payload)
                    });
                }
            }
            match tokio::time::timeout(Duration::from_secs(30), self.body.next()).await {
                Ok(Some(chunk)) => self.buf.extend_from_slice(&chunk.unwrap()),
                Ok(None) => return None,
                Err(_) => panic!("no envelope within 30 s"),
            }
        }
    }

    /// The next message as JSON, skipping keepalives.
    pub async fn event(&mut self) -> Value {
        loop {
            let v = self.next().await.expect("stream ended").json();
            let inner = v.get("event").cloned().unwrap_or(v.clone());
            if inner.get("keepalive").is_none() {
                return v;
            }
        }
    }

    /// Process events until the end event: (stdout, stderr, pty, end).
    pub async fn collect_process(&mut self) -> (Vec<u8>, Vec<u8>, Vec<u8>, Value) {
        let (mut out, mut err, mut pty) = (Vec::new(), Vec::new(), Vec::new());
        loop {
            let v = self.event().await;
            let ev = &v["event"];
            if let Some(data) = ev.get("data") {
                let b64 = |k: &str| {
                    base64::engine::general_purpose::STANDARD
                        .decode(data[k].as_str().unwrap())
                        .unwrap()
                };
                if data.get("stdout").is_some() {
                    out.extend(b64("stdout"));
                } else if data.get("stderr").is_some() {
                    err.extend(b64("stderr"));
                } else {
                    pty.extend(b64("pty"));
                }
            } else if let Some(end) = ev.get("end") {
                return (out, err, pty, end.clone());
            }
        }
    }

    /// The end of the stream: its error, or `None` for a clean end.
    pub async fn end(&mut self) -> Option<Value> {
        loop {
            match self
                .next()
                .await
                .expect("stream ended without its end message")
            {
                Frame::End(v) => return v.get("error").cloned(),
                Frame::Msg(_) => {}
            }
        }
    }
}

/// The pid a process stream opened with.
pub async fn started(s: &mut Stream) -> u64 {
    let v = s.event().await;
    v["event"]["start"]["pid"]
        .as_u64()
        .expect("a start event first")
}

pub fn bash(script: &str) -> Value {
    json!({"cmd": "/bin/bash", "args": ["-l", "-c", script]})
}

pub fn b64(data: &[u8]) -> String {
    base64::engine::general_purpose::STANDARD.encode(data)
}

/// Polls `check` (up to ~10 s) until it holds.
pub async fn eventually<F, Fut>(mut check: F) -> bool
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    for _ in 0..1000 {
        if check().await {
            return true;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    false
}
