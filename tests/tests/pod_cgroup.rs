//! Node mode's programs attached at one pod's own cgroup (BPF_PROG_ATTACH with
//! `BPF_F_ALLOW_MULTI`, no link, no pin) rather than at the node cgroup: the pod is
//! captured, a pod beside it runs none of the programs, and detaching or removing the
//! cgroup leaves nothing behind. The daemon attaches them so for every pod whose cgroup it
//! finds, and at the node cgroup only while a pod whose cgroup it cannot find relies on
//! them.

use redirector::engine::pod_cgroup::{attach, attached_hooks, detach, NodePrograms};
use redirector::store::programs::NODE_PROGRAMS;
use redirector::store::{ObjectId, ObjectPins};
use redirector_tests::bpftool::{program_runs, BpfStats};
use redirector_tests::prelude::*;
use redirector_tests::process::StopOnDrop;

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

/// How many times the programs pinned at `pins` ran during `work` (bpf_stats on for it).
fn runs_during(pins: &[PathBuf], work: impl FnOnce()) -> u64 {
    let total = || pins.iter().map(|p| program_runs(p).0).sum::<u64>();
    let _stats = BpfStats::on();
    let before = total();
    work();
    total() - before
}

/// The app of `pod` connects to its service over both families: to the proxy when
/// `captured`, else directly.
fn connect_both(pod: &ProxiedPod, captured: bool) {
    for v6 in [false, true] {
        let dst = pod.service(v6);
        let outcome = pod.connect(APP_UID, APP_UID, dst);
        if captured {
            assert_proxied(&outcome, dst);
        } else {
            assert_direct(&outcome, dst);
        }
    }
}

#[test]
fn programs_at_a_pods_cgroup_capture_it_and_no_other_pod() {
    privileged!();
    let TestNode { root, node, state } = TestNode::new("pcg");
    let daemon = Daemon::start(&root, &node, &state);
    // Both pods run outside the node cgroup: no program of the node's reaches them.
    let pod = ProxiedPod::new("pcgpod");
    let bystander = ProxiedPod::new("pcgby");
    daemon.add(&pod.topo.pod, "default/app", &STANDARD_INJECTION);
    let object = node_object(&root);
    let programs = NodePrograms::open(&object).expect("opening the node programs");
    let cgroup = pod.topo.pod_cgroup.path();
    let cookie = redirector::sys::netns::Netns::open(&pod.topo.pod.path())
        .expect("opening the pod's netns")
        .cookie();
    pod.assert_app_direct(false);
    assert!(attached_hooks(&programs, cgroup).unwrap().is_empty());

    // Attached at the pod's cgroup: captured, both families.
    let hooks = attach(&programs, cgroup, true, cookie).expect("attaching at the pod's cgroup");
    assert_eq!(hooks.len(), NODE_PROGRAMS.len(), "{hooks:?}");
    connect_both(&pod, true);
    assert_eq!(attached_hooks(&programs, cgroup).unwrap(), hooks);
    assert_eq!(
        cgroup_attachments(cgroup).len(),
        NODE_PROGRAMS.len(),
        "one attachment per program, no link: {:?}",
        cgroup_attachments(cgroup)
    );
    // Again: nothing more is attached.
    assert!(attach(&programs, cgroup, true, cookie).unwrap().is_empty());
    assert_eq!(cgroup_attachments(cgroup).len(), NODE_PROGRAMS.len());

    // The pod beside it runs none of the programs, while the captured pod runs them.
    let pins = program_pins(&object);
    assert_eq!(
        runs_during(&pins, || connect_both(&bystander, false)),
        0,
        "the bystander's connections ran the programs"
    );
    assert!(runs_during(&pins, || connect_both(&pod, true)) > 0);
    let dst = pod.service(false);

    // The daemon killed: the attachment is the cgroup's, not the daemon's.
    let daemon = daemon.kill().restart();
    assert_proxied(&pod.connect(APP_UID, APP_UID, dst), dst);

    // Detached: the pod's connections go where they were sent, nothing is left there.
    assert_eq!(detach(&programs, cgroup).unwrap(), NODE_PROGRAMS.len());
    assert_direct(&pod.connect(APP_UID, APP_UID, dst), dst);
    assert!(cgroup_attachments(cgroup).is_empty());
    assert_eq!(detach(&programs, cgroup).unwrap(), 0, "detaching again");
    drop(daemon);
}

#[test]
fn attachments_go_with_the_pods_cgroup() {
    privileged!();
    let TestNode { root, node, state } = TestNode::new("pcggone");
    let _daemon = Daemon::start(&root, &node, &state);
    let programs = NodePrograms::open(&node_object(&root)).expect("opening the node programs");
    let pod = Cgroup::new("pcggonepod");
    let path = pod.path().to_path_buf();
    // No pod's namespace: any cookie does.
    attach(&programs, &path, true, redirector_common::NetnsCookie(1))
        .expect("attaching at the pod's cgroup");
    assert_eq!(cgroup_attachments(&path).len(), NODE_PROGRAMS.len());
    drop(pod);
    assert!(!path.exists());
    // Detaching from a cgroup that is gone has nothing to do, and says so.
    assert_eq!(detach(&programs, &path).unwrap(), 0);
}

/// The node cgroup's links of the node's object, as `status` reports them.
fn node_links(root: &PinRoot) -> usize {
    let status = redirector_tests::redirector::status(root);
    status["objects"][0]["node_links"]
        .as_array()
        .map_or(0, Vec::len)
}

/// Each managed pod's `cgroup`, by name, as `pod list --json` reports it.
fn pod_cgroups(daemon: &Daemon) -> Vec<(String, Option<String>)> {
    daemon
        .pods()
        .iter()
        .map(|p| {
            (
                p["name"].as_str().unwrap_or("-").to_owned(),
                p["cgroup"].as_str().map(str::to_owned),
            )
        })
        .collect()
}

#[test]
fn a_daemon_node_runs_no_program_for_a_pod_it_does_not_capture() {
    privileged!();
    let TestNode { root, node, state } = TestNode::new("pcgnode");
    let daemon = Daemon::start_with(&root, &node, &state, &["--gc-interval", "1"]);
    assert_eq!(node_links(&root), 0, "no pod relies on the node cgroup");
    // Both pods run below the node cgroup; one is captured.
    let pod = ProxiedPod::under(&node, "pcgnpod");
    let bystander = ProxiedPod::under(&node, "pcgnby");
    daemon.add(&pod.topo.pod, "default/app", &STANDARD_INJECTION);
    let cgroup = pod.topo.pod_cgroup.path().display().to_string();
    assert_eq!(
        pod_cgroups(&daemon),
        [("default/app".to_owned(), Some(cgroup))],
        "its programs are at its own cgroup, found from its processes"
    );
    assert_eq!(node_links(&root), 0);
    // Its DNS is not captured: the six TCP programs. Captured, the four UDP ones too; and
    // off again, they go.
    let attached = || cgroup_attachments(pod.topo.pod_cgroup.path()).len();
    assert_eq!(attached(), 6);
    let with_dns: Vec<&str> = STANDARD_INJECTION
        .iter()
        .copied()
        .chain(["--redirect-dns", "--capture-all-dns"])
        .collect();
    daemon.add(&pod.topo.pod, "default/app", &with_dns);
    assert_eq!(attached(), NODE_PROGRAMS.len());
    daemon.add(&pod.topo.pod, "default/app", &STANDARD_INJECTION);
    assert_eq!(attached(), 6);
    let pins = program_pins(&node_object(&root));
    assert_eq!(
        runs_during(&pins, || connect_both(&bystander, false)),
        0,
        "the bystander ran the programs"
    );
    assert!(runs_during(&pins, || connect_both(&pod, true)) > 0);

    // A pod whose cgroup is not found (a bare namespace, no process in it) relies on the
    // node cgroup: the programs are attached there, the list says so.
    let bare = NetNs::new("pcgnbare");
    daemon.add(&bare, "default/bare", &STANDARD_INJECTION);
    assert_eq!(node_links(&root), NODE_PROGRAMS.len());
    assert!(pod_cgroups(&daemon).contains(&("default/bare".to_owned(), None)));
    let out = daemon.pod(&["list"]);
    let list = String::from_utf8_lossy(&out.stdout);
    assert!(list.contains("programs at the node cgroup"), "{list}");
    // The captured pod runs both its own and the node's programs, and is captured once.
    let dst = pod.service(false);
    assert_proxied(&pod.connect(APP_UID, APP_UID, dst), dst);
    let other = SocketAddr::new(dst.ip(), 8080);
    assert_proxied(&pod.connect(APP_UID, APP_UID, other), other);

    // An init container's pod below the node cgroup: covered by the node's programs, it
    // adds only its entries and relies on them too.
    let init = ProxiedPod::under(&node, "pcgninit");
    let log = init.install(&root, &STANDARD_INJECTION);
    assert!(log.contains("cover cgroup"), "{log}");
    // The bare pod gone: the init container's pod still relies on the node's programs,
    // which stay through collections (one a second).
    daemon.del("default/bare");
    std::thread::sleep(Duration::from_secs(3));
    assert_eq!(node_links(&root), NODE_PROGRAMS.len());
    init.assert_app_proxied(false);
    // It cleaned up too: the next collection removes the node's links.
    init.install(&root, &["--cleanup-only"]);
    let gone = within(Duration::from_secs(30), || node_links(&root) == 0);
    assert!(
        gone.is_some(),
        "the node's links stayed with no pod relying on them"
    );
    assert_proxied(&pod.connect(APP_UID, APP_UID, dst), dst);

    // Killed and restarted: still captured; removed: its cgroup has nothing attached.
    let daemon = daemon.kill().restart();
    assert_proxied(&pod.connect(APP_UID, APP_UID, dst), dst);
    daemon.del("default/app");
    assert_direct(&pod.connect(APP_UID, APP_UID, dst), dst);
    assert!(cgroup_attachments(pod.topo.pod_cgroup.path()).is_empty());
}

#[test]
fn pods_on_the_node_cgroup_move_to_their_own_with_no_connection_escaping() {
    privileged!();
    let TestNode { root, node, state } = TestNode::new("pcgmove");
    let daemon = Daemon::start(&root, &node, &state);
    // Set up while its namespace had no process (as a release before this one set up every
    // pod): it relies on the node cgroup's programs.
    let topo = Topology::under(&node, "pcgmovetopo");
    daemon.add(&topo.pod, "default/app", &STANDARD_INJECTION);
    assert_eq!(pod_cgroups(&daemon), [("default/app".to_owned(), None)]);
    assert_eq!(node_links(&root), NODE_PROGRAMS.len());
    // Its processes start: the service, and the proxy in the pod's cgroup.
    let pod = ProxiedPod::with(topo);
    let dst = pod.topo.service_addr(false, 80);
    assert_proxied(&pod.topo.connect(APP_UID, APP_UID, dst), dst);

    // A client connects all the while the daemon restarts and moves the pod.
    let stop = std::sync::atomic::AtomicBool::new(false);
    let topo = &pod.topo;
    let (outcomes, daemon) = std::thread::scope(|scope| {
        let _stop = StopOnDrop(&stop);
        let client = scope.spawn(|| {
            let mut outcomes = Vec::new();
            while !stop.load(std::sync::atomic::Ordering::SeqCst) || outcomes.len() < 5 {
                outcomes.push(topo.connect(APP_UID, APP_UID, dst));
            }
            outcomes
        });
        let daemon = daemon.kill().restart();
        stop.store(true, std::sync::atomic::Ordering::SeqCst);
        (client.join().unwrap(), daemon)
    });
    for outcome in &outcomes {
        assert_proxied(outcome, dst);
    }
    let cgroup = pod.topo.pod_cgroup.path().display().to_string();
    assert_eq!(
        pod_cgroups(&daemon),
        [("default/app".to_owned(), Some(cgroup))]
    );
    assert_eq!(node_links(&root), 0, "no pod relies on the node cgroup now");
    assert_proxied(&pod.topo.connect(APP_UID, APP_UID, dst), dst);
}
