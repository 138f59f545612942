//! The list in force ([`NetList`]) and what this sandbox's DNS answers taught under it
//! ([`Learned`](crate::dns::Learned)), shared by the supervisor's thread, its resolver, its
//! relay and the [`Supervisor`](crate::Supervisor) handle, which may replace the list while
//! the sandbox runs ([`Current::replace`]).
//!
//! **One read per decision.** A decision takes the list once ([`Current::get`]: an `Arc` of
//! an immutable list) and decides on that copy, so a replacement never mixes two lists
//! inside one decision. A DNS answer learns under the learned rules' lock and reads the list
//! again under it; a replacement swaps the list and forgets every learned rule under the
//! same lock: an answer given for a name of the old list can teach nothing to the new one.

use crate::dns::Learned;
use lockbox_policy::{ListKind, NetRule, NetSpec};
use std::sync::{Arc, Mutex, MutexGuard, RwLock};

/// A network list: what a supervisor allows (or denies). [`Supervisor::replace`](crate::Supervisor::replace)
/// puts another in force while the sandbox runs.
#[derive(Debug, Clone)]
pub struct NetList {
    /// Allow- or deny-list.
    pub kind: ListKind,
    /// Resolved address rules: an allow-list's address rules (its names are
    /// [`NetList::names`]), a deny-list's rules with its names resolved (pinned).
    pub rules: Vec<NetRule>,
    /// The specs that name hosts (`example.org:443`, `*.example.org:*`). Under an allow-list
    /// lockbox's resolver answers these and nothing else; under a deny-list (in a sandbox
    /// whose resolver is lockbox's) it answers every name but these.
    pub names: Vec<NetSpec>,
}

impl NetList {
    /// Whether lockbox's resolver answers `name` (a query's name, as asked).
    pub(crate) fn answers(&self, name: &str) -> bool {
        let named = self.names.iter().any(|s| s.matches_name(name));
        match self.kind {
            ListKind::Allow => named,
            ListKind::Deny => !named,
        }
    }
}

/// The list in force and the rules its DNS answers taught, shared between threads.
#[derive(Debug, Clone)]
pub(crate) struct Current(Arc<Inner>);

#[derive(Debug)]
struct Inner {
    list: RwLock<Arc<NetList>>,
    learned: Mutex<Learned>,
}

impl Current {
    pub(crate) fn new(list: NetList) -> Current {
        Current(Arc::new(Inner {
            list: RwLock::new(Arc::new(list)),
            learned: Mutex::default(),
        }))
    }

    /// The list in force now (a decision takes it once).
    pub(crate) fn get(&self) -> Arc<NetList> {
        match self.0.list.read() {
            Ok(list) => list.clone(),
            // A panic elsewhere cannot leave a half-written `Arc` behind: the value is whole.
            Err(poisoned) => poisoned.into_inner().clone(),
        }
    }

    /// The learned rules, locked. Whoever adds to them reads the list ([`Current::get`])
    /// while holding this lock, so a replacement cannot slip in between.
    pub(crate) fn learned(&self) -> MutexGuard<'_, Learned> {
        self.0
            .learned
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Puts `list` in force and forgets every rule a DNS answer taught (a name the new list
    /// no longer holds must not stay reachable through an earlier answer).
    pub(crate) fn replace(&self, list: NetList) {
        let mut learned = self.learned();
        match self.0.list.write() {
            Ok(mut now) => *now = Arc::new(list),
            Err(poisoned) => *poisoned.into_inner() = Arc::new(list),
        }
        learned.clear();
    }
}
