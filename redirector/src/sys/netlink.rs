//! A minimal netlink request/response loop: one request, then every reply message until
//! the dump ends or the kernel acknowledges (or rejects) the request.

use std::{
    io,
    os::fd::{AsFd, AsRawFd, BorrowedFd, FromRawFd, OwnedFd},
};

/// The rtnetlink protocol: links, addresses, routes.
pub const NETLINK_ROUTE: i32 = 0;
pub const NLM_F_REQUEST: u16 = 0x1;
pub const NLM_F_ACK: u16 = 0x4;
pub const NLM_F_EXCL: u16 = 0x200;
pub const NLM_F_CREATE: u16 = 0x400;
pub const NLM_F_DUMP: u16 = 0x300;
const NLMSG_ERROR: u16 = 2;
const NLMSG_DONE: u16 = 3;
pub const HEADER_LEN: usize = 16;

/// A netlink message: header (length, type, flags) followed by `body`.
pub fn message(kind: u16, flags: u16, body: &[u8]) -> Vec<u8> {
    let len = (HEADER_LEN + body.len()) as u32;
    let mut msg = Vec::with_capacity(len as usize);
    msg.extend_from_slice(&len.to_ne_bytes());
    msg.extend_from_slice(&kind.to_ne_bytes());
    msg.extend_from_slice(&flags.to_ne_bytes());
    msg.extend_from_slice(&[0; 8]); // sequence number, port id
    msg.extend_from_slice(body);
    msg
}

/// The attributes (type, value) of a message's attribute area, in order; a malformed
/// length ends them.
pub fn attributes(mut attrs: &[u8]) -> impl Iterator<Item = (u16, &[u8])> {
    std::iter::from_fn(move || {
        if attrs.len() < 4 {
            return None;
        }
        let len = usize::from(u16::from_ne_bytes([attrs[0], attrs[1]]));
        let kind = u16::from_ne_bytes([attrs[2], attrs[3]]);
        if len < 4 || len > attrs.len() {
            return None;
        }
        let value = &attrs[4..len];
        // Attributes are 4-byte aligned.
        attrs = &attrs[((len + 3) & !3).min(attrs.len())..];
        Some((kind, value))
    })
}

/// A new `protocol` netlink socket of the calling thread's network namespace (it stays in
/// that namespace wherever it is used later).
pub fn socket(protocol: i32) -> io::Result<OwnedFd> {
    // SAFETY: socket(2); the descriptor is owned right below.
    let fd = unsafe {
        libc::socket(
            libc::AF_NETLINK,
            libc::SOCK_DGRAM | libc::SOCK_CLOEXEC,
            protocol,
        )
    };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: `fd` is a new descriptor nobody else owns.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

/// Send `request` on a new `protocol` socket of the current network namespace and pass
/// each reply (type, body) to `on_reply`, until NLMSG_DONE or an acknowledgement.
pub fn exchange(protocol: i32, request: &[u8], on_reply: impl FnMut(u16, &[u8])) -> io::Result<()> {
    exchange_on(socket(protocol)?.as_fd(), request, on_reply)
}

/// [`exchange`] on an open socket.
pub fn exchange_on(
    sock: BorrowedFd<'_>,
    request: &[u8],
    mut on_reply: impl FnMut(u16, &[u8]),
) -> io::Result<()> {
    // SAFETY: sending a buffer we own, with its length.
    if unsafe { libc::send(sock.as_raw_fd(), request.as_ptr().cast(), request.len(), 0) } < 0 {
        return Err(io::Error::last_os_error());
    }
    let mut buf = vec![0u8; 32 * 1024];
    loop {
        // SAFETY: receiving into a buffer we own, with its length.
        let n = unsafe { libc::recv(sock.as_raw_fd(), buf.as_mut_ptr().cast(), buf.len(), 0) };
        if n < 0 {
            return Err(io::Error::last_os_error());
        }
        let mut rest = &buf[..n as usize];
        while rest.len() >= HEADER_LEN {
            let len = u32::from_ne_bytes(rest[0..4].try_into().expect("4 bytes")) as usize;
            let kind = u16::from_ne_bytes(rest[4..6].try_into().expect("2 bytes"));
            if len < HEADER_LEN || len > rest.len() {
                return Err(io::Error::other("truncated netlink reply"));
            }
            match kind {
                NLMSG_DONE => return Ok(()),
                NLMSG_ERROR => {
                    let errno = i32::from_ne_bytes(rest[16..20].try_into().expect("4 bytes"));
                    return if errno == 0 {
                        Ok(())
                    } else {
                        Err(io::Error::from_raw_os_error(-errno))
                    };
                }
                _ => on_reply(kind, &rest[HEADER_LEN..len]),
            }
            // Messages are 4-byte aligned.
            rest = &rest[((len + 3) & !3).min(rest.len())..];
        }
    }
}
