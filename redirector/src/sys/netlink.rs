//! A minimal netlink request/response loop: one request, then every reply message to it
//! (by sequence number) until the dump ends or the kernel acknowledges (or rejects) the
//! request; a dump's error is the one its NLMSG_DONE carries.

use std::{
    io,
    os::fd::{AsFd, AsRawFd, BorrowedFd, FromRawFd, OwnedFd},
    sync::atomic::{AtomicU32, Ordering},
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

/// The sequence number of the next request: each its own within the process.
static NEXT_SEQ: AtomicU32 = AtomicU32::new(1);

/// A netlink request: header (length, type, flags, a sequence number of its own, port id 0
/// for the kernel to fill in) followed by `body`.
pub fn message(kind: u16, flags: u16, body: &[u8]) -> Vec<u8> {
    let len = (HEADER_LEN + body.len()) as u32;
    let seq = NEXT_SEQ.fetch_add(1, Ordering::Relaxed);
    let mut msg = Vec::with_capacity(len as usize);
    msg.extend_from_slice(&len.to_ne_bytes());
    msg.extend_from_slice(&kind.to_ne_bytes());
    msg.extend_from_slice(&flags.to_ne_bytes());
    msg.extend_from_slice(&seq.to_ne_bytes());
    msg.extend_from_slice(&0u32.to_ne_bytes());
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

/// Create what a `kind` message with `body` describes (an address, a route, a rule) in the
/// current network namespace, over NETLINK_ROUTE; one already there is left as it is.
pub fn create(kind: u16, body: &[u8]) -> io::Result<()> {
    let request = message(
        kind,
        NLM_F_REQUEST | NLM_F_ACK | NLM_F_CREATE | NLM_F_EXCL,
        body,
    );
    match exchange(NETLINK_ROUTE, &request, |_, _| {}) {
        Err(err) if err.raw_os_error() == Some(libc::EEXIST) => Ok(()),
        other => other,
    }
}

/// Deletes the `(kind, body)` message's rule or route; one already gone is fine.
pub fn delete(kind: u16, body: &[u8]) -> io::Result<()> {
    let request = message(kind, NLM_F_REQUEST | NLM_F_ACK, body);
    match exchange(NETLINK_ROUTE, &request, |_, _| {}) {
        Err(err) if matches!(err.raw_os_error(), Some(libc::ENOENT | libc::ESRCH)) => Ok(()),
        other => other,
    }
}

/// Send `request` on a new `protocol` socket of the current network namespace and pass
/// each reply (type, body) to `on_reply`, until NLMSG_DONE or an acknowledgement.
pub fn exchange(protocol: i32, request: &[u8], on_reply: impl FnMut(u16, &[u8])) -> io::Result<()> {
    exchange_on(socket(protocol)?.as_fd(), request, on_reply)
}

/// [`exchange`] on an open socket. Only the replies that carry the request's sequence
/// number count: an earlier exchange on the socket that ended in an error may have left
/// the rest of its replies unread.
pub fn exchange_on(
    sock: BorrowedFd<'_>,
    request: &[u8],
    mut on_reply: impl FnMut(u16, &[u8]),
) -> io::Result<()> {
    let seq = request
        .get(8..12)
        .map(|b| u32::from_ne_bytes(b.try_into().expect("4 bytes")))
        .ok_or_else(|| io::Error::new(io::ErrorKind::InvalidInput, "no netlink header"))?;
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
        if read_replies(&buf[..n as usize], seq, &mut on_reply)? {
            return Ok(());
        }
    }
}

/// Pass the messages of one datagram that answer `seq` to `on_reply`: `true` once one
/// ends the exchange (NLMSG_DONE, or NLMSG_ERROR, which is also the acknowledgement).
fn read_replies(
    mut rest: &[u8],
    seq: u32,
    on_reply: &mut impl FnMut(u16, &[u8]),
) -> io::Result<bool> {
    while rest.len() >= HEADER_LEN {
        let len = u32::from_ne_bytes(rest[0..4].try_into().expect("4 bytes")) as usize;
        let kind = u16::from_ne_bytes(rest[4..6].try_into().expect("2 bytes"));
        let reply_seq = u32::from_ne_bytes(rest[8..12].try_into().expect("4 bytes"));
        if len < HEADER_LEN || len > rest.len() {
            return Err(io::Error::other("truncated netlink reply"));
        }
        let body = &rest[HEADER_LEN..len];
        if reply_seq == seq {
            match kind {
                // A dump that failed part way (a table changing under it, a buffer too
                // small) ends in NLMSG_DONE carrying the error, not in NLMSG_ERROR.
                NLMSG_DONE => return outcome(body, 0).map(|()| true),
                NLMSG_ERROR => return outcome(body, -libc::EPROTO).map(|()| true),
                _ => on_reply(kind, body),
            }
        }
        // Messages are 4-byte aligned.
        rest = &rest[((len + 3) & !3).min(rest.len())..];
    }
    Ok(false)
}

/// The outcome NLMSG_DONE or NLMSG_ERROR carries: 0 or a negative errno, first in its
/// body; `missing` when the body is too short to hold one.
fn outcome(body: &[u8], missing: i32) -> io::Result<()> {
    let errno = body.get(..4).map_or(missing, |b| {
        i32::from_ne_bytes(b.try_into().expect("4 bytes"))
    });
    if errno == 0 {
        Ok(())
    } else {
        Err(io::Error::from_raw_os_error(-errno))
    }
}

#[cfg(test)]
mod tests {
    use std::os::{fd::AsFd, unix::net::UnixDatagram};

    use super::*;

    /// A reply message of `kind` with `seq` and `body`, as the kernel writes it.
    fn reply(kind: u16, seq: u32, body: &[u8]) -> Vec<u8> {
        let mut msg = message(kind, 0x2 /* NLM_F_MULTI */, body);
        msg[8..12].copy_from_slice(&seq.to_ne_bytes());
        // Padded to 4 bytes, as messages are laid one after another.
        msg.resize(msg.len().next_multiple_of(4), 0);
        msg
    }

    fn seq_of(request: &[u8]) -> u32 {
        u32::from_ne_bytes(request[8..12].try_into().unwrap())
    }

    /// `request` exchanged with a peer that has queued `replies` (one datagram each): the
    /// reply bodies passed on, and the result.
    fn exchange_with(request: &[u8], replies: &[Vec<u8>]) -> (Vec<Vec<u8>>, io::Result<()>) {
        let (ours, kernel) = UnixDatagram::pair().unwrap();
        for datagram in replies {
            kernel.send(datagram).unwrap();
        }
        let mut bodies = Vec::new();
        let result = exchange_on(ours.as_fd(), request, |_, body| bodies.push(body.to_vec()));
        (bodies, result)
    }

    #[test]
    fn a_dump_that_fails_ends_in_the_error_its_done_message_carries() {
        let request = message(18, NLM_F_REQUEST | NLM_F_DUMP, &[0; 16]);
        let seq = seq_of(&request);
        let replies = [
            reply(16, seq, b"link"),
            reply(NLMSG_DONE, seq, &(-libc::EMSGSIZE).to_ne_bytes()),
        ];
        let (bodies, result) = exchange_with(&request, &replies);
        assert_eq!(bodies, [b"link".to_vec()]);
        assert_eq!(
            result.unwrap_err().raw_os_error(),
            Some(libc::EMSGSIZE),
            "the dump's error"
        );
        // A dump that ends well carries 0.
        let replies = [reply(NLMSG_DONE, seq, &0i32.to_ne_bytes())];
        assert!(exchange_with(&request, &replies).1.is_ok());
    }

    #[test]
    fn replies_to_an_earlier_request_are_skipped() {
        let request = message(18, NLM_F_REQUEST | NLM_F_DUMP, &[0; 16]);
        let seq = seq_of(&request);
        let earlier = seq.wrapping_sub(1);
        // What an abandoned exchange on the same socket left unread, in one datagram.
        let stale = [
            reply(16, earlier, b"stale"),
            reply(NLMSG_DONE, earlier, &0i32.to_ne_bytes()),
        ]
        .concat();
        let replies = [
            stale,
            reply(16, seq, b"fresh"),
            reply(NLMSG_DONE, seq, &0i32.to_ne_bytes()),
        ];
        let (bodies, result) = exchange_with(&request, &replies);
        result.unwrap();
        assert_eq!(bodies, [b"fresh".to_vec()]);
    }

    #[test]
    fn each_request_has_a_sequence_number_of_its_own() {
        let one = message(18, NLM_F_REQUEST, &[]);
        let two = message(18, NLM_F_REQUEST, &[]);
        assert_ne!(seq_of(&one), seq_of(&two));
    }
}
