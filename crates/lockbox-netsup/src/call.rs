//! The calls the supervisor decides on, copied out of the caller: [`Call`] and its
//! arguments (`process_vm_readv`), and the sockaddr parser.

use super::{MAX_CONTROL, MAX_IOV};
use crate::sys::{self as sysnet, Notif};
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};

/// The call being decided, with the supervisor's own copies of its arguments.
#[derive(Debug)]
pub(super) enum Call {
    Connect {
        addr: Vec<u8>,
    },
    Send {
        name: Option<Vec<u8>>,
        /// Where the data iovecs are: (base, len) in the caller.
        iov: Vec<(u64, usize)>,
        control: Vec<u8>,
        flags: i32,
        /// For sendmmsg: where to store `msg_len` of the first message.
        mmsg_len_at: Option<u64>,
    },
}

impl Call {
    pub(super) fn name(&self) -> &'static str {
        match self {
            Call::Connect { .. } => "connect",
            Call::Send { .. } => "send",
        }
    }
}

fn read_bytes(tid: libc::pid_t, addr: u64, len: usize) -> Result<Vec<u8>, i32> {
    let mut buf = vec![0u8; len];
    sysnet::vm_read(tid, addr, &mut buf).map_err(|e| e.0)?;
    Ok(buf)
}

fn word(b: &[u8], at: usize) -> u64 {
    let mut w = [0u8; 8];
    w.copy_from_slice(&b[at..at + 8]);
    u64::from_ne_bytes(w)
}

/// Copies the arguments the decision depends on.
pub(super) fn read_call(tid: libc::pid_t, n: &Notif) -> Result<Call, i32> {
    let a = n.args;
    let sockaddr = |ptr: u64, len: u64| -> Result<Option<Vec<u8>>, i32> {
        if ptr == 0 {
            return Ok(None);
        }
        let len = usize::try_from(len).unwrap_or(usize::MAX);
        if len > std::mem::size_of::<libc::sockaddr_storage>() {
            return Err(libc::EINVAL);
        }
        read_bytes(tid, ptr, len).map(Some)
    };
    match i64::from(n.nr) {
        libc::SYS_connect => Ok(Call::Connect {
            addr: sockaddr(a[1], a[2])?.unwrap_or_default(),
        }),
        libc::SYS_sendto => Ok(Call::Send {
            name: sockaddr(a[4], a[5])?,
            iov: vec![(a[1], usize::try_from(a[2]).unwrap_or(usize::MAX))],
            control: Vec::new(),
            flags: a[3] as i32,
            mmsg_len_at: None,
        }),
        libc::SYS_sendmsg => read_msghdr(tid, a[1], a[2] as i32, None),
        libc::SYS_sendmmsg => {
            if a[2] == 0 {
                return Err(libc::EINVAL);
            }
            // Only the first message: sendmmsg may send fewer than asked.
            let len_at = a[1] + std::mem::size_of::<libc::msghdr>() as u64;
            read_msghdr(tid, a[1], a[3] as i32, Some(len_at))
        }
        _ => Err(libc::ENOSYS),
    }
}

fn read_msghdr(
    tid: libc::pid_t,
    at: u64,
    flags: i32,
    mmsg_len_at: Option<u64>,
) -> Result<Call, i32> {
    // struct msghdr on 64-bit: name, namelen(+pad), iov, iovlen, control, controllen, flags.
    let h = read_bytes(tid, at, std::mem::size_of::<libc::msghdr>())?;
    let (name_ptr, name_len) = (word(&h, 0), word(&h, 8) & 0xffff_ffff);
    let (iov_ptr, iov_len) = (word(&h, 16), word(&h, 24));
    let (control_ptr, control_len) = (word(&h, 32), word(&h, 40));
    if iov_len as usize > MAX_IOV || control_len as usize > MAX_CONTROL {
        return Err(libc::EMSGSIZE);
    }
    let name = if name_ptr == 0 || name_len == 0 {
        None
    } else if name_len as usize > std::mem::size_of::<libc::sockaddr_storage>() {
        return Err(libc::EINVAL);
    } else {
        Some(read_bytes(tid, name_ptr, name_len as usize)?)
    };
    let raw = read_bytes(tid, iov_ptr, iov_len as usize * 16)?;
    let iov = raw
        .chunks_exact(16)
        .map(|c| (word(c, 0), word(c, 8) as usize))
        .collect();
    let control = if control_ptr == 0 {
        Vec::new()
    } else {
        read_bytes(tid, control_ptr, control_len as usize)?
    };
    Ok(Call::Send {
        name,
        iov,
        control,
        flags,
        mmsg_len_at,
    })
}

/// Parses an AF_INET/AF_INET6 sockaddr; `None` for anything else (AF_UNSPEC included).
pub fn parse_sockaddr(b: &[u8]) -> Option<SocketAddr> {
    let family = i32::from(u16::from_ne_bytes([*b.first()?, *b.get(1)?]));
    let port = u16::from_be_bytes([*b.get(2)?, *b.get(3)?]);
    match family {
        libc::AF_INET if b.len() >= 8 => {
            let ip = Ipv4Addr::new(b[4], b[5], b[6], b[7]);
            Some(SocketAddr::new(IpAddr::V4(ip), port))
        }
        libc::AF_INET6 if b.len() >= 24 => {
            let mut ip = [0u8; 16];
            ip.copy_from_slice(&b[8..24]);
            Some(SocketAddr::new(IpAddr::V6(Ipv6Addr::from(ip)), port))
        }
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sockaddrs_parse_v4_and_v6_and_reject_others() {
        let mut v4 = vec![0u8; 16];
        v4[..2].copy_from_slice(&(libc::AF_INET as u16).to_ne_bytes());
        v4[2..4].copy_from_slice(&8080u16.to_be_bytes());
        v4[4..8].copy_from_slice(&[127, 0, 0, 2]);
        assert_eq!(parse_sockaddr(&v4), Some("127.0.0.2:8080".parse().unwrap()));
        let mut v6 = vec![0u8; 28];
        v6[..2].copy_from_slice(&(libc::AF_INET6 as u16).to_ne_bytes());
        v6[2..4].copy_from_slice(&53u16.to_be_bytes());
        v6[23] = 1;
        assert_eq!(parse_sockaddr(&v6), Some("[::1]:53".parse().unwrap()));
        assert_eq!(parse_sockaddr(&v6[..20]), None);
        assert_eq!(parse_sockaddr(&[0, 0]), None);
        assert_eq!(parse_sockaddr(&[]), None);
    }
}
