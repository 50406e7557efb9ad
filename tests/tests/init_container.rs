//! Run as an init container is: in a child cgroup of the pod, optionally in a private cgroup
//! namespace, with no `--cgroup`: redirector attaches to the pod's cgroup (the parent).

use std::process::Command;

use redirector_tests::prelude::*;

/// The init container's cgroup, a child of the pod's; removed on drop (before the pod's).
struct ChildCgroup(PathBuf);

impl Drop for ChildCgroup {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir(&self.0);
    }
}

fn run_in_child(topo: &Topology, root: &PinRoot, child: &ChildCgroup, cgroupns: bool) {
    // The shell joins the child cgroup, then becomes redirector (through unshare).
    let mut script = format!("echo $$ > {}/cgroup.procs && exec ", child.0.display());
    if cgroupns {
        script.push_str("unshare --cgroup ");
    }
    script.push_str("\"$@\"");
    let out = Command::new("sh")
        .args(["-c", &script, "sh"])
        .arg(redirector_bin())
        .args(["istio-iptables", "--network-namespace"])
        .arg(topo.pod.path())
        .arg("--pin-root")
        .arg(root.path())
        .args(STANDARD_INJECTION)
        .output()
        .expect("running redirector");
    assert!(
        out.status.success(),
        "cgroupns={cgroupns}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

#[test]
fn attaches_to_the_parent_of_its_own_cgroup_also_in_a_private_cgroup_namespace() {
    privileged!();
    let topo = Topology::new("initctr");
    let child = ChildCgroup(topo.pod_cgroup.path().join("init"));
    std::fs::create_dir(&child.0).expect("creating the init container's cgroup");
    for cgroupns in [false, true] {
        let root = PinRoot::new("initctr");
        run_in_child(&topo, &root, &child, cgroupns);
        let attached = cgroup_attachments(topo.pod_cgroup.path());
        assert_eq!(
            attached.len(),
            6,
            "cgroupns={cgroupns}: pod cgroup attachments {attached:?}"
        );
        assert_eq!(
            cgroup_attachments(&child.0),
            vec![],
            "cgroupns={cgroupns}: nothing on the child"
        );
        drop(root);
    }
}
