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
        let mut request = [0u8; 1024];
        let read = stream.read(&mut request).unwrap_or(0);
        let line = String::from_utf8_lossy(&request[..read]);
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
