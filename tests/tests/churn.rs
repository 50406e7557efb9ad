//! An init-container node cleans up after its deleted pods by itself: every setup also
//! removes a few pods that are gone, so pods deleted without `--cleanup-only` never fill
//! the node's maps, and nothing a live pod needs is ever removed.

use std::collections::BTreeMap;

use redirector_common::capacity;
use redirector_tests::bpftool::wait_pods_detached;
use redirector_tests::churn::churn;
use redirector_tests::prelude::*;
use redirector_tests::redirector::{map_fill, status};

/// Pods set up and deleted, and how many are alive at a time (besides the long-lived one).
const PODS: usize = 2_000;
const ALIVE: usize = 10;
/// How many pods that are gone may stay installed beside the live ones: a setup checks a
/// few pods and the kernel detaches a deleted pod's links a moment after its deletion.
const GONE_AT_MOST: u64 = 12;

fn fills(root: &PinRoot) -> BTreeMap<String, u64> {
    map_fill(root).into_iter().collect()
}

#[test]
fn pods_deleted_without_cleanup_go_with_later_setups() {
    privileged!();
    let root = PinRoot::new("churn");
    let live = ProxiedPod::new("churnlive");
    live.install(&root, &STANDARD_INJECTION);
    let dst = live.service(false);
    assert_proxied(&live.connect(APP_UID, APP_UID, dst), dst);
    let cookie = live.topo.pod.cookie();
    let links = pod_links(&root, cookie).expect("the live pod").len();
    // One pod's entries in each map, and the pins of the object itself.
    let one_pod = fills(&root);
    let object_pins = pins_under(root.path()).len() - links;
    let bound = |pods: u64| -> BTreeMap<String, u64> {
        one_pod
            .iter()
            .map(|(map, n)| (map.clone(), n * pods))
            .collect()
    };
    let installed = |root: &PinRoot| -> u64 {
        status(root)["objects"][0]["pods"]
            .as_array()
            .expect("pods")
            .len() as u64
    };
    let limit = ALIVE as u64 + 1 + GONE_AT_MOST;
    let mut most = 0;
    let run = churn(&root, PODS, ALIVE, |deleted| {
        // The long-lived pod keeps everything, and is captured.
        assert_eq!(pod_links(&root, cookie).map(|l| l.len()), Some(links));
        assert_proxied(&live.connect(APP_UID, APP_UID, dst), dst);
        let pods = installed(&root);
        most = most.max(pods);
        assert!(
            pods <= limit,
            "after {deleted} deletions {pods} pods are installed, {} alive",
            ALIVE + 1
        );
        for (map, entries) in fills(&root) {
            assert!(
                entries <= bound(limit)[&map],
                "after {deleted} deletions {map} holds {entries} entries"
            );
        }
    });
    // Every live pod keeps all its links.
    for (netns, _) in &run.alive {
        assert_eq!(
            pod_links(&root, netns.cookie()).map(|l| l.len()),
            Some(links)
        );
    }
    let pins = pins_under(root.path()).len();
    let pods = installed(&root);
    assert!(
        pins <= object_pins + links * limit as usize,
        "{pins} pins for {pods} pods installed"
    );
    let first: f64 = run.setup_ms[..10].iter().sum::<f64>() / 10.0;
    let last: f64 = run.setup_ms[PODS - 10..].iter().sum::<f64>() / 10.0;
    eprintln!(
        "{PODS} pods, {} alive: at most {most} installed at a checkpoint, {pods} at the end, {pins} pins ({object_pins} the object's); setup {first:.1} ms (first 10) and {last:.1} ms (last 10); fills {:?}",
        ALIVE + 1,
        fills(&root)
    );
}

/// istio-iptables flags capturing outbound traffic to `ports` ports only: that many
/// PORT_SETS entries.
fn outbound_ports(ports: u16) -> Vec<String> {
    let list: Vec<String> = (1..=ports).map(|p| p.to_string()).collect();
    let flags = format!("-p 15001 -z 15006 -u 1337 -i * -b * -o {}", list.join(","));
    words(&flags).into_iter().map(str::to_owned).collect()
}

#[test]
fn a_setup_a_map_has_no_room_for_first_removes_every_pod_that_is_gone() {
    privileged!();
    let root = PinRoot::new("churnfull");
    let live = (NetNs::new("fulllive"), Cgroup::new("fulllive"));
    install(&live.0, &live.1, &root, &STANDARD_INJECTION);
    let live_links = pod_links(&root, live.0.cookie()).expect("the live pod");
    // 16 pods of 2,000 ports each nearly fill PORT_SETS, then go without a cleanup: more
    // than one setup's round of checks can find.
    let (gone_pods, per_pod, new_pod) = (16, 2_000u16, 10_000u16);
    let args = outbound_ports(per_pod);
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let pods: Vec<(NetNs, Cgroup)> = (0..gone_pods)
        .map(|_| {
            let pod = (NetNs::new("fullgone"), Cgroup::new("fullgone"));
            install(&pod.0, &pod.1, &root, &args);
            pod
        })
        .collect();
    let gone: Vec<u64> = pods.iter().map(|(netns, _)| netns.cookie()).collect();
    drop(pods);
    let free = u64::from(capacity::PORT_ENTRIES) - gone_pods * u64::from(per_pod) - 3;
    assert!(free + 4 * u64::from(per_pod) < u64::from(new_pod));
    wait_pods_detached(&root, &gone);

    let pod = (NetNs::new("fullnew"), Cgroup::new("fullnew"));
    let args = outbound_ports(new_pod);
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let out = istio_iptables(&pod.0, &pod.1, &root, &args);
    let log = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{log}");
    assert!(
        log.contains("PORT_SETS was full: removed")
            && log.contains("pod(s) that are gone, applying once more"),
        "{log}"
    );
    // Every gone pod went; the live pod and the new one have all they need.
    for cookie in gone {
        assert_eq!(pod_links(&root, cookie), None);
    }
    assert_eq!(pod_links(&root, live.0.cookie()), Some(live_links));
    assert!(pod_links(&root, pod.0.cookie()).is_some());
    let fills: BTreeMap<String, u64> = fills(&root);
    assert_eq!(fills["PORT_SETS"], 3 + u64::from(new_pod));
    assert_eq!(fills["POD_CONFIG"], 2);
}
