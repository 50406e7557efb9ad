//! The agent against a ztunnel played by the test over a real socket.

use std::{
    os::{fd::OwnedFd, unix::fs::MetadataExt as _},
    path::PathBuf,
};

use super::*;
use crate::zds::wire::{Response, WorkloadRequest, WorkloadResponse};

/// Long enough that a loaded machine still answers in time; the silent cases wait it out.
const BOUND: Duration = Duration::from_secs(2);

struct Pods(Mutex<Vec<Workload>>);

impl Enrolled for Pods {
    fn snapshot(&self) -> Result<Vec<Workload>, String> {
        let pods = self.0.lock().unwrap().clone();
        match pods.iter().any(|pod| pod.uid == "unreadable") {
            true => Err("the records cannot be read".to_owned()),
            false => Ok(pods),
        }
    }
}

fn pod(uid: &str, netns: &str) -> Workload {
    Workload {
        uid: uid.to_owned(),
        info: WorkloadInfo {
            name: format!("{uid}-name"),
            namespace: "default".to_owned(),
            service_account: "sa".to_owned(),
        },
        netns: PathBuf::from(netns),
    }
}

const HERE: &str = "/proc/self/ns/net";

/// ztunnel's side: says hello, reads requests, answers them.
struct FakeZtunnel(Conn);

impl FakeZtunnel {
    async fn connect(socket: &Path, version: Version) -> FakeZtunnel {
        let conn = Conn::connect(socket).expect("connecting to the agent");
        let hello = ZdsHello {
            version: version as i32,
        };
        conn.send(&hello.encode_to_vec(), None).await.unwrap();
        FakeZtunnel(conn)
    }

    async fn next(&self) -> (Request, Option<OwnedFd>) {
        let packet = timeout(Duration::from_secs(5), self.0.recv())
            .await
            .expect("a request in time")
            .unwrap()
            .expect("a request, not the end");
        let request = WorkloadRequest::decode(&packet.bytes[..]).unwrap();
        (request.payload.expect("a payload"), packet.fd)
    }

    async fn ack(&self, error: &str) {
        let ack = WorkloadResponse {
            payload: Some(Response::Ack(crate::zds::wire::Ack {
                error: error.to_owned(),
            })),
        };
        self.0.send(&ack.encode_to_vec(), None).await.unwrap();
    }

    /// The snapshot, each acked: what it named, and whether each Add came with this
    /// process's netns.
    async fn take_snapshot(&self) -> Vec<String> {
        let mut named = Vec::new();
        loop {
            let (request, fd) = self.next().await;
            match &request {
                Request::Add(add) => {
                    assert!(is_here(fd.expect("an add comes with its netns")));
                    named.push(format!("add {}", add.uid));
                }
                Request::Keep(keep) => {
                    assert!(fd.is_none());
                    named.push(format!("keep {}", keep.uid));
                }
                Request::SnapshotSent(_) => {
                    self.ack("").await;
                    return named;
                }
                Request::Del(_) => panic!("a del in a snapshot"),
            }
            self.ack("").await;
        }
    }

    async fn hung_up(&self) -> bool {
        matches!(
            timeout(Duration::from_secs(5), self.0.recv()).await,
            Ok(Ok(None))
        )
    }
}

fn is_here(fd: OwnedFd) -> bool {
    let (got, here) = (
        File::from(fd).metadata().unwrap(),
        std::fs::metadata(HERE).unwrap(),
    );
    (got.dev(), got.ino()) == (here.dev(), here.ino())
}

struct Setup {
    agent: Agent,
    socket: PathBuf,
    pods: Arc<Pods>,
    dir: PathBuf,
}

impl Drop for Setup {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

fn setup(name: &str, pods: Vec<Workload>) -> Setup {
    let dir = std::env::temp_dir().join(format!("zds-agent-{}-{name}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let socket = dir.join("ztunnel.sock");
    let pods = Arc::new(Pods(Mutex::new(pods)));
    let agent = Agent::start(&socket, Arc::clone(&pods) as Arc<dyn Enrolled>, BOUND).unwrap();
    Setup {
        agent,
        socket,
        pods,
        dir,
    }
}

async fn synced(agent: &Agent) {
    for _ in 0..100 {
        if matches!(agent.ztunnel(), Ztunnel::Synced(_)) {
            return;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    panic!("not synced: {:?}", agent.ztunnel());
}

#[tokio::test]
async fn a_snapshot_then_pods_as_they_come_and_go() {
    let setup = setup("live", vec![pod("a", HERE), pod("b", "/nonexistent/netns")]);
    assert_eq!(setup.agent.ztunnel(), Ztunnel::Away);
    let ztunnel = FakeZtunnel::connect(&setup.socket, Version::V1).await;
    assert_eq!(ztunnel.take_snapshot().await, ["add a", "keep b"]);
    synced(&setup.agent).await;
    let Ztunnel::Synced(peer) = setup.agent.ztunnel() else {
        unreachable!()
    };
    assert_eq!(peer.pid, std::process::id(), "the peer is known");

    let agent = setup.agent.clone();
    let added = tokio::spawn(async move { agent.add(pod("c", HERE)).await });
    let (request, fd) = ztunnel.next().await;
    assert_eq!(request, add(&pod("c", HERE)));
    assert!(is_here(fd.unwrap()));
    ztunnel.ack("").await;
    added.await.unwrap().expect("acked");

    let agent = setup.agent.clone();
    let deleted = tokio::spawn(async move { agent.del("c").await });
    let (request, fd) = ztunnel.next().await;
    assert_eq!(request, Request::Del(DelWorkload { uid: "c".into() }));
    assert!(fd.is_none());
    ztunnel.ack("").await;
    deleted.await.unwrap().expect("acked");
}

#[tokio::test]
async fn every_connection_gets_a_fresh_snapshot() {
    let setup = setup("again", vec![pod("a", HERE)]);
    let first = FakeZtunnel::connect(&setup.socket, Version::V1).await;
    assert_eq!(first.take_snapshot().await, ["add a"]);
    synced(&setup.agent).await;
    drop(first);
    setup.pods.0.lock().unwrap().push(pod("b", HERE));
    let second = FakeZtunnel::connect(&setup.socket, Version::V1).await;
    assert_eq!(second.take_snapshot().await, ["add a", "add b"]);
}

#[tokio::test]
async fn a_refused_pod_fails_its_add_and_the_connection_stays() {
    let setup = setup("refused", vec![]);
    let ztunnel = FakeZtunnel::connect(&setup.socket, Version::V1).await;
    assert!(ztunnel.take_snapshot().await.is_empty());
    synced(&setup.agent).await;
    let agent = setup.agent.clone();
    let added = tokio::spawn(async move { agent.add(pod("c", HERE)).await });
    ztunnel.next().await;
    ztunnel.ack("unknown workload").await;
    let err = added.await.unwrap().expect_err("refused");
    assert!(
        matches!(&err, ZdsError::Refused { why, .. } if why == "unknown workload"),
        "{err}"
    );
    // Still connected: the next add goes through.
    let agent = setup.agent.clone();
    let added = tokio::spawn(async move { agent.add(pod("d", HERE)).await });
    ztunnel.next().await;
    ztunnel.ack("").await;
    added.await.unwrap().expect("acked");
}

#[tokio::test]
async fn a_ztunnel_that_never_answers_fails_the_add_and_is_dropped() {
    let setup = setup("silent", vec![]);
    let ztunnel = FakeZtunnel::connect(&setup.socket, Version::V1).await;
    ztunnel.take_snapshot().await;
    synced(&setup.agent).await;
    let err = setup
        .agent
        .add(pod("c", HERE))
        .await
        .expect_err("no answer");
    assert!(matches!(err, ZdsError::NoAnswer { .. }), "{err}");
    ztunnel.next().await; // the add it never answered
    assert!(ztunnel.hung_up().await, "the agent dropped the connection");
}

#[tokio::test]
async fn without_ztunnel_an_add_fails_and_a_del_is_nothing_to_do() {
    let setup = setup("away", vec![]);
    let err = setup.agent.add(pod("c", HERE)).await.expect_err("nobody");
    assert!(matches!(err, ZdsError::NotConnected(_)), "{err}");
    setup.agent.del("c").await.expect("nothing to do");
    // The add left behind is not sent to a ztunnel that connects later: nobody waits.
    let ztunnel = FakeZtunnel::connect(&setup.socket, Version::V1).await;
    assert!(ztunnel.take_snapshot().await.is_empty());
    synced(&setup.agent).await;
    let agent = setup.agent.clone();
    let added = tokio::spawn(async move { agent.add(pod("d", HERE)).await });
    let (request, _) = ztunnel.next().await;
    assert_eq!(request, add(&pod("d", HERE)));
    ztunnel.ack("").await;
    added.await.unwrap().expect("acked");
}

#[tokio::test]
async fn a_hello_in_another_version_is_hung_up_on() {
    let setup = setup("version", vec![pod("a", HERE)]);
    let ztunnel = FakeZtunnel::connect(&setup.socket, Version::NotUsed).await;
    assert!(ztunnel.hung_up().await);
}

#[tokio::test]
async fn a_stale_socket_is_replaced_and_anything_else_refused() {
    let setup = setup("stale", vec![]);
    drop(setup.agent.clone());
    // A second agent at the same path (the daemon restarted) takes the socket over.
    let again = Agent::start(&setup.socket, setup.pods.clone(), BOUND).expect("replaced");
    let ztunnel = FakeZtunnel::connect(&setup.socket, Version::V1).await;
    ztunnel.take_snapshot().await;
    synced(&again).await;
    let file = setup.dir.join("a-file");
    std::fs::write(&file, "").unwrap();
    let err = Agent::start(&file, setup.pods.clone(), BOUND)
        .err()
        .expect("refused");
    assert_eq!(err.kind(), std::io::ErrorKind::AlreadyExists, "{err}");
}

#[tokio::test]
async fn no_snapshot_is_sent_when_the_pods_cannot_be_read() {
    let setup = setup("unreadable", vec![pod("a", HERE), pod("unreadable", HERE)]);
    let ztunnel = FakeZtunnel::connect(&setup.socket, Version::V1).await;
    assert!(ztunnel.hung_up().await, "hung up before any request");
}

#[tokio::test]
async fn a_second_ztunnel_replaces_the_first() {
    let setup = setup("upgrade", vec![pod("a", HERE)]);
    let old = FakeZtunnel::connect(&setup.socket, Version::V1).await;
    assert_eq!(old.take_snapshot().await, ["add a"]);
    synced(&setup.agent).await;
    // The new one connects while the old one still runs: it is sent the snapshot, the old
    // one is let go, and pods from then on go to the new one.
    let new = FakeZtunnel::connect(&setup.socket, Version::V1).await;
    assert_eq!(new.take_snapshot().await, ["add a"]);
    assert!(old.hung_up().await, "the old one is let go");
    let agent = setup.agent.clone();
    let added = tokio::spawn(async move { agent.add(pod("b", HERE)).await });
    let (request, _) = new.next().await;
    assert_eq!(request, add(&pod("b", HERE)));
    new.ack("").await;
    added.await.unwrap().expect("acked by the new one");
}

#[tokio::test]
async fn adds_past_the_queue_without_ztunnel_fail_and_do_not_hang() {
    let setup = setup("full", vec![]);
    let adds: Vec<_> = (0..100)
        .map(|n| {
            let agent = setup.agent.clone();
            tokio::spawn(async move { agent.add(pod(&format!("p{n}"), HERE)).await })
        })
        .collect();
    for add in adds {
        // Far past the bound: an add waiting for room in the queue would wait for ever.
        let done = timeout(Duration::from_secs(30), add)
            .await
            .expect("not hung");
        let err = done.unwrap().expect_err("nobody to take it");
        assert!(matches!(err, ZdsError::NotConnected(_)), "{err}");
    }
}
