//! The calling thread's scheduling (policy, real-time priority, nice value): what a command
//! inherits from whoever starts it, so a start on someone else's behalf (the pre-arm
//! helper) checks it is the same as its caller's.

use serde::{Deserialize, Serialize};

/// A thread's scheduling, as a child process inherits it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct Scheduling {
    /// `SCHED_OTHER`, `SCHED_FIFO`, ... (with `SCHED_RESET_ON_FORK` cleared).
    pub policy: i32,
    /// The real-time priority (0 for the normal policies).
    pub priority: i32,
    /// The nice value.
    pub nice: i32,
}

/// The calling thread's scheduling.
pub fn scheduling() -> Scheduling {
    crate::sys::scheduling()
}
