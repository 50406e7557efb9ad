//! Linkerd's network validator (docs/linkerd.md#how-linkerd-runs-it) in a pod the node daemon
//! captured in Linkerd's dialect (`redirector pod add --dialect linkerd`): one process as uid
//! 65534, listening on the outbound proxy port, whose connection to an address no one in the pod
//! owns must come back to that listener with its token. It is what a CNI-mode Linkerd pod runs
//! before its proxy starts, and what decides whether the pod starts at all.
//!
//! The connect addresses (1.1.1.1, fd00::1) are reached only from the kit's pod namespace,
//! whose one link leads to the test's peer namespace, which has no route to them
//! ([`redirector_tests::Topology::assert_no_route_out`], checked before every run): a
//! connection that is not redirected fails inside the test's namespaces.

use redirector_tests::linkerd::meshed::INJECTOR_FLAGS;
use redirector_tests::linkerd::validator;
use redirector_tests::linkerd::validator::Addrs;
use redirector_tests::prelude::*;

/// The injector's flags with IPv6 captured too (`--ipv6=true`, proxy-init's default).
fn with_ipv6() -> Vec<&'static str> {
    INJECTOR_FLAGS
        .iter()
        .map(|flag| match *flag {
            "--ipv6=false" => "--ipv6=true",
            other => other,
        })
        .collect()
}

/// Uncaptured, the validator fails (exit 95); captured with the injector's flags (IPv6
/// off) its IPv4 check passes and its IPv6 check fails; with IPv6 on, both pass (the
/// injector's IPv6 pair is `[::]:4140` and `[fd00::1]:20001`); released, it fails again.
#[test]
fn the_network_validator_passes_in_a_pod_the_daemon_captured_for_linkerd() {
    privileged!();
    let TestNode { root, node, state } = TestNode::new("lkval");
    let daemon = Daemon::start(&root, &node, &state);
    let topo = Topology::under(&node, "lkval");
    let name = "default/validated";

    // Not captured: the validator's connection goes nowhere, as in a pod the node missed.
    validator::assert_fails(&topo, Addrs::ipv4());

    // The injector's flags: IPv4 captured, IPv6 left alone (--ipv6=false).
    daemon.add_linkerd(&topo.pod, &topo.pod_cgroup, name, &[], &INJECTOR_FLAGS);
    assert_eq!(daemon.pod_names(), [name]);
    validator::assert_passes(&topo, Addrs::ipv4());
    validator::assert_fails(&topo, Addrs::ipv6());

    // IPv6 on: both families reach the listener.
    daemon.del(name);
    daemon.add_linkerd(&topo.pod, &topo.pod_cgroup, name, &[], &with_ipv6());
    validator::assert_passes(&topo, Addrs::ipv6());
    validator::assert_passes(&topo, Addrs::ipv4());

    // Released: the validator fails again, and no pod state is left.
    let cookie = topo.pod.cookie();
    daemon.del(name);
    assert_eq!(pod_links(&root, cookie), None);
    validator::assert_fails(&topo, Addrs::ipv4());
}

/// Not a test: Linkerd's network validator's process (the test binary re-executed with
/// this test selected; see `linkerd::validator`). Run without its environment variable,
/// it returns at once.
#[test]
#[ignore = "a helper process of the validator tests, started by them"]
fn network_validator_process() {
    validator::validate_if_asked();
}
