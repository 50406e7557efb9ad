//! Listening TCP sockets of the current network namespace, from the kernel's sock_diag
//! netlink interface. Asking for LISTEN sockets only walks the listening hash, where
//! /proc/net/tcp walks every socket of the host (milliseconds on a large machine).

use std::{
    io,
    os::fd::{AsRawFd, FromRawFd, OwnedFd},
};

const NETLINK_SOCK_DIAG: i32 = 4;
const SOCK_DIAG_BY_FAMILY: u16 = 20;
const NLM_F_REQUEST: u16 = 0x1;
const NLM_F_DUMP: u16 = 0x300;
const NLMSG_ERROR: u16 = 2;
const NLMSG_DONE: u16 = 3;
const TCP_LISTEN: u32 = 10;
const NLMSG_HDR_LEN: usize = 16;
/// `struct inet_diag_req_v2`.
const REQ_LEN: usize = 56;
/// Offset of `idiag_inode` in `struct inet_diag_msg`.
const MSG_INODE_OFFSET: usize = 68;
/// Offset of `id.idiag_sport` in `struct inet_diag_msg`.
const MSG_SPORT_OFFSET: usize = 4;

/// A listening socket: local port and socket inode.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ListeningSocket {
    pub port: u16,
    pub inode: u64,
}

/// Every TCP listener of `family` (AF_INET or AF_INET6) in this thread's network namespace.
pub fn tcp_listeners(family: u8) -> io::Result<Vec<ListeningSocket>> {
    // SAFETY: socket(2); the descriptor is owned below.
    let fd = unsafe { libc::socket(libc::AF_NETLINK, libc::SOCK_DGRAM | libc::SOCK_CLOEXEC, NETLINK_SOCK_DIAG) };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: `fd` is a new descriptor nobody else owns.
    let sock = unsafe { OwnedFd::from_raw_fd(fd) };
    let mut req = [0u8; NLMSG_HDR_LEN + REQ_LEN];
    let total = req.len() as u32;
    req[0..4].copy_from_slice(&total.to_ne_bytes());
    req[4..6].copy_from_slice(&SOCK_DIAG_BY_FAMILY.to_ne_bytes());
    req[6..8].copy_from_slice(&(NLM_F_REQUEST | NLM_F_DUMP).to_ne_bytes());
    req[16] = family;
    req[17] = libc::IPPROTO_TCP as u8;
    req[20..24].copy_from_slice(&(1u32 << TCP_LISTEN).to_ne_bytes());
    // SAFETY: sending a buffer we own, with its length.
    if unsafe { libc::send(sock.as_raw_fd(), req.as_ptr().cast(), req.len(), 0) } < 0 {
        return Err(io::Error::last_os_error());
    }
    let mut found = Vec::new();
    let mut buf = vec![0u8; 32 * 1024];
    loop {
        // SAFETY: receiving into a buffer we own, with its length.
        let n = unsafe { libc::recv(sock.as_raw_fd(), buf.as_mut_ptr().cast(), buf.len(), 0) };
        if n < 0 {
            return Err(io::Error::last_os_error());
        }
        let mut msg = &buf[..n as usize];
        while msg.len() >= NLMSG_HDR_LEN {
            let len = u32::from_ne_bytes(msg[0..4].try_into().expect("4 bytes")) as usize;
            let kind = u16::from_ne_bytes(msg[4..6].try_into().expect("2 bytes"));
            if len < NLMSG_HDR_LEN || len > msg.len() {
                return Err(io::Error::other("truncated sock_diag reply"));
            }
            match kind {
                NLMSG_DONE => return Ok(found),
                NLMSG_ERROR => {
                    let errno = i32::from_ne_bytes(msg[16..20].try_into().expect("4 bytes"));
                    return Err(io::Error::from_raw_os_error(-errno));
                }
                _ => {
                    let body = &msg[NLMSG_HDR_LEN..len];
                    if body.len() >= MSG_INODE_OFFSET + 4 {
                        let port = u16::from_be_bytes([body[MSG_SPORT_OFFSET], body[MSG_SPORT_OFFSET + 1]]);
                        let inode = u32::from_ne_bytes(
                            body[MSG_INODE_OFFSET..MSG_INODE_OFFSET + 4].try_into().expect("4 bytes"),
                        );
                        found.push(ListeningSocket { port, inode: u64::from(inode) });
                    }
                }
            }
            // Messages are 4-byte aligned.
            msg = &msg[((len + 3) & !3).min(msg.len())..];
        }
    }
}
