//! Unix `SOCK_SEQPACKET` sockets on tokio: one message a packet, a file descriptor beside
//! it (SCM_RIGHTS), and the peer's process (SO_PEERCRED). std and tokio have stream and
//! datagram unix sockets only.

use std::{
    io,
    mem::{size_of, zeroed},
    os::{
        fd::{AsFd, AsRawFd, BorrowedFd, FromRawFd, OwnedFd, RawFd},
        unix::ffi::OsStrExt,
    },
    path::Path,
};

use tokio::io::{unix::AsyncFd, Interest};

use super::wire::MAX_MESSAGE;

/// A listening socket.
pub struct Listener(AsyncFd<OwnedFd>);

/// One connection.
pub struct Conn(AsyncFd<OwnedFd>);

/// The process at the other end, as the kernel saw it connect.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Peer {
    pub pid: u32,
    pub uid: u32,
    pub gid: u32,
}

/// A message, and the descriptor that came with it.
pub struct Packet {
    pub bytes: Vec<u8>,
    pub fd: Option<OwnedFd>,
}

fn socket() -> io::Result<OwnedFd> {
    // SAFETY: socket(2) with constant arguments; a valid fd is owned from here on.
    let fd = unsafe {
        libc::socket(
            libc::AF_UNIX,
            libc::SOCK_SEQPACKET | libc::SOCK_NONBLOCK | libc::SOCK_CLOEXEC,
            0,
        )
    };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: fd was just returned by socket(2) and is owned by nobody else.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

fn register(fd: OwnedFd) -> io::Result<AsyncFd<OwnedFd>> {
    // SAFETY: the OwnedFd keeps its descriptor open and unchanged for as long as the
    // AsyncFd holding it lives.
    unsafe { AsyncFd::register(fd) }.map_err(|e| e.into_parts().1)
}

fn address(path: &Path) -> io::Result<(libc::sockaddr_un, libc::socklen_t)> {
    // SAFETY: sockaddr_un is plain data; all zeroes is a valid value.
    let mut addr: libc::sockaddr_un = unsafe { zeroed() };
    addr.sun_family = libc::AF_UNIX as libc::sa_family_t;
    let bytes = path.as_os_str().as_bytes();
    if bytes.len() >= addr.sun_path.len() {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            format!("socket path too long: {}", path.display()),
        ));
    }
    for (slot, &byte) in addr.sun_path.iter_mut().zip(bytes) {
        *slot = byte as libc::c_char;
    }
    let len = size_of::<libc::sa_family_t>() + bytes.len() + 1;
    Ok((addr, len as libc::socklen_t))
}

fn check(ret: libc::c_int) -> io::Result<libc::c_int> {
    if ret < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(ret)
    }
}

impl Listener {
    /// Listens at `path` (which must not exist). Call inside a tokio runtime.
    pub fn bind(path: &Path) -> io::Result<Self> {
        let fd = socket()?;
        let (addr, len) = address(path)?;
        // SAFETY: addr is a valid sockaddr_un of len bytes; fd is an open socket.
        check(unsafe { libc::bind(fd.as_raw_fd(), (&raw const addr).cast(), len) })?;
        // SAFETY: listen(2) on an open, bound socket.
        check(unsafe { libc::listen(fd.as_raw_fd(), 8) })?;
        Ok(Listener(register(fd)?))
    }

    pub async fn accept(&self) -> io::Result<Conn> {
        let fd = self
            .0
            .async_io(Interest::READABLE, |fd| {
                // SAFETY: accept4(2) on a listening socket; no address is asked for.
                let conn = unsafe {
                    libc::accept4(
                        fd.as_raw_fd(),
                        std::ptr::null_mut(),
                        std::ptr::null_mut(),
                        libc::SOCK_NONBLOCK | libc::SOCK_CLOEXEC,
                    )
                };
                // SAFETY: a non-negative result is a new fd nobody else owns.
                check(conn).map(|conn| unsafe { OwnedFd::from_raw_fd(conn) })
            })
            .await?;
        Conn::new(fd)
    }
}

impl Conn {
    fn new(fd: OwnedFd) -> io::Result<Self> {
        Ok(Conn(register(fd)?))
    }

    /// Connects to a listener at `path` (ztunnel's side, and the tests'). Call inside a
    /// tokio runtime.
    pub fn connect(path: &Path) -> io::Result<Self> {
        let fd = socket()?;
        let (addr, len) = address(path)?;
        // SAFETY: addr is a valid sockaddr_un of len bytes. A unix socket connects at once
        // or fails (EAGAIN when the backlog is full).
        check(unsafe { libc::connect(fd.as_raw_fd(), (&raw const addr).cast(), len) })?;
        Conn::new(fd)
    }

    /// A connected pair, for tests.
    pub fn pair() -> io::Result<(Self, Self)> {
        let mut fds = [0 as RawFd; 2];
        // SAFETY: socketpair(2) writes two fds into the array.
        check(unsafe {
            libc::socketpair(
                libc::AF_UNIX,
                libc::SOCK_SEQPACKET | libc::SOCK_NONBLOCK | libc::SOCK_CLOEXEC,
                0,
                fds.as_mut_ptr(),
            )
        })?;
        // SAFETY: both fds were just made and are owned by nobody else.
        let (a, b) = unsafe { (OwnedFd::from_raw_fd(fds[0]), OwnedFd::from_raw_fd(fds[1])) };
        Ok((Conn::new(a)?, Conn::new(b)?))
    }

    /// The connecting process.
    pub fn peer(&self) -> io::Result<Peer> {
        // SAFETY: ucred is plain data; getsockopt writes at most len bytes into it.
        let mut cred: libc::ucred = unsafe { zeroed() };
        let mut len = size_of::<libc::ucred>() as libc::socklen_t;
        check(unsafe {
            libc::getsockopt(
                self.0.as_raw_fd(),
                libc::SOL_SOCKET,
                libc::SO_PEERCRED,
                (&raw mut cred).cast(),
                &mut len,
            )
        })?;
        Ok(Peer {
            pid: cred.pid as u32,
            uid: cred.uid,
            gid: cred.gid,
        })
    }

    /// Sends one message, with `fd` beside it if given.
    pub async fn send(&self, bytes: &[u8], fd: Option<BorrowedFd<'_>>) -> io::Result<()> {
        self.0
            .async_io(Interest::WRITABLE, |sock| {
                send_now(sock.as_raw_fd(), bytes, fd)
            })
            .await
    }

    /// The next message; `None` once the peer has closed (an empty packet reads the same:
    /// no ZDS message is empty). A message longer than [`MAX_MESSAGE`] is an error.
    pub async fn recv(&self) -> io::Result<Option<Packet>> {
        self.0
            .async_io(Interest::READABLE, |sock| recv_now(sock.as_raw_fd()))
            .await
    }
}

impl AsFd for Conn {
    fn as_fd(&self) -> BorrowedFd<'_> {
        self.0.get_ref().as_fd()
    }
}

/// Room for one fd's control message, aligned as a `cmsghdr` is.
#[repr(C, align(8))]
struct Control([u8; 64]);

fn send_now(sock: RawFd, bytes: &[u8], fd: Option<BorrowedFd<'_>>) -> io::Result<()> {
    let mut iov = libc::iovec {
        iov_base: bytes.as_ptr() as *mut libc::c_void,
        iov_len: bytes.len(),
    };
    // SAFETY: msghdr is plain data; zeroes are valid.
    let mut msg: libc::msghdr = unsafe { zeroed() };
    let mut control = Control([0; 64]);
    msg.msg_iov = &mut iov;
    msg.msg_iovlen = 1;
    if let Some(fd) = fd {
        let raw = fd.as_raw_fd();
        // SAFETY: CMSG_SPACE/CMSG_LEN are arithmetic; the control buffer holds one fd's
        // header and data (64 bytes > CMSG_SPACE(4)); CMSG_FIRSTHDR is non-null because
        // msg_controllen is at least one header.
        unsafe {
            msg.msg_control = control.0.as_mut_ptr().cast();
            msg.msg_controllen = libc::CMSG_SPACE(size_of::<RawFd>() as u32) as _;
            let cmsg = libc::CMSG_FIRSTHDR(&msg);
            (*cmsg).cmsg_level = libc::SOL_SOCKET;
            (*cmsg).cmsg_type = libc::SCM_RIGHTS;
            (*cmsg).cmsg_len = libc::CMSG_LEN(size_of::<RawFd>() as u32) as _;
            std::ptr::write_unaligned(libc::CMSG_DATA(cmsg).cast::<RawFd>(), raw);
        }
    }
    // SAFETY: msg points at live buffers for the whole call.
    let sent = unsafe { libc::sendmsg(sock, &msg, libc::MSG_NOSIGNAL) };
    if sent < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

fn recv_now(sock: RawFd) -> io::Result<Option<Packet>> {
    let mut buf = vec![0u8; MAX_MESSAGE];
    let mut iov = libc::iovec {
        iov_base: buf.as_mut_ptr().cast(),
        iov_len: buf.len(),
    };
    // SAFETY: as in send_now.
    let mut msg: libc::msghdr = unsafe { zeroed() };
    let mut control = Control([0; 64]);
    msg.msg_iov = &mut iov;
    msg.msg_iovlen = 1;
    msg.msg_control = control.0.as_mut_ptr().cast();
    msg.msg_controllen = size_of::<Control>() as _;
    // SAFETY: msg points at live buffers for the whole call.
    let read = unsafe { libc::recvmsg(sock, &mut msg, libc::MSG_CMSG_CLOEXEC) };
    if read < 0 {
        return Err(io::Error::last_os_error());
    }
    let fd = received_fd(&msg);
    if read == 0 && fd.is_none() {
        return Ok(None);
    }
    if msg.msg_flags & libc::MSG_TRUNC != 0 {
        return Err(io::Error::new(
            io::ErrorKind::InvalidData,
            format!("a message over {MAX_MESSAGE} bytes"),
        ));
    }
    if msg.msg_flags & libc::MSG_CTRUNC != 0 {
        return Err(io::Error::new(
            io::ErrorKind::InvalidData,
            "more descriptors than one with a message",
        ));
    }
    buf.truncate(read as usize);
    Ok(Some(Packet { bytes: buf, fd }))
}

/// The first descriptor of a received message's SCM_RIGHTS, owned.
fn received_fd(msg: &libc::msghdr) -> Option<OwnedFd> {
    // SAFETY: the kernel filled msg's control buffer; CMSG_FIRSTHDR/CMSG_NXTHDR walk it
    // within msg_controllen, and an SCM_RIGHTS header's data holds fds the kernel
    // installed in this process.
    unsafe {
        let mut cmsg = libc::CMSG_FIRSTHDR(msg);
        while !cmsg.is_null() {
            if (*cmsg).cmsg_level == libc::SOL_SOCKET && (*cmsg).cmsg_type == libc::SCM_RIGHTS {
                let fd = std::ptr::read_unaligned(libc::CMSG_DATA(cmsg).cast::<RawFd>());
                return Some(OwnedFd::from_raw_fd(fd));
            }
            cmsg = libc::CMSG_NXTHDR(msg, cmsg);
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use std::os::unix::fs::MetadataExt as _;

    use super::*;

    fn runtime() -> tokio::runtime::Runtime {
        tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap()
    }

    #[test]
    fn a_message_travels_with_its_descriptor_and_the_peer_is_known() {
        runtime().block_on(async {
            let dir = tempdir();
            let path = dir.join("zds.sock");
            let listener = Listener::bind(&path).unwrap();
            let client = Conn::connect(&path).unwrap();
            let server = listener.accept().await.unwrap();
            assert_eq!(server.peer().unwrap().pid, std::process::id());

            let netns = std::fs::File::open("/proc/self/ns/net").unwrap();
            server.send(b"hello", Some(netns.as_fd())).await.unwrap();
            let packet = client.recv().await.unwrap().unwrap();
            assert_eq!(packet.bytes, b"hello");
            let got = std::fs::File::from(packet.fd.expect("the fd came along"));
            let (a, b) = (netns.metadata().unwrap(), got.metadata().unwrap());
            assert_eq!((a.dev(), a.ino()), (b.dev(), b.ino()));

            client.send(b"ack", None).await.unwrap();
            let ack = server.recv().await.unwrap().expect("a message");
            assert!(ack.bytes == b"ack" && ack.fd.is_none());
            drop(client);
            assert!(server.recv().await.unwrap().is_none(), "closed");
            std::fs::remove_dir_all(dir).unwrap();
        });
    }

    #[test]
    fn a_message_over_the_limit_is_refused() {
        runtime().block_on(async {
            let (a, b) = Conn::pair().unwrap();
            a.send(&[0u8; MAX_MESSAGE + 1], None).await.unwrap();
            let err = b.recv().await.err().expect("refused");
            assert_eq!(err.kind(), io::ErrorKind::InvalidData, "{err}");
        });
    }

    fn tempdir() -> std::path::PathBuf {
        let dir = std::env::temp_dir().join(format!("zds-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        dir
    }
}
