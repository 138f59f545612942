//! Network policy: [`Net`] (none, host, an allow-list or a deny-list), the destination
//! specs the lists hold ([`NetSpec`], parsed by [`NetSpec::parse`]), their resolved form
//! ([`NetRule`]) and the one decision every intercepted call asks ([`route`]).
//!
//! Pure: names are matched here ([`NetSpec::matches_name`], [`normalize_name`]) and resolved
//! by `lockbox-confine`: an allow-list's names when the sandbox asks its resolver (lockbox),
//! a deny-list's once at sandbox start ([`NetSpec::rules`]).

use crate::error::PolicyError;
use serde::{Deserialize, Serialize};
use std::fmt;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};

/// Network access of a sandbox.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Net {
    /// A private network namespace with only loopback (the default).
    #[default]
    None,
    /// The host's network, unchanged.
    Host,
    /// A private namespace with loopback, plus the host-network destinations listed.
    Allow(Vec<NetSpec>),
    /// The host's network except the destinations listed (and the host's loopback).
    Deny(Vec<NetSpec>),
}

impl Net {
    /// Whether the sandbox gets its own network namespace (every mode but `Host`).
    pub fn own_namespace(&self) -> bool {
        !matches!(self, Net::Host)
    }

    /// The specs of an allow- or deny-list (empty for `None` and `Host`).
    pub fn specs(&self) -> &[NetSpec] {
        match self {
            Net::Allow(specs) | Net::Deny(specs) => specs,
            Net::None | Net::Host => &[],
        }
    }
}

/// What [`Net`]'s `Deserialize` takes (`"none"`, `"host"`, `{"allow": [SPEC...]}`,
/// `{"deny": [SPEC...]}`, each SPEC a [`NetSpec`] as text): component `NetChoice` of
/// lockbox-server's OpenAPI document, its two words component `NetMode`.
#[cfg(feature = "openapi")]
impl utoipa::PartialSchema for Net {
    fn schema() -> utoipa::openapi::RefOr<utoipa::openapi::schema::Schema> {
        use utoipa::openapi::schema::{
            ArrayBuilder, ObjectBuilder, OneOfBuilder, RefBuilder, Type,
        };
        let list = |key: &str, title: &str, description: &str| {
            ObjectBuilder::new()
                .schema_type(Type::Object)
                .title(Some(title))
                .description(Some(description))
                .property(
                    key,
                    ArrayBuilder::new()
                        .items(ObjectBuilder::new().schema_type(Type::String))
                        .description(Some("The destinations.")),
                )
                .required(key)
        };
        OneOfBuilder::new()
            .item(
                RefBuilder::new()
                    .ref_location_from_schema_name(net_mode::NAME)
                    .description(Some("`none` or `host`.")),
            )
            .item(list(
                "allow",
                "NetAllow",
                "Only these destinations ([tcp://|udp://]HOST:PORTS; HOST a name, *.name for its\n\
                 subdomains, an address or block). The sandbox's resolver is lockbox: listed names\n\
                 are resolved when asked, other names get NXDOMAIN, and an address opens once an\n\
                 answer gave it.",
            ))
            .item(list(
                "deny",
                "NetDeny",
                "The host's network except these destinations (names resolved once at start; no\n\
                 *. names).",
            ))
            .description(Some(
                "Network access (`lockbox_policy::Net`): `none` (loopback only, default), `host`, or\n\
                 only / all but some destinations.",
            ))
            .into()
    }
}

#[cfg(feature = "openapi")]
impl utoipa::ToSchema for Net {
    fn name() -> std::borrow::Cow<'static, str> {
        "NetChoice".into()
    }

    fn schemas(
        schemas: &mut Vec<(
            String,
            utoipa::openapi::RefOr<utoipa::openapi::schema::Schema>,
        )>,
    ) {
        schemas.push((net_mode::NAME.into(), net_mode::schema()));
    }
}

/// The unit variants of [`Net`] as words, a component of their own.
#[cfg(feature = "openapi")]
mod net_mode {
    use utoipa::openapi::schema::{ObjectBuilder, Schema, Type};
    use utoipa::openapi::RefOr;

    pub(super) const NAME: &str = "NetMode";

    pub(super) fn schema() -> RefOr<Schema> {
        ObjectBuilder::new()
            .schema_type(Type::String)
            .enum_values(Some(["none", "host"]))
            .description(Some("`none` or `host`."))
            .into()
    }
}

/// Transport protocol of a rule or a connection.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Proto {
    /// TCP (stream sockets).
    Tcp,
    /// UDP (datagram sockets).
    Udp,
}

impl fmt::Display for Proto {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Proto::Tcp => "tcp",
            Proto::Udp => "udp",
        })
    }
}

/// Ports a rule covers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Ports {
    /// Every port (`*`).
    Any,
    /// An inclusive range (`443`, or `8000-8100`).
    Range(u16, u16),
}

impl Ports {
    /// Whether `port` is one of these.
    pub fn contains(self, port: u16) -> bool {
        match self {
            Ports::Any => true,
            Ports::Range(lo, hi) => (lo..=hi).contains(&port),
        }
    }
}

impl fmt::Display for Ports {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Ports::Any => f.write_str("*"),
            Ports::Range(lo, hi) if lo == hi => write!(f, "{lo}"),
            Ports::Range(lo, hi) => write!(f, "{lo}-{hi}"),
        }
    }
}

/// An address block: an address and a prefix length (`10.0.0.0/8`, `::1/128`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct IpNet {
    /// The network address (host bits are cleared).
    pub addr: IpAddr,
    /// Prefix length in bits.
    pub prefix: u8,
}

impl IpNet {
    /// A block; `None` if `prefix` is longer than the address.
    /// An IPv4-mapped IPv6 block (`[::ffff:10.0.0.1]`, prefix ≥ 96) is the IPv4 block it
    /// maps: destinations are compared in their canonical form, so as an IPv6 block it would
    /// match nothing (and a deny rule written that way would deny nothing).
    pub fn new(addr: IpAddr, prefix: u8) -> Option<IpNet> {
        let bits = if addr.is_ipv4() { 32 } else { 128 };
        if prefix > bits {
            return None;
        }
        let (addr, prefix) = match addr {
            IpAddr::V6(a) if prefix >= 96 => match a.to_ipv4_mapped() {
                Some(v4) => (IpAddr::V4(v4), prefix - 96),
                None => (addr, prefix),
            },
            _ => (addr, prefix),
        };
        Some(IpNet {
            addr: mask(addr, prefix),
            prefix,
        })
    }

    /// One address (an IPv4-mapped one as its IPv4 address).
    pub fn host(addr: IpAddr) -> IpNet {
        let addr = canonical(addr);
        IpNet {
            addr,
            prefix: if addr.is_ipv4() { 32 } else { 128 },
        }
    }

    /// Whether `ip` is in the block (IPv4-mapped IPv6 addresses count as IPv4).
    pub fn contains(&self, ip: IpAddr) -> bool {
        let ip = canonical(ip);
        ip.is_ipv4() == self.addr.is_ipv4() && mask(ip, self.prefix) == self.addr
    }
}

impl fmt::Display for IpNet {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let full = if self.addr.is_ipv4() { 32 } else { 128 };
        match (self.addr, self.prefix == full) {
            (IpAddr::V4(a), true) => write!(f, "{a}"),
            (IpAddr::V4(a), false) => write!(f, "{a}/{}", self.prefix),
            (IpAddr::V6(a), true) => write!(f, "[{a}]"),
            (IpAddr::V6(a), false) => write!(f, "[{a}/{}]", self.prefix),
        }
    }
}

fn mask(ip: IpAddr, prefix: u8) -> IpAddr {
    match ip {
        IpAddr::V4(a) => {
            let m = u32::MAX.checked_shl(32 - u32::from(prefix)).unwrap_or(0);
            IpAddr::V4(Ipv4Addr::from(u32::from(a) & m))
        }
        IpAddr::V6(a) => {
            let m = u128::MAX.checked_shl(128 - u32::from(prefix)).unwrap_or(0);
            IpAddr::V6(Ipv6Addr::from(u128::from(a) & m))
        }
    }
}

/// IPv4-mapped IPv6 (`::ffff:a.b.c.d`) as the IPv4 address it is.
pub fn canonical(ip: IpAddr) -> IpAddr {
    match ip {
        IpAddr::V6(a) => a.to_ipv4_mapped().map_or(ip, IpAddr::V4),
        v4 => v4,
    }
}

/// The host part of a spec.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum NetHost {
    /// A name (lower-case ASCII, IDNA-converted, no trailing dot): that name only.
    Name(String),
    /// `*.NAME`: every name below NAME (any depth), not NAME itself.
    Subdomains(String),
    /// An address or block.
    Block(IpNet),
}

/// One destination of `--net-allow` / `--net-deny`: `[tcp://|udp://]HOST:PORTS`, where HOST
/// is a name (`example.org`), every subdomain of a name (`*.example.org`), an IPv4 address
/// or CIDR block, or an IPv6 address or block in brackets, and PORTS is a port, a range
/// `A-B` or `*`. No scheme means both TCP and UDP. Names are case-insensitive, may end in
/// one dot, and may be internationalised (converted to ASCII with IDNA).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NetSpec {
    /// `None`: TCP and UDP.
    pub proto: Option<Proto>,
    /// Where.
    pub host: NetHost,
    /// Which ports.
    pub ports: Ports,
}

impl NetSpec {
    /// Parses a spec; the error names it and says what is wrong. Never panics.
    pub fn parse(spec: &str) -> Result<NetSpec, PolicyError> {
        let bad = |reason: &str| PolicyError::BadNetSpec {
            spec: spec.to_owned(),
            reason: reason.to_owned(),
        };
        let (proto, rest) = if let Some(rest) = spec.strip_prefix("tcp://") {
            (Some(Proto::Tcp), rest)
        } else if let Some(rest) = spec.strip_prefix("udp://") {
            (Some(Proto::Udp), rest)
        } else if spec.contains("://") {
            return Err(bad("the scheme must be tcp:// or udp://"));
        } else {
            (None, spec)
        };
        let (host, ports) = if let Some(inner) = rest.strip_prefix('[') {
            let (inside, after) = inner
                .split_once(']')
                .ok_or_else(|| bad("missing ']' after the IPv6 address"))?;
            let ports = after
                .strip_prefix(':')
                .ok_or_else(|| bad("expected ':PORT' after ']' (use '*' for every port)"))?;
            let (addr, prefix) = split_prefix(inside, 128).map_err(|r| bad(&r))?;
            let addr: Ipv6Addr = addr
                .parse()
                .map_err(|_| bad("not an IPv6 address inside the brackets"))?;
            let block = IpNet::new(IpAddr::V6(addr), prefix)
                .ok_or_else(|| bad("IPv6 prefix longer than 128"))?;
            (NetHost::Block(block), ports)
        } else {
            let (host, ports) = rest
                .rsplit_once(':')
                .ok_or_else(|| bad("expected HOST:PORT (use '*' for every port)"))?;
            if host.contains(':') {
                return Err(bad("put IPv6 addresses in brackets: [::1]:443"));
            }
            (parse_host(host).map_err(|r| bad(&r))?, ports)
        };
        let ports = parse_ports(ports).map_err(|r| bad(&r))?;
        Ok(NetSpec { proto, host, ports })
    }

    /// The resolved rules of this spec: one per address block (`addrs` are what the name
    /// resolved to; ignored for address specs).
    pub fn rules(&self, addrs: &[IpAddr]) -> Vec<NetRule> {
        let blocks = match &self.host {
            NetHost::Block(b) => vec![*b],
            NetHost::Name(_) | NetHost::Subdomains(_) => {
                addrs.iter().map(|a| IpNet::host(canonical(*a))).collect()
            }
        };
        blocks
            .into_iter()
            .map(|block| NetRule {
                proto: self.proto,
                block,
                ports: self.ports,
            })
            .collect()
    }
}

impl NetSpec {
    /// Whether a name the sandbox looks up is covered by this spec's host: `example.org`
    /// covers itself, `*.example.org` every name below it but not itself. The name is
    /// compared as [`normalize_name`] makes it; one that does not normalise matches nothing.
    pub fn matches_name(&self, name: &str) -> bool {
        let Some(name) = normalize_name(name) else {
            return false;
        };
        match &self.host {
            NetHost::Name(n) => *n == name,
            NetHost::Subdomains(d) => name
                .strip_suffix(d.as_str())
                .and_then(|rest| rest.strip_suffix('.'))
                .is_some_and(|label| !label.is_empty()),
            NetHost::Block(_) => false,
        }
    }
}

/// A hostname as lists compare it: one trailing dot dropped, converted to ASCII with IDNA
/// (UTS #46, which also lower-cases), and checked against RFC 1123 (labels of letters,
/// digits and inner hyphens, at most 63 bytes each, 253 in all; the last label not all
/// digits, which would be a mistyped address). `None` if it is not such a name.
pub fn normalize_name(name: &str) -> Option<String> {
    let name = name.strip_suffix('.').unwrap_or(name);
    if name.is_empty() || name.ends_with('.') {
        return None;
    }
    let ascii = if name.is_ascii() {
        name.to_ascii_lowercase()
    } else {
        idna::domain_to_ascii_strict(name).ok()?
    };
    let valid = ascii.len() <= 253
        && ascii.split('.').all(|l| {
            !l.is_empty()
                && l.len() <= 63
                && !l.starts_with('-')
                && !l.ends_with('-')
                && l.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-')
        })
        && !ascii
            .rsplit('.')
            .next()
            .is_some_and(|l| l.bytes().all(|b| b.is_ascii_digit()));
    valid.then_some(ascii)
}

fn split_prefix(s: &str, max: u8) -> Result<(&str, u8), String> {
    match s.split_once('/') {
        None => Ok((s, max)),
        Some((addr, p)) => {
            let prefix: u8 = p
                .parse()
                .map_err(|_| format!("prefix {p:?} is not a number"))?;
            if prefix > max {
                return Err(format!("prefix /{prefix} is longer than {max} bits"));
            }
            Ok((addr, prefix))
        }
    }
}

fn parse_host(host: &str) -> Result<NetHost, String> {
    if host.is_empty() {
        return Err("empty host".into());
    }
    if host.contains('/') {
        let (addr, prefix) = split_prefix(host, 32)?;
        let addr: Ipv4Addr = addr
            .parse()
            .map_err(|_| format!("{addr:?} is not an IPv4 address"))?;
        return IpNet::new(IpAddr::V4(addr), prefix)
            .map(NetHost::Block)
            .ok_or_else(|| "bad prefix".into());
    }
    if let Ok(addr) = host.parse::<Ipv4Addr>() {
        return Ok(NetHost::Block(IpNet::host(IpAddr::V4(addr))));
    }
    let (wild, name) = match host.strip_prefix("*.") {
        Some(rest) => (true, rest),
        None => (false, host),
    };
    if name.contains('*') {
        return Err(format!(
            "{host:?}: '*' may only stand for the subdomains of a name, as in *.example.org"
        ));
    }
    match normalize_name(name) {
        Some(n) if wild => Ok(NetHost::Subdomains(n)),
        Some(n) => Ok(NetHost::Name(n)),
        None => Err(format!("{host:?} is not a hostname or an IPv4 address")),
    }
}

fn parse_ports(s: &str) -> Result<Ports, String> {
    let port = |p: &str| match p.parse::<u16>() {
        Ok(0) | Err(_) => Err(format!("port {p:?} is not a number from 1 to 65535")),
        Ok(n) => Ok(n),
    };
    match s {
        "*" => Ok(Ports::Any),
        "" => Err("missing port (use '*' for every port)".into()),
        _ => match s.split_once('-') {
            Some((lo, hi)) => {
                let (lo, hi) = (port(lo)?, port(hi)?);
                if lo > hi {
                    return Err(format!("port range {lo}-{hi} is empty"));
                }
                Ok(Ports::Range(lo, hi))
            }
            None => port(s).map(|p| Ports::Range(p, p)),
        },
    }
}

impl std::str::FromStr for NetSpec {
    type Err = PolicyError;
    fn from_str(s: &str) -> Result<NetSpec, PolicyError> {
        NetSpec::parse(s)
    }
}

impl fmt::Display for NetSpec {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if let Some(p) = self.proto {
            write!(f, "{p}://")?;
        }
        match &self.host {
            NetHost::Name(n) => write!(f, "{n}:{}", self.ports),
            NetHost::Subdomains(d) => write!(f, "*.{d}:{}", self.ports),
            NetHost::Block(b) => write!(f, "{b}:{}", self.ports),
        }
    }
}

impl Serialize for NetSpec {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(self)
    }
}

impl<'de> Deserialize<'de> for NetSpec {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<NetSpec, D::Error> {
        let text = String::deserialize(d)?;
        NetSpec::parse(&text).map_err(serde::de::Error::custom)
    }
}

/// A spec with its host resolved: what the supervisor matches connections against.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct NetRule {
    /// `None`: TCP and UDP.
    pub proto: Option<Proto>,
    /// Which addresses.
    pub block: IpNet,
    /// Which ports.
    pub ports: Ports,
}

impl NetRule {
    /// Whether a `proto` connection to `dest` matches.
    pub fn matches(&self, proto: Proto, dest: SocketAddr) -> bool {
        self.proto.is_none_or(|p| p == proto)
            && self.ports.contains(dest.port())
            && self.block.contains(dest.ip())
    }
}

impl fmt::Display for NetRule {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let proto = self.proto.map_or("tcp+udp".to_owned(), |p| p.to_string());
        write!(f, "{proto} {}:{}", self.block, self.ports)
    }
}

/// Where a connection or datagram of a sandbox with its own namespace goes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Route {
    /// The sandbox's own loopback (its namespace).
    Inside,
    /// The host's network.
    Host,
    /// Refused.
    Denied,
}

/// Whether a list is an allow-list or a deny-list.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ListKind {
    /// Only the listed destinations reach the host network.
    Allow,
    /// Everything but the listed destinations reaches the host network.
    Deny,
}

/// The decision: an allow rule sends a destination to the host (the host's loopback only
/// when a rule names it); other loopback and unspecified addresses stay inside; under a
/// deny-list the rest of the world is reachable unless a rule denies it.
pub fn route(kind: ListKind, rules: &[NetRule], proto: Proto, dest: SocketAddr) -> Route {
    let ip = canonical(dest.ip());
    let dest = SocketAddr::new(ip, dest.port());
    let local = ip.is_loopback() || ip.is_unspecified();
    let listed = rules.iter().any(|r| r.matches(proto, dest));
    match kind {
        ListKind::Allow if listed => Route::Host,
        ListKind::Deny if local => Route::Inside,
        ListKind::Deny if !listed => Route::Host,
        _ if local => Route::Inside,
        _ => Route::Denied,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec(s: &str) -> NetSpec {
        NetSpec::parse(s).unwrap()
    }

    #[test]
    fn every_documented_form_parses() {
        assert_eq!(
            spec("example.com:443"),
            NetSpec {
                proto: None,
                host: NetHost::Name("example.com".into()),
                ports: Ports::Range(443, 443)
            }
        );
        assert_eq!(spec("pypi.org:*").ports, Ports::Any);
        assert_eq!(spec("tcp://10.0.0.1:80").proto, Some(Proto::Tcp));
        assert_eq!(spec("udp://10.0.0.1:53").proto, Some(Proto::Udp));
        assert_eq!(
            spec("10.1.2.3/8:8000-8100"),
            NetSpec {
                proto: None,
                host: NetHost::Block(IpNet::new("10.0.0.0".parse().unwrap(), 8).unwrap()),
                ports: Ports::Range(8000, 8100)
            }
        );
        assert_eq!(
            spec("[::1]:22").host,
            NetHost::Block(IpNet::host("::1".parse().unwrap()))
        );
        assert_eq!(
            spec("[2001:db8::/32]:*").host,
            NetHost::Block(IpNet::new("2001:db8::".parse().unwrap(), 32).unwrap())
        );
    }

    #[test]
    fn a_mapped_ipv6_spec_is_its_ipv4_destination() {
        // Found with the net_spec fuzz target's property: `[::ffff:10.0.0.1]` stayed an IPv6
        // block, which no (canonicalised) destination matched, so `--net-deny` of it denied
        // nothing.
        for text in ["[::ffff:10.0.0.1]:80", "[::ffff:10.0.0.0/120]:80"] {
            let s = spec(text);
            let rules = s.rules(&[]);
            for dest in ["10.0.0.1:80", "[::ffff:10.0.0.1]:80"] {
                let dest: SocketAddr = dest.parse().unwrap();
                assert!(
                    rules.iter().any(|r| r.matches(Proto::Tcp, dest)),
                    "{text} {dest}"
                );
                assert_eq!(
                    route(ListKind::Deny, &rules, Proto::Tcp, dest),
                    Route::Denied
                );
            }
            assert_eq!(spec(&s.to_string()), s);
        }
        assert_eq!(spec("[::ffff:10.0.0.1]:80").to_string(), "10.0.0.1:80");
        assert_eq!(
            spec("[::ffff:10.0.0.0/120]:80").to_string(),
            "10.0.0.0/24:80"
        );
        // Below /96 it is an IPv6 block, as written.
        assert_eq!(spec("[::ffff:0:0/95]:80").to_string(), "[::fffe:0:0/95]:80");
    }

    #[test]
    fn parse_errors_name_the_spec_and_the_problem() {
        for (input, needle) in [
            ("::1:80", "brackets"),
            ("example.com", "HOST:PORT"),
            ("example.com:", "missing port"),
            ("example.com:0", "1 to 65535"),
            ("example.com:70000", "1 to 65535"),
            ("http://example.com:80", "tcp:// or udp://"),
            ("[::1:80", "']'"),
            ("[::1]80", "':PORT'"),
            ("[zz]:80", "IPv6"),
            ("10.0.0.0/33:80", "longer than 32"),
            ("[::/129]:80", "longer than 128"),
            ("bad_name:80", "not a hostname"),
            ("1.2.3.256:80", "not a hostname"),
            (":80", "empty host"),
            ("h:9-3", "empty"),
        ] {
            let err = NetSpec::parse(input).unwrap_err().to_string();
            assert!(err.contains(input), "{input}: {err}");
            assert!(err.contains(needle), "{input}: {err}");
        }
    }

    fn rule(s: &str) -> Vec<NetRule> {
        spec(s).rules(&[])
    }

    fn dest(s: &str) -> SocketAddr {
        s.parse().unwrap()
    }

    #[test]
    fn allow_list_routes_named_destinations_to_the_host_and_keeps_loopback_inside() {
        let rules = [rule("127.0.0.2:8080"), rule("udp://[2001:db8::/32]:53")].concat();
        let r = |p, d: &str| route(ListKind::Allow, &rules, p, dest(d));
        assert_eq!(r(Proto::Tcp, "127.0.0.2:8080"), Route::Host);
        assert_eq!(r(Proto::Udp, "127.0.0.2:8080"), Route::Host);
        assert_eq!(r(Proto::Tcp, "127.0.0.2:8081"), Route::Inside);
        assert_eq!(r(Proto::Tcp, "127.0.0.1:8080"), Route::Inside);
        assert_eq!(r(Proto::Tcp, "[::ffff:127.0.0.2]:8080"), Route::Host);
        assert_eq!(r(Proto::Udp, "[2001:db8::9]:53"), Route::Host);
        assert_eq!(r(Proto::Tcp, "[2001:db8::9]:53"), Route::Denied);
        assert_eq!(r(Proto::Tcp, "10.0.0.1:8080"), Route::Denied);
        assert_eq!(r(Proto::Tcp, "0.0.0.0:8080"), Route::Inside);
    }

    #[test]
    fn deny_list_allows_the_rest_but_never_the_hosts_loopback() {
        let rules = rule("tcp://10.0.0.0/8:*");
        let r = |p, d: &str| route(ListKind::Deny, &rules, p, dest(d));
        assert_eq!(r(Proto::Tcp, "10.1.1.1:443"), Route::Denied);
        assert_eq!(r(Proto::Udp, "10.1.1.1:443"), Route::Host);
        assert_eq!(r(Proto::Tcp, "192.0.2.1:443"), Route::Host);
        assert_eq!(r(Proto::Tcp, "127.0.0.1:443"), Route::Inside);
        assert_eq!(r(Proto::Tcp, "[::1]:443"), Route::Inside);
    }

    #[test]
    fn names_become_one_rule_per_pinned_address() {
        let s = spec("tcp://localhost:80");
        let rules = s.rules(&["127.0.0.1".parse().unwrap(), "::1".parse().unwrap()]);
        assert_eq!(rules.len(), 2);
        assert!(rules[1].matches(Proto::Tcp, dest("[::1]:80")));
        assert!(!rules[1].matches(Proto::Udp, dest("[::1]:80")));
    }

    #[test]
    fn net_modes_round_trip_through_toml() {
        #[derive(Serialize, Deserialize, PartialEq, Debug)]
        struct W {
            net: Net,
        }
        for net in [
            Net::None,
            Net::Host,
            Net::Allow(vec![spec("tcp://example.com:443"), spec("[::1/128]:*")]),
            Net::Deny(vec![spec("10.0.0.0/8:*")]),
        ] {
            let w = W { net };
            let text = toml::to_string(&w).unwrap();
            assert_eq!(toml::from_str::<W>(&text).unwrap(), w, "{text}");
        }
        let w: W = toml::from_str("net = { allow = [\"pypi.org:443\"] }").unwrap();
        assert_eq!(w.net, Net::Allow(vec![spec("pypi.org:443")]));
        let err = toml::from_str::<W>("net = { allow = [\"pypi.org\"] }").unwrap_err();
        assert!(err.to_string().contains("pypi.org"), "{err}");
    }

    #[test]
    fn wildcards_cover_subdomains_but_not_the_apex() {
        let wild = spec("*.example.org:443");
        assert_eq!(wild.host, NetHost::Subdomains("example.org".into()));
        assert_eq!(wild.to_string(), "*.example.org:443");
        for yes in [
            "a.example.org",
            "a.b.example.org",
            "A.Example.ORG",
            "a.example.org.",
        ] {
            assert!(wild.matches_name(yes), "{yes}");
        }
        for no in [
            "example.org",
            "example.org.",
            "aexample.org",
            "example.org.evil",
            ".example.org",
            "a..example.org",
            "",
        ] {
            assert!(!wild.matches_name(no), "{no}");
        }
        let apex = spec("Example.ORG.:443");
        assert_eq!(apex.host, NetHost::Name("example.org".into()));
        assert!(apex.matches_name("EXAMPLE.org."));
        assert!(!apex.matches_name("a.example.org"));
    }

    #[test]
    fn internationalised_names_are_compared_in_ascii() {
        let s = spec("*.bücher.example:443");
        assert_eq!(s.to_string(), "*.xn--bcher-kva.example:443");
        assert!(s.matches_name("shop.xn--bcher-kva.example"));
        assert!(s.matches_name("shop.BÜCHER.example"));
        assert_eq!(spec(&s.to_string()), s);
    }

    #[test]
    fn misplaced_wildcards_are_refused_by_name() {
        for input in [
            "*:443",
            "a.*.org:443",
            "*example.org:443",
            "**.org:443",
            "*.:443",
            "*.1.2.3.4:80",
        ] {
            let err = NetSpec::parse(input).unwrap_err().to_string();
            assert!(err.contains(input), "{input}: {err}");
        }
    }

    proptest::proptest! {
        #[test]
        fn parse_never_panics_and_display_round_trips(s in "\\PC{0,40}") {
            if let Ok(parsed) = NetSpec::parse(&s) {
                proptest::prop_assert_eq!(NetSpec::parse(&parsed.to_string()).unwrap(), parsed);
            }
        }

        #[test]
        fn generated_specs_round_trip(
            tcp in proptest::option::of(proptest::bool::ANY),
            v4 in proptest::bool::ANY,
            bits in proptest::num::u128::ANY,
            prefix in 0u8..=128,
            lo in 1u16..,
            span in 0u16..100,
        ) {
            let addr = if v4 {
                IpAddr::V4(Ipv4Addr::from(bits as u32))
            } else {
                IpAddr::V6(Ipv6Addr::from(bits))
            };
            let prefix = if v4 { prefix % 33 } else { prefix };
            let s = NetSpec {
                proto: tcp.map(|t| if t { Proto::Tcp } else { Proto::Udp }),
                host: NetHost::Block(IpNet::new(addr, prefix).unwrap()),
                ports: Ports::Range(lo, lo.saturating_add(span)),
            };
            proptest::prop_assert_eq!(NetSpec::parse(&s.to_string()).unwrap(), s);
        }

        #[test]
        fn a_wildcard_matches_exactly_the_names_below_it(
            labels in proptest::collection::vec("[a-z0-9]([a-z0-9-]{0,8}[a-z0-9])?", 1..4),
            domain in proptest::collection::vec("[a-z]([a-z0-9-]{0,8}[a-z0-9])?", 1..4),
            flips in proptest::collection::vec(proptest::bool::ANY, 64),
            dot in proptest::bool::ANY,
        ) {
            let domain = domain.join(".");
            let below = format!("{}.{domain}", labels.join("."));
            // Case flipped at random, and maybe one trailing dot: the same name.
            let shout = |n: &str| -> String {
                let mut out: String = n.chars().zip(flips.iter().cycle())
                    .map(|(c, &f)| if f { c.to_ascii_uppercase() } else { c })
                    .collect();
                if dot { out.push('.'); }
                out
            };
            let wild = NetSpec::parse(&format!("*.{domain}:443")).unwrap();
            let apex = NetSpec::parse(&format!("{domain}:443")).unwrap();
            proptest::prop_assert!(wild.matches_name(&shout(&below)));
            proptest::prop_assert!(!wild.matches_name(&shout(&domain)));
            proptest::prop_assert!(apex.matches_name(&shout(&domain)));
            proptest::prop_assert!(!apex.matches_name(&shout(&below)));
            // A name that merely ends with the same letters is not below it.
            let glued = format!("{}{domain}", labels.join("."));
            proptest::prop_assert!(!wild.matches_name(&glued));
            proptest::prop_assert_eq!(NetSpec::parse(&wild.to_string()).unwrap(), wild);
        }

        #[test]
        fn name_matching_never_panics(pattern in "\\PC{0,30}", name in "\\PC{0,30}") {
            if let Ok(s) = NetSpec::parse(&format!("{pattern}:1")) {
                let _ = s.matches_name(&name);
            }
            let _ = normalize_name(&name);
        }
    }
}
