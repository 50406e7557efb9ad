//! Other programs on the pods' cgroup path. A program attached at an ancestor cgroup
//! without BPF_F_ALLOW_MULTI (a socket load-balancer of Cilium before 1.14, at the root)
//! makes the kernel refuse attachments below it: the setup names that attachment and
//! what to change, exits 1, and leaves nothing of the pod attached.

use std::process::Command;

use redirector_tests::bpftool::{cgroup_attachments, pinned_id};
use redirector_tests::redirector::{
    istio_iptables, object_ids, pod_links, run_ok, PinRoot, STANDARD_INJECTION,
};
use redirector_tests::{require_root, use_probe_bin, Cgroup, ProxiedPod};

#[test]
fn an_exclusive_program_at_an_ancestor_is_named_and_nothing_is_attached() {
    if !require_root() {
        return;
    }
    use_probe_bin(env!("CARGO_BIN_EXE_probe"));
    let ancestor = Cgroup::new("nbr");
    // A program to stand in for the neighbour's: one of redirector's own, loaded under a
    // pin root of its own by setting up another pod.
    let other_root = PinRoot::new("nbrother");
    let other = ProxiedPod::new("nbrother");
    other.install(&other_root, &STANDARD_INJECTION);
    let object = &object_ids(&other_root)[0];
    let program = other_root
        .path()
        .join("objects")
        .join(object)
        .join("progs/capture_connect4");
    let id = pinned_id("prog", &program);
    let cgroup = ancestor.path().display().to_string();
    let program_arg = program.display().to_string();
    // No flags: exclusive, as a non-multi attachment is.
    run_ok(Command::new("bpftool").args([
        "cgroup",
        "attach",
        &cgroup,
        "connect4",
        "pinned",
        &program_arg,
    ]));

    let root = PinRoot::new("nbr");
    let pod = ProxiedPod::under(&ancestor, "nbrpod");
    let out = istio_iptables(
        &pod.topo.pod,
        &pod.topo.pod_cgroup,
        &root,
        &STANDARD_INJECTION,
    );
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
    run_ok(Command::new("bpftool").args([
        "cgroup",
        "detach",
        &cgroup,
        "connect4",
        "pinned",
        &program_arg,
    ]));
    run_ok(Command::new("bpftool").args([
        "cgroup",
        "attach",
        &cgroup,
        "connect4",
        "pinned",
        &program_arg,
        "multi",
    ]));
    let out = istio_iptables(
        &pod.topo.pod,
        &pod.topo.pod_cgroup,
        &root,
        &STANDARD_INJECTION,
    );
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(pod_links(&root, pod.topo.pod.cookie()).is_some());
    run_ok(Command::new("bpftool").args([
        "cgroup",
        "detach",
        &cgroup,
        "connect4",
        "pinned",
        &program_arg,
    ]));
}
