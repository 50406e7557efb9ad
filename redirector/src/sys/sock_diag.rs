//! Listening TCP sockets of the current network namespace, from the kernel's sock_diag
//! netlink interface. Asking for LISTEN sockets only walks the listening hash, where
//! /proc/net/tcp walks every socket of the host (milliseconds on a large machine).

use std::{io, os::fd::BorrowedFd};

use crate::sys::netlink::{self, NLM_F_DUMP, NLM_F_REQUEST};

pub const NETLINK_SOCK_DIAG: i32 = 4;
const SOCK_DIAG_BY_FAMILY: u16 = 20;
const TCP_LISTEN: u32 = 10;
/// `struct inet_diag_req_v2`.
const REQ_LEN: usize = 56;
/// Offset of `id.idiag_sport` in `struct inet_diag_msg`.
const MSG_SPORT_OFFSET: usize = 4;
/// Offset of `idiag_inode` in `struct inet_diag_msg`.
const MSG_INODE_OFFSET: usize = 68;

/// A listening socket: local port and socket inode.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ListeningSocket {
    pub port: u16,
    pub inode: u64,
}

/// Every TCP listener of `family` (AF_INET or AF_INET6) in the network namespace of `sock`,
/// a NETLINK_SOCK_DIAG socket.
pub fn tcp_listeners(sock: BorrowedFd<'_>, family: u8) -> io::Result<Vec<ListeningSocket>> {
    let mut req = [0u8; REQ_LEN];
    req[0] = family;
    req[1] = libc::IPPROTO_TCP as u8;
    req[4..8].copy_from_slice(&(1u32 << TCP_LISTEN).to_ne_bytes());
    let request = netlink::message(SOCK_DIAG_BY_FAMILY, NLM_F_REQUEST | NLM_F_DUMP, &req);
    let mut found = Vec::new();
    netlink::exchange_on(sock, &request, |_, body| {
        if body.len() >= MSG_INODE_OFFSET + 4 {
            let port = u16::from_be_bytes([body[MSG_SPORT_OFFSET], body[MSG_SPORT_OFFSET + 1]]);
            let inode = u32::from_ne_bytes(
                body[MSG_INODE_OFFSET..MSG_INODE_OFFSET + 4]
                    .try_into()
                    .expect("4 bytes"),
            );
            found.push(ListeningSocket {
                port,
                inode: u64::from(inode),
            });
        }
    })?;
    Ok(found)
}
