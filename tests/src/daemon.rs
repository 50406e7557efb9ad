//! A `redirector daemon` of a test's own: its pin root, node cgroup, socket and state
//! directory; killed on drop (it never detaches anything, the pin root's drop does).

use std::ffi::OsStr;
use std::io::{BufRead, BufReader, Read, Write};
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::Duration;

use procfs::net::TcpState;

use crate::process::{within, EVENTUALLY};
use crate::redirector::{redirector_bin, PinRoot};
use crate::{unique_name, Cgroup, ChildGuard, NetNs, Spawn};

/// A directory under /tmp removed (with its contents) on drop.
#[derive(Debug)]
pub struct StateDir {
    path: PathBuf,
    /// A file system of its own is mounted on it (unmounted on drop).
    mounted: bool,
}

impl StateDir {
    pub fn new(hint: &str) -> Self {
        let path = std::env::temp_dir().join(unique_name(hint));
        std::fs::create_dir_all(&path).expect("creating a state directory");
        StateDir {
            path,
            mounted: false,
        }
    }

    /// A state directory on a tmpfs of its own, as the daemon's `/run/redirector` is on a
    /// node (/tmp may be a disk file system, where every new record is an inode written).
    pub fn on_tmpfs(hint: &str) -> Self {
        Self::mounted(hint, &["-t", "tmpfs", "-o", "size=64m,mode=0700", "tmpfs"])
    }

    /// A directory with a file system of its own mounted on it by `mount ARGS <dir>`
    /// (unmounted on drop).
    pub fn mounted(hint: &str, args: &[&str]) -> Self {
        let mut dir = StateDir::new(hint);
        let out = Command::new("mount")
            .args(args)
            .arg(&dir.path)
            .output()
            .expect("running mount");
        assert!(
            out.status.success(),
            "mount {args:?} on {}: {}",
            dir.path.display(),
            String::from_utf8_lossy(&out.stderr)
        );
        dir.mounted = true;
        dir
    }

    pub fn path(&self) -> &Path {
        &self.path
    }
}

impl Drop for StateDir {
    fn drop(&mut self) {
        if self.mounted {
            let unmounted = Command::new("umount").arg(&self.path).status();
            if !unmounted.is_ok_and(|s| s.success()) {
                eprintln!("warning: unmounting {}", self.path.display());
            }
        }
        if let Err(err) = std::fs::remove_dir_all(&self.path) {
            eprintln!("warning: removing {}: {err}", self.path.display());
        }
    }
}

pub struct Daemon {
    child: ChildGuard,
    socket: PathBuf,
    args: Vec<String>,
    env: Vec<(String, String)>,
}

impl Daemon {
    /// Start a daemon and wait until it serves (after its start-up reconcile).
    pub fn start(root: &PinRoot, node: &Cgroup, state: &StateDir) -> Self {
        Self::start_with(root, node, state, &[])
    }

    /// [`Daemon::start`] with more flags, e.g. `--metrics-addr 127.0.0.1:0`. Repair is off
    /// unless `extra` sets `--repair`: a test's daemon never asks the host's runtime.
    pub fn start_with(root: &PinRoot, node: &Cgroup, state: &StateDir, extra: &[&str]) -> Self {
        Self::start_with_env(root, node, state, extra, &[])
    }

    /// [`Daemon::start_with`] with environment variables set for it (and its restarts).
    pub fn start_with_env(
        root: &PinRoot,
        node: &Cgroup,
        state: &StateDir,
        extra: &[&str],
        env: &[(&str, &str)],
    ) -> Self {
        let socket = state.path().join("redirector.sock");
        let mut args = vec!["daemon".to_owned(), "--socket".into()];
        args.push(socket.display().to_string());
        args.extend(node_flags(root, node, state));
        args.extend(extra.iter().map(|a| a.to_string()));
        if !extra.contains(&"--repair") {
            args.extend(["--repair".into(), "off".into()]);
        }
        let env = env.iter().map(|(k, v)| (k.to_string(), v.to_string()));
        Self::spawn(socket, args, env.collect())
    }

    fn spawn(socket: PathBuf, args: Vec<String>, env: Vec<(String, String)>) -> Self {
        let child = Spawn::new(redirector_bin()).args(&args).envs(&env).spawn();
        let daemon = Daemon {
            child,
            socket,
            args,
            env,
        };
        // Its start loads the object when the node lacks it: about 0.1 s here, but under
        // emulation (TCG) beside another guest, 20 s was seen not to be enough.
        daemon.wait_ready(Duration::from_secs(120));
        daemon
    }

    fn wait_ready(&self, timeout: Duration) {
        let served = within(timeout, || self.pod(&["list"]).status.success());
        assert!(
            served.is_some(),
            "the daemon did not serve within {timeout:?}; its log:\n{}",
            self.child.stderr()
        );
    }

    pub fn pid(&self) -> u32 {
        self.child.pid()
    }

    /// Its API socket.
    pub fn socket(&self) -> &Path {
        &self.socket
    }

    /// Kill it with SIGKILL (it gets no chance to clean up anything).
    pub fn kill(self) -> Killed {
        let Daemon {
            child,
            socket,
            args,
            env,
        } = self;
        drop(child);
        Killed { socket, args, env }
    }

    /// Kill it with SIGKILL and start a new one with the same flags.
    pub fn kill_and_restart(self) -> Self {
        self.kill().restart()
    }

    /// Stop it with SIGTERM; its exit status and log.
    pub fn terminate(mut self) -> (std::process::ExitStatus, String) {
        let status = self.child.terminate(EVENTUALLY);
        (status, self.child.stderr())
    }

    pub fn log(&self) -> String {
        self.child.stderr()
    }

    /// Waits until the daemon's log holds `text` (it is read as the daemon writes it, so a
    /// line can come after what the daemon did), or panics with the log.
    pub fn assert_logged(&self, text: &str) {
        let found = within(EVENTUALLY, || self.log().contains(text));
        assert!(
            found.is_some(),
            "{text:?} not in the daemon's log:\n{}",
            self.log()
        );
    }

    /// GET `path` from the metrics server on loopback (started with `--metrics-addr`):
    /// the status code and the body.
    pub fn http_get(&self, path: &str) -> (u16, String) {
        http_get(&self.metrics_addr(), path).expect("asking the metrics server")
    }

    /// Whether its `/metrics` has the line `line`.
    pub fn has_metric(&self, line: &str) -> bool {
        self.http_get("/metrics").1.lines().any(|l| l == line)
    }

    /// Waits up to 60 s (room for a loaded machine, a repair round a second and a scrape a
    /// second old) for `done`; panics with `what` and its log.
    pub fn wait_until(&self, what: &str, done: impl FnMut() -> bool) {
        let reached = within(Duration::from_secs(60), done);
        assert!(reached.is_some(), "{what}\n{}", self.log());
    }

    /// GET `path` from the health server on loopback (started with `--health-addr`).
    pub fn health_get(&self, path: &str) -> (u16, String) {
        http_get(&self.served_addr("health"), path).expect("asking the health server")
    }

    /// Where the metrics server listens, as its log says (on loopback).
    pub fn metrics_addr(&self) -> String {
        self.served_addr("metrics")
    }

    /// The address of the `server` (`metrics` or `health`) from the daemon's log line
    /// `<server> on http://ADDR/…`, waited for: the daemon writes it before it serves the
    /// API, but its stderr reaches the test through a reader thread, which a loaded machine
    /// may run later.
    fn served_addr(&self, server: &str) -> String {
        let needle = format!("{server} on http://");
        within(Duration::from_secs(30), || self.log().contains(&needle));
        let log = self.log();
        let addr = log
            .split(&needle)
            .nth(1)
            .and_then(|rest| rest.split('/').next())
            .unwrap_or_else(|| panic!("no {server} address in the log:\n{log}"));
        assert!(
            addr.starts_with("127.0.0.1:"),
            "{server} only on loopback in a test: {addr}"
        );
        addr.to_owned()
    }

    /// Its resident memory (VmRSS), in KiB.
    pub fn rss_kib(&self) -> u64 {
        rss_kib(self.pid())
    }

    /// A connection to its API, with a 30 s read timeout.
    pub fn connect(&self) -> UnixStream {
        let stream = UnixStream::connect(&self.socket).expect("connecting to the daemon");
        stream
            .set_read_timeout(Some(Duration::from_secs(30)))
            .expect("setting a read timeout");
        stream
    }

    /// `redirector pod --socket S ARGS`.
    pub fn pod(&self, args: &[&str]) -> Output {
        Command::new(redirector_bin())
            .arg("pod")
            .arg("--socket")
            .arg(&self.socket)
            .args(args)
            .output()
            .expect("running redirector pod")
    }

    /// `redirector pod add --dialect ambient` of the pod in `netns` and `cgroup`, named
    /// `namespace/name` with uid `uid`, as it ran.
    pub fn add_ambient(&self, netns: &NetNs, cgroup: &Cgroup, name: &str, uid: &str) -> Output {
        self.add_ambient_annotated(netns, cgroup, name, uid, &[])
    }

    /// [`Daemon::add_ambient`] with the pod's `annotations` (`--annotation KEY=VALUE`).
    pub fn add_ambient_annotated(
        &self,
        netns: &NetNs,
        cgroup: &Cgroup,
        name: &str,
        uid: &str,
        annotations: &[(&str, &str)],
    ) -> Output {
        let (netns, cgroup) = (
            netns.path().display().to_string(),
            cgroup.path().display().to_string(),
        );
        let mut args = vec![
            "add".to_owned(),
            "--dialect".to_owned(),
            "ambient".to_owned(),
            format!("--netns={netns}"),
            format!("--cgroup={cgroup}"),
            format!("--name={name}"),
            format!("--pod-uid={uid}"),
        ];
        args.extend(
            annotations
                .iter()
                .map(|(key, value)| format!("--annotation={key}={value}")),
        );
        self.pod(&args.iter().map(String::as_str).collect::<Vec<_>>())
    }

    /// `redirector pod add --netns NETNS --name NAME -- FLAGS`; panics with the daemon's log
    /// unless it succeeds.
    pub fn add(&self, netns: &NetNs, name: &str, flags: &[&str]) {
        self.add_with(netns, None, name, flags);
    }

    /// [`Daemon::add`] with the pod's own cgroup given (`--cgroup`): its programs are
    /// attached there, which a kernel whose programs read the pod's cookie from its cgroup
    /// needs (a pod with none is refused there).
    pub fn add_in(&self, netns: &NetNs, cgroup: &Cgroup, name: &str, flags: &[&str]) {
        self.add_with(netns, Some(cgroup), name, flags);
    }

    fn add_with(&self, netns: &NetNs, cgroup: Option<&Cgroup>, name: &str, flags: &[&str]) {
        self.add_request(netns, cgroup, name, &[], flags);
    }

    /// `redirector pod add --netns NETNS --cgroup CGROUP --name NAME --dialect linkerd
    /// [--annotation K=V]... -- FLAGS` (proxy-init's flags, Linkerd's annotations); panics
    /// with the daemon's log unless it succeeds.
    pub fn add_linkerd(
        &self,
        netns: &NetNs,
        cgroup: &Cgroup,
        name: &str,
        annotations: &[(&str, &str)],
        flags: &[&str],
    ) {
        let annotations: Vec<String> = annotations
            .iter()
            .map(|(k, v)| format!("{k}={v}"))
            .collect();
        let mut options = vec!["--dialect", "linkerd"];
        for annotation in &annotations {
            options.extend(["--annotation", annotation.as_str()]);
        }
        self.add_request(netns, Some(cgroup), name, &options, flags);
    }

    /// `pod add` of `netns` (in `cgroup`) as `name`, with `options` before `--` and `flags`
    /// after it.
    fn add_request(
        &self,
        netns: &NetNs,
        cgroup: Option<&Cgroup>,
        name: &str,
        options: &[&str],
        flags: &[&str],
    ) {
        let netns = netns.path().display().to_string();
        let cgroup = cgroup.map(|c| c.path().display().to_string());
        let mut args = vec!["add", "--netns", netns.as_str(), "--name", name];
        if let Some(cgroup) = &cgroup {
            args.extend(["--cgroup", cgroup.as_str()]);
        }
        args.extend_from_slice(options);
        args.push("--");
        args.extend_from_slice(flags);
        let out = self.pod(&args);
        assert!(
            out.status.success(),
            "pod add {name}: {}{}\ndaemon log:\n{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr),
            self.log()
        );
    }

    /// `redirector pod del --name NAME`, which must succeed.
    #[track_caller]
    pub fn del(&self, name: &str) {
        crate::process::assert_success(&self.pod(&["del", "--name", name]));
    }

    /// The names of the pods it manages, sorted.
    pub fn pod_names(&self) -> Vec<String> {
        let mut names: Vec<String> = self
            .pods()
            .iter()
            .map(|p| p["name"].as_str().unwrap_or("").to_owned())
            .collect();
        names.sort();
        names
    }

    /// `pod list --json`, parsed.
    pub fn pods(&self) -> Vec<serde_json::Value> {
        let out = self.pod(&["list", "--json"]);
        assert!(
            out.status.success(),
            "pod list: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        serde_json::from_slice(&out.stdout).expect("pod list --json prints JSON")
    }

    /// The network namespace cookie of every pod the daemon has.
    pub fn pod_cookies(&self) -> Vec<u64> {
        let pods = self.pods();
        pods.iter()
            .filter_map(|p| p["netns_cookie"].as_u64())
            .collect()
    }
}

/// A daemon killed by the test, to start again.
pub struct Killed {
    socket: PathBuf,
    args: Vec<String>,
    env: Vec<(String, String)>,
}

impl Killed {
    /// A new daemon with the same flags, once it serves.
    pub fn restart(self) -> Daemon {
        Daemon::spawn(self.socket, self.args, self.env)
    }

    /// A new daemon with the same flags but `flag` set to `value`.
    pub fn restart_with_flag(mut self, flag: &str, value: &str) -> Daemon {
        set_flag(&mut self.args, flag, value);
        self.restart()
    }

    /// The daemon's command with `flag` set to `value`, run until it exits: a start it
    /// refuses ([`refused`]).
    pub fn run_refused(&self, flag: &str, value: &str) -> (i32, String) {
        let mut args = self.args.clone();
        set_flag(&mut args, flag, value);
        refused(&args, &self.env)
    }

    /// A new daemon with the same flags, loading the eBPF object at `object` (as another
    /// release's daemon would).
    pub fn restart_with_object(self, object: &Path) -> Daemon {
        self.restart_with_env("REDIRECTOR_EBPF_OBJECT", &object.display().to_string())
    }

    /// A new daemon with the same flags and env var `key` set to `value`.
    pub fn restart_with_env(mut self, key: &str, value: &str) -> Daemon {
        self.env.retain(|(k, _)| k != key);
        self.env.push((key.to_owned(), value.to_owned()));
        self.restart()
    }
}

/// The flags naming a node's pins, cgroup and state directory, as `redirector daemon`
/// takes them.
pub fn node_flags(root: &PinRoot, node: &Cgroup, state: &StateDir) -> Vec<String> {
    let flags = ["--pin-root", "--cgroup", "--state-dir"];
    let paths = [root.path(), node.path(), state.path()].map(|p| p.display().to_string());
    flags
        .into_iter()
        .zip(paths)
        .flat_map(|(f, p)| [f.to_owned(), p])
        .collect()
}

/// `redirector daemon --uninstall` of the node of `root`, `node` and `state`, with `extra`
/// flags.
pub fn uninstall(root: &PinRoot, node: &Cgroup, state: &StateDir, extra: &[&str]) -> Output {
    Command::new(redirector_bin())
        .args(["daemon", "--uninstall"])
        .args(node_flags(root, node, state))
        .args(extra)
        .output()
        .expect("running redirector daemon --uninstall")
}

/// `redirector ARGS` with `env`, a daemon expected to refuse its start: its exit code and
/// stderr. Panics if it still runs after 30 s.
pub fn refused<S: AsRef<OsStr>>(args: &[S], env: &[(S, S)]) -> (i32, String) {
    let out = Command::new("timeout")
        .arg("30")
        .arg(redirector_bin())
        .args(args)
        .envs(env.iter().map(|(k, v)| (k, v)))
        .stdout(Stdio::null())
        .output()
        .expect("running redirector daemon");
    let code = out.status.code().unwrap_or(-1);
    let args: Vec<_> = args.iter().map(|a| a.as_ref().to_string_lossy()).collect();
    assert_ne!(code, 124, "the daemon still runs with {args:?}");
    (code, String::from_utf8_lossy(&out.stderr).into_owned())
}

/// `flag value` in `args`, in place of the flag's earlier value if it has one.
fn set_flag(args: &mut Vec<String>, flag: &str, value: &str) {
    match args.iter().position(|a| a == flag) {
        Some(at) if at + 1 < args.len() => args[at + 1] = value.to_owned(),
        _ => args.extend([flag.to_owned(), value.to_owned()]),
    }
}

/// The resident memory (VmRSS) of process `pid`, in KiB.
pub fn rss_kib(pid: u32) -> u64 {
    let status = procfs::process::Process::new(pid as i32).and_then(|p| p.status());
    let status = status.unwrap_or_else(|e| panic!("reading /proc/{pid}/status: {e}"));
    status
        .vmrss
        .unwrap_or_else(|| panic!("no VmRSS in /proc/{pid}/status"))
}

/// The addresses TCP sockets of this network namespace listen on at `port`, from
/// /proc/net/tcp and tcp6: which addresses a server is reachable at, read without
/// sending anything.
pub fn tcp_listeners(port: u16) -> Vec<std::net::SocketAddr> {
    let tables = [procfs::net::tcp(), procfs::net::tcp6()];
    let mut found: Vec<_> = tables
        .into_iter()
        .flat_map(|table| table.unwrap_or_else(|e| panic!("reading /proc/net/tcp: {e}")))
        .filter(|entry| entry.state == TcpState::Listen && entry.local_address.port() == port)
        .map(|entry| entry.local_address)
        .collect();
    found.sort();
    found
}

/// One API request line on `stream`, and the daemon's answer line, parsed.
pub fn ask(stream: &mut UnixStream, request: &str) -> serde_json::Value {
    writeln!(stream, "{request}").expect("writing a request");
    let mut line = String::new();
    BufReader::new(stream.try_clone().expect("cloning the stream"))
        .read_line(&mut line)
        .expect("reading the answer");
    serde_json::from_str(&line).unwrap_or_else(|e| panic!("{e}: {line:?}"))
}

/// `GET path` from the HTTP server at `addr` (loopback): its status and body.
pub fn http_get(addr: &str, path: &str) -> std::io::Result<(u16, String)> {
    http_response(addr, path).map(|(status, _, body)| (status, body))
}

/// `GET path` from the HTTP server at `addr` (loopback): its status, head and body.
pub fn http_response(addr: &str, path: &str) -> std::io::Result<(u16, String, String)> {
    let mut stream = std::net::TcpStream::connect(addr)?;
    // One write: a request in one segment, as a real client sends it.
    let request = format!("GET {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n");
    stream.write_all(request.as_bytes())?;
    let mut response = String::new();
    stream.read_to_string(&mut response)?;
    let (head, body) = response.split_once("\r\n\r\n").unwrap_or((&response, ""));
    let status = head.split_whitespace().nth(1).and_then(|s| s.parse().ok());
    Ok((status.unwrap_or(0), head.to_owned(), body.to_owned()))
}

#[cfg(test)]
mod tests {
    use std::net::{Ipv4Addr, SocketAddr, TcpListener};

    #[test]
    fn listeners_are_read_with_their_addresses() {
        let v4 = TcpListener::bind((Ipv4Addr::LOCALHOST, 0)).unwrap();
        let port = v4.local_addr().unwrap().port();
        let v6 = SocketAddr::from((std::net::Ipv6Addr::LOCALHOST, port));
        // The port may be taken on ::1 by someone else: then only IPv4 is looked for.
        let v6_listener = TcpListener::bind(v6).ok();
        let mut expected = vec![v4.local_addr().unwrap()];
        expected.extend(v6_listener.as_ref().map(|_| v6));
        assert_eq!(super::tcp_listeners(port), expected);
    }
}
