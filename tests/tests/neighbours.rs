//! Other programs on the pods' cgroup path. A program attached at an ancestor cgroup
//! without BPF_F_ALLOW_MULTI (a socket load-balancer of Cilium before 1.14, at the root)
//! makes the kernel refuse attachments below it: the setup names that attachment and
//! what to change, exits 1, and leaves nothing of the pod attached. A load-balancer
//! attached with BPF_F_ALLOW_MULTI composes with redirector: the app's connection to a
//! ClusterIP lands on the proxy with the ClusterIP as its original destination, and the
//! proxy's own connection to it is load-balanced to a backend.

use std::net::SocketAddrV4;
use std::process::Command;

use redirector_tests::prelude::*;
use redirector_tests::proxied_pod::assert_forwarded;
use redirector_tests::socket_lb::SocketLb;

/// `bpftool cgroup <verb> <cgroup> connect4 pinned <program> <flags…>`.
fn connect4(cgroup: &Cgroup, program: &Path, verb: &str, flags: &[&str]) {
    let (cgroup, program) = (cgroup.path().display(), program.display());
    let args = format!("cgroup {verb} {cgroup} connect4 pinned {program}");
    run_ok(Command::new("bpftool").args(words(&args)).args(flags));
}

#[test]
fn an_exclusive_program_at_an_ancestor_is_named_and_nothing_is_attached() {
    privileged!();
    let ancestor = Cgroup::new("nbr");
    // A program to stand in for the neighbour's: one of redirector's own, loaded under a
    // pin root of its own by setting up another pod.
    let other_root = PinRoot::new("nbrother");
    let other = ProxiedPod::new("nbrother");
    other.install(&other_root, &STANDARD_INJECTION);
    let object = &object_ids(&other_root)[0];
    let program = other_root
        .path()
        .join(format!("objects/{object}/progs/capture_connect4"));
    let id = pinned_id("prog", &program);
    let cgroup = ancestor.path().display().to_string();
    // No flags: exclusive, as a non-multi attachment is.
    connect4(&ancestor, &program, "attach", &[]);

    let root = PinRoot::new("nbr");
    let pod = ProxiedPod::under(&ancestor, "nbrpod");
    let out = pod.istio_iptables(&root, &STANDARD_INJECTION);
    let stderr = String::from_utf8_lossy(&out.stderr);
    eprintln!("{}", stderr.lines().last().unwrap_or_default());
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    for expected in [
        cgroup.as_str(),
        &format!("(id {id})"),
        "capture_connect",
        "without BPF_F_ALLOW_MULTI",
    ] {
        assert!(stderr.contains(expected), "{expected:?} not in: {stderr}");
    }
    assert!(cgroup_attachments(pod.topo.pod_cgroup.path()).is_empty());
    assert_eq!(pod_links(&root, pod.topo.pod.cookie()), None);

    // Once the neighbour's program is attached with BPF_F_ALLOW_MULTI, the pod is set up.
    connect4(&ancestor, &program, "detach", &[]);
    connect4(&ancestor, &program, "attach", &["multi"]);
    let out = pod.istio_iptables(&root, &STANDARD_INJECTION);
    assert_success(&out);
    assert!(pod_links(&root, pod.topo.pod.cookie()).is_some());
    connect4(&ancestor, &program, "detach", &[]);
}

/// A socket LB at `ancestor` (a ClusterIP to a backend in the service namespace), a pod
/// below `parent` with a forwarding proxy; `capture` sets the pod up. The app's connection
/// to the ClusterIP reaches the backend through the LB alone before, and lands on the
/// proxy with the ClusterIP as its original destination after, the proxy's own connection
/// load-balanced to the backend.
fn compose_with_a_socket_lb(
    ancestor: &Cgroup,
    parent: &Cgroup,
    root: &PinRoot,
    capture: impl FnOnce(&Topology),
) {
    let topo = Topology::under(parent, "lb");
    let cluster_ip = SocketAddrV4::new(Ipv4Addr::new(10, 96, 0, 10), 80);
    let backend = SocketAddrV4::new(topo.service_ip4(), 8080);
    let _backend = ProbeServer::serve(&topo.service, "backend")
        .listen(backend.into())
        .start();
    let _proxy = ProbeServer::proxy(&topo.pod, "proxy")
        .listen(SocketAddr::new(Ipv4Addr::LOCALHOST.into(), 15001))
        .forward()
        .cgroup(&topo.pod_cgroup)
        .user(PROXY_UID, PROXY_UID)
        .start();
    let _lb = SocketLb::attach(ancestor, cluster_ip, backend);
    let served_by_backend = |outcome: &ConnOutcome| matches!(outcome, ConnOutcome::Served { name, local, .. } if name == "backend" && *local == SocketAddr::from(backend));
    let direct = topo.connect(APP_UID, APP_UID, cluster_ip.into());
    assert!(served_by_backend(&direct), "the LB alone: {direct:?}");

    capture(&topo);
    // The ClusterIP is the original destination; the proxy's own connection is balanced.
    let outcome = topo.connect(APP_UID, APP_UID, cluster_ip.into());
    assert_forwarded(
        &outcome,
        "proxy",
        cluster_ip.into(),
        "backend",
        backend.into(),
    );
    // `explain` lists the load-balancer among the programs on the pod's cgroup path.
    let netns = topo.pod.path().display().to_string();
    let pin_root = root.path().display().to_string();
    let dst = SocketAddr::from(cluster_ip).to_string();
    let explain = format!("explain --netns {netns} --pin-root {pin_root} --dst {dst}");
    let out = run_ok(&mut redirector(&explain).command());
    let explain = String::from_utf8_lossy(&out.stdout);
    let listed = format!("{}: connect4 socket_lb", ancestor.path().display());
    assert!(explain.contains(&listed), "{listed:?} not in:\n{explain}");
    assert!(explain.contains("multi)"), "{explain}");
    // And `status`, for the cgroup paths the object's links are attached on.
    let out = run_ok(&mut redirector(&format!("status --pin-root {pin_root}")).command());
    let status = String::from_utf8_lossy(&out.stdout);
    assert!(status.contains(&listed), "{listed:?} not in:\n{status}");
}

#[test]
fn a_socket_load_balancer_above_an_init_container_pod_composes_with_the_redirect() {
    privileged!();
    let ancestor = Cgroup::new("lbroot");
    let root = PinRoot::new("lb");
    compose_with_a_socket_lb(&ancestor, &ancestor, &root, |topo| {
        let out = istio_iptables(&topo.pod, &topo.pod_cgroup, &root, &STANDARD_INJECTION);
        assert_success(&out);
    });
}

#[test]
fn a_socket_load_balancer_above_the_daemons_node_composes_with_the_redirect() {
    privileged!();
    let ancestor = Cgroup::new("lbroot");
    let node = Cgroup::under(&ancestor, "lbnode");
    let root = PinRoot::new("lbd");
    let state = StateDir::new("lbd");
    let daemon = Daemon::start(&root, &node, &state);
    compose_with_a_socket_lb(&ancestor, &node, &root, |topo| {
        daemon.add(&topo.pod, "default/lb", &STANDARD_INJECTION);
    });
}
