//! Applies that race: many init containers on one node at once, the same pod twice at
//! once, cleanup against apply, gc against apply. Every pod ends captured exactly once
//! (six cgroup attachments, one entry set, its connections reach the proxy) or, where a
//! cleanup won, not at all — never half.

use std::process::{Child, Command, Stdio};

use redirector_tests::prelude::*;
use redirector_tests::redirector::{istio_iptables_command, status, status_pod};

/// Links the standard injection attaches to the pod's cgroup.
const CGROUP_LINKS: usize = 6;

fn spawn_apply(pod: &ProxiedPod, root: &PinRoot, extra: &[&str]) -> Child {
    let mut cmd = istio_iptables_command(&pod.topo.pod, &pod.topo.pod_cgroup, root);
    spawn(cmd.args(STANDARD_INJECTION).args(extra))
}

fn spawn_gc(root: &PinRoot) -> Child {
    spawn(&mut redirector(&format!("gc --pin-root {}", root.path().display())).command())
}

/// `cmd` started, its stderr kept for [`wait_ok`].
fn spawn(cmd: &mut Command) -> Child {
    let cmd = cmd.stdout(Stdio::null()).stderr(Stdio::piped());
    cmd.spawn().expect("starting redirector")
}

#[track_caller]
fn wait_ok(child: Child, what: &str) {
    let out = child.wait_with_output().unwrap();
    assert!(
        out.status.success(),
        "{what}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// The pod is captured exactly once: its links, its config, and a real connection.
#[track_caller]
fn assert_captured_once(pod: &ProxiedPod, root: &PinRoot) {
    assert_eq!(
        cgroup_attachments(pod.topo.pod_cgroup.path()).len(),
        CGROUP_LINKS,
        "attachments of {}",
        pod.topo.pod_cgroup.path().display()
    );
    assert!(pod_links(root, pod.topo.pod.cookie()).is_some());
    pod.assert_app_proxied(false);
}

/// Whichever way a race went, the pod is wholly captured or wholly not.
#[track_caller]
fn assert_whole(pod: &ProxiedPod, root: &PinRoot) -> bool {
    let attached = cgroup_attachments(pod.topo.pod_cgroup.path()).len();
    let cookie = pod.topo.pod.cookie();
    let in_status = status_pod(root, cookie).is_some();
    let dst = pod.service(false);
    let outcome = pod.connect(APP_UID, APP_UID, dst);
    if attached == 0 {
        assert!(!in_status, "no links but the pod is still in the maps");
        assert_direct(&outcome, dst);
        false
    } else {
        assert_eq!(attached, CGROUP_LINKS, "a half-applied pod");
        assert!(in_status, "links without the pod's entries");
        assert_proxied(&outcome, dst);
        true
    }
}

#[test]
fn twenty_init_containers_at_once_each_capture_their_own_pod_once() {
    privileged!();
    let root = PinRoot::new("many");
    let pods: Vec<ProxiedPod> = (0..20)
        .map(|i| ProxiedPod::new(&format!("many{i}")))
        .collect();
    let children: Vec<Child> = pods.iter().map(|p| spawn_apply(p, &root, &[])).collect();
    for child in children {
        wait_ok(child, "a concurrent init container");
    }
    let objects = status(&root)["objects"].as_array().unwrap().clone();
    assert_eq!(objects.len(), 1, "one object for the node: {objects:?}");
    assert_eq!(objects[0]["pods"].as_array().unwrap().len(), pods.len());
    for pod in &pods {
        assert_captured_once(pod, &root);
    }
}

#[test]
fn the_same_pod_applied_twice_at_once_is_captured_once() {
    privileged!();
    let root = PinRoot::new("twice");
    let pod = ProxiedPod::new("twice");
    for round in 0..5 {
        let extra: &[&str] = if round % 2 == 0 {
            &[]
        } else {
            &["--force-apply"]
        };
        let a = spawn_apply(&pod, &root, extra);
        let b = spawn_apply(&pod, &root, extra);
        wait_ok(a, "the first of two");
        wait_ok(b, "the second of two");
        assert_captured_once(&pod, &root);
    }
}

#[test]
fn cleanup_racing_apply_leaves_the_pod_whole_one_way_or_the_other() {
    privileged!();
    let root = PinRoot::new("race");
    let pod = ProxiedPod::new("race");
    let mut outcomes = [0, 0];
    for _ in 0..8 {
        let apply = spawn_apply(&pod, &root, &[]);
        let cleanup = spawn_apply(&pod, &root, &["--cleanup-only"]);
        wait_ok(apply, "apply");
        wait_ok(cleanup, "cleanup");
        outcomes[usize::from(assert_whole(&pod, &root))] += 1;
    }
    eprintln!(
        "cleanup won {} times, apply {} times",
        outcomes[0], outcomes[1]
    );
}

#[test]
fn gc_racing_apply_never_removes_a_live_pod() {
    privileged!();
    let root = PinRoot::new("gcrace");
    let pods: Vec<ProxiedPod> = (0..4)
        .map(|i| ProxiedPod::new(&format!("gcrace{i}")))
        .collect();
    for _ in 0..3 {
        let mut children: Vec<(Child, &str)> = pods
            .iter()
            .map(|p| (spawn_apply(p, &root, &["--force-apply"]), "apply"))
            .collect();
        children.push((spawn_gc(&root), "gc"));
        children.push((spawn_gc(&root), "gc"));
        for (child, what) in children {
            wait_ok(child, what);
        }
        for pod in &pods {
            assert_captured_once(pod, &root);
        }
    }
}

/// The pin root goes with its last pod. A setup that waited for the node lock while the
/// last pod's cleanup removed the root must not work in the removed directory while a
/// later setup locks the new one: every pod ends captured exactly once, in one object.
#[test]
fn cleanup_of_the_last_pod_racing_new_pods_leaves_each_captured_once() {
    privileged!();
    let root = PinRoot::new("lastpod");
    let last = ProxiedPod::new("lastpod");
    let pods: Vec<ProxiedPod> = (0..10)
        .map(|i| ProxiedPod::new(&format!("lastpod{i}")))
        .collect();
    for round in 0..50 {
        wait_ok(spawn_apply(&last, &root, &[]), "setting up the last pod");
        let cleanup = spawn_apply(&last, &root, &["--cleanup-only"]);
        let children: Vec<Child> = pods.iter().map(|p| spawn_apply(p, &root, &[])).collect();
        wait_ok(cleanup, "cleaning up the last pod");
        for child in children {
            wait_ok(child, "a setup racing the cleanup");
        }
        let objects = status(&root)["objects"].as_array().unwrap().clone();
        assert_eq!(objects.len(), 1, "round {round}: one object: {objects:?}");
        assert_eq!(
            objects[0]["pods"].as_array().unwrap().len(),
            pods.len(),
            "round {round}: the new pods and not the last one"
        );
        assert!(
            cgroup_attachments(last.topo.pod_cgroup.path()).is_empty(),
            "round {round}: the cleaned-up pod kept links"
        );
        for pod in &pods {
            assert_captured_once(pod, &root);
        }
        for pod in &pods {
            wait_ok(spawn_apply(pod, &root, &["--cleanup-only"]), "cleanup");
        }
        assert!(
            !root.path().exists(),
            "round {round}: the root outlived its pods"
        );
    }
}
