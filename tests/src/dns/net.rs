//! Sockets for `dnsprobe`: UDP listeners that keep IPv4 and IPv6 apart, and DNS over TCP's
//! two-byte length framing (RFC 1035 §4.2.2).

use std::io::{self, Read, Write};
use std::net::{SocketAddr, TcpStream, UdpSocket};

use crate::sockaddr::{bind_family_apart, socket};

/// A UDP socket bound to `addr` with `SO_REUSEADDR`; IPv6 ones are `IPV6_V6ONLY`, so a
/// server can listen on `127.0.0.1:P` and `[::1]:P` (or the wildcards) side by side.
pub fn bind_udp(addr: SocketAddr) -> io::Result<UdpSocket> {
    let socket = socket(&addr, socket2::Type::DGRAM)?;
    bind_family_apart(&socket, addr)?;
    Ok(socket.into())
}

/// Writes one length-prefixed DNS message.
pub fn write_frame(stream: &mut TcpStream, msg: &[u8]) -> io::Result<()> {
    let len = u16::try_from(msg.len()).map_err(|_| io::Error::other("DNS message over 64 KiB"))?;
    let mut frame = Vec::with_capacity(msg.len() + 2);
    frame.extend_from_slice(&len.to_be_bytes());
    frame.extend_from_slice(msg);
    stream.write_all(&frame)
}

/// What came back on a DNS-over-TCP connection.
#[derive(Debug)]
pub enum Frame {
    /// One complete length-prefixed message.
    Message(Vec<u8>),
    /// The peer closed before a whole frame: everything it sent (empty on a clean EOF
    /// between messages). A server that does not speak DNS ends up here.
    Short(Vec<u8>),
}

/// Reads one length-prefixed message, never more (a client may send its next query right
/// behind: glibc pipelines A and AAAA). A reset after some bytes ends the data like an EOF:
/// a server that writes a line and closes without reading our query resets the connection,
/// and the line it wrote is what the caller wants to see.
pub fn read_frame(stream: &mut TcpStream) -> io::Result<Frame> {
    let mut got = Vec::new();
    if !fill(stream, &mut got, 2)? {
        return Ok(Frame::Short(got));
    }
    let want = 2 + usize::from(u16::from_be_bytes([got[0], got[1]]));
    if !fill(stream, &mut got, want)? {
        return Ok(Frame::Short(got));
    }
    Ok(Frame::Message(got.split_off(2)))
}

/// Reads until `got` holds `len` bytes; `false` when the peer closed first.
fn fill(stream: &mut TcpStream, got: &mut Vec<u8>, len: usize) -> io::Result<bool> {
    let mut buf = [0u8; 4096];
    while got.len() < len {
        let room = (len - got.len()).min(buf.len());
        match stream.read(&mut buf[..room]) {
            Ok(0) => return Ok(false),
            Ok(n) => got.extend_from_slice(&buf[..n]),
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) if e.kind() == io::ErrorKind::ConnectionReset && !got.is_empty() => {
                return Ok(false)
            }
            Err(e) => return Err(e),
        }
    }
    Ok(true)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::net::TcpListener;

    #[test]
    fn udp_v4_and_v6_listeners_share_a_port() {
        let v4 = bind_udp("127.0.0.1:0".parse().unwrap()).unwrap();
        let port = v4.local_addr().unwrap().port();
        bind_udp(SocketAddr::new("::1".parse().unwrap(), port)).unwrap();
    }

    #[test]
    fn frames_round_trip_and_short_reads_keep_the_bytes() {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap();
        let server = std::thread::spawn(move || {
            let (mut s, _) = listener.accept().unwrap();
            let Frame::Message(msg) = read_frame(&mut s).unwrap() else {
                panic!("short")
            };
            write_frame(&mut s, &msg).unwrap();
            s.write_all(b"not dns").unwrap();
        });
        let mut client = TcpStream::connect(addr).unwrap();
        write_frame(&mut client, b"hello").unwrap();
        assert!(matches!(read_frame(&mut client).unwrap(), Frame::Message(m) if m == b"hello"));
        server.join().unwrap();
        assert!(matches!(read_frame(&mut client).unwrap(), Frame::Short(b) if b == b"not dns"));
    }
}
