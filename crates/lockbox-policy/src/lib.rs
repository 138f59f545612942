//! lockbox-policy (work in progress).
