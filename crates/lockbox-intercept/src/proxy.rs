//! [`Interceptor`]: the thread that terminates the sandbox's TLS connections to intercepted
//! hosts, checks each request, sets the credential and sends it on to the real server.
//!
//! One thread per sandbox with a current-thread tokio runtime. Each connection the relay
//! hands over ([`lockbox_netsup::Intercepted`]) becomes a task:
//!
//! 1. **TLS with the sandbox.** rustls, with the ClientHello the relay already read replayed
//!    first, and a leaf certificate for the server name signed by the sandbox's CA
//!    ([`crate::ca`]). HTTP/2 or HTTP/1.1, as ALPN settles (`h2`, `http/1.1`).
//! 2. **Each request** (hyper's HTTP/2 or HTTP/1 server): its host (`Host`, or the authority of an
//!    absolute URI) must be the TLS server name, without userinfo (`user@`), and its method
//!    and path must pass the host's `--http-allow` rules ([`HttpRules::check`], which reads
//!    the path one way and refuses what a server could read otherwise); otherwise lockbox
//!    answers 403 itself and nothing reaches the server. Then the credential's header
//!    replaces whatever the sandbox put there (a placeholder, or nothing).
//! 3. **The real server.** rustls on the socket the supervisor connected to the address the
//!    sandbox chose (one its DNS answers allowed), verifying the server's certificate for
//!    the server name against the host's trust store (and the `--upstream-ca` file), and
//!    offering `h2` and `http/1.1` by ALPN: hyper's HTTP/2 client when the server picks
//!    `h2` (the sandbox's requests, whichever version they came in, then go concurrently
//!    as streams of that one connection, `:authority` naming the server name), else its
//!    HTTP/1 client (one request at a time). A server that closed its connection is
//!    dialled again at the same address. The response goes back as it came.
//!
//! An HTTP/1.1 upgrade (WebSocket) is checked and given its credential like any request; it
//! goes to the server on an HTTP/1.1 connection (ALPN `http/1.1` only: HTTP/2 has no such
//! upgrade), and once the server answers 101, the two upgraded streams are copied into
//! each other unread.
//!
//! Each request is an audit event (`request`: method, path, credential name, status).
//!
//! **Bounded.** Connections hold their relay slot ([`lockbox_netsup::RELAY_SLOTS`] per
//! sandbox); the TLS handshake with the sandbox must end within [`HANDSHAKE`]; hyper bounds
//! each request head. The thread ends, closing every connection, when the [`Interceptor`] is
//! dropped.

use crate::ca::{Authority, Resolver};
use crate::error::Error;
use crate::rules::{AuthScheme, HttpRules, Refusal};
use crate::secret::Credentials;
use bytes::Bytes;
use http::header::HOST;
use http::{Request, Response, StatusCode, Uri};
use http_body_util::{combinators::BoxBody, BodyExt, Full};
use hyper::body::Incoming;
use hyper::client::conn::{http1, http2};
use hyper_util::rt::{TokioExecutor, TokioIo};
use lockbox_netsup::{
    AuditSink, Decision as NetDecision, EventKind as NetEventKind, Intercepted,
    Protocol as NetProtocol,
};
use rustls::{ClientConfig, RootCertStore, ServerConfig};
use rustls_pki_types::pem::PemObject;
use rustls_pki_types::{CertificateDer, ServerName};
use std::convert::Infallible;
use std::io;
use std::net::SocketAddr;
use std::path::Path;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::thread::JoinHandle;
use std::time::Duration;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::TcpStream;
use tokio::sync::mpsc;

/// How long a TLS handshake (with the sandbox's client, or with the real server) may take.
pub const HANDSHAKE: Duration = Duration::from_secs(10);
/// Longest path kept in an audit event, in bytes.
const MAX_LOGGED_PATH: usize = 1024;

type Body = BoxBody<Bytes, hyper::Error>;

/// What every connection task shares.
#[derive(Debug)]
struct Shared {
    rules: HttpRules,
    credentials: Credentials,
    server: Arc<ServerConfig>,
    /// Offers `h2` and `http/1.1`.
    client: Arc<ClientConfig>,
    /// Offers `http/1.1` only: for upgrades.
    client_h1: Arc<ClientConfig>,
    audit: Option<AuditSink>,
}

/// The interceptor of one sandbox; dropping it stops its thread and closes its connections.
#[derive(Debug)]
pub struct Interceptor {
    shared: Arc<Shared>,
    pem: String,
    tx: Option<mpsc::UnboundedSender<Intercepted>>,
    thread: Option<JoinHandle<()>>,
}

impl Interceptor {
    /// Makes the sandbox's CA and starts the thread. `upstream_ca`: a PEM file of CAs
    /// trusted for the real servers besides the host's trust store (a test's, a company's);
    /// `audit` receives a `request` event per request.
    pub fn start(
        rules: HttpRules,
        credentials: Credentials,
        upstream_ca: Option<&Path>,
        audit: Option<AuditSink>,
    ) -> Result<Interceptor, Error> {
        let authority = Arc::new(Authority::new(&rules.hosts())?);
        let pem = authority.pem().to_owned();
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let mut server = ServerConfig::builder_with_provider(provider.clone())
            .with_safe_default_protocol_versions()?
            .with_no_client_auth()
            .with_cert_resolver(Arc::new(Resolver(authority)));
        server.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec()];
        let mut client = ClientConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()?
            .with_root_certificates(upstream_roots(upstream_ca)?)
            .with_no_client_auth();
        let mut client_h1 = client.clone();
        client.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec()];
        client_h1.alpn_protocols = vec![b"http/1.1".to_vec()];
        let shared = Arc::new(Shared {
            rules,
            credentials,
            server: Arc::new(server),
            client: Arc::new(client),
            client_h1: Arc::new(client_h1),
            audit,
        });
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_io()
            .enable_time()
            .build()
            .map_err(Error::Start)?;
        let (tx, mut rx) = mpsc::unbounded_channel::<Intercepted>();
        let tasks = shared.clone();
        let thread = std::thread::Builder::new()
            .name("lockbox-intercept".into())
            .spawn(move || {
                runtime.block_on(async move {
                    while let Some(conn) = rx.recv().await {
                        tokio::spawn(connection(tasks.clone(), conn));
                    }
                });
                // Dropping the runtime cancels every connection's task, closing its sockets.
            })
            .map_err(Error::Start)?;
        Ok(Interceptor {
            shared,
            pem,
            tx: Some(tx),
            thread: Some(thread),
        })
    }
}

impl Drop for Interceptor {
    fn drop(&mut self) {
        drop(self.tx.take());
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

impl lockbox_netsup::Interceptor for Interceptor {
    fn intercepts(&self, name: &str, _port: u16) -> bool {
        self.shared.rules.intercepts(name)
    }

    fn take(&self, conn: Intercepted) {
        if let Some(tx) = &self.tx {
            // Only fails once the thread is gone: dropping the connection closes it.
            let _ = tx.send(conn);
        }
    }

    fn ca_pem(&self) -> &str {
        &self.pem
    }
}

/// The host's trust store, plus the certificates of `extra`.
fn upstream_roots(extra: Option<&Path>) -> Result<RootCertStore, Error> {
    let mut roots = RootCertStore::empty();
    let native = rustls_native_certs::load_native_certs();
    roots.add_parsable_certificates(native.certs);
    if let Some(path) = extra {
        let bad = |reason: String| Error::UpstreamCa {
            path: path.to_owned(),
            reason,
        };
        let pem = std::fs::read(path).map_err(|e| bad(e.to_string()))?;
        let certs: Vec<CertificateDer<'static>> = CertificateDer::pem_slice_iter(&pem)
            .collect::<Result<_, _>>()
            .map_err(|e| bad(format!("not PEM certificates: {e}")))?;
        if certs.is_empty() {
            return Err(bad("holds no PEM certificate".to_owned()));
        }
        for cert in certs {
            roots
                .add(cert)
                .map_err(|e| bad(format!("unusable certificate: {e}")))?;
        }
    }
    Ok(roots)
}

/// The sandbox's end of the connection, with the first flight the relay already read put
/// back in front.
struct Replay {
    head: Vec<u8>,
    at: usize,
    inner: TcpStream,
}

impl AsyncRead for Replay {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        if this.at < this.head.len() {
            let n = buf.remaining().min(this.head.len() - this.at);
            buf.put_slice(&this.head[this.at..this.at + n]);
            this.at += n;
            return Poll::Ready(Ok(()));
        }
        Pin::new(&mut this.inner).poll_read(cx, buf)
    }
}

impl AsyncWrite for Replay {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.get_mut().inner).poll_write(cx, buf)
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().inner).poll_flush(cx)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().inner).poll_shutdown(cx)
    }
}

fn tokio_stream(fd: std::os::fd::OwnedFd) -> io::Result<TcpStream> {
    let std = std::net::TcpStream::from(fd);
    std.set_nonblocking(true)?;
    TcpStream::from_std(std)
}

/// One intercepted connection, for its requests and their events.
#[derive(Debug, Clone)]
struct Conn {
    shared: Arc<Shared>,
    sni: String,
    dest: SocketAddr,
    pid: Option<u32>,
    command: Option<String>,
}

/// The connection to the real server: the supervisor's socket until first used, then an
/// HTTP/2 or HTTP/1 client (as the server's ALPN chose); dialled again at the same address
/// when the server closed it.
enum Upstream {
    Socket(Option<TcpStream>),
    Ready(Sender),
}

/// A client of the real server.
enum Sender {
    /// HTTP/1.1: one request at a time (the caller holds the [`Upstream`] meanwhile).
    H1(http1::SendRequest<Incoming>),
    /// HTTP/2: cloned for each request, which goes as a stream of its own.
    H2(http2::SendRequest<Incoming>),
}

async fn connection(shared: Arc<Shared>, conn: Intercepted) {
    let Intercepted {
        client,
        first_flight,
        upstream,
        dest,
        sni,
        pid,
        command,
        slot,
        ..
    } = conn;
    let conn = Conn {
        shared,
        sni,
        dest,
        pid,
        command,
    };
    let (Ok(client), Ok(upstream)) = (tokio_stream(client), tokio_stream(upstream)) else {
        return;
    };
    let client = Replay {
        head: first_flight,
        at: 0,
        inner: client,
    };
    let acceptor = tokio_rustls::TlsAcceptor::from(conn.shared.server.clone());
    let tls = match tokio::time::timeout(HANDSHAKE, acceptor.accept(client)).await {
        Ok(Ok(tls)) => tls,
        Ok(Err(e)) => {
            conn.log_tls(format!(
                "the sandbox's TLS handshake with lockbox failed (does the client trust lockbox's CA?): {e}"
            ));
            return;
        }
        Err(_) => {
            conn.log_tls("the sandbox's TLS handshake with lockbox timed out".to_owned());
            return;
        }
    };
    let h2 = tls.get_ref().1.alpn_protocol() == Some(b"h2");
    // One connection to the server per connection of the sandbox's: with HTTP/1.1 requests
    // go one at a time (an HTTP/2 client's concurrent streams wait their turn).
    let upstream = Arc::new(tokio::sync::Mutex::new(Upstream::Socket(Some(upstream))));
    let service = hyper::service::service_fn(move |req| {
        let conn = conn.clone();
        let upstream = upstream.clone();
        async move { Ok::<_, Infallible>(conn.handle(req, &upstream).await) }
    });
    let io = TokioIo::new(tls);
    let _ = if h2 {
        hyper::server::conn::http2::Builder::new(TokioExecutor::new())
            .serve_connection(io, service)
            .await
    } else {
        hyper::server::conn::http1::Builder::new()
            .serve_connection(io, service)
            .with_upgrades()
            .await
    };
    drop(slot);
}

impl Conn {
    async fn handle(
        &self,
        mut req: Request<Incoming>,
        upstream: &tokio::sync::Mutex<Upstream>,
    ) -> Response<Body> {
        let method = req.method().as_str().to_owned();
        let path = req.uri().path().to_owned();
        let mut event = RequestLog {
            method: &method,
            path: &path,
            host: None,
            credential: None,
        };
        let verdict = match other_host(&req, &self.sni) {
            _ if has_userinfo(&req) => Err(Refusal::Userinfo),
            Some(other) => {
                event.host = Some(other.clone());
                Err(Refusal::OtherHost(other))
            }
            None => self.shared.rules.check(&method, &self.sni, &path),
        };
        if let Err(refusal) = verdict {
            let reason = format!("{method} {path} on {}: {refusal}", self.sni);
            self.log_request(&event, NetDecision::Denied, reason.clone(), 403);
            return text(
                StatusCode::FORBIDDEN,
                format!("lockbox: refused: {reason}\n"),
            );
        }
        event.credential = self.rewrite(&mut req);
        // An HTTP/1.1 upgrade (WebSocket): once the server switches protocols, bytes are
        // copied both ways, unread.
        let upgrade = req
            .headers()
            .contains_key(http::header::UPGRADE)
            .then(|| hyper::upgrade::on(&mut req));
        let mut retried = false;
        // The kept connection, while an HTTP/1.1 request (or its upgrade) has it.
        let mut held = None;
        let sent = loop {
            let mut kept = upstream.lock().await;
            let sender = match self.ready(&mut kept, upgrade.is_some()).await {
                Ok(sender) => sender,
                Err(why) => {
                    let reason = format!("{method} {path} on {}: {why}", self.sni);
                    self.log_request(&event, NetDecision::Denied, reason.clone(), 502);
                    return text(StatusCode::BAD_GATEWAY, format!("lockbox: {reason}\n"));
                }
            };
            let result = match sender {
                Sender::H1(s) => {
                    http1_form(&mut req, &self.sni);
                    let result = s.try_send_request(req).await;
                    held = Some(kept);
                    result
                }
                Sender::H2(s) => {
                    let mut s = s.clone();
                    drop(kept);
                    http2_form(&mut req, &self.sni);
                    s.try_send_request(req).await
                }
            };
            match result {
                Ok(response) => break Ok(response),
                // The server closed its kept-alive connection before the request was
                // written (hyper gives it back): dial again once and send it there.
                Err(mut e) => match e.take_message() {
                    Some(back) if !retried => {
                        retried = true;
                        req = back;
                        if let Some(mut kept) = held.take() {
                            *kept = Upstream::Socket(None);
                        }
                    }
                    _ => break Err(e.into_error()),
                },
            }
        };
        match sent {
            Ok(mut response) => {
                let status = response.status().as_u16();
                if let Some(down) = upgrade.filter(|_| status == 101) {
                    let up = hyper::upgrade::on(&mut response);
                    // This server connection is the upgraded stream's now.
                    if let Some(mut kept) = held.take() {
                        *kept = Upstream::Socket(None);
                    }
                    tokio::spawn(async move {
                        if let (Ok(down), Ok(up)) = (down.await, up.await) {
                            let (mut down, mut up) = (TokioIo::new(down), TokioIo::new(up));
                            let _ = tokio::io::copy_bidirectional(&mut down, &mut up).await;
                        }
                    });
                }
                let reason = match event.credential {
                    Some(name) => format!("{method} {path} on {}: credential {name} set", self.sni),
                    None => format!("{method} {path} on {}: allowed", self.sni),
                };
                self.log_request(&event, NetDecision::Allowed, reason, status);
                drop(held);
                // hyper's HTTP/1.1 server writes any version as HTTP/1.1 (with a warning);
                // its HTTP/2 server ignores it.
                *response.version_mut() = http::Version::HTTP_11;
                response.map(BodyExt::boxed)
            }
            Err(e) => {
                let reason = format!("{method} {path} on {}: the server failed: {e}", self.sni);
                self.log_request(&event, NetDecision::Allowed, reason.clone(), 502);
                text(StatusCode::BAD_GATEWAY, format!("lockbox: {reason}\n"))
            }
        }
    }

    /// Sets the host's credential (returning its name).
    fn rewrite(&self, req: &mut Request<Incoming>) -> Option<&str> {
        let rule = self.shared.rules.auth_for(&self.sni)?;
        let prefix = match rule.scheme {
            AuthScheme::Bearer => "Bearer ",
            AuthScheme::Header(_) => "",
        };
        let value = self
            .shared
            .credentials
            .get(&rule.credential)
            .and_then(|s| s.header(prefix))?;
        let header = rule.header();
        req.headers_mut().remove(&header);
        req.headers_mut().insert(header, value);
        Some(rule.credential.as_str())
    }

    /// The client of the real server, connecting (or reconnecting) first if needed: an
    /// HTTP/1.1 one if `upgrade` (replacing a kept HTTP/2 one, whose requests in flight
    /// go on).
    async fn ready<'a>(
        &self,
        up: &'a mut Upstream,
        upgrade: bool,
    ) -> Result<&'a mut Sender, String> {
        let usable = match up {
            Upstream::Ready(Sender::H1(s)) => !s.is_closed(),
            Upstream::Ready(Sender::H2(s)) => !upgrade && !s.is_closed(),
            Upstream::Socket(_) => false,
        };
        if !usable {
            let socket = match up {
                Upstream::Socket(s) => s.take(),
                Upstream::Ready(_) => None,
            };
            let socket = match socket {
                Some(s) => s,
                None => TcpStream::connect(self.dest)
                    .await
                    .map_err(|e| format!("connecting to {}: {e}", self.dest))?,
            };
            *up = Upstream::Ready(self.dial(socket, upgrade).await?);
        }
        let Upstream::Ready(sender) = up else {
            return Err("no connection to the server".to_owned());
        };
        let ready = match sender {
            Sender::H1(s) => s.ready().await,
            Sender::H2(s) => s.ready().await,
        };
        ready.map_err(|e| format!("the connection to the server failed: {e}"))?;
        Ok(sender)
    }

    /// TLS (verifying the server) on `socket`, then HTTP/2 if the server's ALPN picked
    /// `h2`, else HTTP/1.1 (always, if `http1_only`).
    async fn dial(&self, socket: TcpStream, http1_only: bool) -> Result<Sender, String> {
        // The supervisor's socket may still be connecting.
        socket
            .writable()
            .await
            .map_err(|e| format!("connecting to {}: {e}", self.dest))?;
        if let Some(e) = socket.take_error().ok().flatten() {
            return Err(format!("connecting to {}: {e}", self.dest));
        }
        let name = ServerName::try_from(self.sni.clone())
            .map_err(|e| format!("server name {}: {e}", self.sni))?;
        let config = if http1_only {
            &self.shared.client_h1
        } else {
            &self.shared.client
        };
        let connector = tokio_rustls::TlsConnector::from(config.clone());
        let tls = match tokio::time::timeout(HANDSHAKE, connector.connect(name, socket)).await {
            Ok(Ok(tls)) => tls,
            Ok(Err(e)) => {
                return Err(format!(
                    "TLS with the server {} ({}) failed: {e}",
                    self.sni, self.dest
                ))
            }
            Err(_) => return Err(format!("TLS with the server {} timed out", self.sni)),
        };
        let failed = |e: hyper::Error| format!("HTTP with the server {}: {e}", self.sni);
        if tls.get_ref().1.alpn_protocol() == Some(b"h2") {
            let (sender, connection) = http2::handshake(TokioExecutor::new(), TokioIo::new(tls))
                .await
                .map_err(failed)?;
            tokio::spawn(connection);
            return Ok(Sender::H2(sender));
        }
        let (sender, connection) = http1::handshake(TokioIo::new(tls)).await.map_err(failed)?;
        tokio::spawn(async move {
            let _ = connection.with_upgrades().await;
        });
        Ok(Sender::H1(sender))
    }

    fn log_tls(&self, reason: String) {
        let Some(sink) = &self.shared.audit else {
            return;
        };
        let mut e = sink.event(NetEventKind::Tls, NetDecision::Denied, reason);
        self.fill(&mut e);
        sink.emit(e);
    }

    fn log_request(
        &self,
        req: &RequestLog<'_>,
        decision: NetDecision,
        reason: String,
        status: u16,
    ) {
        let Some(sink) = &self.shared.audit else {
            return;
        };
        let mut e = sink.event(NetEventKind::Request, decision, reason);
        self.fill(&mut e);
        e.host = req.host.clone();
        e.method = Some(req.method.to_owned());
        e.path = Some(printable(req.path, MAX_LOGGED_PATH));
        e.credential = req.credential.map(str::to_owned);
        e.status = Some(status);
        sink.emit(e);
    }

    fn fill(&self, e: &mut lockbox_netsup::NetEvent) {
        e.protocol = Some(NetProtocol::Tcp);
        e.address = Some(lockbox_policy::canonical(self.dest.ip()));
        e.port = Some(self.dest.port());
        e.sni = Some(self.sni.clone());
        e.pid = self.pid;
        e.command = self.command.clone();
    }
}

/// Makes `req` one for an HTTP/1.1 server: the origin form, and a `Host` (an HTTP/2
/// request's authority, which names the server name, or the server name).
fn http1_form<B>(req: &mut Request<B>, sni: &str) {
    let authority = req.uri().authority().map(|a| a.as_str().to_owned());
    if authority.is_some() {
        let pq = req.uri().path_and_query().cloned();
        *req.uri_mut() = pq.map_or_else(|| Uri::from_static("/"), Uri::from);
    }
    if !req.headers().contains_key(HOST) {
        let host = authority.unwrap_or_else(|| sni.to_owned());
        if let Ok(host) = http::HeaderValue::from_str(&host) {
            req.headers_mut().insert(HOST, host);
        }
    }
    *req.version_mut() = http::Version::HTTP_11;
}

/// Makes `req` one for an HTTP/2 server: an absolute `https` URI whose authority (sent as
/// `:authority`) is the request's (its `Host`, which names the server name, perhaps with a
/// port; or the server name), and no `Host` (RFC 9113, 8.3.1).
fn http2_form<B>(req: &mut Request<B>, sni: &str) {
    let authority = req
        .headers_mut()
        .remove(HOST)
        .and_then(|h| h.to_str().ok().map(str::to_owned))
        .or_else(|| req.uri().authority().map(|a| a.as_str().to_owned()))
        .unwrap_or_else(|| sni.to_owned());
    let pq = req
        .uri()
        .path_and_query()
        .map_or("/", http::uri::PathAndQuery::as_str)
        .to_owned();
    // The authority passed `other_host` (it names the server name); one that is no URI
    // authority keeps the request as it was, and the server refuses it.
    if let Ok(uri) = Uri::builder()
        .scheme("https")
        .authority(authority.as_str())
        .path_and_query(pq)
        .build()
    {
        *req.uri_mut() = uri;
    }
    *req.version_mut() = http::Version::HTTP_2;
}

/// What an audit event says of a request.
struct RequestLog<'a> {
    method: &'a str,
    path: &'a str,
    /// The other host a refused request named.
    host: Option<String>,
    credential: Option<&'a str>,
}

/// The host other than `sni` that the request's `Host` or the authority of its absolute URI
/// names, if any (lower case, without port or trailing dot).
fn other_host<B>(req: &Request<B>, sni: &str) -> Option<String> {
    let from_uri = req.uri().host().map(str::to_owned);
    let from_header = req.headers().get_all(HOST).iter().map(|v| {
        match v
            .to_str()
            .ok()
            .and_then(|s| s.parse::<http::uri::Authority>().ok())
        {
            Some(a) => a.host().to_owned(),
            None => String::from_utf8_lossy(v.as_bytes()).into_owned(),
        }
    });
    from_uri
        .into_iter()
        .chain(from_header)
        .map(|h| h.trim_end_matches('.').to_ascii_lowercase())
        .find(|h| h != sni)
        .map(|h| printable(&h, 253))
}

/// Whether the request's authority (absolute target, `:authority`) or a `Host` has userinfo
/// (`evil.test@api.test`): the relay, lockbox and servers may each take another part of it
/// for the host, so none is taken.
fn has_userinfo<B>(req: &Request<B>) -> bool {
    req.uri()
        .authority()
        .is_some_and(|a| a.as_str().contains('@'))
        || req
            .headers()
            .get_all(HOST)
            .iter()
            .any(|v| v.as_bytes().contains(&b'@'))
}

fn text(status: StatusCode, body: String) -> Response<Body> {
    let mut response = Response::new(
        Full::new(Bytes::from(body))
            .map_err(|never| match never {})
            .boxed(),
    );
    *response.status_mut() = status;
    response.headers_mut().insert(
        http::header::CONTENT_TYPE,
        http::HeaderValue::from_static("text/plain; charset=utf-8"),
    );
    response
}

/// Printable ASCII, at most `max` bytes.
fn printable(s: &str, max: usize) -> String {
    s.chars()
        .map(|c| if c.is_ascii_graphic() { c } else { '?' })
        .take(max)
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn issue_32_userinfo_in_the_authority_or_host_is_found() {
        let req = |uri: &str, host: Option<&str>| {
            let mut b = Request::builder().uri(uri);
            if let Some(h) = host {
                b = b.header(HOST, h);
            }
            b.body(()).unwrap()
        };
        // HTTP/2's :authority arrives as the URI's authority.
        assert!(has_userinfo(&req("https://evil.test@api.test/v1", None)));
        assert!(has_userinfo(&req("/v1", Some("evil.test@api.test"))));
        assert!(has_userinfo(&req("/v1", Some("u:p@api.test:443"))));
        assert!(!has_userinfo(&req(
            "https://api.test/v1/a@b",
            Some("api.test")
        )));
        assert!(!has_userinfo(&req("/v1/a@b", Some("api.test:443"))));
    }
}
