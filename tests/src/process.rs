//! Processes started inside a netns and a cgroup, as a given user, and killed on drop.

use std::ffi::{CString, OsStr, OsString};
use std::fs::{File, OpenOptions};
use std::io::{BufRead, BufReader, Read};
use std::os::fd::AsRawFd;
use std::os::unix::process::CommandExt;
use std::path::PathBuf;
use std::process::{Child, Command, ExitStatus, Output, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::{self, Receiver, RecvTimeoutError};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use crate::{Cgroup, NetNs};

/// How long a wait for something that should happen allows. Such a wait returns as soon as
/// it does, so this bounds only a failure; it is long because CI runs the suites in emulated
/// guests that a busy host can starve for seconds at a time.
pub const EVENTUALLY: Duration = Duration::from_secs(60);

/// Builder for a process that runs inside a netns, optionally in a cgroup and as a uid/gid.
///
/// Everything happens in the forked child before `exec` (`pre_exec`), in this order, so the
/// program is in place from its first instruction — a cgroup program sees its very first
/// socket:
/// 1. write its own pid to the cgroup's `cgroup.procs` (needs root, so before dropping ids);
/// 2. with [`bind_file`](Self::bind_file): a private mount namespace and the bind mounts
///    (needs root, so before dropping ids);
/// 3. `setns` into the netns (a direct `setns`, not `ip netns exec`, which would hide the
///    cgroup2 and bpffs mounts), then into the user namespace, if any;
/// 4. `setgroups([])`, `setgid`, `setuid`;
/// 5. `PR_SET_PDEATHSIG(SIGKILL)` (after the id change, which would clear it), so nothing
///    outlives a test process that dies without running its destructors.
///
/// The death signal follows the *thread* that spawned the process: spawn long-lived
/// processes from the test's own thread, not from a short-lived helper thread.
#[derive(Debug, Clone)]
pub struct Spawn {
    program: OsString,
    args: Vec<OsString>,
    envs: Vec<(OsString, OsString)>,
    netns: Option<PathBuf>,
    userns: Option<PathBuf>,
    cgroup: Option<PathBuf>,
    user: Option<(u32, u32)>,
    binds: Vec<(PathBuf, PathBuf)>,
}

impl Spawn {
    /// This test binary re-executed with only its ignored test `test` selected: a helper
    /// process whose body is that test.
    pub fn helper(test: &str) -> Self {
        let exe = std::env::current_exe().expect("the test binary's path");
        let args = [
            test,
            "--exact",
            "--ignored",
            "--nocapture",
            "--test-threads=1",
        ];
        Spawn::new(exe).args(args)
    }

    pub fn new(program: impl AsRef<OsStr>) -> Self {
        Spawn {
            program: program.as_ref().to_owned(),
            args: Vec::new(),
            envs: Vec::new(),
            netns: None,
            userns: None,
            cgroup: None,
            user: None,
            binds: Vec::new(),
        }
    }

    pub fn arg(mut self, arg: impl AsRef<OsStr>) -> Self {
        self.args.push(arg.as_ref().to_owned());
        self
    }

    pub fn args<I: IntoIterator<Item = S>, S: AsRef<OsStr>>(mut self, args: I) -> Self {
        self.args
            .extend(args.into_iter().map(|a| a.as_ref().to_owned()));
        self
    }

    pub fn env(mut self, key: impl AsRef<OsStr>, value: impl AsRef<OsStr>) -> Self {
        self.envs
            .push((key.as_ref().to_owned(), value.as_ref().to_owned()));
        self
    }

    pub fn envs<K: AsRef<OsStr>, V: AsRef<OsStr>>(self, envs: &[(K, V)]) -> Self {
        envs.iter().fold(self, |spawn, (k, v)| spawn.env(k, v))
    }

    pub fn netns(mut self, netns: &NetNs) -> Self {
        self.netns = Some(netns.path());
        self
    }

    pub fn cgroup(mut self, cgroup: &Cgroup) -> Self {
        self.cgroup = Some(cgroup.path().to_path_buf());
        self
    }

    /// Join the user namespace at `path` (after the netns); [`user`](Self::user)'s ids are
    /// then ids inside it.
    pub fn userns(mut self, path: impl Into<PathBuf>) -> Self {
        self.userns = Some(path.into());
        self
    }

    /// Run as `uid`/`gid` with no supplementary groups.
    pub fn user(mut self, uid: u32, gid: u32) -> Self {
        self.user = Some((uid, gid));
        self
    }

    /// Run in a private mount namespace with `source` bind-mounted over `target`, e.g. a
    /// test's resolv.conf over /etc/resolv.conf for a resolver library. The namespace is the
    /// child's alone and ends with it; nothing changes in the test's own mounts.
    pub fn bind_file(mut self, source: impl Into<PathBuf>, target: impl Into<PathBuf>) -> Self {
        self.binds.push((source.into(), target.into()));
        self
    }

    /// A short description for panic messages.
    pub fn describe(&self) -> String {
        let mut text = self.program.to_string_lossy().into_owned();
        for arg in &self.args {
            text.push(' ');
            text.push_str(&arg.to_string_lossy());
        }
        text
    }

    /// The configured `Command` (stdio untouched). The namespace and cgroup files are opened
    /// here, in the parent, so the child only makes async-signal-safe system calls.
    pub fn command(&self) -> Command {
        let mut cmd = Command::new(&self.program);
        cmd.args(&self.args);
        for (key, value) in &self.envs {
            cmd.env(key, value);
        }
        let netns = self.netns.as_ref().map(|path| {
            File::open(path).unwrap_or_else(|e| panic!("cannot open netns {}: {e}", path.display()))
        });
        let userns = self.userns.as_ref().map(|path| {
            File::open(path)
                .unwrap_or_else(|e| panic!("cannot open userns {}: {e}", path.display()))
        });
        let procs = self.cgroup.as_ref().map(|dir| {
            let path = dir.join("cgroup.procs");
            OpenOptions::new()
                .write(true)
                .open(&path)
                .unwrap_or_else(|e| panic!("cannot open {}: {e}", path.display()))
        });
        let user = self.user;
        let binds: Vec<(CString, CString)> = self
            .binds
            .iter()
            .map(|(source, target)| (c_path(source), c_path(target)))
            .collect();
        // SAFETY: getpid has no preconditions.
        let parent = unsafe { libc::getpid() };
        // SAFETY: the hook only makes async-signal-safe system calls on fds opened above and
        // formats into a stack buffer; it allocates nothing.
        unsafe {
            cmd.pre_exec(move || {
                if let Some(procs) = &procs {
                    join_cgroup(procs.as_raw_fd())?;
                }
                if !binds.is_empty() {
                    private_mounts(&binds)?;
                }
                if let Some(netns) = &netns {
                    check(libc::setns(netns.as_raw_fd(), libc::CLONE_NEWNET))?;
                }
                if let Some(userns) = &userns {
                    check(libc::setns(userns.as_raw_fd(), libc::CLONE_NEWUSER))?;
                }
                if let Some((uid, gid)) = user {
                    check(libc::setgroups(0, std::ptr::null()))?;
                    check(libc::setgid(gid))?;
                    check(libc::setuid(uid))?;
                }
                check(libc::prctl(
                    libc::PR_SET_PDEATHSIG,
                    libc::SIGKILL as libc::c_ulong,
                ))?;
                if libc::getppid() != parent {
                    // The test process died before the death signal was armed.
                    libc::_exit(1);
                }
                Ok(())
            });
        }
        cmd
    }

    /// Runs to completion and returns the output, whatever the exit status.
    pub fn output(&self) -> Output {
        self.command()
            .stdin(Stdio::null())
            .output()
            .unwrap_or_else(|e| panic!("cannot run `{}`: {e}", self.describe()))
    }

    /// Starts the process with stdout read line by line (see [`ChildGuard::wait_line`]) and
    /// stderr collected for panic messages.
    pub fn spawn(&self) -> ChildGuard {
        let mut child = self
            .command()
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap_or_else(|e| panic!("cannot start `{}`: {e}", self.describe()));
        let (line_tx, lines) = mpsc::channel();
        let stdout = child.stdout.take().expect("stdout was piped");
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines() {
                let Ok(line) = line else { break };
                if line_tx.send(line).is_err() {
                    break;
                }
            }
        });
        let stderr = Arc::new(Mutex::new(String::new()));
        let mut pipe = child.stderr.take().expect("stderr was piped");
        let sink = Arc::clone(&stderr);
        std::thread::spawn(move || {
            let mut buf = [0u8; 4096];
            while let Ok(n @ 1..) = pipe.read(&mut buf) {
                sink.lock()
                    .unwrap()
                    .push_str(&String::from_utf8_lossy(&buf[..n]));
            }
        });
        ChildGuard {
            child,
            label: self.describe(),
            lines,
            stderr,
        }
    }
}

fn c_path(path: &std::path::Path) -> CString {
    CString::new(path.as_os_str().as_encoded_bytes())
        .unwrap_or_else(|_| panic!("path with a NUL byte: {}", path.display()))
}

/// Moves the calling process into a mount namespace of its own, where `binds` (source,
/// target) are bind-mounted. Only system calls on prepared C strings: safe after fork.
fn private_mounts(binds: &[(CString, CString)]) -> std::io::Result<()> {
    let none = std::ptr::null();
    // SAFETY: plain system calls with NUL-terminated strings that outlive them.
    unsafe {
        check(libc::unshare(libc::CLONE_NEWNS))?;
        // Private first, so that the bind mounts never propagate to the test's namespace.
        check(libc::mount(
            none,
            c"/".as_ptr(),
            none,
            libc::MS_REC | libc::MS_PRIVATE,
            none.cast(),
        ))?;
        for (source, target) in binds {
            check(libc::mount(
                source.as_ptr(),
                target.as_ptr(),
                none,
                libc::MS_BIND,
                none.cast(),
            ))?;
        }
    }
    Ok(())
}

/// Writes the calling process's pid to an open `cgroup.procs`, without allocating.
fn join_cgroup(procs_fd: libc::c_int) -> std::io::Result<()> {
    let mut buf = [0u8; 12];
    let mut at = buf.len();
    // SAFETY: getpid has no preconditions.
    let mut pid = unsafe { libc::getpid() } as u32;
    loop {
        at -= 1;
        buf[at] = b'0' + (pid % 10) as u8;
        pid /= 10;
        if pid == 0 {
            break;
        }
    }
    let digits = &buf[at..];
    // SAFETY: the pointer and length describe `digits`.
    let written = unsafe { libc::write(procs_fd, digits.as_ptr().cast(), digits.len()) };
    if written < 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(())
}

fn check(rc: libc::c_int) -> std::io::Result<()> {
    if rc < 0 {
        Err(std::io::Error::last_os_error())
    } else {
        Ok(())
    }
}

/// A running child, killed (SIGKILL by pid) and reaped on drop.
#[derive(Debug)]
pub struct ChildGuard {
    child: Child,
    label: String,
    lines: Receiver<String>,
    stderr: Arc<Mutex<String>>,
}

impl ChildGuard {
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// The next stdout line, or `None` on timeout or when stdout closed.
    pub fn next_line(&self, timeout: Duration) -> Option<String> {
        self.lines.recv_timeout(timeout).ok()
    }

    /// Waits for the first stdout line that satisfies `pred` (earlier lines are consumed);
    /// panics with `what`, the process and its stderr on timeout or exit.
    pub fn wait_line(&self, what: &str, timeout: Duration, pred: impl Fn(&str) -> bool) -> String {
        let deadline = Instant::now() + timeout;
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            match self.lines.recv_timeout(left) {
                Ok(line) if pred(&line) => return line,
                Ok(_) => {}
                Err(RecvTimeoutError::Timeout) => {
                    panic!(
                        "timed out after {timeout:?} waiting for {what} from `{}`; stderr: {}",
                        self.label,
                        self.stderr()
                    )
                }
                Err(RecvTimeoutError::Disconnected) => {
                    // Give the stderr reader a moment to collect the reason.
                    std::thread::sleep(Duration::from_millis(50));
                    panic!(
                        "`{}` exited while waiting for {what}; stderr: {}",
                        self.label,
                        self.stderr()
                    )
                }
            }
        }
    }

    /// Everything the child wrote to stderr so far.
    pub fn stderr(&self) -> String {
        self.stderr.lock().unwrap().clone()
    }

    /// The exit status if the child has exited.
    pub fn try_wait(&mut self) -> Option<ExitStatus> {
        self.child.try_wait().ok().flatten()
    }

    /// Sends it SIGTERM.
    pub fn sigterm(&self) {
        // SAFETY: kill(2) on our own child, still unreaped, so its pid cannot be reused.
        let sent = unsafe { libc::kill(self.pid() as i32, libc::SIGTERM) };
        assert_eq!(sent, 0, "sending SIGTERM to `{}`", self.label);
    }

    /// SIGTERM, and its exit status; panics if it has not exited after `timeout`.
    pub fn terminate(&mut self, timeout: Duration) -> ExitStatus {
        self.sigterm();
        let mut status = None;
        within(timeout, || {
            status = self.try_wait();
            status.is_some()
        });
        let label = &self.label;
        status.unwrap_or_else(|| panic!("`{label}` still runs after SIGTERM: {}", self.stderr()))
    }
}

impl Drop for ChildGuard {
    fn drop(&mut self) {
        if self.try_wait().is_none() {
            // Child::kill is kill(pid, SIGKILL) on this exact child; it is still unreaped,
            // so the pid cannot have been reused.
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}

/// Polls `ss -ltnH` inside `netns` until something listens on TCP `port`; panics after
/// `timeout`. Never connects, so it sends no traffic and triggers no capture rule.
pub fn wait_tcp_listening(netns: &NetNs, port: u16, timeout: Duration) {
    let mut out = String::new();
    let listening = within(timeout, || {
        out = netns.run(&["ss", "-ltnH"]);
        // Columns: State Recv-Q Send-Q Local-Address:Port Peer-Address:Port …
        out.lines().any(|line| {
            line.split_whitespace()
                .nth(3)
                .and_then(|local| local.rsplit_once(':'))
                .is_some_and(|(_, p)| p.parse() == Ok(port))
        })
    });
    assert!(
        listening.is_some(),
        "nothing listens on tcp port {port} in {} after {timeout:?}:\n{out}",
        netns.name()
    );
}

/// Sets its flag when dropped — also when a panic unwinds past it — so that threads looping
/// until the flag end: a `thread::scope` whose body fails then ends with the failure
/// instead of waiting for its clients forever.
pub struct StopOnDrop<'a>(pub &'a AtomicBool);

impl Drop for StopOnDrop<'_> {
    fn drop(&mut self) {
        self.0.store(true, Ordering::SeqCst);
    }
}

/// Polls `done` every 20 ms until it holds: how long that took, or `None` after `timeout`.
/// It returns as soon as `done` holds, so a generous `timeout` costs nothing on success.
pub fn within(timeout: Duration, mut done: impl FnMut() -> bool) -> Option<Duration> {
    let start = Instant::now();
    loop {
        if done() {
            return Some(start.elapsed());
        }
        if start.elapsed() > timeout {
            return None;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// The process that gave `out` exited 0; its stderr is the message when it did not.
#[track_caller]
pub fn assert_success(out: &Output) {
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}
