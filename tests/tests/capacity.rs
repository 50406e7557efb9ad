//! Node-wide maps filled to their limits by real pods: the pod that does not fit is
//! refused with a message naming the full map, nothing of it stays (entries rolled back,
//! nothing attached), and the pods already there keep theirs.

use std::process::Output;

use redirector_common::capacity;
use redirector_tests::prelude::*;
use redirector_tests::redirector::{map_fill, status};

fn fill(root: &PinRoot, map: &str) -> u64 {
    map_fill(root)
        .into_iter()
        .find_map(|(name, entries)| (name == map).then_some(entries))
        .expect("the map is in status")
}

fn apply(topo: &Topology, root: &PinRoot, flag: &str, list: &str) -> Output {
    let flags = format!("-p 15001 -z 15006 -u 1337 -i * -b * {flag} {list}");
    istio_iptables(&topo.pod, &topo.pod_cgroup, root, &words(&flags))
}

/// Pods of `per_pod` entries each until one does not fit; checks that one.
fn fill_until_refused(hint: &str, map: &str, capacity: u64, per_pod: u64, flag: &str, list: &str) {
    let root = PinRoot::new(hint);
    let mut pods = Vec::new();
    loop {
        let topo = Topology::new(hint);
        let out = apply(&topo, &root, flag, list);
        let log = String::from_utf8_lossy(&out.stderr);
        let fits = (pods.len() as u64 + 1) * per_pod <= capacity;
        if fits {
            assert!(
                out.status.success(),
                "pod {} of {map}: {log}",
                pods.len() + 1
            );
            pods.push(topo);
            continue;
        }
        assert_eq!(out.status.code(), Some(1), "{log}");
        assert!(log.contains(&format!("{map} is full")), "{log}");
        assert!(cgroup_attachments(topo.pod_cgroup.path()).is_empty());
        assert_eq!(fill(&root, map), pods.len() as u64 * per_pod, "rolled back");
        let installed = status(&root)["objects"][0]["pods"]
            .as_array()
            .unwrap()
            .len();
        assert_eq!(installed, pods.len());
        for pod in &pods {
            assert_eq!(cgroup_attachments(pod.pod_cgroup.path()).len(), 6);
        }
        eprintln!(
            "{map}: {} pods of {per_pod} fit in {capacity}; the next was refused",
            pods.len()
        );
        return;
    }
}

#[test]
fn a_pod_whose_ports_do_not_fit_is_refused_and_rolled_back() {
    privileged!();
    let per_pod = 10_000;
    let ports: Vec<String> = (1..=per_pod).map(|p| p.to_string()).collect();
    fill_until_refused(
        "capports",
        "PORT_SETS",
        u64::from(capacity::PORT_ENTRIES),
        per_pod,
        "-o",
        &ports.join(","),
    );
}

#[test]
fn a_pod_whose_cidrs_do_not_fit_is_refused_and_rolled_back() {
    privileged!();
    let per_pod: u64 = 8_000;
    let cidrs: Vec<String> = (0..per_pod)
        .map(|i| format!("10.{}.{}.0/24", 100 + i / 256, i % 256))
        .collect();
    // Each pod also has its own address (pod-local) in the trie.
    fill_until_refused(
        "capcidrs",
        "CIDRS_V4",
        u64::from(capacity::CIDR_ENTRIES),
        per_pod + 1,
        "-x",
        &cidrs.join(","),
    );
}
