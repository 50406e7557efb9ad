//! `--dry-run` prints the plan and changes nothing: kernel state is compared before and
//! after, through bpftool and bpffs.

use std::collections::BTreeSet;

use redirector_tests::prelude::*;

/// Everything of the kernel's that a run could change: the programs, maps and links
/// loaded, and the pod's (its cgroup's attachments, the pins and whether the pin root
/// exists, the addresses of its `lo`).
struct KernelState {
    loaded: [(&'static str, BTreeSet<u64>); 3],
    pod: (usize, Vec<PathBuf>, bool, String),
}

fn snapshot(topo: &Topology, root: &Path) -> KernelState {
    let lo_addrs = topo.pod.run(&["ip", "-6", "addr", "show", "dev", "lo"]);
    let attached = cgroup_attachments(topo.pod_cgroup.path()).len();
    KernelState {
        loaded: [("program", "prog"), ("map", "map"), ("link", "link")]
            .map(|(kind, bpftool_kind)| (kind, loaded_ids(bpftool_kind).into_iter().collect())),
        pod: (attached, pins_under(root), root.exists(), lo_addrs),
    }
}

#[test]
fn dry_run_prints_the_plan_and_changes_nothing() {
    privileged!();
    let topo = Topology::new("dryrun");
    let root = PinRoot::new("dryrun");
    let before = snapshot(&topo, root.path());
    // Objects of earlier tests may still be going away (the kernel frees them
    // asynchronously), so "unchanged" means: nothing new, and everything else the same.
    let mut args: Vec<&str> = STANDARD_INJECTION.to_vec();
    args.extend(["--dry-run", "--redirect-dns", "--log_as_json"]);
    let out = istio_iptables(&topo.pod, &topo.pod_cgroup, &root, &args);
    assert_success(&out);
    let after = snapshot(&topo, root.path());
    for ((kind, was), (_, now)) in before.loaded.iter().zip(&after.loaded) {
        let new: Vec<_> = now.difference(was).collect();
        assert!(new.is_empty(), "a dry run loaded {kind}s {new:?}");
    }
    assert_eq!(after.pod, before.pod, "a dry run changed the pod");

    let plan = String::from_utf8_lossy(&out.stdout);
    for expected in [
        "attach capture_connect4 (connect4) to cgroup",
        "attach steer_sk_lookup (sk_lookup) to the pod's network namespace",
        "attach capture_sendmsg4 (sendmsg4)",
        "POD_CONFIG[",
        "PORT_SETS[",
        "inbound-exclude (-d) 15090",
        "CIDRS_V4[",
        "pod-local",
        "POD_BY_ADDR[",
    ] {
        assert!(plan.contains(expected), "plan lacks {expected:?}:\n{plan}");
    }
    // --log_as_json: every log line is a JSON object.
    let log = String::from_utf8_lossy(&out.stderr);
    assert!(log.lines().count() > 10, "{log}");
    for line in log.lines() {
        assert!(
            line.starts_with('{') && line.ends_with('}'),
            "not a JSON line: {line}"
        );
    }
    assert!(log.contains("dry run: nothing applied"), "{log}");
}

/// `redirector istio-iptables` for `topo`'s pod, started in the cgroup2 root with no
/// `--cgroup`: a shell on the host, not an init container.
fn from_the_root_cgroup(topo: &Topology, root: &PinRoot, extra: &[&str]) -> std::process::Output {
    use std::os::unix::process::CommandExt as _;
    let procs = redirector_tests::cgroup::cgroup2_root().join("cgroup.procs");
    let mut cmd = std::process::Command::new(redirector_bin());
    cmd.arg("istio-iptables")
        .arg("--network-namespace")
        .arg(topo.pod.path())
        .arg("--pin-root")
        .arg(root.path())
        .args(STANDARD_INJECTION)
        .args(extra);
    // SAFETY: only a write(2) to cgroup.procs between fork and exec.
    unsafe {
        cmd.pre_exec(move || std::fs::write(&procs, "0"));
    }
    cmd.output().expect("running redirector")
}

#[test]
fn from_the_root_cgroup_a_dry_run_prints_the_plan_and_an_apply_says_to_pass_cgroup() {
    privileged!();
    let topo = Topology::new("rootcg");
    let root = PinRoot::new("rootcg");

    let out = from_the_root_cgroup(&topo, &root, &["--dry-run"]);
    let (plan, log) = (
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr),
    );
    assert!(out.status.success(), "{log}");
    assert_contains(&plan, "to cgroup <no pod cgroup found: pass --cgroup>");
    assert!(plan.contains("POD_CONFIG["), "{plan}");
    assert!(log.contains("runs in the root cgroup"), "{log}");

    let out = from_the_root_cgroup(&topo, &root, &[]);
    let log = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{log}");
    assert!(
        log.contains("runs in the root cgroup") && log.contains("pass --cgroup"),
        "{log}"
    );
    assert!(!log.contains("is not a cgroup v2 directory"), "{log}");
    assert!(pins_under(root.path()).is_empty());
}
