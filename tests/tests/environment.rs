//! Faults of the node around redirector: bpffs missing or read-only, the pod's cgroup or
//! network namespace gone, foreign files under the pin root. Each gives exit 1, a message
//! naming the cause, and nothing attached or pinned.

use std::process::Output;

use redirector_tests::prelude::*;
use redirector_tests::redirector::status;

fn apply_with(netns: &Path, cgroup: &Path, root: &Path) -> Output {
    let (netns, cgroup, root) = (netns.display(), cgroup.display(), root.display());
    let line =
        format!("istio-iptables --network-namespace {netns} --cgroup {cgroup} --pin-root {root}");
    redirector(&line).args(STANDARD_INJECTION).output()
}

#[track_caller]
fn assert_refused(out: &Output, cause: &str, topo: &Topology) {
    let log = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{log}");
    assert!(
        log.contains(cause),
        "the message does not name {cause:?}:\n{log}"
    );
    assert!(cgroup_attachments(topo.pod_cgroup.path()).is_empty());
}

#[test]
fn a_pin_root_off_bpffs_or_on_a_read_only_one_is_refused() {
    privileged!();
    let topo = Topology::new("envfs");
    let plain = StateDir::new("notbpffs");
    let root = plain.path().join("redirector");
    let out = apply_with(&topo.pod.path(), topo.pod_cgroup.path(), &root);
    assert_refused(&out, "is not on a bpffs mount", &topo);
    assert!(!root.exists());

    let ro = StateDir::mounted("robpffs", &["-t", "bpf", "-o", "ro", "bpf"]);
    let root = ro.path().join("redirector");
    let out = apply_with(&topo.pod.path(), topo.pod_cgroup.path(), &root);
    assert_refused(&out, "Read-only file system", &topo);
    assert!(!root.exists());
}

#[test]
fn a_pod_cgroup_or_network_namespace_that_is_gone_is_refused() {
    privileged!();
    let topo = Topology::new("envgone");
    let root = PinRoot::new("envgone");
    let gone_cgroup = topo.pod_cgroup.path().join("gone");
    let out = apply_with(&topo.pod.path(), &gone_cgroup, root.path());
    assert_refused(&out, &gone_cgroup.display().to_string(), &topo);
    let gone_netns = Path::new("/run/netns/rdt-no-such-netns");
    let out = apply_with(gone_netns, topo.pod_cgroup.path(), root.path());
    assert_refused(&out, "/run/netns/rdt-no-such-netns", &topo);
    // A file that is not a network namespace.
    let out = apply_with(
        Path::new("/etc/hostname"),
        topo.pod_cgroup.path(),
        root.path(),
    );
    assert_refused(&out, "/etc/hostname", &topo);
    assert!(pins_under(root.path()).is_empty());
}

#[test]
fn foreign_files_under_the_pin_root_are_left_alone() {
    privileged!();
    let topo = Topology::new("envforeign");
    let root = PinRoot::new("envforeign");
    std::fs::create_dir_all(root.path().join("objects")).unwrap();
    std::fs::create_dir_all(root.path().join("someone-elses")).unwrap();
    std::fs::create_dir_all(root.path().join("objects/not-an-object/progs")).unwrap();
    install(&topo.pod, &topo.pod_cgroup, &root, &STANDARD_INJECTION);
    assert_eq!(cgroup_attachments(topo.pod_cgroup.path()).len(), 6);
    let objects = status(&root)["objects"].as_array().unwrap().len();
    assert!(objects >= 1);
    install(&topo.pod, &topo.pod_cgroup, &root, &["--cleanup-only"]);
    assert!(cgroup_attachments(topo.pod_cgroup.path()).is_empty());
    assert!(root.path().join("someone-elses").exists());
}
