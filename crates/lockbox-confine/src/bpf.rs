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
/// `BPF_JMP | BPF_JA`: jump forward by `k` (32 bits, unlike the 8-bit conditional jumps).
pub(crate) const JA: u16 = 0x05;

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

/// What [`dispatch`] does with a number it finds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Found {
    /// Return this (a `SECCOMP_RET_*` value).
    Return(u32),
    /// Go on to block `n` of those given to [`dispatch`].
    Block(usize),
}

/// Up to this many numbers are compared one by one at a leaf of [`dispatch`].
const LEAF: usize = 4;

/// A binary search for the accumulator (a syscall number) among `sorted` (ascending,
/// distinct numbers, each with what to do when found); a number not among them returns
/// `miss`. A filter whose every syscall walks a chain of comparisons costs the kernel, when
/// installed, a run of that chain per syscall number (the seccomp action cache emulates the
/// filter for each), and every call not in the cache the walk: the search makes it about
/// 16 instructions for lockbox's filter. `blocks` follow the search, each reached by the
/// numbers found with [`Found::Block`]; each must end in a return.
pub(crate) fn dispatch(
    sorted: &[(u32, Found)],
    miss: u32,
    blocks: &[Vec<sock_filter>],
) -> Vec<sock_filter> {
    let mut out = Vec::new();
    let mut jumps = Vec::new();
    search(sorted, miss, &mut out, &mut jumps);
    let mut starts = Vec::with_capacity(blocks.len());
    for block in blocks {
        starts.push(out.len());
        out.extend_from_slice(block);
    }
    for (at, block) in jumps {
        out[at].k = (starts[block] - at - 1) as u32;
    }
    out
}

/// Emits the search of `sorted`; `jumps` collects (instruction, block) to patch.
fn search(
    sorted: &[(u32, Found)],
    miss: u32,
    out: &mut Vec<sock_filter>,
    jumps: &mut Vec<(usize, usize)>,
) {
    if sorted.len() <= LEAF {
        for &(n, found) in sorted {
            // Equal: the action right after; else skip it.
            out.push(ins(JEQ_K, 0, 1, n));
            match found {
                Found::Return(k) => out.push(ins(RET_K, 0, 0, k)),
                Found::Block(block) => {
                    jumps.push((out.len(), block));
                    out.push(ins(JA, 0, 0, 0));
                }
            }
        }
        out.push(ins(RET_K, 0, 0, miss));
        return;
    }
    let (low, high) = sorted.split_at(sorted.len() / 2);
    // A >= high[0]: take the jump over the lower half; else skip the jump.
    out.push(ins(JGE_K, 0, 1, high[0].0));
    let over = out.len();
    out.push(ins(JA, 0, 0, 0));
    search(low, miss, out, jumps);
    out[over].k = (out.len() - over - 1) as u32;
    search(high, miss, out, jumps);
}
