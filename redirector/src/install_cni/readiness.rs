//! `install-cni`'s own `/readyz` (and `/healthz`): kubelet's readiness probe of the
//! container, ready once the entry is in place, never on a node that cannot be served. A
//! plain blocking server on one thread: the installer has no async runtime.

use std::{
    io::{self, Read as _, Write as _},
    net::{SocketAddr, TcpListener, TcpStream},
    sync::{Arc, Mutex, PoisonError},
    time::Duration,
};

/// What `/readyz` answers: `Ok` ready, `Err` not ready, with why.
#[derive(Clone)]
pub struct Readiness(Arc<Mutex<Result<(), String>>>);

impl Readiness {
    /// Not ready yet; served at `addr` if given.
    pub fn serve(addr: Option<SocketAddr>) -> io::Result<Self> {
        let state = Readiness(Arc::new(Mutex::new(Err("starting".to_owned()))));
        if let Some(addr) = addr {
            let listener = TcpListener::bind(addr)?;
            tracing::info!("readiness on http://{}/readyz", listener.local_addr()?);
            let served = state.clone();
            std::thread::spawn(move || {
                for stream in listener.incoming().flatten() {
                    served.answer(stream);
                }
            });
        }
        Ok(state)
    }

    pub fn set(&self, ready: Result<(), String>) {
        *self.0.lock().unwrap_or_else(PoisonError::into_inner) = ready;
    }

    fn answer(&self, mut stream: TcpStream) {
        let _ = stream.set_read_timeout(Some(Duration::from_secs(2)));
        let request = read_head(&mut stream);
        let line = String::from_utf8_lossy(&request);
        let path = line.split_whitespace().nth(1).unwrap_or("");
        let (status, body) = match path {
            "/healthz" => ("200 OK", "ok".to_owned()),
            "/readyz" => match &*self.0.lock().unwrap_or_else(PoisonError::into_inner) {
                Ok(()) => ("200 OK", "ready".to_owned()),
                Err(why) => ("503 Service Unavailable", why.clone()),
            },
            _ => ("404 Not Found", "not found".to_owned()),
        };
        let _ = write!(
            stream,
            "HTTP/1.1 {status}\r\nContent-Type: text/plain\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}\n",
            body.len() + 1
        );
    }
}

/// The request's head, read to its blank line: a request may come in several segments, and
/// closing with part of it unread would reset the connection instead of answering.
fn read_head(stream: &mut TcpStream) -> Vec<u8> {
    const MAX: usize = 8192;
    let mut head = Vec::new();
    let mut chunk = [0u8; 1024];
    while head.len() < MAX && !head.windows(4).any(|w| w == b"\r\n\r\n") {
        match stream.read(&mut chunk) {
            Ok(0) | Err(_) => break,
            Ok(read) => head.extend_from_slice(&chunk[..read]),
        }
    }
    head
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A request split over segments is read whole and answered, not reset.
    #[test]
    fn answers_a_request_sent_in_pieces() {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap();
        let readiness = Readiness(Arc::new(Mutex::new(Err("not yet".to_owned()))));
        let client = std::thread::spawn(move || {
            let mut stream = TcpStream::connect(addr).unwrap();
            stream.write_all(b"GET /rea").unwrap();
            std::thread::sleep(Duration::from_millis(50));
            stream.write_all(b"dyz HTTP/1.1\r\nHost: x\r\n").unwrap();
            std::thread::sleep(Duration::from_millis(50));
            stream.write_all(b"\r\n").unwrap();
            let mut response = String::new();
            stream.read_to_string(&mut response).unwrap();
            response
        });
        readiness.answer(listener.accept().unwrap().0);
        let response = client.join().unwrap();
        assert!(response.starts_with("HTTP/1.1 503 "), "{response}");
        assert!(response.ends_with("not yet\n"), "{response}");
    }
}
