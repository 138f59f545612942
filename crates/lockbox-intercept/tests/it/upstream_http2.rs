//! The interceptor towards real servers of either HTTP version: it offers `h2` and
//! `http/1.1` by ALPN, speaks HTTP/2 to a server that picks `h2` (whatever the sandbox's
//! client speaks, and with the credential set as for HTTP/1.1), and HTTP/1.1 to one that
//! does not.
//!
//! The servers are hyper's (HTTP/2 and HTTP/1) over rustls on 127.0.0.1, with a certificate
//! for `api.test` from a CA the test makes and names as the upstream CA. The sandbox's side
//! is a connection handed to the interceptor as the relay would hand it, whose client is
//! hyper's over rustls trusting the interceptor's CA. No sandbox is needed: what is tested
//! is what goes over the wire on each side.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use bytes::Bytes;
use http::{Request, Response, Version};
use http_body_util::{BodyExt, Empty, Full};
use hyper::body::Incoming;
use hyper_util::rt::{TokioExecutor, TokioIo};
use lockbox_intercept::{Authority, CredentialSpec, Credentials, HttpRules, Interceptor};
use lockbox_netsup::{Intercepted, Interceptor as _, RelaySlot};
use rustls::server::{ClientHello, ResolvesServerCert};
use rustls::sign::CertifiedKey;
use rustls::{ClientConfig, RootCertStore, ServerConfig};
use rustls_pki_types::pem::PemObject;
use rustls_pki_types::{CertificateDer, ServerName};
use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use tokio::io::{AsyncBufReadExt, AsyncWriteExt};

const SECRET: &str = "sk-test-secret-of-the-upstream";

#[derive(Debug)]
struct OneCert(Arc<CertifiedKey>);

impl ResolvesServerCert for OneCert {
    fn resolve(&self, _: ClientHello<'_>) -> Option<Arc<CertifiedKey>> {
        Some(self.0.clone())
    }
}

fn provider() -> Arc<rustls::crypto::CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}

/// A real server for `api.test` (certificate from `ca`) offering `alpn`, answering each
/// request `VERSION AUTHORIZATION AUTHORITY PATH` (the authority from the URI, else from
/// `Host`), and an HTTP/1.1 request with `Upgrade: echo` with 101, then `echo LINE` for
/// each line; its address and a count of the connections it accepted.
fn server(ca: &Authority, alpn: &[&[u8]]) -> (SocketAddr, Arc<AtomicUsize>) {
    let mut config = ServerConfig::builder_with_provider(provider())
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_no_client_auth()
        .with_cert_resolver(Arc::new(OneCert(ca.leaf("api.test").unwrap())));
    config.alpn_protocols = alpn.iter().map(|p| p.to_vec()).collect();
    let acceptor = tokio_rustls::TlsAcceptor::from(Arc::new(config));
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    listener.set_nonblocking(true).unwrap();
    let addr = listener.local_addr().unwrap();
    let accepted = Arc::new(AtomicUsize::new(0));
    let count = accepted.clone();
    std::thread::spawn(move || {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        rt.block_on(async move {
            let listener = tokio::net::TcpListener::from_std(listener).unwrap();
            while let Ok((tcp, _)) = listener.accept().await {
                count.fetch_add(1, Ordering::SeqCst);
                let acceptor = acceptor.clone();
                tokio::spawn(async move {
                    let Ok(tls) = acceptor.accept(tcp).await else {
                        return;
                    };
                    let h2 = tls.get_ref().1.alpn_protocol() == Some(b"h2");
                    let service =
                        hyper::service::service_fn(|mut req: Request<Incoming>| async move {
                            if req.headers().get(http::header::UPGRADE).is_some() {
                                let upgraded = hyper::upgrade::on(&mut req);
                                tokio::spawn(async move {
                                    let Ok(upgraded) = upgraded.await else { return };
                                    let (read, mut write) =
                                        tokio::io::split(TokioIo::new(upgraded));
                                    let mut lines = tokio::io::BufReader::new(read).lines();
                                    while let Ok(Some(line)) = lines.next_line().await {
                                        let echo = format!("echo {line}\n");
                                        if write.write_all(echo.as_bytes()).await.is_err() {
                                            break;
                                        }
                                    }
                                });
                                let mut response = Response::new(Full::new(Bytes::new()));
                                *response.status_mut() = http::StatusCode::SWITCHING_PROTOCOLS;
                                let headers = response.headers_mut();
                                headers.insert(http::header::UPGRADE, "echo".parse().unwrap());
                                headers
                                    .insert(http::header::CONNECTION, "upgrade".parse().unwrap());
                                return Ok::<_, Infallible>(response);
                            }
                            let header = |name: http::header::HeaderName| {
                                req.headers()
                                    .get(name)
                                    .map(|v| v.to_str().unwrap().to_owned())
                            };
                            let auth = header(http::header::AUTHORIZATION).unwrap_or("-".into());
                            let authority = req
                                .uri()
                                .authority()
                                .map(ToString::to_string)
                                .or_else(|| header(http::header::HOST))
                                .unwrap_or("-".into());
                            let body = format!(
                                "{:?} {auth} {authority} {}",
                                req.version(),
                                req.uri().path()
                            );
                            Ok::<_, Infallible>(Response::new(Full::new(Bytes::from(body))))
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
                });
            }
        });
    });
    (addr, accepted)
}

/// An interceptor setting `Authorization: Bearer SECRET` on api.test, trusting `ca` for
/// the real server.
fn interceptor(ca: &Authority, dir: &std::path::Path) -> Interceptor {
    let rules = HttpRules::new(vec!["api.test bearer API".parse().unwrap()], Vec::new()).unwrap();
    let specs: Vec<CredentialSpec> = vec!["API=env:API".parse().unwrap()];
    let credentials = Credentials::load(&specs, &rules, |_| Some(SECRET.into())).unwrap();
    let ca_file = dir.join("upstream-ca.pem");
    std::fs::write(&ca_file, ca.pem()).unwrap();
    Interceptor::start(rules, credentials, Some(&ca_file), None).unwrap()
}

/// A connection of the sandbox's client speaking `version` (by ALPN) to api.test, handed to
/// `interceptor` as the relay would hand it, towards `server`.
async fn connect(
    interceptor: &Interceptor,
    server: SocketAddr,
    version: Version,
) -> TokioIo<tokio_rustls::client::TlsStream<tokio::net::TcpStream>> {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let client = std::net::TcpStream::connect(listener.local_addr().unwrap()).unwrap();
    let (ours, _) = listener.accept().unwrap();
    let upstream = std::net::TcpStream::connect(server).unwrap();
    interceptor.take(Intercepted {
        client: ours.into(),
        first_flight: Vec::new(),
        upstream: upstream.into(),
        dest: server,
        sni: "api.test".to_owned(),
        pid: None,
        command: None,
        slot: RelaySlot::unbounded(),
    });
    let mut roots = RootCertStore::empty();
    for cert in CertificateDer::pem_slice_iter(interceptor.ca_pem().as_bytes()) {
        roots.add(cert.unwrap()).unwrap();
    }
    let mut config = ClientConfig::builder_with_provider(provider())
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_root_certificates(roots)
        .with_no_client_auth();
    config.alpn_protocols = if version == Version::HTTP_2 {
        vec![b"h2".to_vec()]
    } else {
        vec![b"http/1.1".to_vec()]
    };
    client.set_nonblocking(true).unwrap();
    let tcp = tokio::net::TcpStream::from_std(client).unwrap();
    let tls = tokio_rustls::TlsConnector::from(Arc::new(config))
        .connect(ServerName::try_from("api.test").unwrap(), tcp)
        .await
        .unwrap();
    TokioIo::new(tls)
}

/// Sends `paths` (concurrently with HTTP/2) as the sandbox's client speaking `version`, on
/// one connection (see [`connect`]): each response's version (as the client sees it) and
/// body.
async fn fetch(
    interceptor: &Interceptor,
    server: SocketAddr,
    version: Version,
    paths: &[&str],
) -> Vec<String> {
    let io = connect(interceptor, server, version).await;
    let request = |path: &str| {
        let builder = Request::get(if version == Version::HTTP_2 {
            format!("https://api.test{path}")
        } else {
            path.to_owned()
        });
        let builder = if version == Version::HTTP_2 {
            builder
        } else {
            builder.header(http::header::HOST, "api.test")
        };
        builder
            .header(http::header::AUTHORIZATION, "Bearer PLACEHOLDER")
            .body(Empty::<Bytes>::new())
            .unwrap()
    };
    let read = |response: Response<Incoming>| async move {
        let seen = response.version();
        let body = response.into_body().collect().await.unwrap().to_bytes();
        format!("{seen:?}: {}", String::from_utf8_lossy(&body))
    };
    if version == Version::HTTP_2 {
        let (sender, connection) = hyper::client::conn::http2::handshake(TokioExecutor::new(), io)
            .await
            .unwrap();
        tokio::spawn(connection);
        let all = paths.iter().map(|p| {
            let mut sender = sender.clone();
            let req = request(p);
            async move { read(sender.send_request(req).await.unwrap()).await }
        });
        futures_util::future::join_all(all).await
    } else {
        let (mut sender, connection) = hyper::client::conn::http1::handshake(io).await.unwrap();
        tokio::spawn(connection);
        let mut out = Vec::new();
        for p in paths {
            out.push(read(sender.send_request(request(p)).await.unwrap()).await);
        }
        out
    }
}

fn run<F: std::future::Future>(f: F) -> F::Output {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap()
        .block_on(f)
}

#[test]
fn a_server_that_picks_h2_gets_http2_with_the_credential_from_http1_and_http2_clients() {
    let dir = tempfile::tempdir().unwrap();
    let ca = Authority::new(&["api.test"]).unwrap();
    let (addr, accepted) = server(&ca, &[b"h2", b"http/1.1"]);
    let interceptor = interceptor(&ca, dir.path());
    let want = |path: &str| format!("HTTP/1.1: HTTP/2.0 Bearer {SECRET} api.test {path}");
    let got = run(fetch(
        &interceptor,
        addr,
        Version::HTTP_11,
        &["/v1/a", "/v1/b"],
    ));
    assert_eq!(got, [want("/v1/a"), want("/v1/b")]);
    // An HTTP/2 client's concurrent requests go as streams of one connection to the server.
    let got = run(fetch(
        &interceptor,
        addr,
        Version::HTTP_2,
        &["/x", "/y", "/z"],
    ));
    let want2 = |path: &str| format!("HTTP/2.0: HTTP/2.0 Bearer {SECRET} api.test {path}");
    assert_eq!(got, [want2("/x"), want2("/y"), want2("/z")]);
    assert_eq!(
        accepted.load(Ordering::SeqCst),
        2,
        "one connection per client connection"
    );
}

#[test]
fn a_server_that_speaks_only_http1_still_gets_http1_with_the_credential() {
    let dir = tempfile::tempdir().unwrap();
    let ca = Authority::new(&["api.test"]).unwrap();
    let (addr, _) = server(&ca, &[b"http/1.1"]);
    let interceptor = interceptor(&ca, dir.path());
    let got = run(fetch(&interceptor, addr, Version::HTTP_2, &["/v1/models"]));
    assert_eq!(
        got,
        [format!(
            "HTTP/2.0: HTTP/1.1 Bearer {SECRET} api.test /v1/models"
        )]
    );
    // A server without ALPN at all.
    let (addr, _) = server(&ca, &[]);
    let got = run(fetch(&interceptor, addr, Version::HTTP_11, &["/v1/models"]));
    assert_eq!(
        got,
        [format!(
            "HTTP/1.1: HTTP/1.1 Bearer {SECRET} api.test /v1/models"
        )]
    );
}

#[test]
fn an_upgrade_goes_on_an_http1_connection_of_its_own_when_the_kept_one_is_http2() {
    let dir = tempfile::tempdir().unwrap();
    let ca = Authority::new(&["api.test"]).unwrap();
    let (addr, accepted) = server(&ca, &[b"h2", b"http/1.1"]);
    let interceptor = interceptor(&ca, dir.path());
    let (first, echoed) = run(async {
        let io = connect(&interceptor, addr, Version::HTTP_11).await;
        let (mut sender, connection) = hyper::client::conn::http1::handshake(io).await.unwrap();
        tokio::spawn(connection.with_upgrades());
        let get = Request::get("/v1/a")
            .header(http::header::HOST, "api.test")
            .body(Empty::<Bytes>::new())
            .unwrap();
        let response = sender.send_request(get).await.unwrap();
        let body = response.into_body().collect().await.unwrap().to_bytes();
        let upgrade = Request::get("/ws")
            .header(http::header::HOST, "api.test")
            .header(http::header::CONNECTION, "upgrade")
            .header(http::header::UPGRADE, "echo")
            .body(Empty::<Bytes>::new())
            .unwrap();
        let response = sender.send_request(upgrade).await.unwrap();
        assert_eq!(response.status(), http::StatusCode::SWITCHING_PROTOCOLS);
        let upgraded = hyper::upgrade::on(response).await.unwrap();
        let (read, mut write) = tokio::io::split(TokioIo::new(upgraded));
        write.write_all(b"ping\n").await.unwrap();
        let mut line = String::new();
        tokio::io::BufReader::new(read)
            .read_line(&mut line)
            .await
            .unwrap();
        (String::from_utf8_lossy(&body).into_owned(), line)
    });
    assert_eq!(first, format!("HTTP/2.0 Bearer {SECRET} api.test /v1/a"));
    assert_eq!(echoed, "echo ping\n");
    assert_eq!(
        accepted.load(Ordering::SeqCst),
        2,
        "the kept HTTP/2 connection, and the upgrade's own"
    );
}
