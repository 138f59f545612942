//! Credential values: read once when lockbox starts, kept in lockbox's memory only, never
//! printed (their `Debug` says `<redacted>`), never written anywhere, and held in pages a
//! sandbox's init (a fork of lockbox) sees as zeros ([`lockbox_confine::WipedOnFork`]; the
//! copies made while reading are overwritten).

use crate::error::Error;
use crate::rules::{CredentialSource, CredentialSpec, HttpRules};
use http::HeaderValue;
use lockbox_confine::WipedOnFork;
use std::collections::BTreeMap;
use std::ffi::OsString;
use std::sync::Arc;

/// Largest credential value read, in bytes.
pub const MAX_SECRET: usize = 16 << 10;

/// One credential's value.
#[derive(Clone)]
pub struct Secret(Arc<WipedOnFork>);

impl std::fmt::Debug for Secret {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Secret(<redacted>)")
    }
}

impl Secret {
    /// The header value of `prefix` followed by the secret, marked sensitive (never
    /// indexed by HPACK, never shown by `Debug`).
    pub(crate) fn header(&self, prefix: &str) -> Option<HeaderValue> {
        let mut bytes = prefix.as_bytes().to_vec();
        bytes.extend_from_slice(self.0.as_bytes());
        let value = HeaderValue::from_bytes(&bytes).ok();
        lockbox_confine::wipe(&mut bytes);
        let mut value = value?;
        value.set_sensitive(true);
        Some(value)
    }
}

impl PartialEq for Secret {
    fn eq(&self, other: &Secret) -> bool {
        self.0.as_bytes() == other.0.as_bytes()
    }
}

impl Eq for Secret {}

/// A credential's value and the hosts it may be sent to (empty: any).
#[derive(Debug, Clone, PartialEq, Eq)]
struct Bound {
    secret: Secret,
    hosts: Vec<String>,
}

impl Bound {
    /// Refuses to send it to `host`, naming the credential and the host.
    fn check(&self, name: &str, host: &str) -> Result<(), Error> {
        if self.hosts.is_empty() || self.hosts.iter().any(|h| h == host) {
            return Ok(());
        }
        Err(Error::Credential {
            name: name.to_owned(),
            reason: format!(
                "it is bound to {} when registered; a rule cannot send it to {host}",
                self.hosts.join(", ")
            ),
        })
    }
}

/// The credentials of a sandbox (or the registry of `lockbox serve`), by name, each with
/// the hosts it is bound to.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Credentials(BTreeMap<String, Bound>);

impl Credentials {
    /// Reads every credential of `specs` (`env` looks up lockbox's own environment), used
    /// by a rule or not: the registry `lockbox serve --credential` makes, from which each
    /// sandbox's rules pick ([`Credentials::pick`]). Errors name the credential, the variable
    /// or the file, never the value.
    pub fn read_all(
        specs: &[CredentialSpec],
        env: impl Fn(&str) -> Option<OsString>,
    ) -> Result<Credentials, Error> {
        let mut map = BTreeMap::new();
        for spec in specs {
            if map.contains_key(&spec.name) {
                return Err(Error::Credential {
                    name: spec.name.clone(),
                    reason: "given twice".to_owned(),
                });
            }
            let secret = read(spec, &env)?;
            let hosts = spec.hosts.clone();
            map.insert(spec.name.clone(), Bound { secret, hosts });
        }
        Ok(Credentials(map))
    }

    /// The credentials `rules` name, each from `self` if it has it, else from `registry`:
    /// what one sandbox gets. A name neither holds, or a rule for a host the credential is
    /// not bound to, is an error naming the credential (and the host).
    pub fn pick(&self, rules: &HttpRules, registry: &Credentials) -> Result<Credentials, Error> {
        let mut map = BTreeMap::new();
        for rule in &rules.auth {
            let name = &rule.credential;
            let value = self
                .0
                .get(name)
                .or_else(|| registry.0.get(name))
                .ok_or_else(|| Error::Credential {
                    name: name.clone(),
                    reason: format!(
                        "the rule for {} names it, but no credential of that name is defined",
                        rule.host
                    ),
                })?;
            value.check(name, &rule.host)?;
            map.insert(name.clone(), value.clone());
        }
        Ok(Credentials(map))
    }

    /// Adds `more`'s credentials, replacing those of the same name.
    pub fn extend(&mut self, more: Credentials) {
        self.0.extend(more.0);
    }

    /// Whether there is none.
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// The credentials' names (never their values).
    pub fn names(&self) -> impl Iterator<Item = &str> {
        self.0.keys().map(String::as_str)
    }

    /// Reads every credential of `specs` (`env` looks up lockbox's own environment); every
    /// rule of `rules` must name one of them, for a host it is bound to, and every
    /// credential must be used by a rule.
    /// Errors name the credential, the variable or the file, never the value.
    pub fn load(
        specs: &[CredentialSpec],
        rules: &HttpRules,
        env: impl Fn(&str) -> Option<OsString>,
    ) -> Result<Credentials, Error> {
        let Credentials(map) = Credentials::read_all(specs, env)?;
        for rule in &rules.auth {
            let Some(bound) = map.get(&rule.credential) else {
                return Err(Error::Credential {
                    name: rule.credential.clone(),
                    reason: format!(
                        "--http-auth for {} names it, but no --credential {}=... defines it",
                        rule.host, rule.credential
                    ),
                });
            };
            bound.check(&rule.credential, &rule.host)?;
        }
        if let Some(unused) = map
            .keys()
            .find(|name| !rules.auth.iter().any(|r| &r.credential == *name))
        {
            return Err(Error::Credential {
                name: unused.clone(),
                reason: "no --http-auth rule uses it".to_owned(),
            });
        }
        Ok(Credentials(map))
    }

    /// The value of credential `name`.
    pub(crate) fn get(&self, name: &str) -> Option<&Secret> {
        self.0.get(name).map(|b| &b.secret)
    }

    /// The hosts credential `name` is bound to (empty: any), if there is one of that name.
    pub fn hosts(&self, name: &str) -> Option<&[String]> {
        self.0.get(name).map(|b| b.hosts.as_slice())
    }
}

fn read(spec: &CredentialSpec, env: impl Fn(&str) -> Option<OsString>) -> Result<Secret, Error> {
    let err = |reason: String| Error::Credential {
        name: spec.name.clone(),
        reason,
    };
    let mut bytes = match &spec.source {
        CredentialSource::Env(var) => env(var)
            .ok_or_else(|| err(format!("environment variable {var} is not set")))?
            .into_encoded_bytes(),
        CredentialSource::File(path) => {
            let meta = std::fs::metadata(path)
                .map_err(|e| err(format!("reading {}: {e}", path.display())))?;
            if meta.len() > MAX_SECRET as u64 {
                return Err(err(format!(
                    "{} is larger than {MAX_SECRET} bytes",
                    path.display()
                )));
            }
            std::fs::read(path).map_err(|e| err(format!("reading {}: {e}", path.display())))?
        }
    };
    let mut len = bytes.len();
    if bytes.ends_with(b"\n") {
        len -= 1;
        if bytes[..len].ends_with(b"\r") {
            len -= 1;
        }
    }
    let value = &mut bytes[..len];
    // As `HeaderValue::from_bytes` checks, without making a copy of the value.
    let header_ok = value
        .iter()
        .all(|b| (*b >= 0x20 && *b != 0x7f) || *b == b'\t');
    let why = if value.is_empty() {
        Some("the value is empty".to_owned())
    } else if value.len() > MAX_SECRET || !header_ok {
        Some(format!(
            "the value cannot go in an HTTP header (control characters or more than {MAX_SECRET} bytes)"
        ))
    } else {
        None
    };
    if let Some(why) = why {
        lockbox_confine::wipe(&mut bytes);
        return Err(err(why));
    }
    let taken = WipedOnFork::take(value);
    lockbox_confine::wipe(&mut bytes);
    taken
        .map(|w| Secret(Arc::new(w)))
        .map_err(|e| err(format!("keeping the value in memory of its own: {e}")))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rules(auth: &[&str]) -> HttpRules {
        HttpRules::new(
            auth.iter().map(|a| a.parse().unwrap()).collect(),
            Vec::new(),
        )
        .unwrap()
    }

    #[test]
    fn a_missing_variable_is_named_and_the_value_never_printed() {
        let specs = vec!["API=env:NOPE_NOT_SET".parse().unwrap()];
        let e = Credentials::load(&specs, &rules(&["a.example bearer API"]), |_| None)
            .unwrap_err()
            .to_string();
        assert!(e.contains("API") && e.contains("NOPE_NOT_SET"), "{e}");
        let specs = vec!["API=env:KEY".parse().unwrap()];
        let creds = Credentials::load(&specs, &rules(&["a.example bearer API"]), |_| {
            Some("sk-secret".into())
        })
        .unwrap();
        assert!(!format!("{creds:?}").contains("sk-secret"));
        let header = creds.get("API").unwrap().header("Bearer ").unwrap();
        assert_eq!(header, "Bearer sk-secret");
        assert!(!format!("{header:?}").contains("sk-secret"));
    }

    #[test]
    fn file_credentials_drop_one_trailing_newline() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("key");
        std::fs::write(&path, "tok\n").unwrap();
        let specs = vec![format!("K=file:{}", path.display()).parse().unwrap()];
        let creds = Credentials::load(&specs, &rules(&["a.example bearer K"]), |_| None).unwrap();
        assert_eq!(creds.get("K").unwrap().header("").unwrap(), "tok");
    }

    #[test]
    fn rules_and_credentials_must_name_each_other() {
        let specs = vec!["A=env:X".parse().unwrap()];
        let env = |_: &str| Some(OsString::from("v"));
        assert!(Credentials::load(&specs, &rules(&["a.example bearer B"]), env).is_err());
        assert!(Credentials::load(&specs, &rules(&[]), env).is_err());
        let bad = |_: &str| Some(OsString::from("a\nb"));
        assert!(Credentials::load(&specs, &rules(&["a.example bearer A"]), bad).is_err());
    }

    #[test]
    fn issue_32_a_credential_goes_only_to_the_hosts_it_was_registered_for() {
        let specs = vec!["KEY@api.openai.com=env:X".parse().unwrap()];
        let registry = Credentials::read_all(&specs, |_| Some(OsString::from("sk"))).unwrap();
        assert_eq!(
            registry.hosts("KEY"),
            Some(&["api.openai.com".to_owned()][..])
        );
        let none = Credentials::default();
        assert!(none
            .pick(&rules(&["api.openai.com bearer KEY"]), &registry)
            .is_ok());
        let e = none
            .pick(&rules(&["evil.example bearer KEY"]), &registry)
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("credential KEY")
                && e.contains("evil.example")
                && e.contains("api.openai.com"),
            "{e}"
        );
        let e = Credentials::load(&specs, &rules(&["evil.example bearer KEY"]), |_| {
            Some(OsString::from("sk"))
        })
        .unwrap_err()
        .to_string();
        assert!(
            e.contains("credential KEY") && e.contains("evil.example"),
            "{e}"
        );
    }

    #[test]
    fn a_sandbox_picks_only_the_credentials_its_rules_name() {
        let specs = vec!["A=env:X".parse().unwrap(), "B=env:Y".parse().unwrap()];
        let registry = Credentials::read_all(&specs, |v| Some(OsString::from(v))).unwrap();
        let none = Credentials::default();
        let picked = none
            .pick(&rules(&["a.example bearer A"]), &registry)
            .unwrap();
        assert_eq!(picked.names().collect::<Vec<_>>(), ["A"]);
        let e = none
            .pick(&rules(&["a.example bearer C"]), &registry)
            .unwrap_err()
            .to_string();
        assert!(e.contains("credential C") && e.contains("a.example"), "{e}");
    }
}
