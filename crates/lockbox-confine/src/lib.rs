//! lockbox-confine (work in progress).
