//! The environment a sandboxed command starts with.

use crate::error::PolicyError;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

/// `PATH` used when the caller has none and for `clean` environments.
pub const DEFAULT_PATH: &str = "/usr/local/bin:/usr/bin:/bin:/usr/local/sbin:/usr/sbin:/sbin";

/// Variables inherited from the caller unless `clean` is set. `HOME` is always `/tmp`, the
/// sandbox's private writable directory, so that a caller's home is never implied.
const INHERITED: [&str; 4] = ["PATH", "LANG", "LC_ALL", "TERM"];

/// Which environment variables the command sees.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct EnvPolicy {
    /// Start from nothing instead of the safe minimal set (PATH, LANG, LC_ALL, TERM, HOME=/tmp).
    pub clean: bool,
    /// Variables set explicitly (win over inherited and passed ones).
    pub set: BTreeMap<String, String>,
    /// Names of caller variables passed through.
    pub pass: Vec<String>,
}

impl EnvPolicy {
    pub(crate) fn validate(&self) -> Result<(), PolicyError> {
        for name in self.set.keys().chain(&self.pass) {
            validate_name(name)?;
        }
        for (k, v) in &self.set {
            if v.contains('\0') {
                return Err(PolicyError::BadEnv {
                    reason: format!("value of {k} contains a NUL byte"),
                });
            }
        }
        Ok(())
    }

    /// The command's environment, given the caller's (`lookup` reads a caller variable).
    /// Sorted by name, so the result is deterministic.
    pub fn build(&self, lookup: impl Fn(&str) -> Option<String>) -> Vec<(String, String)> {
        let mut env = BTreeMap::new();
        if !self.clean {
            for name in INHERITED {
                if let Some(v) = lookup(name) {
                    env.insert(name.to_owned(), v);
                }
            }
            env.entry("PATH".to_owned())
                .or_insert_with(|| DEFAULT_PATH.to_owned());
            env.insert("HOME".to_owned(), "/tmp".to_owned());
        }
        for name in &self.pass {
            if let Some(v) = lookup(name) {
                env.insert(name.clone(), v);
            }
        }
        for (k, v) in &self.set {
            env.insert(k.clone(), v.clone());
        }
        env.into_iter().collect()
    }
}

fn validate_name(name: &str) -> Result<(), PolicyError> {
    if name.is_empty() || name.contains('=') || name.contains('\0') {
        return Err(PolicyError::BadEnv {
            reason: format!("{name:?} is not a valid variable name (empty, or has '=' or NUL)"),
        });
    }
    Ok(())
}

/// Parses `K=V` as given to `--env`.
impl EnvPolicy {
    /// Splits a `K=V` argument.
    pub fn parse_assignment(arg: &str) -> Result<(String, String), PolicyError> {
        match arg.split_once('=') {
            Some((k, v)) if !k.is_empty() => Ok((k.to_owned(), v.to_owned())),
            _ => Err(PolicyError::BadEnv {
                reason: format!("{arg:?} is not of the form NAME=VALUE"),
            }),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn caller(name: &str) -> Option<String> {
        match name {
            "PATH" => Some("/caller/bin".into()),
            "SECRET_TOKEN" => Some("hunter2".into()),
            "USER" => Some("me".into()),
            _ => None,
        }
    }

    #[test]
    fn default_env_is_minimal_and_hides_secrets() {
        let env = EnvPolicy::default().build(caller);
        let names: Vec<_> = env.iter().map(|(k, _)| k.as_str()).collect();
        assert_eq!(names, ["HOME", "PATH"]);
        assert!(env.contains(&("HOME".into(), "/tmp".into())));
    }

    #[test]
    fn pass_and_set_apply_in_order() {
        let policy = EnvPolicy {
            clean: true,
            set: [("USER".to_owned(), "sandbox".to_owned())].into(),
            pass: vec!["USER".into(), "SECRET_TOKEN".into()],
        };
        let env = policy.build(caller);
        assert_eq!(
            env,
            vec![
                ("SECRET_TOKEN".to_owned(), "hunter2".to_owned()),
                ("USER".to_owned(), "sandbox".to_owned())
            ]
        );
    }

    #[test]
    fn assignments_need_a_name() {
        assert_eq!(
            EnvPolicy::parse_assignment("A=b=c").unwrap(),
            ("A".into(), "b=c".into())
        );
        assert!(EnvPolicy::parse_assignment("=x").is_err());
        assert!(EnvPolicy::parse_assignment("novalue").is_err());
    }
}
