//! The agent: listens for ztunnel, sends it the snapshot of enrolled pods on every
//! connection, then each pod enrolled or gone, awaiting ztunnel's ack for every request.
//! One ztunnel at a time: a new connection (ztunnel restarted, or upgraded while the old
//! one still runs) replaces the old one and is sent a fresh snapshot.

use std::{
    fs::File,
    path::{Path, PathBuf},
    sync::{Arc, Mutex, PoisonError},
    time::Duration,
};

use prost::Message as _;
use tokio::{
    sync::{mpsc, oneshot},
    time::timeout,
};
use tracing::{info, warn};

use super::{
    seqpacket::{Conn, Listener, Peer},
    wire::{
        decode_ack, AddWorkload, DelWorkload, KeepWorkload, Request, SnapshotSent, Version,
        WireError, WorkloadInfo, ZdsHello,
    },
};

/// A pod as ztunnel is told of it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Workload {
    /// The pod's uid, ztunnel's key.
    pub uid: String,
    pub info: WorkloadInfo,
    /// Its network namespace, sent as an open fd.
    pub netns: PathBuf,
}

/// Where the agent finds the enrolled pods when ztunnel connects.
pub trait Enrolled: Send + Sync + 'static {
    /// Every enrolled pod. An error ends the connection before any snapshot is sent: an
    /// empty or partial one would have ztunnel drain the pods it left out.
    fn snapshot(&self) -> Result<Vec<Workload>, String>;

    /// ztunnel (process `peer`) connected and said hello, before it is sent the snapshot:
    /// whatever must run where ztunnel runs is set up here. A failure is logged, and the
    /// snapshot sent all the same.
    fn connected(&self, _peer: Peer) -> Result<(), String> {
        Ok(())
    }
}

#[derive(Debug, thiserror::Error)]
pub enum ZdsError {
    #[error("ztunnel did not connect within {0:?}")]
    NotConnected(Duration),
    #[error("ztunnel refused {what}: {why}")]
    Refused { what: String, why: String },
    #[error("ztunnel did not answer {what} within {within:?}")]
    NoAnswer { what: String, within: Duration },
    #[error("opening the network namespace {}: {source}", path.display())]
    Netns {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("talking to ztunnel: {0}")]
    Io(#[from] std::io::Error),
    #[error("ztunnel {0}")]
    Protocol(#[from] WireError),
    #[error("ztunnel hung up")]
    HungUp,
    #[error("ztunnel said hello in version {0}, not 1")]
    Version(i32),
    #[error("reading the enrolled pods: {0}")]
    Snapshot(String),
    #[error("the connection is dropped after: {0}")]
    Dropped(String),
    #[error("the ZDS agent has stopped")]
    Stopped,
}

/// What the agent knows of ztunnel, for `status` and the metrics.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Ztunnel {
    /// Nobody connected.
    #[default]
    Away,
    /// Connected, the snapshot not yet acknowledged.
    Syncing(Peer),
    /// Connected and sent every enrolled pod.
    Synced(Peer),
}

enum Command {
    Add(Workload, oneshot::Sender<Result<(), ZdsError>>),
    Del(String, oneshot::Sender<Result<(), ZdsError>>),
}

impl Ztunnel {
    /// Its name in metrics and logs.
    pub fn label(self) -> &'static str {
        match self {
            Ztunnel::Away => "away",
            Ztunnel::Syncing(_) => "syncing",
            Ztunnel::Synced(_) => "synced",
        }
    }
}

impl Command {
    /// Whoever asked still waits for the answer.
    fn wanted(&self) -> bool {
        match self {
            Command::Add(_, reply) | Command::Del(_, reply) => !reply.is_closed(),
        }
    }
}

/// The handle the ways in use: enroll a pod, take it out, ask how ztunnel is.
#[derive(Clone)]
pub struct Agent {
    commands: mpsc::Sender<Command>,
    ztunnel: Arc<Mutex<Ztunnel>>,
    ack_within: Duration,
}

impl Agent {
    /// Listens at `socket` (a stale socket file there is replaced) and serves ztunnel from
    /// a task of the current runtime. `ack_within` bounds every answer awaited.
    pub fn start(
        socket: &Path,
        enrolled: Arc<dyn Enrolled>,
        ack_within: Duration,
    ) -> std::io::Result<Agent> {
        Ok(Bound::bind(socket)?.serve(enrolled, ack_within))
    }

    pub fn ztunnel(&self) -> Ztunnel {
        *self.ztunnel.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Sends ztunnel the pod and waits for its ack: ztunnel must connect, take the pod and
    /// answer within twice the ack bound, or the enrollment fails.
    pub async fn add(&self, workload: Workload) -> Result<(), ZdsError> {
        let uid = workload.uid.clone();
        self.ask(|reply| Command::Add(workload, reply), &format!("add {uid}"))
            .await
    }

    /// Tells ztunnel the pod is gone. Without ztunnel, nothing to do: the next
    /// snapshot leaves the pod out.
    pub async fn del(&self, uid: &str) -> Result<(), ZdsError> {
        if self.ztunnel() == Ztunnel::Away {
            return Ok(());
        }
        self.ask(
            |reply| Command::Del(uid.to_owned(), reply),
            &format!("del {uid}"),
        )
        .await
    }

    async fn ask(
        &self,
        command: impl FnOnce(oneshot::Sender<Result<(), ZdsError>>) -> Command,
        what: &str,
    ) -> Result<(), ZdsError> {
        let (reply, answer) = oneshot::channel();
        let command = command(reply);
        // Room in the queue, connecting, the snapshot and this request's own answer.
        let within = self.ack_within * 2;
        let asked = async {
            self.commands.send(command).await.map_err(|_| ())?;
            answer.await.map_err(|_| ())
        };
        match timeout(within, asked).await {
            Ok(Ok(result)) => result,
            Ok(Err(())) => Err(ZdsError::Stopped),
            Err(_) if self.ztunnel() == Ztunnel::Away => Err(ZdsError::NotConnected(within)),
            Err(_) => Err(ZdsError::NoAnswer {
                what: what.to_owned(),
                within,
            }),
        }
    }
}

/// A socket file left by an earlier agent (killed, or upgraded) is replaced; anything
/// else at the path is left alone and refused.
fn remove_stale_socket(socket: &Path) -> std::io::Result<()> {
    use std::os::unix::fs::FileTypeExt as _;
    match std::fs::symlink_metadata(socket) {
        Ok(meta) if meta.file_type().is_socket() => std::fs::remove_file(socket),
        Ok(_) => Err(std::io::Error::new(
            std::io::ErrorKind::AlreadyExists,
            format!("{} exists and is not a socket", socket.display()),
        )),
        Err(err) if err.kind() == std::io::ErrorKind::NotFound => Ok(()),
        Err(err) => Err(err),
    }
}

/// The agent's socket, listening before the agent serves: a bad path fails the start
/// before anything else is done, and ztunnel's connection waits in the backlog until the
/// pods it is to be sent are known.
pub struct Bound {
    listener: Listener,
    socket: PathBuf,
}

impl Bound {
    /// Listens at `socket` (a stale socket file there is replaced). Call inside a tokio
    /// runtime.
    pub fn bind(socket: &Path) -> std::io::Result<Bound> {
        remove_stale_socket(socket)?;
        Ok(Bound {
            listener: Listener::bind(socket)?,
            socket: socket.to_path_buf(),
        })
    }

    /// Serves ztunnel from a task of the current runtime. `ack_within` bounds every answer
    /// awaited.
    pub fn serve(self, enrolled: Arc<dyn Enrolled>, ack_within: Duration) -> Agent {
        info!("ZDS: waiting for ztunnel on {}", self.socket.display());
        let (commands, queue) = mpsc::channel(64);
        let ztunnel = Arc::new(Mutex::new(Ztunnel::Away));
        let server = Server {
            listener: self.listener,
            enrolled,
            ack_within,
            ztunnel: Arc::clone(&ztunnel),
        };
        tokio::spawn(server.run(queue));
        Agent {
            commands,
            ztunnel,
            ack_within,
        }
    }
}

/// How a connection ended without an error.
enum Ended {
    /// Another ztunnel connected.
    Replaced(Conn),
    /// The agent's handles are all gone.
    Stopped,
}

struct Server {
    listener: Listener,
    enrolled: Arc<dyn Enrolled>,
    ack_within: Duration,
    ztunnel: Arc<Mutex<Ztunnel>>,
}

impl Server {
    fn set(&self, ztunnel: Ztunnel) {
        *self.ztunnel.lock().unwrap_or_else(PoisonError::into_inner) = ztunnel;
    }

    async fn run(self, mut queue: mpsc::Receiver<Command>) {
        let mut replacing = None;
        loop {
            let conn = match replacing.take() {
                Some(conn) => conn,
                None => match self.listener.accept().await {
                    Ok(conn) => conn,
                    Err(err) => {
                        warn!("ZDS: accepting ztunnel: {err}");
                        tokio::time::sleep(Duration::from_millis(100)).await;
                        continue;
                    }
                },
            };
            let peer = match conn.peer() {
                Ok(peer) => peer,
                Err(err) => {
                    warn!("ZDS: who connected: {err}");
                    continue;
                }
            };
            info!("ZDS: ztunnel connected (pid {})", peer.pid);
            self.set(Ztunnel::Syncing(peer));
            let ended = self.session(&conn, peer, &mut queue).await;
            self.set(Ztunnel::Away);
            match ended {
                Ok(Ended::Replaced(next)) => {
                    info!(
                        "ZDS: a new ztunnel connected; the one of pid {} is let go",
                        peer.pid
                    );
                    replacing = Some(next);
                }
                Ok(Ended::Stopped) | Err(ZdsError::HungUp) => {
                    info!("ZDS: ztunnel (pid {}) left", peer.pid)
                }
                Err(err) => warn!("ZDS: ztunnel (pid {}) dropped: {err}", peer.pid),
            }
        }
    }

    /// One connection: hello, the snapshot, then the commands until it ends — ztunnel
    /// hangs up, a request is left unanswered (a late ack would answer the next request),
    /// or another ztunnel connects (an upgrade starts the new one before the old one
    /// stops): the newest is the one told of the pods.
    async fn session(
        &self,
        conn: &Conn,
        peer: Peer,
        queue: &mut mpsc::Receiver<Command>,
    ) -> Result<Ended, ZdsError> {
        let hello = self.receive(conn, "hello").await?;
        let version = ZdsHello::decode(&hello[..])
            .map_err(WireError::from)?
            .version;
        if version != Version::V1 as i32 {
            return Err(ZdsError::Version(version));
        }
        let enrolled = Arc::clone(&self.enrolled);
        match tokio::task::spawn_blocking(move || enrolled.connected(peer)).await {
            Ok(Ok(())) => {}
            Ok(Err(why)) => warn!("ZDS: ztunnel (pid {}): {why}", peer.pid),
            Err(err) => warn!("ZDS: ztunnel (pid {}): {err}", peer.pid),
        }
        let snapshot = self.enrolled.snapshot().map_err(ZdsError::Snapshot)?;
        let count = snapshot.len();
        for workload in snapshot {
            let result = match File::open(&workload.netns) {
                Ok(netns) => self.request(conn, add(&workload), Some(&netns)).await,
                // Its netns is not at hand (being made, or gone): ztunnel keeps what it has.
                Err(_) => {
                    let keep = Request::Keep(KeepWorkload { uid: workload.uid });
                    self.request(conn, keep, None).await
                }
            };
            match result {
                Err(err @ ZdsError::Refused { .. }) => warn!("ZDS: {err}"),
                other => other?,
            }
        }
        self.request(conn, Request::SnapshotSent(SnapshotSent {}), None)
            .await?;
        info!(
            "ZDS: ztunnel (pid {}) has the snapshot of {count} pods",
            peer.pid
        );
        self.set(Ztunnel::Synced(peer));
        loop {
            let command = tokio::select! {
                command = queue.recv() => match command {
                    Some(command) => command,
                    None => return Ok(Ended::Stopped),
                },
                next = self.listener.accept() => match next {
                    Ok(next) => return Ok(Ended::Replaced(next)),
                    Err(err) => {
                        warn!("ZDS: accepting ztunnel: {err}");
                        continue;
                    }
                },
                // ztunnel speaks only when asked: anything else is its end.
                unasked = conn.recv() => return match unasked? {
                    None => Err(ZdsError::HungUp),
                    Some(_) => Err(WireError::NoAck.into()),
                },
            };
            if !command.wanted() {
                continue;
            }
            let (result, reply) = match command {
                Command::Add(workload, reply) => match File::open(&workload.netns) {
                    Ok(netns) => (
                        self.request(conn, add(&workload), Some(&netns)).await,
                        reply,
                    ),
                    Err(source) => {
                        let path = workload.netns;
                        let _ = reply.send(Err(ZdsError::Netns { path, source }));
                        continue;
                    }
                },
                Command::Del(uid, reply) => {
                    let del = Request::Del(DelWorkload { uid });
                    (self.request(conn, del, None).await, reply)
                }
            };
            // A refusal leaves the connection usable; anything else ends it.
            let ended = match &result {
                Ok(()) | Err(ZdsError::Refused { .. }) => None,
                Err(err) => Some(err.to_string()),
            };
            let _ = reply.send(result);
            if let Some(after) = ended {
                return Err(ZdsError::Dropped(after));
            }
        }
    }

    /// Sends one request (with the netns fd for an add) and awaits its ack.
    async fn request(
        &self,
        conn: &Conn,
        request: Request,
        netns: Option<&File>,
    ) -> Result<(), ZdsError> {
        use std::os::fd::AsFd as _;
        let what = request.describe();
        conn.send(&request.to_bytes(), netns.map(|file| file.as_fd()))
            .await?;
        let answer = self.receive(conn, &what).await?;
        decode_ack(&answer)?.map_err(|why| ZdsError::Refused { what, why })
    }

    async fn receive(&self, conn: &Conn, what: &str) -> Result<Vec<u8>, ZdsError> {
        let within = self.ack_within;
        match timeout(within, conn.recv()).await {
            Err(_) => Err(ZdsError::NoAnswer {
                what: what.to_owned(),
                within,
            }),
            Ok(received) => Ok(received?.ok_or(ZdsError::HungUp)?.bytes),
        }
    }
}

fn add(workload: &Workload) -> Request {
    Request::Add(AddWorkload {
        uid: workload.uid.clone(),
        workload_info: Some(workload.info.clone()),
    })
}

#[cfg(test)]
mod tests;
