//! The seccomp filter of the sandboxed command that hands calls to the network supervisor
//! (`lockbox_netsup`, which relies on what it refuses: see its `decide`).

use crate::sysnet;

/// The filter of the sandboxed command: which calls reach the supervisor. With `renames`
/// (a writable overlay view), renames reach it too, for [`crate::dirmove`]: a process has
/// one notification listener.
pub fn filter(renames: bool) -> Vec<seccompiler::sock_filter> {
    use crate::bpf::{ins, JEQ_K, JSET_K, LD_W_ABS, RET_ALLOW as ALLOW, RET_ERRNO as ERRNO, RET_K};
    use seccompiler::sock_filter;
    const NOTIF: u32 = sysnet::RET_USER_NOTIF;
    const FASTOPEN: u32 = 0x2000_0000; // MSG_FASTOPEN: connects from a send
                                       // Sets sticky options (a routing header among them) from a control-message buffer.
    const IPV6_2292PKTOPTIONS: u32 = 6;
    let arg_lo = |i: u32| 16 + 8 * i;
    let arg_hi = |i: u32| 16 + 8 * i + 4;
    let ld = |k| ins(LD_W_ABS, 0, 0, k);
    let ret = |k| ins(RET_K, 0, 0, k);
    // Refuse fast open (its address is in memory we cannot pin), else notify.
    let flags_then_notify = |flags_arg: u32| {
        vec![
            ld(arg_lo(flags_arg)),
            ins(JSET_K, 0, 1, FASTOPEN),
            ret(ERRNO | libc::EOPNOTSUPP as u32),
            ret(NOTIF),
        ]
    };
    let mut blocks: Vec<(i64, Vec<sock_filter>)> = vec![
        (libc::SYS_connect, vec![ret(NOTIF)]),
        (libc::SYS_sendmsg, flags_then_notify(2)),
        (libc::SYS_sendmmsg, flags_then_notify(3)),
        (
            libc::SYS_sendto,
            vec![
                ld(arg_lo(3)),
                ins(JSET_K, 0, 1, FASTOPEN),
                ret(ERRNO | libc::EOPNOTSUPP as u32),
                // No address (a connected socket): the kernel's own path.
                ld(arg_lo(4)),
                ins(JEQ_K, 0, 2, 0),
                ld(arg_hi(4)),
                ins(JEQ_K, 1, 0, 0),
                ret(NOTIF),
                ret(ALLOW),
            ],
        ),
        (
            libc::SYS_setsockopt,
            vec![
                // Sticky IP options (a source route) and IPv6 routing headers send a host
                // socket's packets to an address of their own choosing first, not to the
                // destination the supervisor checked; an IPv6 routing header needs no
                // privilege. Level and name are ints: compare their low 32 bits.
                ld(arg_lo(1)),
                ins(JEQ_K, 0, 3, libc::IPPROTO_IPV6 as u32),
                ld(arg_lo(2)),
                ins(JEQ_K, 5, 0, libc::IPV6_RTHDR as u32),
                ins(JEQ_K, 4, 3, IPV6_2292PKTOPTIONS),
                ins(JEQ_K, 0, 2, libc::IPPROTO_IP as u32),
                ld(arg_lo(2)),
                ins(JEQ_K, 1, 0, libc::IP_OPTIONS as u32),
                ret(ALLOW),
                ret(ERRNO | libc::EPERM as u32),
            ],
        ),
        (
            libc::SYS_clone,
            vec![
                // Sharing the descriptor table outside a thread group would let another
                // process swap a socket under a call we let the kernel continue.
                ld(arg_lo(0)),
                ins(JSET_K, 0, 2, libc::CLONE_FILES as u32),
                ins(JSET_K, 1, 0, libc::CLONE_THREAD as u32),
                ret(ERRNO | libc::EPERM as u32),
                ret(ALLOW),
            ],
        ),
    ];
    if renames {
        blocks.extend(
            crate::dirmove::RENAMES
                .iter()
                .map(|&nr| (nr, vec![ret(NOTIF)])),
        );
    }
    let mut program = vec![ld(0)];
    for (nr, body) in blocks {
        program.push(ins(JEQ_K, 0, body.len() as u8, nr as u32));
        program.extend(body);
        // Bodies end in a return, except that A was overwritten: reload the number.
        program.push(ld(0));
    }
    program.push(ret(ALLOW));
    program
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn filter_jumps_stay_inside_the_program() {
        let p = filter(true);
        for (i, ins) in p.iter().enumerate() {
            if ins.code & 0x07 == 0x05 {
                assert!(i + 1 + (ins.jt.max(ins.jf) as usize) < p.len(), "at {i}");
            }
        }
        assert_eq!(p.last().map(|i| i.code), Some(0x06));
    }
}
