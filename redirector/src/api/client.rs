//! The API's client: one request on a connection of its own, one answer.

use std::{
    io::{BufRead, BufReader, Write},
    os::unix::net::UnixStream,
    path::Path,
    time::Duration,
};

use anyhow::Context as _;

use super::{Request, Response};

/// Why a request got no answer.
#[derive(Debug, thiserror::Error)]
pub enum CallError {
    /// Nothing listens at the socket: the daemon is not running (or not yet).
    #[error("connecting to the daemon at {path}: {source}")]
    Unreachable {
        path: String,
        source: std::io::Error,
    },
    #[error(transparent)]
    Failed(#[from] anyhow::Error),
}

/// Send `request` to the daemon at `socket` and read its answer, waiting at most
/// `timeout` for each read and write when one is given.
pub fn call(
    socket: &Path,
    request: &Request,
    timeout: Option<Duration>,
) -> Result<Response, CallError> {
    let mut stream = UnixStream::connect(socket).map_err(|source| CallError::Unreachable {
        path: socket.display().to_string(),
        source,
    })?;
    stream
        .set_read_timeout(timeout)
        .and_then(|()| stream.set_write_timeout(timeout))
        .context("setting the socket's timeouts")?;
    let mut line = serde_json::to_vec(request).context("encoding the request")?;
    line.push(b'\n');
    // A daemon that refuses the caller answers at once and closes without reading: the
    // write then fails, but its answer is waiting to be read and says why.
    let sent = stream.write_all(&line);
    let mut answer = String::new();
    let read = BufReader::new(stream).read_line(&mut answer);
    if answer.is_empty() {
        sent.context("sending the request")?;
        read.context("reading the daemon's answer")?;
    }
    Ok(serde_json::from_str(&answer).with_context(|| format!("the daemon's answer {answer:?}"))?)
}
