//! Where the commands' log lines go: stderr, one write per line, except inside a
//! [`Section`], whose lines are written in one write when it ends. istio-iptables logs
//! about a hundred lines of environment and config before it does anything, and an init
//! container's stderr is a pipe to the container runtime: every write is a syscall and a
//! wake-up of the reader (through a pipe, the lines cost a pod 0.4–0.5 ms written one by
//! one).

use std::{
    io::{self, Write},
    sync::{Mutex, MutexGuard, PoisonError},
};

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
            let _ = io::stderr().write_all(&lines);
        }
    }
}

/// stderr, held while a section is open: the log subscriber's writer.
pub struct Stderr;

impl Write for Stderr {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        if let Some(lines) = held().as_mut() {
            lines.extend_from_slice(buf);
            return Ok(buf.len());
        }
        io::stderr().write(buf)
    }

    fn flush(&mut self) -> io::Result<()> {
        io::stderr().flush()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_section_holds_its_lines_until_it_ends() {
        let section = Section::start();
        Stderr.write_all(b"one\n").unwrap();
        Stderr.write_all(b"two\n").unwrap();
        assert_eq!(held().as_deref(), Some(&b"one\ntwo\n"[..]));
        drop(section);
        assert!(held().is_none(), "written and closed when the section ends");
    }
}
