//! A handle on a network namespace, passed explicitly to everything that works in one.
//!
//! `setns` moves only the calling thread, so work inside a namespace ([`Netns::run`]) runs
//! on the calling thread, which enters the namespace and returns to its own after (or
//! stays where it is when already there). Sockets made there stay in that namespace: the
//! handle keeps a sock_diag socket made when it was opened.

use std::{
    fs, io,
    os::fd::{AsFd, AsRawFd, BorrowedFd, OwnedFd},
    os::unix::fs::{MetadataExt, OpenOptionsExt},
    path::{Path, PathBuf},
};

use redirector_common::NetnsCookie;

#[derive(Debug, thiserror::Error)]
pub enum NetnsError {
    #[error("opening network namespace {path}: {source}")]
    Open { path: String, source: io::Error },
    #[error("entering network namespace {path}: {source}")]
    Enter { path: String, source: io::Error },
    #[error("reading the cookie of network namespace {path}: {source}")]
    Cookie { path: String, source: io::Error },
    #[error("a thread working in network namespace {path} panicked")]
    Panicked { path: String },
    #[error(
        "{path} is not a network namespace (not on nsfs): give /run/netns/NAME or /proc/PID/ns/net"
    )]
    NotNetns { path: String },
    #[error(
        "{path} is the host's network namespace (PID 1's or this process's own): capturing it would redirect the \
         node's own traffic (sshd, kubelet); give the pod's namespace, or --allow-host-netns \
         if the host is meant"
    )]
    Host { path: String },
}

/// nsfs's magic number: what a namespace file is on.
const NSFS_MAGIC: i64 = 0x6e73_6673;

/// The magic number of the filesystem `file` is on.
fn fs_magic(file: &fs::File) -> Option<i64> {
    // SAFETY: fstatfs on a descriptor we own, into a zeroed struct we own.
    let mut st: libc::statfs = unsafe { std::mem::zeroed() };
    // SAFETY: as above; the kernel writes only into `st`.
    (unsafe { libc::fstatfs(file.as_raw_fd(), &mut st) } == 0).then_some(st.f_type as i64)
}

/// The calling thread's network namespace.
const THREAD_NETNS: &str = "/proc/thread-self/ns/net";

/// An open network namespace: its nsfs file, inode and cookie, and a sock_diag socket made
/// inside it (listing its listeners then needs no thread in it).
#[derive(Debug)]
pub struct Netns {
    file: fs::File,
    path: PathBuf,
    inode: u64,
    cookie: NetnsCookie,
    sock_diag: OwnedFd,
}

impl Netns {
    /// The namespace at `path` (`/run/netns/NAME`, `/proc/PID/ns/net`, …).
    pub fn open(path: &Path) -> Result<Self, NetnsError> {
        Self::open_and_run(path, || ()).map(|(netns, ())| netns)
    }

    /// [`Netns::open`], and `work` run inside it in the same visit: one entry and return
    /// instead of two when a caller needs both.
    pub fn open_and_run<T: Send>(
        path: &Path,
        work: impl FnOnce() -> T + Send,
    ) -> Result<(Self, T), NetnsError> {
        Self::open_pod_and_run(path, true, work)
    }

    /// [`Netns::open_and_run`] for a namespace named as a pod's: the host's own (PID 1's,
    /// where that can be read, or this process's) is refused unless `allow_host`.
    pub fn open_pod_and_run<T: Send>(
        path: &Path,
        allow_host: bool,
        work: impl FnOnce() -> T + Send,
    ) -> Result<(Self, T), NetnsError> {
        let open_err = |source| NetnsError::Open {
            path: path.display().to_string(),
            source,
        };
        // Non-blocking: a FIFO put where a namespace was expected must not block here (with
        // the node lock held, it would wedge every other setup).
        let file = fs::OpenOptions::new()
            .read(true)
            .custom_flags(libc::O_NONBLOCK | libc::O_CLOEXEC)
            .open(path)
            .map_err(open_err)?;
        if fs_magic(&file) != Some(NSFS_MAGIC) {
            return Err(NetnsError::NotNetns {
                path: path.display().to_string(),
            });
        }
        let meta = file.metadata().map_err(open_err)?;
        // The host's: PID 1's where it can be read, and this process's own (the plugin runs
        // in the runtime's namespace, the daemon in the host's network).
        let is_host = ["/proc/1/ns/net", "/proc/self/ns/net"]
            .iter()
            .filter_map(|host| fs::metadata(host).ok())
            .any(|host| host.dev() == meta.dev() && host.ino() == meta.ino());
        if !allow_host && is_host {
            return Err(NetnsError::Host {
                path: path.display().to_string(),
            });
        }
        let inode = meta.ino();
        let (opened, done) = run_in(&file, inode, path, || (diag_socket_and_cookie(), work()))?;
        let (sock_diag, cookie) = opened.map_err(|source| NetnsError::Cookie {
            path: path.display().to_string(),
            source,
        })?;
        let netns = Netns {
            file,
            path: path.to_path_buf(),
            inode,
            cookie,
            sock_diag,
        };
        Ok((netns, done))
    }

    /// The namespace with nsfs inode `inode`, found among the named ones (/run/netns) and
    /// those of running processes; `None` if no path to it is left.
    pub fn find(inode: u64) -> Option<Self> {
        let named = fs::read_dir("/run/netns").into_iter().flatten();
        let of_processes = fs::read_dir("/proc")
            .into_iter()
            .flatten()
            .filter_map(Result::ok)
            .filter(|e| {
                e.file_name()
                    .to_string_lossy()
                    .bytes()
                    .all(|b| b.is_ascii_digit())
            })
            .map(|e| Ok::<_, io::Error>(e.path().join("ns/net")));
        named
            .map(|e| e.map(|e| e.path()))
            .chain(of_processes)
            .filter_map(Result::ok)
            .find(|path| fs::metadata(path).is_ok_and(|m| m.ino() == inode))
            .and_then(|path| Self::open(&path).ok())
    }

    /// The namespace of the calling thread.
    pub fn current() -> Result<Self, NetnsError> {
        Self::open(Path::new(THREAD_NETNS))
    }

    pub fn cookie(&self) -> NetnsCookie {
        self.cookie
    }

    /// The nsfs inode, as the kernel reports it for a netns link's target.
    pub fn inode(&self) -> u64 {
        self.inode
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// A NETLINK_SOCK_DIAG socket of this namespace.
    pub fn sock_diag(&self) -> BorrowedFd<'_> {
        self.sock_diag.as_fd()
    }

    /// Run `work` inside this namespace and return its result (see [`run_in`]).
    pub fn run<T: Send>(&self, work: impl FnOnce() -> T + Send) -> Result<T, NetnsError> {
        run_in(&self.file, self.inode, &self.path, work)
    }
}

/// Run `work` inside the namespace open as `file` (nsfs inode `inode`, opened from `path`),
/// on the calling thread: at once when it is already there (an init container, which
/// starts in its pod's namespace: no setns, which needs CAP_SYS_ADMIN, e.g. when
/// validation runs as the proxy's uid), else entering it and coming back after, even if
/// `work` panics (which is then this call's error). A thread of its own per call would
/// cost a thread's start and two wake-ups across CPUs each time (a daemon adds pods one
/// after another).
fn run_in<T: Send>(
    file: &fs::File,
    inode: u64,
    path: &Path,
    work: impl FnOnce() -> T + Send,
) -> Result<T, NetnsError> {
    let enter_err = |source| NetnsError::Enter {
        path: path.display().to_string(),
        source,
    };
    if fs::metadata(THREAD_NETNS).is_ok_and(|m| m.ino() == inode) {
        return Ok(work());
    }
    // Opened only to come back: an init container, already there, pays one stat.
    let home = fs::File::open(THREAD_NETNS).map_err(enter_err)?;
    setns(file).map_err(enter_err)?;
    let _back = Return(home);
    // A panic is this call's error, as it was when the work had a thread of its own.
    std::panic::catch_unwind(std::panic::AssertUnwindSafe(work)).map_err(|_| NetnsError::Panicked {
        path: path.display().to_string(),
    })
}

/// Moves the calling thread into the network namespace open as `file`.
fn setns(file: &fs::File) -> io::Result<()> {
    // SAFETY: setns on a descriptor the caller keeps open; it moves only this thread.
    if unsafe { libc::setns(file.as_raw_fd(), libc::CLONE_NEWNET) } != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// Takes the calling thread back to the namespace open as its file when dropped. A thread
/// left in a pod's namespace would do the rest of the process's work there, so a failure
/// to return (no reason for it is known: the thread started there) ends the process.
struct Return(fs::File);

impl Drop for Return {
    fn drop(&mut self) {
        if let Err(err) = setns(&self.0) {
            eprintln!("redirector: returning a thread to its network namespace failed: {err}");
            std::process::abort();
        }
    }
}

impl AsFd for Netns {
    fn as_fd(&self) -> BorrowedFd<'_> {
        self.file.as_fd()
    }
}

/// A NETLINK_SOCK_DIAG socket of the calling thread's network namespace, and the
/// namespace's cookie.
fn diag_socket_and_cookie() -> io::Result<(OwnedFd, NetnsCookie)> {
    let sock = crate::sys::netlink::socket(crate::sys::sock_diag::NETLINK_SOCK_DIAG)?;
    Ok((sock, crate::sys::netns_cookie::of_current_thread()?))
}
