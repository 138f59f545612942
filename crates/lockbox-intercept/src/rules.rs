//! The rules of interception, as parsed from `--credential`, `--http-auth` and
//! `--http-allow`: which credential goes on which host's requests, in which header, and which
//! methods and paths an intercepted host lets through. Plain data; no secret here.

use crate::error::Error;
use http::header::{HeaderName, AUTHORIZATION};
use std::path::PathBuf;

/// Where a credential's value is read from, once, when lockbox starts (`--credential
/// NAME[@HOSTS]=env:VAR|file:PATH`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CredentialSource {
    /// A variable of lockbox's own environment.
    Env(String),
    /// A file (its content, one trailing newline dropped).
    File(PathBuf),
}

/// One `--credential NAME[@HOST,HOST...]=SOURCE`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CredentialSpec {
    /// The name rules refer to it by (letters, digits, `_`, `-`).
    pub name: String,
    /// The hosts it may be sent to (normalised names), bound when it is registered: a
    /// rule that would send it elsewhere is refused. Empty: any host a rule names (only
    /// where the rules come from whoever registers it: `lockbox run`, an in-process caller;
    /// `lockbox serve` requires hosts).
    pub hosts: Vec<String>,
    /// Where its value comes from.
    pub source: CredentialSource,
}

impl std::str::FromStr for CredentialSpec {
    type Err = Error;

    fn from_str(arg: &str) -> Result<CredentialSpec, Error> {
        let bad = |reason: &str| Error::BadRule {
            flag: "--credential",
            rule: arg.to_owned(),
            reason: reason.to_owned(),
        };
        let (name, source) = arg
            .split_once('=')
            .ok_or_else(|| bad("expected NAME[@HOST,...]=env:VAR or NAME[@HOST,...]=file:PATH"))?;
        let (name, hosts) = match name.split_once('@') {
            Some((name, hosts)) => {
                let hosts = hosts
                    .split(',')
                    .map(host_name)
                    .collect::<Result<Vec<_>, _>>()
                    .map_err(|r| bad(&r))?;
                (name, hosts)
            }
            None => (name, Vec::new()),
        };
        check_name(name).map_err(|r| bad(&r))?;
        let source = if let Some(var) = source.strip_prefix("env:") {
            if var.is_empty() || var.contains('=') || var.contains('\0') {
                return Err(bad("env: needs a variable name"));
            }
            CredentialSource::Env(var.to_owned())
        } else if let Some(path) = source.strip_prefix("file:") {
            if path.is_empty() {
                return Err(bad("file: needs a path"));
            }
            CredentialSource::File(PathBuf::from(path))
        } else {
            return Err(bad(
                "the source must be env:VAR or file:PATH (never the value itself, which would show in the process list)",
            ));
        };
        Ok(CredentialSpec {
            name: name.to_owned(),
            hosts,
            source,
        })
    }
}

fn check_name(name: &str) -> Result<(), String> {
    let ok = !name.is_empty()
        && name.len() <= 64
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-');
    if ok {
        Ok(())
    } else {
        Err(format!(
            "{name:?} is not a credential name (1 to 64 letters, digits, '_' or '-')"
        ))
    }
}

/// How a credential is written into its header.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum AuthScheme {
    /// `Authorization: Bearer VALUE`.
    Bearer,
    /// `HEADER: VALUE`.
    Header(HeaderName),
}

/// One `--http-auth 'HOST bearer NAME'` or `--http-auth 'HOST header X-Api-Key NAME'`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AuthRule {
    /// The host (normalised: lower case, ASCII, no trailing dot).
    pub host: String,
    /// The header and its form.
    pub scheme: AuthScheme,
    /// The credential's name.
    pub credential: String,
}

impl AuthRule {
    /// The header the credential goes in.
    pub fn header(&self) -> HeaderName {
        match &self.scheme {
            AuthScheme::Bearer => AUTHORIZATION,
            AuthScheme::Header(h) => h.clone(),
        }
    }
}

/// The rule as `--http-auth` takes it (`HOST bearer NAME`, `HOST header HEADER NAME`):
/// parsing the text gives the rule back. Names the credential, never holds its value.
impl std::fmt::Display for AuthRule {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match &self.scheme {
            AuthScheme::Bearer => write!(f, "{} bearer {}", self.host, self.credential),
            AuthScheme::Header(h) => write!(f, "{} header {} {}", self.host, h, self.credential),
        }
    }
}

impl std::str::FromStr for AuthRule {
    type Err = Error;

    fn from_str(arg: &str) -> Result<AuthRule, Error> {
        let bad = |reason: String| Error::BadRule {
            flag: "--http-auth",
            rule: arg.to_owned(),
            reason,
        };
        let words: Vec<&str> = arg.split_whitespace().collect();
        let (host, scheme, credential) = match words.as_slice() {
            [host, kind, name] if kind.eq_ignore_ascii_case("bearer") => {
                (*host, AuthScheme::Bearer, *name)
            }
            [host, kind, header, name] if kind.eq_ignore_ascii_case("header") => {
                let header = HeaderName::from_bytes(header.as_bytes())
                    .map_err(|_| bad(format!("{header:?} is not a header name")))?;
                (*host, AuthScheme::Header(header), *name)
            }
            _ => {
                return Err(bad(
                    "expected 'HOST bearer NAME' or 'HOST header HEADER-NAME NAME'".to_owned(),
                ))
            }
        };
        check_name(credential).map_err(bad)?;
        Ok(AuthRule {
            host: host_name(host).map_err(bad)?,
            scheme,
            credential: credential.to_owned(),
        })
    }
}

/// One `--http-allow 'METHOD HOST/PATH-PREFIX'`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AllowRule {
    /// The method, upper case; `None` for `*` (any).
    pub method: Option<String>,
    /// The host (normalised).
    pub host: String,
    /// The path prefix, starting with `/`, as [`canonical_path`] reads it: it matches
    /// itself and what lies below it (`/v1/models` matches `/v1/models` and `/v1/models/x`,
    /// not `/v1/modelsx`).
    pub prefix: String,
}

impl std::str::FromStr for AllowRule {
    type Err = Error;

    fn from_str(arg: &str) -> Result<AllowRule, Error> {
        let bad = |reason: String| Error::BadRule {
            flag: "--http-allow",
            rule: arg.to_owned(),
            reason,
        };
        let words: Vec<&str> = arg.split_whitespace().collect();
        let [method, target] = words.as_slice() else {
            return Err(bad(
                "expected 'METHOD HOST/PATH-PREFIX' (METHOD may be *)".to_owned()
            ));
        };
        let method = match *method {
            "*" => None,
            m if !m.is_empty() && m.bytes().all(|b| b.is_ascii_alphabetic()) => {
                Some(m.to_ascii_uppercase())
            }
            m => return Err(bad(format!("{m:?} is not an HTTP method"))),
        };
        let (host, prefix) = match target.find('/') {
            Some(i) => (&target[..i], &target[i..]),
            None => (*target, "/"),
        };
        let prefix = canonical_path(prefix)
            .map_err(|why| bad(format!("the path prefix {prefix:?} has {why}")))?;
        Ok(AllowRule {
            method,
            host: host_name(host).map_err(bad)?,
            prefix,
        })
    }
}

/// The rule as `--http-allow` takes it (`METHOD HOST/PREFIX`, `*` for any method): parsing
/// the text gives the rule back.
impl std::fmt::Display for AllowRule {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let method = self.method.as_deref().unwrap_or("*");
        write!(f, "{method} {}{}", self.host, self.prefix)
    }
}

impl AllowRule {
    /// Whether the rule lets a `method` request for `path` (canonical) through.
    fn matches(&self, method: &str, path: &str) -> bool {
        let method_ok = self
            .method
            .as_deref()
            .is_none_or(|m| m.eq_ignore_ascii_case(method));
        let prefix = self.prefix.trim_end_matches('/');
        let path_ok = match path.strip_prefix(prefix) {
            Some(rest) => rest.is_empty() || rest.starts_with('/'),
            None => false,
        };
        method_ok && path_ok
    }
}

/// The one reading of a request path (or a rule's prefix), or why it has none.
///
/// Servers and frameworks disagree on paths: Tomcat drops `;` parameters (`/a/..;/admin`),
/// IIS decodes `%u002e`, some decode twice (`%252e`), some fold fullwidth or overlong UTF-8
/// forms to ASCII (`%EF%BC%8E`), some stop at NUL or trim spaces, Windows servers read `\`
/// as `/`. So a path is read one way, and refused unless every server reads it so: only
/// printable ASCII other than `\` and `;`; `%XX` only for a printable ASCII byte that is
/// none of `.`, `/`, `\`, `%` (a second encoding), `;`, `?`, `#`; and, once decoded, no
/// segment made of dots only. The decoded path is what rules match; the request goes to the
/// server as it came, whose bytes are exactly those checked.
pub fn canonical_path(path: &str) -> Result<String, &'static str> {
    let bytes = path.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while let Some(&b) = bytes.get(i) {
        let decoded = if b == b'%' {
            let hex = |at: usize| bytes.get(at).and_then(|c| (*c as char).to_digit(16));
            let (Some(hi), Some(lo)) = (hex(i + 1), hex(i + 2)) else {
                return Err("a '%' not followed by two hex digits (as in %u002e)");
            };
            i += 3;
            let d = (hi * 16 + lo) as u8;
            if !d.is_ascii_graphic() {
                return Err("an escaped byte that is not printable ASCII (NUL, a space, UTF-8 such as a fullwidth or overlong '.')");
            }
            if matches!(d, b'.' | b'/' | b'\\' | b'%' | b';' | b'?' | b'#') {
                return Err("an escaped '.', '/', '\\', '%', ';', '?' or '#' (a server may decode it, or decode twice)");
            }
            d
        } else {
            i += 1;
            if !b.is_ascii_graphic() {
                return Err("a byte that is not printable ASCII");
            }
            match b {
                b'\\' => return Err("a '\\' (a server may read it as '/')"),
                b';' => return Err("a ';' (a server may drop path parameters, as in '..;')"),
                b'?' | b'#' => return Err("a query or fragment"),
                _ => b,
            }
        };
        out.push(decoded);
    }
    if out
        .split(|b| *b == b'/')
        .any(|seg| !seg.is_empty() && seg.iter().all(|b| *b == b'.'))
    {
        return Err("a '.' or '..' segment");
    }
    // Only printable ASCII was pushed.
    String::from_utf8(out).map_err(|_| "a byte that is not printable ASCII")
}

fn host_name(host: &str) -> Result<String, String> {
    lockbox_policy::normalize_name(host).ok_or_else(|| {
        format!("{host:?} is not a host name (an intercepted host is named, not an address or a wildcard)")
    })
}

/// Why lockbox refused a request on an intercepted host.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Refusal {
    /// No `--http-allow` rule of the host lists the method and path.
    NotListed,
    /// The path could be read otherwise by the server ([`canonical_path`] says why).
    AmbiguousPath(&'static str),
    /// The request's `Host` or authority carries userinfo (`user@host`), which the relay,
    /// lockbox and servers may each read otherwise.
    Userinfo,
    /// The request names another host than the TLS server name.
    OtherHost(String),
    /// `TRACE` (or `TRACK`): the server would echo the request, credential included.
    Reflecting,
}

impl std::fmt::Display for Refusal {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Refusal::NotListed => f.write_str("not allowed by --http-allow"),
            Refusal::AmbiguousPath(why) => write!(
                f,
                "the path has {why} (refused, as the server could read it otherwise)"
            ),
            Refusal::Userinfo => f.write_str(
                "the request's Host or authority has userinfo ('@'), which servers read differently",
            ),
            Refusal::OtherHost(h) => write!(f, "the request names host {h:?}, not the TLS server name"),
            Refusal::Reflecting => f.write_str(
                "TRACE and TRACK are refused on intercepted hosts (the server would echo the credential back)",
            ),
        }
    }
}

/// Every rule of a sandbox: which hosts are intercepted, with which credential, and what
/// their requests may be.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct HttpRules {
    /// `--http-auth` rules, one per host at most.
    pub auth: Vec<AuthRule>,
    /// `--http-allow` rules.
    pub allow: Vec<AllowRule>,
}

impl HttpRules {
    /// Rules from the parsed flags; refuses two `--http-auth` rules for one host.
    pub fn new(auth: Vec<AuthRule>, allow: Vec<AllowRule>) -> Result<HttpRules, Error> {
        for (i, rule) in auth.iter().enumerate() {
            if auth[..i].iter().any(|r| r.host == rule.host) {
                return Err(Error::BadRule {
                    flag: "--http-auth",
                    rule: rule.host.clone(),
                    reason: "a host takes one --http-auth rule".to_owned(),
                });
            }
        }
        Ok(HttpRules { auth, allow })
    }

    /// Whether there is no rule at all.
    pub fn is_empty(&self) -> bool {
        self.auth.is_empty() && self.allow.is_empty()
    }

    /// The hosts lockbox intercepts, each once.
    pub fn hosts(&self) -> Vec<&str> {
        let mut hosts: Vec<&str> = self
            .auth
            .iter()
            .map(|r| r.host.as_str())
            .chain(self.allow.iter().map(|r| r.host.as_str()))
            .collect();
        hosts.sort_unstable();
        hosts.dedup();
        hosts
    }

    /// Whether `host` (normalised) is intercepted.
    pub fn intercepts(&self, host: &str) -> bool {
        self.auth.iter().any(|r| r.host == host) || self.allow.iter().any(|r| r.host == host)
    }

    /// The credential rule of `host`, if any.
    pub fn auth_for(&self, host: &str) -> Option<&AuthRule> {
        self.auth.iter().find(|r| r.host == host)
    }

    /// Whether a `method` request for `path` (without its query, as it came) may go to
    /// `host`: every request when no `--http-allow` rule names the host, else only those a
    /// rule lists, matched on the path's one reading ([`canonical_path`]). Ambiguous paths
    /// and `TRACE`/`TRACK` are refused either way.
    pub fn check(&self, method: &str, host: &str, path: &str) -> Result<(), Refusal> {
        if method.eq_ignore_ascii_case("TRACE") || method.eq_ignore_ascii_case("TRACK") {
            return Err(Refusal::Reflecting);
        }
        let path = canonical_path(path).map_err(Refusal::AmbiguousPath)?;
        let mut rules = self.allow.iter().filter(|r| r.host == host).peekable();
        if rules.peek().is_none() {
            return Ok(());
        }
        if rules.any(|r| r.matches(method, &path)) {
            Ok(())
        } else {
            Err(Refusal::NotListed)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rules(auth: &[&str], allow: &[&str]) -> HttpRules {
        HttpRules::new(
            auth.iter().map(|a| a.parse().unwrap()).collect(),
            allow.iter().map(|a| a.parse().unwrap()).collect(),
        )
        .unwrap()
    }

    #[test]
    fn credential_sources_are_env_or_file_never_the_value() {
        let spec: CredentialSpec = "API=env:API_KEY".parse().unwrap();
        assert_eq!(spec.source, CredentialSource::Env("API_KEY".into()));
        let spec: CredentialSpec = "gh=file:/run/secrets/gh".parse().unwrap();
        assert_eq!(
            spec.source,
            CredentialSource::File("/run/secrets/gh".into())
        );
        let spec: CredentialSpec = "API@Api.Example.org.,b.example=env:K".parse().unwrap();
        assert_eq!(spec.name, "API");
        assert_eq!(spec.hosts, ["api.example.org", "b.example"]);
        assert_eq!(spec.source, CredentialSource::Env("K".into()));
        assert!("API=env:K"
            .parse::<CredentialSpec>()
            .unwrap()
            .hosts
            .is_empty());
        for bad in [
            "API@=env:X",
            "API@*.example.org=env:X",
            "API@10.0.0.1=env:X",
            "API@a.example,=env:X",
            "API=sk-123",
            "API",
            "=env:X",
            "A B=env:X",
            "API=env:",
            "API=file:",
        ] {
            assert!(bad.parse::<CredentialSpec>().is_err(), "{bad}");
        }
    }

    #[test]
    fn auth_rules_name_a_host_a_header_and_a_credential() {
        let r: AuthRule = "API.Example.org. bearer API".parse().unwrap();
        assert_eq!(r.host, "api.example.org");
        assert_eq!(r.header(), AUTHORIZATION);
        let r: AuthRule = "api.example.org header X-Api-Key API".parse().unwrap();
        assert_eq!(r.header().as_str(), "x-api-key");
        for bad in [
            "api.example.org API",
            "api.example.org basic API",
            "*.example.org bearer API",
            "10.0.0.1 bearer API",
            "api.example.org header Bad:Name API",
        ] {
            assert!(bad.parse::<AuthRule>().is_err(), "{bad}");
        }
    }

    #[test]
    fn allow_rules_match_whole_path_segments_and_the_method() {
        let r = rules(
            &[],
            &[
                "GET api.example.org/v1/models",
                "post api.example.org/v1/chat/",
            ],
        );
        assert_eq!(r.check("GET", "api.example.org", "/v1/models"), Ok(()));
        assert_eq!(r.check("GET", "api.example.org", "/v1/models/gpt"), Ok(()));
        assert_eq!(r.check("POST", "api.example.org", "/v1/chat/x"), Ok(()));
        assert_eq!(r.check("POST", "api.example.org", "/v1/chat"), Ok(()));
        assert_eq!(
            r.check("GET", "api.example.org", "/v1/modelsx"),
            Err(Refusal::NotListed)
        );
        assert_eq!(
            r.check("DELETE", "api.example.org", "/v1/models"),
            Err(Refusal::NotListed)
        );
        assert!(matches!(
            r.check("GET", "api.example.org", "/v1/models/../../admin"),
            Err(Refusal::AmbiguousPath(_))
        ));
        assert!(matches!(
            r.check("GET", "api.example.org", "/v1/models/%2E%2e/admin"),
            Err(Refusal::AmbiguousPath(_))
        ));
        // A host without --http-allow rules takes every request.
        assert_eq!(r.check("DELETE", "other.example.org", "/x"), Ok(()));
    }

    #[test]
    fn issue_32_paths_a_server_could_read_otherwise_are_refused_before_any_rule() {
        let r = rules(&[], &["GET echo.test/v1/models"]);
        for path in [
            "/v1/models/..;/admin",
            "/v1/models/..;x=1/admin",
            "/v1/models/%u002e%u002e/admin",
            "/v1/models/%EF%BC%8E%EF%BC%8E/admin",
            "/v1/models/%C0%AE%C0%AE/admin",
            "/v1/models/%252e%252e/admin",
            "/v1/models/.%00./admin",
            "/v1/models/%00/admin",
            "/v1/models/x%3b/admin",
            "/v1/models/..%5cadmin",
            "/v1/models\\..\\admin",
            "/v1/models/%2f..%2fadmin",
            "/v1/models/%20..%20/admin",
            "/v1/models/.../admin",
            "/v1/models/%",
            "/v1/models/%4",
            "/v1/models/\u{ff0e}\u{ff0e}/admin",
        ] {
            assert!(
                matches!(
                    r.check("GET", "echo.test", path),
                    Err(Refusal::AmbiguousPath(_))
                ),
                "{path}"
            );
        }
        // Unambiguous escapes are read decoded, for the rule and for the server alike.
        assert_eq!(r.check("GET", "echo.test", "/v1/%6Dodels/ft%3Ax"), Ok(()));
        assert_eq!(
            r.check("GET", "echo.test", "/v1/%6Dodelsx"),
            Err(Refusal::NotListed)
        );
        assert_eq!(
            canonical_path("/v1/%6dodels/a%2Db").as_deref(),
            Ok("/v1/models/a-b")
        );
        // A rule's prefix is read the same way, and refused when ambiguous.
        assert_eq!(
            "GET a.example/v%31".parse::<AllowRule>().unwrap().prefix,
            "/v1"
        );
        for bad in [
            "GET a.example/v1;x",
            "GET a.example/v1/%2e",
            "GET a.example/%u0041",
        ] {
            assert!(bad.parse::<AllowRule>().is_err(), "{bad}");
        }
    }

    #[test]
    fn canonical_paths_hold_no_dot_segment_and_no_escape_that_decodes_again() {
        // Every string over an alphabet of the tricky pieces: what is accepted reads back
        // to itself once escaped again, and never has a dot segment or a second escape.
        let pieces = [
            "/", ".", "%2e", "%25", "%41", ";", "a", "%", "%00", "\\", "%c0%ae",
        ];
        let mut x: u64 = 0x2545_f491_4f6c_dd1d;
        for _ in 0..50_000 {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            let mut path = String::new();
            let mut y = x;
            for _ in 0..(1 + (x % 8)) {
                path.push_str(pieces[(y % pieces.len() as u64) as usize]);
                y /= pieces.len() as u64;
            }
            let Ok(c) = canonical_path(&path) else {
                continue;
            };
            assert!(c.bytes().all(|b| b.is_ascii_graphic()), "{path}");
            assert!(!c.contains(['%', ';', '\\']), "{path} -> {c}");
            assert!(
                !c.split('/')
                    .any(|s| !s.is_empty() && s.bytes().all(|b| b == b'.')),
                "{path} -> {c}"
            );
            assert_eq!(canonical_path(&c).as_deref(), Ok(c.as_str()), "{path}");
        }
    }

    #[test]
    fn a_star_method_and_a_bare_host_allow_everything_there() {
        let r = rules(&[], &["* api.example.org"]);
        assert_eq!(r.check("PATCH", "api.example.org", "/anything"), Ok(()));
        assert_eq!(r.check("GET", "api.example.org", "/"), Ok(()));
        // Except the methods whose answer echoes the request, credential included.
        assert_eq!(
            r.check("TRACE", "api.example.org", "/"),
            Err(Refusal::Reflecting)
        );
    }

    #[test]
    fn rules_read_back_from_their_text() {
        for text in [
            "API.Example.org bearer API",
            "api.example.org header X-Api-Key KEY",
        ] {
            let rule: AuthRule = text.parse().unwrap();
            assert_eq!(
                rule.to_string().parse::<AuthRule>().unwrap(),
                rule,
                "{text}"
            );
        }
        assert_eq!(
            "a.example header X-Api-Key K"
                .parse::<AuthRule>()
                .unwrap()
                .to_string(),
            "a.example header x-api-key K"
        );
        for text in [
            "get API.example.org/v1/models",
            "* a.example",
            "POST a.example/x/",
        ] {
            let rule: AllowRule = text.parse().unwrap();
            assert_eq!(
                rule.to_string().parse::<AllowRule>().unwrap(),
                rule,
                "{text}"
            );
        }
        assert_eq!(
            "* a.example".parse::<AllowRule>().unwrap().to_string(),
            "* a.example/"
        );
    }

    #[test]
    fn a_host_takes_one_auth_rule() {
        let auth = vec![
            "a.example bearer A".parse().unwrap(),
            "a.example bearer B".parse().unwrap(),
        ];
        assert!(HttpRules::new(auth, Vec::new()).is_err());
    }

    #[test]
    fn intercepted_hosts_are_those_of_every_rule() {
        let r = rules(
            &["a.example bearer A"],
            &["GET b.example/x", "GET a.example/y"],
        );
        assert_eq!(r.hosts(), vec!["a.example", "b.example"]);
        assert!(r.intercepts("b.example"));
        assert!(!r.intercepts("c.example"));
    }
}
