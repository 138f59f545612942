//! The classic-BPF pieces of the seccomp filters lockbox writes by hand (seccompiler builds
//! the deny list; the prologue, the socket-family block and the network filter need jumps
//! and return values it cannot express). Values from `linux/filter.h` and `linux/seccomp.h`.

use seccompiler::sock_filter;

/// `BPF_LD | BPF_W | BPF_ABS`: load a 32-bit word of `seccomp_data`.
pub(crate) const LD_W_ABS: u16 = 0x20;
/// `BPF_JMP | BPF_JEQ | BPF_K`.
pub(crate) const JEQ_K: u16 = 0x15;
/// `BPF_JMP | BPF_JGE | BPF_K`.
pub(crate) const JGE_K: u16 = 0x35;
/// `BPF_JMP | BPF_JSET | BPF_K`.
pub(crate) const JSET_K: u16 = 0x45;
/// `BPF_RET | BPF_K`.
pub(crate) const RET_K: u16 = 0x06;

/// `SECCOMP_RET_ALLOW`.
pub(crate) const RET_ALLOW: u32 = 0x7fff_0000;
/// `SECCOMP_RET_ERRNO` (the errno goes in the low 16 bits).
pub(crate) const RET_ERRNO: u32 = 0x0005_0000;
/// `SECCOMP_RET_KILL_PROCESS`.
pub(crate) const RET_KILL_PROCESS: u32 = 0x8000_0000;

/// One instruction.
pub(crate) fn ins(code: u16, jt: u8, jf: u8, k: u32) -> sock_filter {
    sock_filter { code, jt, jf, k }
}
