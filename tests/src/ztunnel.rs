//! A stand-in for istio ambient's ztunnel on a node agent's ZDS socket: [`connect`] and
//! [`serve`] speak the protocol (the `standin-ztunnel` binary opens its listeners in each
//! pod it is sent, and [`StandInProcess`] runs it); [`StandInZtunnel`] keeps every request
//! it is sent (an add's network namespace by device and inode) and answers each as the test
//! says; [`FixedPods`] plays the node agent's records when the test is the agent.

use std::{
    os::{fd::OwnedFd, unix::fs::MetadataExt as _},
    path::Path,
    sync::{Arc, Mutex},
    time::{Duration, Instant},
};

use prost::Message as _;
use redirector::zds::{
    seqpacket::Conn,
    wire::{Ack, Request, Response, Version, WorkloadRequest, WorkloadResponse, ZdsHello},
};

use crate::process::within;

/// A request as the stand-in saw it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Seen {
    /// An add, with the (device, inode) of the namespace it came with.
    Add {
        uid: String,
        netns: (u64, u64),
    },
    Keep(String),
    Del(String),
    SnapshotSent,
}

impl Seen {
    fn of(request: Request, fd: Option<OwnedFd>) -> Seen {
        match request {
            Request::Add(add) => {
                let netns = std::fs::File::from(fd.expect("an add carries its netns"));
                let meta = netns.metadata().expect("the netns fd");
                Seen::Add {
                    uid: add.uid,
                    netns: (meta.dev(), meta.ino()),
                }
            }
            Request::Keep(keep) => Seen::Keep(keep.uid),
            Request::Del(del) => Seen::Del(del.uid),
            Request::SnapshotSent(_) => Seen::SnapshotSent,
        }
    }
}

/// How a request is answered.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Answer {
    Ack,
    Refuse(String),
    /// Never: a ztunnel that hangs.
    Silence,
}

/// Connects to the agent at `socket` (waiting up to 30 s for it to listen) and says hello
/// in version 1.
pub async fn connect(socket: &Path) -> Conn {
    connect_within(socket, Duration::from_secs(30)).await
}

/// [`connect`], waiting up to `wait` for the agent to listen. A connection reset before
/// the hello is sent is tried again, as ztunnel does: an agent that is being killed can
/// take a connection into its backlog and then close its socket.
pub async fn connect_within(socket: &Path, wait: Duration) -> Conn {
    let deadline = Instant::now() + wait;
    let hello = ZdsHello {
        version: Version::V1 as i32,
    }
    .encode_to_vec();
    loop {
        let said_hello = match Conn::connect(socket) {
            Ok(conn) => conn.send(&hello, None).await.map(|()| conn),
            Err(err) => Err(err),
        };
        match said_hello {
            Ok(conn) => return conn,
            Err(err) if Instant::now() > deadline => {
                panic!("connecting to {} and saying hello: {err}", socket.display())
            }
            Err(_) => tokio::time::sleep(Duration::from_millis(50)).await,
        }
    }
}

/// Handles the agent's requests until it hangs up, each answered as `handle` says.
pub async fn serve(conn: &Conn, mut handle: impl FnMut(Request, Option<OwnedFd>) -> Answer) {
    while let Ok(Some(packet)) = conn.recv().await {
        let request = WorkloadRequest::decode(&packet.bytes[..]).expect("a ZDS request");
        let request = request.payload.expect("a request with a payload");
        let error = match handle(request, packet.fd) {
            Answer::Ack => String::new(),
            Answer::Refuse(why) => why,
            Answer::Silence => continue,
        };
        let ack = WorkloadResponse {
            payload: Some(Response::Ack(Ack { error })),
        };
        if conn.send(&ack.encode_to_vec(), None).await.is_err() {
            return;
        }
    }
}

/// A ztunnel that only speaks ZDS, from a thread of the test.
pub struct StandInZtunnel {
    seen: Arc<Mutex<Vec<Seen>>>,
    answer: Arc<Mutex<Answer>>,
    /// Dropping it ends the connection.
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl StandInZtunnel {
    /// Connected to the agent at `socket` (see [`connect`]), acking every request.
    pub fn connect(socket: &Path) -> StandInZtunnel {
        let seen: Arc<Mutex<Vec<Seen>>> = Arc::default();
        let answer = Arc::new(Mutex::new(Answer::Ack));
        let (stop, stopped) = tokio::sync::oneshot::channel();
        let (ready, connected) = std::sync::mpsc::channel();
        let socket = socket.to_path_buf();
        let thread = {
            let (seen, answer) = (Arc::clone(&seen), Arc::clone(&answer));
            std::thread::spawn(move || {
                let runtime = tokio::runtime::Builder::new_current_thread()
                    .enable_all()
                    .build()
                    .expect("a runtime for the stand-in ztunnel");
                runtime.block_on(async move {
                    let conn = connect(&socket).await;
                    ready.send(()).expect("the test waits");
                    let record = |request, fd| {
                        seen.lock().unwrap().push(Seen::of(request, fd));
                        answer.lock().unwrap().clone()
                    };
                    tokio::select! {
                        _ = serve(&conn, record) => {}
                        _ = stopped => {}
                    }
                });
            })
        };
        connected
            .recv_timeout(Duration::from_secs(30))
            .expect("the stand-in ztunnel connected");
        StandInZtunnel {
            seen,
            answer,
            stop: Some(stop),
            thread: Some(thread),
        }
    }

    /// How it answers from now on.
    pub fn answer(&self, answer: Answer) {
        *self.answer.lock().unwrap() = answer;
    }

    pub fn seen(&self) -> Vec<Seen> {
        self.seen.lock().unwrap().clone()
    }

    /// Waits up to 30 s for what it has seen to satisfy `done`; what it has seen then.
    pub fn wait_for(&self, what: &str, done: impl Fn(&[Seen]) -> bool) -> Vec<Seen> {
        let mut seen = Vec::new();
        let reached = within(Duration::from_secs(30), || {
            seen = self.seen();
            done(&seen)
        });
        assert!(reached.is_some(), "{what}: the stand-in saw {seen:?}");
        seen
    }
}

impl Drop for StandInZtunnel {
    fn drop(&mut self) {
        drop(self.stop.take());
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

/// The `standin-ztunnel` binary as a process in a network namespace and cgroup of its own,
/// connected to the agent at `socket`. Fields drop in order: the process before its
/// namespace and cgroup.
pub struct StandInProcess {
    pub process: crate::ChildGuard,
    _netns: crate::NetNs,
    _cgroup: crate::Cgroup,
}

impl StandInProcess {
    /// It prints every connection it proxies (the tests' witness).
    pub fn start(hint: &str, socket: &Path) -> StandInProcess {
        Self::spawn(hint, socket, None, &[])
    }

    /// A ztunnel that hangs: it never answers an add (printing `silent on UID`).
    pub fn start_silent(hint: &str, socket: &Path) -> StandInProcess {
        Self::spawn(hint, socket, None, &["--silent"])
    }

    /// For loads of many connections: it prints only the agent's requests, and runs on
    /// CPU `cpu` alone.
    pub fn start_for_load(hint: &str, socket: &Path, cpu: u32) -> StandInProcess {
        Self::spawn(hint, socket, Some(cpu), &["--quiet"])
    }

    fn spawn(hint: &str, socket: &Path, cpu: Option<u32>, flags: &[&str]) -> StandInProcess {
        let netns = crate::NetNs::new(hint);
        let cgroup = crate::Cgroup::new(hint);
        let bin = crate::bin_path("standin-ztunnel");
        let spawn = match cpu {
            None => crate::Spawn::new(bin),
            Some(cpu) => crate::Spawn::new("taskset")
                .args(["-c", &cpu.to_string()])
                .arg(bin),
        };
        let process = spawn
            .arg("--zds")
            .arg(socket)
            .args(flags)
            .netns(&netns)
            .cgroup(&cgroup)
            .spawn();
        StandInProcess {
            process,
            _netns: netns,
            _cgroup: cgroup,
        }
    }

    /// Waits up to 30 s for the line `line` (earlier lines are consumed).
    pub fn wait_line(&self, what: &str, line: &str) {
        self.process
            .wait_line(what, Duration::from_secs(30), |l| l == line);
    }
}

/// The node agent's enrolled pods when the test plays the agent: always these.
pub struct FixedPods(pub Vec<redirector::zds::agent::Workload>);

impl redirector::zds::agent::Enrolled for FixedPods {
    fn snapshot(&self) -> Result<Vec<redirector::zds::agent::Workload>, String> {
        Ok(self.0.clone())
    }
}

/// The node agent played by the test: redirector's ZDS agent serving `pods` at a socket,
/// on a runtime of its own. Fields drop in order: the agent before its runtime.
pub struct TestAgent {
    pub agent: redirector::zds::agent::Agent,
    runtime: tokio::runtime::Runtime,
}

impl TestAgent {
    pub fn start(
        socket: &Path,
        pods: Vec<redirector::zds::agent::Workload>,
        ack_within: Duration,
    ) -> TestAgent {
        let runtime = tokio::runtime::Runtime::new().expect("a runtime for the agent");
        let agent = {
            let _entered = runtime.enter();
            redirector::zds::agent::Agent::start(socket, Arc::new(FixedPods(pods)), ack_within)
                .expect("the agent listens")
        };
        TestAgent { agent, runtime }
    }

    /// Enrolls `pod`: sends it to ztunnel and waits for the ack.
    pub fn add(
        &self,
        pod: redirector::zds::agent::Workload,
    ) -> Result<(), redirector::zds::agent::ZdsError> {
        self.runtime.block_on(self.agent.add(pod))
    }
}
