//! Node mode's programs attached at one pod's own cgroup (BPF_PROG_ATTACH with
//! `BPF_F_ALLOW_MULTI`, no link, no pin) rather than at the node cgroup: the pod is
//! captured, a pod beside it runs none of the programs, and detaching or removing the
//! cgroup leaves nothing behind.

use std::path::PathBuf;

use redirector::engine::pod_cgroup::{attach, attached_hooks, detach};
use redirector::store::programs::NODE_PROGRAMS;
use redirector::store::{ObjectId, ObjectPins};
use redirector_tests::bpftool::{cgroup_attachments, program_runs, BpfStats};
use redirector_tests::daemon::{Daemon, StateDir};
use redirector_tests::redirector::{object_ids, PinRoot, STANDARD_INJECTION};
use redirector_tests::{
    assert_direct, assert_proxied, require_root, use_probe_bin, Cgroup, ProxiedPod, APP_UID,
};

/// The node's one object, as the engine names its pins.
fn node_object(root: &PinRoot) -> ObjectPins {
    let ids = object_ids(root);
    assert_eq!(ids.len(), 1, "one object: {ids:?}");
    let hash = u64::from_str_radix(&ids[0], 16).expect("an object id is 16 hex digits");
    redirector::store::PinRoot::new(root.path()).object(&ObjectId::from_hash(hash))
}

/// The object's node programs, pinned: their run counts tell whether they ran.
fn program_pins(object: &ObjectPins) -> Vec<PathBuf> {
    NODE_PROGRAMS
        .iter()
        .map(|spec| object.program(spec.function))
        .collect()
}

fn total_runs(pins: &[PathBuf]) -> u64 {
    pins.iter().map(|p| program_runs(p).0).sum()
}

#[test]
fn programs_at_a_pods_cgroup_capture_it_and_no_other_pod() {
    if !require_root() {
        return;
    }
    use_probe_bin(env!("CARGO_BIN_EXE_probe"));
    let root = PinRoot::new("pcg");
    let node = Cgroup::new("pcgnode");
    let state = StateDir::new("pcgstate");
    let daemon = Daemon::start(&root, &node, &state);
    // Both pods run outside the node cgroup: no program of the node's reaches them.
    let pod = ProxiedPod::new("pcgpod");
    let bystander = ProxiedPod::new("pcgby");
    daemon.add(&pod.topo.pod, "default/app", &STANDARD_INJECTION);
    let object = node_object(&root);
    let cgroup = pod.topo.pod_cgroup.path();
    let dst = pod.service(false);
    assert_direct(&pod.connect(APP_UID, APP_UID, dst), dst);
    assert!(attached_hooks(&object, cgroup).unwrap().is_empty());

    // Attached at the pod's cgroup: captured, both families.
    let hooks = attach(&object, cgroup).expect("attaching at the pod's cgroup");
    assert_eq!(hooks.len(), NODE_PROGRAMS.len(), "{hooks:?}");
    for v6 in [false, true] {
        let dst = pod.service(v6);
        assert_proxied(&pod.connect(APP_UID, APP_UID, dst), dst);
    }
    assert_eq!(attached_hooks(&object, cgroup).unwrap(), hooks);
    assert_eq!(
        cgroup_attachments(cgroup).len(),
        NODE_PROGRAMS.len(),
        "one attachment per program, no link: {:?}",
        cgroup_attachments(cgroup)
    );
    // Again: nothing more is attached.
    assert!(attach(&object, cgroup).unwrap().is_empty());
    assert_eq!(cgroup_attachments(cgroup).len(), NODE_PROGRAMS.len());

    // The pod beside it runs none of the programs, while the captured pod runs them.
    let pins = program_pins(&object);
    let stats = BpfStats::on();
    let before = total_runs(&pins);
    for v6 in [false, true] {
        let dst = bystander.service(v6);
        assert_direct(&bystander.connect(APP_UID, APP_UID, dst), dst);
    }
    let after_bystander = total_runs(&pins);
    let dst = pod.service(false);
    assert_proxied(&pod.connect(APP_UID, APP_UID, dst), dst);
    let after_pod = total_runs(&pins);
    drop(stats);
    assert_eq!(
        after_bystander, before,
        "the bystander's connections ran the programs"
    );
    assert!(
        after_pod > after_bystander,
        "the captured pod's connection ran them"
    );

    // The daemon killed: the attachment is the cgroup's, not the daemon's.
    let daemon = daemon.kill().restart();
    assert_proxied(&pod.connect(APP_UID, APP_UID, dst), dst);

    // Detached: the pod's connections go where they were sent, nothing is left there.
    assert_eq!(detach(&object, cgroup).unwrap(), NODE_PROGRAMS.len());
    assert_direct(&pod.connect(APP_UID, APP_UID, dst), dst);
    assert!(cgroup_attachments(cgroup).is_empty());
    assert_eq!(detach(&object, cgroup).unwrap(), 0, "detaching again");
    drop(daemon);
}

#[test]
fn attachments_go_with_the_pods_cgroup() {
    if !require_root() {
        return;
    }
    let root = PinRoot::new("pcggone");
    let node = Cgroup::new("pcggonenode");
    let state = StateDir::new("pcggonestate");
    let _daemon = Daemon::start(&root, &node, &state);
    let object = node_object(&root);
    let pod = Cgroup::new("pcggonepod");
    let path = pod.path().to_path_buf();
    attach(&object, &path).expect("attaching at the pod's cgroup");
    assert_eq!(cgroup_attachments(&path).len(), NODE_PROGRAMS.len());
    drop(pod);
    assert!(!path.exists());
    // Detaching from a cgroup that is gone has nothing to do, and says so.
    assert_eq!(detach(&object, &path).unwrap(), 0);
}
