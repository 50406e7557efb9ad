//! Capture listeners that were already listening when a pod was set up.
//!
//! The kernel side registers the proxy's listener when it calls listen(); a proxy that
//! started earlier is found here: its socket in the pod's listening sockets (sock_diag), the process holding
//! it in /proc, and a duplicate of the descriptor through pidfd_getfd (Linux 5.6+).

use std::{
    fs, io,
    os::fd::{FromRawFd, OwnedFd},
};

use redirector_common::{ListenerKey, AF_INET, AF_INET6};

use crate::{store::NodeMaps, sys::netns::Netns, sys::sock_diag};

/// A listening socket of a pod's network namespace.
#[derive(Debug, PartialEq, Eq)]
struct Listener {
    port: u16,
    family: u16,
    inode: u64,
}

fn listeners_on(netns: &Netns, ports: &[u16]) -> Vec<Listener> {
    [AF_INET, AF_INET6]
        .iter()
        .flat_map(|&family| {
            let found =
                sock_diag::tcp_listeners(netns.sock_diag(), family as u8).unwrap_or_else(|err| {
                    tracing::warn!("listing listening sockets: {err}");
                    Vec::new()
                });
            found.into_iter().map(move |s| Listener {
                port: s.port,
                family,
                inode: s.inode,
            })
        })
        .filter(|l| ports.contains(&l.port))
        .collect()
}

/// (pid, fd) of a process holding the socket with this inode.
fn socket_owner(inode: u64) -> Option<(i32, i32)> {
    let wanted = format!("socket:[{inode}]");
    for proc_entry in fs::read_dir("/proc").ok()?.filter_map(Result::ok) {
        let Ok(pid) = proc_entry.file_name().to_string_lossy().parse::<i32>() else {
            continue;
        };
        let Ok(fds) = fs::read_dir(proc_entry.path().join("fd")) else {
            continue;
        };
        for fd_entry in fds.filter_map(Result::ok) {
            if fs::read_link(fd_entry.path()).is_ok_and(|t| t.as_os_str() == wanted.as_str()) {
                let fd = fd_entry.file_name().to_string_lossy().parse().ok()?;
                return Some((pid, fd));
            }
        }
    }
    None
}

fn duplicate_fd(pid: i32, fd: i32) -> io::Result<OwnedFd> {
    // SAFETY: plain syscalls; each returned descriptor is owned exactly once.
    unsafe {
        let pidfd = libc::syscall(libc::SYS_pidfd_open, pid, 0);
        if pidfd < 0 {
            return Err(io::Error::last_os_error());
        }
        let pidfd = OwnedFd::from_raw_fd(pidfd as i32);
        let dup = libc::syscall(
            libc::SYS_pidfd_getfd,
            std::os::fd::AsRawFd::as_raw_fd(&pidfd),
            fd,
            0,
        );
        if dup < 0 {
            return Err(io::Error::last_os_error());
        }
        Ok(OwnedFd::from_raw_fd(dup as i32))
    }
}

/// Register the listeners on `ports` that already exist in `netns`; returns what was
/// registered, for the log.
pub fn register_existing(maps: &mut NodeMaps, netns: &Netns, ports: &[u16]) -> Vec<String> {
    let found = listeners_on(netns, ports);
    let netns_cookie = netns.cookie().get();
    let mut registered = Vec::new();
    for listener in found {
        let Some((pid, fd)) = socket_owner(listener.inode) else {
            tracing::warn!(
                "a listener on port {} exists but its process is not visible here; it is captured once it listens again",
                listener.port
            );
            continue;
        };
        let key = ListenerKey {
            netns_cookie,
            port: listener.port,
            family: listener.family,
            _pad: 0,
        };
        match duplicate_fd(pid, fd)
            .map_err(|e| e.to_string())
            .and_then(|sock| {
                maps.listeners
                    .insert(key, std::os::fd::AsRawFd::as_raw_fd(&sock), 0)
                    .map_err(|e| e.to_string())
            }) {
            Ok(()) => registered.push(format!("port {} (pid {pid})", listener.port)),
            Err(err) => tracing::warn!(
                "registering the listener on port {} of pid {pid}: {err}",
                listener.port
            ),
        }
    }
    registered
}
