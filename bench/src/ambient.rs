//! Enrolling an Istio ambient pod, one at a time with the stand-in ztunnel connected: the
//! way istio-cni's node agent does it — `iptables-restore` and `ip6tables-restore` of its
//! in-pod rules entering the pod's namespace, the policy route, then the pod sent to
//! ztunnel and its ack awaited — against `redirector pod add --dialect ambient` through
//! the daemon, which sets the pod up, installs the route and awaits the same ack.

use std::time::{Duration, Instant};

use redirector::zds::{agent::Workload, wire::WorkloadInfo};
use redirector_tests::cgroup::Cgroup;
use redirector_tests::daemon::{Daemon, StateDir};
use redirector_tests::redirector::PinRoot;
use redirector_tests::ztunnel::{StandInProcess, TestAgent};
use redirector_tests::{istio_cni, NetNs};

use crate::timed::{nsenter, timed};

/// Wall times in ms, one per pod.
#[derive(Debug, Default, serde::Serialize)]
pub struct Enrollment {
    pub samples: usize,
    pub istio_cni_ms: Vec<f64>,
    /// Of which its rules and route (the rest is the ZDS add and ztunnel's ack).
    pub istio_cni_rules_ms: Vec<f64>,
    pub redirector_ms: Vec<f64>,
}

pub fn run(samples: usize) -> Enrollment {
    let mut out = Enrollment {
        samples,
        ..Enrollment::default()
    };
    let mut kept: Vec<(NetNs, Cgroup)> = Vec::new();

    // istio-cni's way, the bench as its agent.
    let dir = StateDir::on_tmpfs("benchzdsref");
    let socket = dir.path().join("ztunnel.sock");
    let agent = TestAgent::start(&socket, Vec::new(), Duration::from_secs(10));
    let ztunnel = StandInProcess::start_for_load("benchztref", &socket, 1);
    let (v4, v6) = istio_cni::rules();
    for i in 0..samples {
        let (ns, cg) = (NetNs::new("bambref"), Cgroup::new("bambref"));
        let start = Instant::now();
        timed(nsenter(&ns).arg("iptables-restore"), Some(&v4));
        timed(nsenter(&ns).arg("ip6tables-restore"), Some(&v6));
        redirector::sys::netns::Netns::open(&ns.path())
            .expect("the pod's namespace")
            .run(redirector::sys::reply_route::install)
            .expect("entering the pod's namespace")
            .expect("the policy route");
        out.istio_cni_rules_ms
            .push(start.elapsed().as_secs_f64() * 1e3);
        agent
            .add(Workload {
                uid: format!("ref-{i}"),
                info: WorkloadInfo {
                    name: format!("ref-{i}"),
                    namespace: "bench".to_owned(),
                    service_account: "default".to_owned(),
                },
                netns: ns.path(),
            })
            .expect("ztunnel's ack");
        out.istio_cni_ms.push(start.elapsed().as_secs_f64() * 1e3);
        kept.push((ns, cg));
    }
    drop((ztunnel, agent, dir));

    // redirector's way, through the daemon.
    let (root, node, state) = (
        PinRoot::new("bambrd"),
        Cgroup::new("bambrdnode"),
        StateDir::on_tmpfs("bambrd"),
    );
    let socket = state.path().join("ztunnel.sock");
    let socket_flag = socket.display().to_string();
    let daemon = Daemon::start_with(&root, &node, &state, &["--ztunnel-socket", &socket_flag]);
    let ztunnel = StandInProcess::start_for_load("benchztrd", &socket, 1);
    for i in 0..samples {
        let (ns, cg) = (NetNs::new("bambrd"), Cgroup::new("bambrd"));
        let start = Instant::now();
        let added = daemon.add_ambient(&ns, &cg, &format!("bench/rd-{i}"), &format!("rd-{i}"));
        out.redirector_ms.push(start.elapsed().as_secs_f64() * 1e3);
        assert!(
            added.status.success(),
            "pod add --dialect ambient: {}",
            String::from_utf8_lossy(&added.stderr)
        );
        kept.push((ns, cg));
    }
    let _ = daemon.terminate();
    drop(ztunnel);
    drop(kept);
    out
}
