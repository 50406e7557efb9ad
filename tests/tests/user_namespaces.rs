//! A pod with a user namespace of its own (`hostUsers: false`): the programs see host ids
//! (`bpf_get_current_uid_gid`), so the proxy running as 1337 inside is 101337 to them.
//! Set up through the daemon, the pod's configured ids are translated through its uid and
//! gid maps: the proxy's own upstream connection is passed, the app's redirected.

use redirector_tests::connect_in_user_ns;
use redirector_tests::prelude::*;
use redirector_tests::proxied_pod::assert_forwarded;
use redirector_tests::user_ns::{UserNs, HOST_ID_BASE};

#[test]
fn a_user_namespaced_pods_proxy_is_passed_and_its_app_redirected() {
    privileged!();
    let TestNode { root, node, state } = TestNode::new("userns");
    let daemon = Daemon::start(&root, &node, &state);
    let userns = UserNs::new();
    let topo = Topology::with_pod(
        "userns",
        NetNs::adopt("usernspod", &userns.netns_file()),
        Cgroup::under(&node, "usernspod"),
    );
    let dst = topo.service_addr(false, 80);
    let _service = ProbeServer::serve(&topo.service, "svc").listen(dst).start();
    let proxy = ProbeServer::proxy(&topo.pod, "proxy")
        .listen(SocketAddr::new(Ipv4Addr::LOCALHOST.into(), 15001))
        .forward()
        .cgroup(&topo.pod_cgroup)
        .userns(userns.path())
        .user(PROXY_UID, PROXY_UID)
        .start();
    // The proxy is 1337 inside, 101337 to the kernel's programs.
    let status = std::fs::read_to_string(format!("/proc/{}/status", proxy.pid())).unwrap();
    let host_uid = HOST_ID_BASE + PROXY_UID;
    assert!(
        status
            .lines()
            .any(|l| l.starts_with("Uid:") && l.contains(&host_uid.to_string())),
        "{status}"
    );
    daemon.add(&topo.pod, "default/userns", &STANDARD_INJECTION);
    let pods = daemon.pods();
    let config = pods[0]["config"].as_str().unwrap_or_default().to_owned();
    eprintln!("pod config: {config}");

    // The app, uid 1000 inside (101000 on the host): to the proxy, with its original
    // destination; the proxy's own connection on to it (1337 inside) reaches the service.
    let outcome = connect_in_user_ns(
        &topo.pod,
        &topo.pod_cgroup,
        &userns.path(),
        APP_UID,
        APP_UID,
        dst,
    );
    // The proxy's own connection must reach the service, not itself.
    assert_forwarded(&outcome, "proxy", dst, "svc", dst);
}
