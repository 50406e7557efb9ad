//! The engine as a library, the way a node daemon uses it: one process sets up two pods
//! at the same time from two threads, each through its own `Netns` handle, and the
//! process itself never changes network namespace; the maps it keeps open between pods
//! follow the object when another process removes it and loads it again; a pod whose
//! keys are known is observed and removed by looking them up; work in a pod's namespace
//! runs there and its thread comes back, even when the work panics.

use std::collections::HashMap;
use std::os::unix::fs::MetadataExt;
use std::sync::Mutex;

use redirector::{
    engine::apply::{apply, Outcome},
    engine::diff::Mode,
    engine::facts::PodFacts,
    engine::gc::teardown,
    engine::observe::{observe, Installation, Lookup},
    engine::plan::{plan_pod, PodPlan},
    engine::pod_keys::PodKeys,
    mesh::istio::parse_istio_iptables,
    store::{self, EbpfObject, NodeMaps, OpenMaps},
    sys::netns::{Netns, NetnsError},
};
use redirector_common::{PortKey, PortSet};
use redirector_tests::prelude::*;

/// The network namespace inode of every thread of this process. A thread just joined may
/// still be listed while it exits, with its namespaces already released (ENOENT): it has
/// none to count.
fn thread_namespaces() -> Vec<u64> {
    let mut inodes: Vec<u64> = std::fs::read_dir("/proc/self/task")
        .unwrap()
        .filter_map(
            |t| match std::fs::metadata(t.unwrap().path().join("ns/net")) {
                Ok(ns) => Some(ns.ino()),
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => None,
                Err(e) => panic!("a thread's network namespace: {e}"),
            },
        )
        .collect();
    inodes.sort();
    inodes.dedup();
    inodes
}

/// The pod as the library is given it.
fn target(pod: &ProxiedPod) -> Target {
    let topo = &pod.topo;
    let (netns, cgroup) = (topo.pod.path(), topo.pod_cgroup.path().to_path_buf());
    let (cookie, ip) = (topo.pod.cookie(), topo.pod_ip4());
    Target {
        netns,
        cgroup,
        cookie,
        ip,
    }
}

/// What the library needs to know of a pod: where its namespace and cgroup are.
struct Target {
    netns: PathBuf,
    cgroup: PathBuf,
    cookie: u64,
    ip: Ipv4Addr,
}

impl Target {
    /// The pod's plan for the standard injection.
    fn plan(&self) -> (Netns, PodPlan) {
        let netns = Netns::open(&self.netns).expect("opening the pod's netns");
        assert_eq!(netns.cookie().get(), self.cookie);
        let argv = std::iter::once("istio-iptables").chain(STANDARD_INJECTION);
        let cfg = parse_istio_iptables(argv, &HashMap::<String, String>::new()).unwrap();
        let facts = PodFacts::gather(
            &netns,
            Some(self.cgroup.clone()),
            Path::new("/nonexistent/resolv.conf"),
        )
        .expect("reading the pod");
        assert!(
            facts.local_addrs.contains(&self.ip.into()),
            "the pod's own addresses, read inside its namespace: {facts:?}"
        );
        (netns, plan_pod(&cfg.capture, &facts))
    }

    /// Set the pod up through the library, as `redirector istio-iptables` would, with the
    /// maps `maps` keeps open.
    fn set_up(
        &self,
        root: &store::PinRoot,
        object: &EbpfObject,
        maps: &Mutex<OpenMaps>,
    ) -> Outcome {
        let (netns, plan) = self.plan();
        let mut maps = maps.lock().unwrap();
        apply(root, object, &plan, &netns, Mode::Changes, &mut maps, None).expect("applying")
    }
}

/// A pin root of the test's own and the embedded object.
fn engine(name: &str) -> (PinRoot, store::PinRoot, EbpfObject) {
    let pins = PinRoot::new(name);
    let root = store::PinRoot::new(pins.path());
    (
        pins,
        root,
        EbpfObject::configured().expect("the embedded object"),
    )
}

#[test]
fn one_process_sets_up_two_pods_at_once_without_changing_its_namespace() {
    privileged!();
    let (pins, root, object) = engine("engine");
    let pods = [ProxiedPod::new("enga"), ProxiedPod::new("engb")];
    let before = thread_namespaces();
    let maps = Mutex::default();

    let targets: Vec<Target> = pods.iter().map(target).collect();
    let outcomes: Vec<Outcome> = std::thread::scope(|scope| {
        let running: Vec<_> = targets
            .iter()
            .map(|target| scope.spawn(|| target.set_up(&root, &object, &maps)))
            .collect();
        running.into_iter().map(|t| t.join().unwrap()).collect()
    });
    assert!(
        outcomes.iter().all(|o| matches!(o, Outcome::New(_))),
        "{outcomes:?}"
    );
    assert_eq!(thread_namespaces(), before, "no thread moved for good");
    assert_eq!(object_ids(&pins).len(), 1, "one object for both pods");

    for pod in &pods {
        pod.assert_app_proxied(false);
        // The same plan again is no change.
        assert!(matches!(
            target(pod).set_up(&root, &object, &maps),
            Outcome::Unchanged
        ));
    }

    for pod in &pods {
        let removed = teardown(&root, cookie_of(pod), &mut maps.lock().unwrap(), None)
            .expect("removing the pod");
        assert_eq!(removed.len(), 1);
        pod.assert_app_direct(false);
    }
    assert!(
        !pins.path().exists(),
        "the last pod's teardown removes the pin root"
    );
}

/// The calling thread's network namespace inode.
fn own_namespace() -> u64 {
    std::fs::metadata("/proc/thread-self/ns/net").unwrap().ino()
}

#[test]
fn work_in_a_namespace_runs_there_and_its_thread_comes_back_even_when_it_panics() {
    privileged!();
    let pod = NetNs::new("engrun");
    let netns = Netns::open(&pod.path()).expect("opening the pod's namespace");
    let own = own_namespace();
    let inside = netns
        .run(own_namespace)
        .expect("working in the pod's namespace");
    assert_eq!(inside, netns.inode(), "the work ran in the pod's namespace");
    assert_ne!(inside, own);
    assert_eq!(own_namespace(), own, "back in its own namespace");
    let panicked = netns.run(|| -> u64 { panic!("work that fails in the pod's namespace") });
    assert!(
        matches!(panicked, Err(NetnsError::Panicked { .. })),
        "a panic is the call's error: {panicked:?}"
    );
    assert_eq!(
        own_namespace(),
        own,
        "back in its own namespace after a panic"
    );
}

fn cookie_of(pod: &ProxiedPod) -> redirector_common::NetnsCookie {
    redirector_common::NetnsCookie(pod.topo.pod.cookie())
}

#[test]
fn maps_kept_open_follow_the_object_when_it_is_loaded_again() {
    privileged!();
    let (pins, root, object) = engine("engine-reload");
    let [first, second, third] = ["engr1", "engr2", "engr3"].map(ProxiedPod::new);
    let kept = Mutex::default();
    assert!(matches!(
        target(&first).set_up(&root, &object, &kept),
        Outcome::New(_)
    ));
    // Another process removes the only pod, and with it the object; a third loads the
    // object again at the same path, with new maps.
    teardown(&root, cookie_of(&first), &mut OpenMaps::default(), None).expect("removing the pod");
    assert!(!pins.path().exists(), "the object went with its last pod");
    target(&second).set_up(&root, &object, &Mutex::default());
    assert_eq!(object_ids(&pins).len(), 1);

    // The maps kept since the first pod are the removed object's: the pod set up with them
    // is configured in the object its links run.
    assert!(matches!(
        target(&third).set_up(&root, &object, &kept),
        Outcome::New(_)
    ));
    for pod in [&second, &third] {
        pod.assert_app_proxied(false);
    }
    for pod in [&second, &third] {
        teardown(&root, cookie_of(pod), &mut kept.lock().unwrap(), None).expect("removing the pod");
    }
    assert!(!pins.path().exists());
}

/// Entries in one order whatever order a map gave them in.
fn sorted<T: std::fmt::Debug>(entries: &[T]) -> Vec<String> {
    let mut out: Vec<String> = entries.iter().map(|e| format!("{e:?}")).collect();
    out.sort();
    out
}

/// The map entries of `pod` under the node's one object, found as `lookup` says.
fn entries(root: &store::PinRoot, pod: &ProxiedPod, lookup: Lookup) -> Installation {
    let state =
        observe(root, cookie_of(pod), &mut OpenMaps::default(), lookup).expect("observing the pod");
    assert_eq!(state.installations.len(), 1, "{state:?}");
    state.installations[0].clone()
}

#[test]
fn a_pod_found_by_its_keys_is_observed_and_removed_without_the_other_pods_entries() {
    privileged!();
    let (pins, root, object) = engine("engine-keys");
    let [one, other] = ["engk1", "engk2"].map(ProxiedPod::new);
    let maps = Mutex::default();
    for pod in [&one, &other] {
        assert!(matches!(
            target(pod).set_up(&root, &object, &maps),
            Outcome::New(_)
        ));
    }
    let keys = PodKeys::of(&target(&one).plan().1);
    let other_before = entries(&root, &other, Lookup::ReadThrough);

    // An entry of the pod that its keys do not name, as a run killed with other flags
    // leaves: a lookup of the pod's keys does not see it, so it reads no map through.
    let stray = PortKey::new(cookie_of(&one).get(), PortSet::OutboundExclude, 9999);
    let object_pins = root.object(object.id());
    NodeMaps::open(&object_pins)
        .expect("opening the maps")
        .port_sets
        .insert(stray, 1, 0)
        .expect("writing a stray entry");
    let by_keys = entries(&root, &one, Lookup::Keys(&keys));
    let read_through = entries(&root, &one, Lookup::ReadThrough);
    assert!(!by_keys.ports.contains(&stray) && read_through.ports.contains(&stray));
    let planned: Vec<_> = keys.port_keys(cookie_of(&one)).collect();
    assert_eq!(sorted(&by_keys.ports), sorted(&planned));
    assert_eq!(sorted(&by_keys.cidrs_v4), sorted(&read_through.cidrs_v4));
    assert_eq!(sorted(&by_keys.cidrs_v6), sorted(&read_through.cidrs_v6));
    assert_eq!(sorted(&by_keys.addrs), sorted(&read_through.addrs));
    assert_eq!(by_keys.config, read_through.config);

    // Removed by its keys: its own entries go, the other pod's stay exactly as they were
    // and it is still captured.
    teardown(
        &root,
        cookie_of(&one),
        &mut maps.lock().unwrap(),
        Some(&keys),
    )
    .expect("removing the pod");
    one.assert_app_direct(false);
    let after = entries(&root, &other, Lookup::ReadThrough);
    assert_eq!(
        (after.ports, after.cidrs_v4, after.addrs, after.config),
        (
            other_before.ports,
            other_before.cidrs_v4,
            other_before.addrs,
            other_before.config
        )
    );
    other.assert_app_proxied(false);

    // What its keys did not name, garbage collection finds: the pod is gone.
    let left = observe(
        &root,
        cookie_of(&one),
        &mut OpenMaps::default(),
        Lookup::ReadThrough,
    )
    .unwrap();
    assert!(
        left.installations.is_empty(),
        "no config, no links: {left:?}"
    );
    let ports = |maps: &NodeMaps| maps.port_sets.get(&stray, 0).is_ok();
    assert!(ports(&NodeMaps::open(&object_pins).unwrap()));
    let removed = redirector::engine::gc::collect_stale(&root).expect("collecting");
    assert!(removed.contains(&cookie_of(&one)), "{removed:?}");
    assert!(!ports(&NodeMaps::open(&object_pins).unwrap()));

    teardown(&root, cookie_of(&other), &mut maps.lock().unwrap(), None).expect("removing");
    assert!(!pins.path().exists());
}
