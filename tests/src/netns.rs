//! Named network namespaces that delete themselves.
//!
//! Namespaces are entered with `setns` (in a child's `pre_exec`, in a helper thread) or with
//! `nsenter --net=`, never with `ip netns exec`: that remounts /sys in the child and hides the
//! cgroup2 and bpffs mounts the redirector needs.

use std::fs::File;
use std::io::Write;
use std::os::fd::AsRawFd;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};

use crate::unique_name;

/// `SO_NETNS_COOKIE` (Linux 5.14); not in the libc crate yet.
const SO_NETNS_COOKIE: libc::c_int = 71;

/// A network namespace `rdt-<pid>-<n>-<hint>` with `lo` up, deleted on drop.
///
/// Processes still inside keep the namespace alive after the delete (the kernel frees it when
/// the last one exits), so drop the [`ChildGuard`](crate::ChildGuard)s running in it first:
/// declare them after the namespace.
#[derive(Debug)]
pub struct NetNs {
    name: String,
}

impl NetNs {
    pub fn new(hint: &str) -> Self {
        let name = unique_name(hint);
        run_checked(
            Command::new("ip").args(["netns", "add", &name]),
            None,
            "ip netns add",
        );
        // Own it from here on, so a failure below still deletes it.
        let netns = NetNs { name };
        netns.run(&["ip", "link", "set", "lo", "up"]);
        netns
    }

    /// The namespace open at `ns_file` (e.g. `/proc/<pid>/ns/net` of a process that made
    /// it), bind-mounted under a name as `ip netns add` does, with `lo` up.
    pub fn adopt(hint: &str, ns_file: &Path) -> Self {
        let name = unique_name(hint);
        let path = PathBuf::from("/run/netns").join(&name);
        std::fs::create_dir_all("/run/netns").expect("creating /run/netns");
        File::create(&path).unwrap_or_else(|e| panic!("creating {}: {e}", path.display()));
        // Own it from here on, so a failure below still deletes it.
        let netns = NetNs { name };
        run_checked(
            Command::new("mount").arg("--bind").arg(ns_file).arg(&path),
            None,
            "mount --bind",
        );
        netns.run(&["ip", "link", "set", "lo", "up"]);
        netns
    }

    pub fn name(&self) -> &str {
        &self.name
    }

    /// `/run/netns/<name>`, for `nsenter --net=` and `setns`.
    pub fn path(&self) -> PathBuf {
        PathBuf::from("/run/netns").join(&self.name)
    }

    /// Runs `args` inside the namespace via `nsenter --net=`, returns its stdout; panics with
    /// the command and its stderr when it fails.
    pub fn run(&self, args: &[&str]) -> String {
        self.run_with_stdin(args, None)
    }

    /// Like [`run`](Self::run), feeding `stdin` to the command (e.g. `iptables-restore`).
    pub fn run_with_stdin(&self, args: &[&str], stdin: Option<&str>) -> String {
        let output = run_checked(&mut self.command(args), stdin, &args.join(" "));
        String::from_utf8_lossy(&output.stdout).into_owned()
    }

    /// Runs `args` inside the namespace and returns its output, whatever the exit status.
    pub fn try_run(&self, args: &[&str]) -> Output {
        self.command(args)
            .stdin(Stdio::null())
            .output()
            .unwrap_or_else(|e| panic!("cannot run nsenter for `{}`: {e}", args.join(" ")))
    }

    /// A `Command` for `nsenter --net=<path> <args…>`.
    pub fn command(&self, args: &[&str]) -> Command {
        let mut cmd = Command::new("nsenter");
        cmd.arg(format!("--net={}", self.path().display()))
            .args(args);
        cmd
    }

    /// Runs `f` on a fresh thread that has entered this namespace (`setns` changes only the
    /// calling thread, and that thread ends with `f`, so no other code ever runs in it).
    /// Sockets `f` creates belong to this namespace.
    pub fn in_thread<R: Send + 'static>(&self, f: impl FnOnce() -> R + Send + 'static) -> R {
        in_netns_at(&self.path(), f)
    }

    /// The namespace's cookie (`SO_NETNS_COOKIE` of a socket made inside it): the key
    /// redirector uses for per-pod state.
    pub fn cookie(&self) -> u64 {
        cookie_at(&self.path())
    }
}

impl Drop for NetNs {
    fn drop(&mut self) {
        // Never panic here: this may run while a test is already unwinding.
        match Command::new("ip")
            .args(["netns", "del", &self.name])
            .output()
        {
            Ok(out) if out.status.success() => {}
            Ok(out) => eprintln!(
                "warning: ip netns del {}: {}",
                self.name,
                String::from_utf8_lossy(&out.stderr).trim()
            ),
            Err(e) => eprintln!("warning: cannot run ip netns del {}: {e}", self.name),
        }
    }
}

/// Runs `cmd` to completion with `stdin` (or nothing) on its stdin; panics with `what`, the
/// exit status and stderr when it does not succeed.
pub(crate) fn run_checked(cmd: &mut Command, stdin: Option<&str>, what: &str) -> Output {
    cmd.stdin(if stdin.is_some() {
        Stdio::piped()
    } else {
        Stdio::null()
    })
    .stdout(Stdio::piped())
    .stderr(Stdio::piped());
    let mut child = cmd
        .spawn()
        .unwrap_or_else(|e| panic!("cannot start `{what}`: {e}"));
    if let Some(input) = stdin {
        // Dropping the handle at the end of this block closes the pipe: the command sees EOF.
        let mut pipe = child.stdin.take().expect("stdin was piped");
        pipe.write_all(input.as_bytes())
            .unwrap_or_else(|e| panic!("cannot write stdin of `{what}`: {e}"));
    }
    let output = child
        .wait_with_output()
        .unwrap_or_else(|e| panic!("cannot wait for `{what}`: {e}"));
    if !output.status.success() {
        panic!(
            "`{what}` failed ({}): {}{}",
            output.status,
            String::from_utf8_lossy(&output.stderr).trim(),
            stdin
                .map(|s| format!("\n--- its stdin ---\n{s}"))
                .unwrap_or_default()
        );
    }
    output
}

/// Runs `f` on a short-lived thread that entered the netns at `path` (setns moves only the
/// calling thread), and returns its result.
pub fn in_netns_at<R: Send + 'static>(path: &Path, f: impl FnOnce() -> R + Send + 'static) -> R {
    let path = path.to_path_buf();
    std::thread::spawn(move || {
        let ns =
            File::open(&path).unwrap_or_else(|e| panic!("cannot open {}: {e}", path.display()));
        // SAFETY: a valid namespace fd; CLONE_NEWNET checks that it is a net namespace.
        if unsafe { libc::setns(ns.as_raw_fd(), libc::CLONE_NEWNET) } != 0 {
            panic!(
                "setns({}): {}",
                path.display(),
                std::io::Error::last_os_error()
            );
        }
        f()
    })
    .join()
    .unwrap_or_else(|e| std::panic::resume_unwind(e))
}

/// The cookie (`SO_NETNS_COOKIE`, or before 5.14 redirector's stamp) of the netns at
/// `path`: the key redirector files a pod's state under.
pub fn cookie_at(path: &Path) -> u64 {
    in_netns_at(path, || {
        let socket = std::net::UdpSocket::bind("127.0.0.1:0").expect("udp socket in netns");
        let mut cookie: u64 = 0;
        let mut len = size_of::<u64>() as libc::socklen_t;
        // SAFETY: the buffer and its length describe `cookie`.
        let rc = unsafe {
            libc::getsockopt(
                socket.as_raw_fd(),
                libc::SOL_SOCKET,
                SO_NETNS_COOKIE,
                (&raw mut cookie).cast(),
                &mut len,
            )
        };
        if rc != 0 {
            let err = std::io::Error::last_os_error();
            assert_eq!(
                err.raw_os_error(),
                Some(libc::ENOPROTOOPT),
                "SO_NETNS_COOKIE: {err}"
            );
            // Before 5.14: the cookie as redirector's fallback stamps it on a socket.
            return redirector::sys::netns_cookie::of_current_thread()
                .expect("the netns cookie, stamped")
                .get();
        }
        cookie
    })
}
