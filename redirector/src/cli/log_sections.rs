//! Where the commands' log lines go: stderr (or stdout, for the proxy-init dialect, which
//! logs there as proxy-init does), one write per line, except inside a [`Section`], whose
//! lines are written in one write when it ends. istio-iptables logs about a hundred lines
//! of environment and config before it does anything, and an init container's output is a
//! pipe to the container runtime: every write is a syscall and a wake-up of the reader
//! (through a pipe, the lines cost a pod 0.4–0.5 ms written one by one).

use std::{
    io::{self, IsTerminal as _, Write},
    sync::{
        atomic::{AtomicBool, Ordering},
        Mutex, MutexGuard, PoisonError,
    },
};

/// The stream log lines are written to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Stream {
    Stderr,
    Stdout,
}

impl Stream {
    pub fn is_terminal(self) -> bool {
        match self {
            Stream::Stderr => io::stderr().is_terminal(),
            Stream::Stdout => io::stdout().is_terminal(),
        }
    }

    fn write(self, buf: &[u8]) -> io::Result<usize> {
        match self {
            Stream::Stderr => io::stderr().write(buf),
            Stream::Stdout => io::stdout().write(buf),
        }
    }

    fn write_all(self, buf: &[u8]) -> io::Result<()> {
        match self {
            Stream::Stderr => io::stderr().write_all(buf),
            Stream::Stdout => io::stdout().write_all(buf),
        }
    }

    fn flush(self) -> io::Result<()> {
        match self {
            Stream::Stderr => io::stderr().flush(),
            Stream::Stdout => io::stdout().flush(),
        }
    }
}

/// Whether logs go to stdout rather than stderr; set once, before logging starts.
static TO_STDOUT: AtomicBool = AtomicBool::new(false);

/// Send every later log line (and section) to `stream`.
pub fn set_stream(stream: Stream) {
    TO_STDOUT.store(stream == Stream::Stdout, Ordering::Relaxed);
}

fn stream() -> Stream {
    if TO_STDOUT.load(Ordering::Relaxed) {
        Stream::Stdout
    } else {
        Stream::Stderr
    }
}

/// The lines of the open section; `None` when no section is open.
static HELD: Mutex<Option<Vec<u8>>> = Mutex::new(None);

fn held() -> MutexGuard<'static, Option<Vec<u8>>> {
    HELD.lock().unwrap_or_else(PoisonError::into_inner)
}

/// Lines logged while this lives are written together when it drops: at its end, or
/// early through `?` or a panic, so that nothing logged is lost. Sections do not nest.
pub struct Section(());

impl Section {
    pub fn start() -> Section {
        held().get_or_insert_with(Vec::new);
        Section(())
    }
}

impl Drop for Section {
    fn drop(&mut self) {
        if let Some(lines) = held().take() {
            let _ = stream().write_all(&lines);
        }
    }
}

/// The log stream ([`set_stream`]), held while a section is open: the log subscriber's
/// writer.
pub struct LogOutput;

impl Write for LogOutput {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        if let Some(lines) = held().as_mut() {
            lines.extend_from_slice(buf);
            return Ok(buf.len());
        }
        stream().write(buf)
    }

    fn flush(&mut self) -> io::Result<()> {
        stream().flush()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_section_holds_its_lines_until_it_ends() {
        let section = Section::start();
        LogOutput.write_all(b"one\n").unwrap();
        LogOutput.write_all(b"two\n").unwrap();
        assert_eq!(held().as_deref(), Some(&b"one\ntwo\n"[..]));
        drop(section);
        assert!(held().is_none(), "written and closed when the section ends");
    }
}
