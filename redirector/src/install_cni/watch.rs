//! Keeping the entry in place: inotify on the configuration directory, and the entry
//! chained again after every change — a network plugin that rewrote its file, a file that
//! now sorts first, the cluster network's file appearing at last. A file that cannot be
//! edited is reported once and tried again, never overwritten.

use std::{
    os::fd::AsRawFd,
    path::Path,
    time::{Duration, Instant},
};

use inotify::{EventMask, Inotify, WatchMask};

use super::{InstallError, Installer};

/// How long a change settles before the directory is read: a writer's create, write and
/// rename come as a burst of events.
const SETTLE: Duration = Duration::from_millis(20);

/// While something is wrong (no file yet, a file that cannot be edited), how often it is
/// tried again even with no event.
const RETRY: Duration = Duration::from_secs(5);

/// Chain the entry now and after every change of the directory, and at least every
/// `recheck`; `until` ends it (tests; `None` runs for ever).
pub fn watch(
    installer: &Installer,
    recheck: Duration,
    until: Option<&dyn Fn() -> bool>,
) -> Result<(), InstallError> {
    if installer.install_plugin()? {
        tracing::info!("installed {}", installer.plugin_path().display());
    }
    let mut watcher: Option<Inotify> = None;
    let mut reported: Option<String> = None;
    while !until.is_some_and(|done| done()) {
        if watcher.is_none() {
            watcher = watch_dir(&installer.conf_dir);
        }
        if !installer.plugin_installed() && installer.install_plugin()? {
            tracing::info!("installed {} again", installer.plugin_path().display());
        }
        match installer.chain() {
            Ok(change) => {
                if let Some(change) = change {
                    tracing::info!("{change}");
                }
                reported = None;
            }
            Err(err) => {
                let message = err.to_string();
                if reported.as_ref() != Some(&message) {
                    tracing::warn!("{message}; trying again on the next change");
                }
                reported = Some(message);
            }
        }
        let timeout = if reported.is_some() { RETRY } else { recheck };
        match &mut watcher {
            Some(inotify) => {
                if !wait(inotify, timeout) {
                    watcher = None; // the directory went away: watch it anew
                }
            }
            None => std::thread::sleep(RETRY.min(timeout)),
        }
    }
    Ok(())
}

/// An inotify watch of the directory's entries; `None` while it does not exist.
fn watch_dir(dir: &Path) -> Option<Inotify> {
    let inotify = Inotify::init().ok()?;
    let mask = WatchMask::CREATE
        | WatchMask::CLOSE_WRITE
        | WatchMask::MODIFY
        | WatchMask::DELETE
        | WatchMask::MOVED_TO
        | WatchMask::MOVED_FROM
        | WatchMask::DELETE_SELF
        | WatchMask::MOVE_SELF;
    inotify.watches().add(dir, mask).ok()?;
    Some(inotify)
}

/// Wait up to `timeout` for a change and let it settle; `false` when the watch ended
/// (the directory was removed or moved).
fn wait(inotify: &mut Inotify, timeout: Duration) -> bool {
    let deadline = Instant::now() + timeout;
    let mut buffer = [0u8; 4096];
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        if !readable(inotify, left) {
            return true; // timed out: look anyway
        }
        let mut alive = true;
        let mut relevant = false;
        // Drain what came, then whatever the rest of the burst brings.
        loop {
            match inotify.read_events(&mut buffer) {
                Ok(events) => {
                    for event in events {
                        if event.mask.intersects(
                            EventMask::IGNORED | EventMask::DELETE_SELF | EventMask::MOVE_SELF,
                        ) {
                            alive = false;
                        }
                        // Our own staging files come and go with every write.
                        let staging = event
                            .name
                            .is_some_and(|n| n.to_string_lossy().ends_with(".redirector-tmp"));
                        relevant |= !staging;
                    }
                }
                Err(err) if err.kind() == std::io::ErrorKind::WouldBlock => {
                    if !readable(inotify, SETTLE) {
                        break;
                    }
                }
                Err(_) => return false,
            }
        }
        if !alive {
            return false;
        }
        if relevant || Instant::now() >= deadline {
            return true;
        }
    }
}

/// Whether the inotify descriptor has events within `timeout`.
fn readable(inotify: &Inotify, timeout: Duration) -> bool {
    let mut fd = libc::pollfd {
        fd: inotify.as_raw_fd(),
        events: libc::POLLIN,
        revents: 0,
    };
    let millis = i32::try_from(timeout.as_millis()).unwrap_or(i32::MAX);
    // SAFETY: one valid pollfd, alive for the duration of the call.
    let ready = unsafe { libc::poll(&mut fd, 1, millis) };
    ready > 0 && fd.revents & libc::POLLIN != 0
}
