//! Daemon mode: pods captured by their network namespace, through `redirector daemon` and
//! `redirector pod`, with the cgroup programs attached at each pod's own cgroup (at the
//! node cgroup only while a pod whose cgroup is not found relies on them); capture that
//! survives the daemon being killed; init-container pods beside daemon pods.

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};

use redirector_tests::bpftool::{pinned_map, wait_link_detached, wait_pods_detached};
use redirector_tests::daemon::uninstall;
use redirector_tests::prelude::*;
use redirector_tests::process::StopOnDrop;
use redirector_tests::redirector::{status_pod, MapChange, NextObject};

/// The app in `topo` connecting to `dst` again and again until `stop`, counting in `made`:
/// what each connection landed on.
fn keep_connecting(
    topo: &Topology,
    dst: SocketAddr,
    stop: &AtomicBool,
    made: &AtomicUsize,
) -> Vec<ConnOutcome> {
    let mut outcomes = Vec::new();
    while !stop.load(Ordering::SeqCst) {
        outcomes.push(topo.connect(APP_UID, APP_UID, dst));
        made.fetch_add(1, Ordering::SeqCst);
    }
    outcomes
}

/// Waits until `made` counts `count` connections: a number of them, where waiting a fixed
/// time could give a loaded machine none. Each takes milliseconds here.
fn wait_connections(made: &AtomicUsize, count: usize) {
    let reached = within(Duration::from_secs(30), || {
        made.load(Ordering::SeqCst) >= count
    });
    assert!(
        reached.is_some(),
        "{} of {count} connections made",
        made.load(Ordering::SeqCst)
    );
}

#[test]
fn daemon_captures_a_pod_by_its_namespace_and_releases_it() {
    privileged!();
    let TestNode { root, node, state } = TestNode::new("daemon");
    let daemon = Daemon::start_with(&root, &node, &state, &["--metrics-addr", "127.0.0.1:0"]);
    assert_eq!(daemon.http_get("/healthz").0, 200);
    assert_eq!(daemon.http_get("/readyz").0, 200);
    let status = redirector_tests::redirector::status(&root);
    let node_links = status["objects"][0]["node_links"].as_array().unwrap().len();
    assert_eq!(
        node_links, 0,
        "no pod relies on programs at the node cgroup: {status}"
    );
    let pod = ProxiedPod::under(&node, "dpod");
    let dst = pod.service(false);
    assert_direct(&pod.connect(APP_UID, APP_UID, dst), dst);

    daemon.add(&pod.topo.pod, "default/app", &STANDARD_INJECTION);
    for v6 in [false, true] {
        pod.assert_app_proxied(v6);
    }
    assert_direct(&pod.connect(PROXY_UID, PROXY_UID, dst), dst);
    let cookie = pod.topo.pod.cookie();
    assert_eq!(
        pod_links(&root, cookie),
        Some(vec!["sk_lookup".to_owned()]),
        "a daemon pod has only its namespace's link; the cgroup programs are the node's"
    );

    let pods = daemon.pods();
    assert_eq!(pods.len(), 1, "{pods:?}");
    assert_eq!(pods[0]["name"], "default/app");
    assert_eq!(pods[0]["netns_cookie"].as_u64(), Some(cookie));
    assert_eq!(counted(&daemon, "redirected"), 2, "{pods:?}");
    assert!(daemon
        .pod(&["check", "--name", "default/app"])
        .status
        .success());

    // A bad flag: the same message as istio-iptables', exit 1, nothing changed.
    let netns = pod.topo.pod.path().display().to_string();
    let out = daemon.pod(&words(&format!(
        "add --netns {netns} --name x/y -- -p 70000"
    )));
    assert_eq!(out.status.code(), Some(1));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("70000") && err.contains("-p"), "{err}");
    assert_eq!(daemon.pod_names(), ["default/app"]);

    daemon.del("default/app");
    assert_direct(&pod.connect(APP_UID, APP_UID, dst), dst);
    assert!(daemon.pods().is_empty());
    assert_eq!(pod_links(&root, cookie), None);
    // Deleting again is not an error.
    daemon.del("default/app");

    // istio's annotations through the API: port 80 left alone, the rest captured.
    let annotation = "traffic.sidecar.istio.io/excludeOutboundPorts=80";
    let add = format!("add --netns {netns} --annotation {annotation} --");
    let args = [words(&add), STANDARD_INJECTION.to_vec()].concat();
    assert_success(&daemon.pod(&args));
    assert_direct(&pod.connect(APP_UID, APP_UID, dst), dst);
    let other = SocketAddr::new(dst.ip(), 8080);
    assert_proxied(&pod.connect(APP_UID, APP_UID, other), other);

    // SIGTERM: exit 0, capture stays (it never ends with the daemon).
    let (status, log) = daemon.terminate();
    assert!(status.success(), "{log}");
    assert_eq!(object_ids(&root).len(), 1, "{log}");
    assert_proxied(&pod.connect(APP_UID, APP_UID, other), other);

    // --uninstall removes everything: pods, node links, records, the pin root.
    assert_success(&uninstall(&root, &node, &state, &[]));
    assert!(!root.path().exists(), "the pin root is gone");
    assert_direct(&pod.connect(APP_UID, APP_UID, other), other);
}

#[test]
fn killed_daemon_leaves_pods_captured_and_a_new_one_rebuilds_its_view() {
    privileged!();
    let TestNode { root, node, state } = TestNode::new("restart");
    let mut daemon = Daemon::start(&root, &node, &state);
    let pod = ProxiedPod::under(&node, "rpod");
    let doomed = ProxiedPod::under(&node, "gone");
    daemon.add(&pod.topo.pod, "default/app", &STANDARD_INJECTION);
    daemon.add(&doomed.topo.pod, "default/doomed", &STANDARD_INJECTION);
    let doomed_cookie = doomed.topo.pod.cookie();

    let doomed_link = pins_under(root.path())
        .into_iter()
        .find(|p| p.ends_with(format!("links/{}_sk_lookup", doomed.topo.pod.cookie())))
        .expect("the doomed pod's link");
    let mut doomed = Some(doomed);

    // A client in the pod connects all the time while the daemon is killed and restarted.
    let (stop, made) = (AtomicBool::new(false), AtomicUsize::new(0));
    let dst = pod.service(false);
    let topo = &pod.topo;
    let outcomes = std::thread::scope(|scope| {
        let _stop = StopOnDrop(&stop);
        let client = scope.spawn(|| keep_connecting(topo, dst, &stop, &made));
        for cycle in 0..10 {
            let killed = daemon.kill();
            if cycle == 5 {
                // The second pod goes away while no daemon runs.
                drop(doomed.take());
                assert!(
                    wait_link_detached(&doomed_link, EVENTUALLY),
                    "the removed pod's namespace is torn down"
                );
            }
            daemon = killed.restart();
            let expected: &[&str] = if cycle >= 5 {
                &["default/app"]
            } else {
                &["default/app", "default/doomed"]
            };
            assert_eq!(daemon.pod_names(), expected, "after restart {cycle}");
        }
        wait_connections(&made, 10);
        stop.store(true, Ordering::SeqCst);
        client.join().unwrap()
    });
    assert_eq!(
        pod_links(&root, doomed_cookie),
        None,
        "the pod whose namespace went while no daemon ran is removed by the restart's reconcile"
    );
    assert!(outcomes.len() >= 10, "{} connections", outcomes.len());
    assert_all_proxied(&outcomes, dst);
}

#[test]
fn init_container_pods_and_daemon_pods_share_the_node() {
    privileged!();
    let TestNode { root, node, state } = TestNode::new("mixed");
    let daemon = Daemon::start(&root, &node, &state);
    let by_daemon = ProxiedPod::under(&node, "dmn");
    // An init-container pod outside the node cgroup: its own cgroup links.
    let outside = ProxiedPod::new("out");
    // One inside it.
    let inside = ProxiedPod::under(&node, "in");
    daemon.add(&by_daemon.topo.pod, "default/daemon", &STANDARD_INJECTION);
    outside.install(&root, &STANDARD_INJECTION);
    // No program is attached at the node cgroup (the daemon's pod has them at its own):
    // the init container attaches its own.
    let log = inside.install(&root, &STANDARD_INJECTION);
    assert!(!log.contains("cover cgroup"), "{log}");
    for pod in [&inside, &outside] {
        assert_eq!(
            pod_links(&root, pod.topo.pod.cookie()).map(|l| l.len()),
            Some(7)
        );
    }
    assert_eq!(object_ids(&root).len(), 1, "one object for every pod");

    let check_all = |when: &str| {
        for pod in [&by_daemon, &outside, &inside] {
            let dst = pod.service(false);
            match pod.connect(APP_UID, APP_UID, dst) {
                ConnOutcome::Proxied { name, orig, .. } if name == "proxy" => {
                    assert_eq!(orig, Some(dst), "{when}")
                }
                other => panic!("{when}: expected the proxy, got {other:?}"),
            }
            assert_direct(&pod.connect(PROXY_UID, PROXY_UID, dst), dst);
        }
    };
    check_all("all three set up");
    // Each counts its own connections once: no program runs twice on a socket.
    let counters =
        |pod: &ProxiedPod| status_pod(&root, pod.topo.pod.cookie()).unwrap()["counters"].clone();
    for pod in [&by_daemon, &outside, &inside] {
        let expected = serde_json::json!({
            "redirected": 1,
            "orig_dst_answered": 1,
            "passed_proxy_owner": 1
        });
        assert_eq!(counters(pod), expected);
    }

    // A daemon restart keeps the init-container pods; their cleanup keeps the daemon's.
    let daemon = daemon.kill_and_restart();
    check_all("after a daemon restart");
    assert_eq!(daemon.pod_names(), ["default/daemon"]);
    for pod in [&outside, &inside] {
        pod.install(&root, &["--cleanup-only"]);
        pod.assert_app_direct(false);
    }
    by_daemon.assert_app_proxied(false);
}

#[test]
fn a_new_object_replaces_the_node_programs_with_no_gap() {
    privileged!();
    let TestNode { root, node, state } = TestNode::new("upgrade");
    let daemon = Daemon::start(&root, &node, &state);
    let pod = ProxiedPod::under(&node, "upod");
    daemon.add(&pod.topo.pod, "default/app", &STANDARD_INJECTION);
    let before = object_ids(&root);
    let next = NextObject::new();

    let (stop, made) = (AtomicBool::new(false), AtomicUsize::new(0));
    let dst = pod.service(false);
    let topo = &pod.topo;
    let (outcomes, daemon) = std::thread::scope(|scope| {
        let _stop = StopOnDrop(&stop);
        let client = scope.spawn(|| keep_connecting(topo, dst, &stop, &made));
        wait_connections(&made, 5);
        // A daemon with a rebuilt kernel side takes the node over.
        let daemon = daemon.kill().restart_with_object(&next.path);
        wait_connections(&made, made.load(Ordering::SeqCst) + 5);
        stop.store(true, Ordering::SeqCst);
        (client.join().unwrap(), daemon)
    });
    let log = daemon.log();
    assert!(log.contains("upgraded the node from object"), "{log}");
    assert!(
        log.contains("maps shared"),
        "same map definitions: the new programs use the old maps: {log}"
    );
    let after = object_ids(&root);
    assert_eq!(after.len(), 1, "the old object is gone: {after:?}");
    assert_ne!(after, before);
    assert_eq!(
        pod_links(&root, pod.topo.pod.cookie()),
        Some(vec!["sk_lookup".to_owned()])
    );
    assert_eq!(daemon.pod_names(), ["default/app"]);
    assert!(outcomes.len() >= 5, "{} connections", outcomes.len());
    assert_all_proxied(&outcomes, dst);
    assert_proxied(&pod.connect(APP_UID, APP_UID, dst), dst);
    assert_direct(&pod.connect(PROXY_UID, PROXY_UID, dst), dst);
}

#[test]
fn a_pod_whose_namespace_goes_is_removed_while_the_daemon_runs() {
    privileged!();
    let TestNode { root, node, state } = TestNode::new("gcrun");
    let daemon = Daemon::start_with(&root, &node, &state, &["--gc-interval", "1"]);
    let kept = ProxiedPod::under(&node, "kept");
    let gone = ProxiedPod::under(&node, "gone");
    daemon.add(&kept.topo.pod, "default/kept", &STANDARD_INJECTION);
    daemon.add(&gone.topo.pod, "default/gone", &STANDARD_INJECTION);
    let gone_cookie = gone.topo.pod.cookie();
    // Deleted without `pod del` (a missed CNI DEL).
    drop(gone);
    let removed = within(EVENTUALLY, || daemon.pod_names() == ["default/kept"]);
    let (names, log) = (daemon.pod_names(), daemon.log());
    assert!(
        removed.is_some(),
        "the gone pod is still listed: {names:?}\n{log}"
    );
    assert_eq!(pod_links(&root, gone_cookie), None);
    kept.assert_app_proxied(false);
}

#[test]
fn the_daemons_next_add_removes_pods_that_went_without_a_cleanup() {
    privileged!();
    let TestNode { root, node, state } = TestNode::new("gcadd");
    // No periodic collection: only the adds remove what is gone.
    let daemon = Daemon::start_with(&root, &node, &state, &["--gc-interval", "0"]);
    let kept = (NetNs::new("kept"), Cgroup::under(&node, "kept"));
    daemon.add_in(&kept.0, &kept.1, "default/kept", &STANDARD_INJECTION);
    // A daemon pod deleted without `pod del` (a missed CNI DEL), and an init-container pod
    // under the node cgroup (in the daemon's object) deleted without `--cleanup-only`.
    let by_daemon = (NetNs::new("gone"), Cgroup::under(&node, "gone"));
    let (netns, cgroup) = &by_daemon;
    daemon.add_in(netns, cgroup, "default/gone", &STANDARD_INJECTION);
    let by_init = (NetNs::new("initgone"), Cgroup::under(&node, "initgone"));
    install(&by_init.0, &by_init.1, &root, &STANDARD_INJECTION);
    let gone = [by_daemon.0.cookie(), by_init.0.cookie()];
    drop((by_daemon, by_init));
    wait_pods_detached(&root, &gone);
    assert!(gone.iter().all(|c| pod_links(&root, *c).is_some()));

    let new = (NetNs::new("new"), Cgroup::under(&node, "new"));
    daemon.add_in(&new.0, &new.1, "default/new", &STANDARD_INJECTION);
    for cookie in gone {
        assert_eq!(pod_links(&root, cookie), None, "{}", daemon.log());
    }
    daemon.assert_logged("removed 2 pod(s) that are gone");
    for (netns, _) in [&kept, &new] {
        assert_eq!(
            pod_links(&root, netns.cookie()),
            Some(vec!["sk_lookup".to_owned()])
        );
    }
}

#[test]
fn a_runtime_that_cannot_be_reached_leaves_the_daemon_serving() {
    privileged!();
    let TestNode { root, node, state } = TestNode::new("norepair");
    // The plugin is chained, so a repair round has rules; the runtime's socket is not there.
    let conf = StateDir::new("conf");
    let entry = serde_json::json!({"cniVersion": "1.0.0", "name": "k8s", "plugins": [
        {"type": "ptp"}, {"type": "redirector-cni", "args": STANDARD_INJECTION}]});
    std::fs::write(conf.path().join("10-k8s.conflist"), entry.to_string()).unwrap();
    let socket = state.path().join("no-runtime.sock");
    let flags = format!(
        "--cri-socket {} --cni-conf-dir {} --repair capture --repair-interval 1",
        socket.display(),
        conf.path().display()
    );
    let daemon = Daemon::start_with(&root, &node, &state, &words(&flags));
    let asked = within(EVENTUALLY, || {
        daemon
            .log()
            .contains("repair: connecting to the CRI socket")
    });
    assert!(asked.is_some(), "{}", daemon.log());
    // Pods are still set up through the API.
    let pod = (NetNs::new("pod"), Cgroup::under(&node, "pod"));
    daemon.add_in(&pod.0, &pod.1, "default/pod", &STANDARD_INJECTION);
    assert_eq!(daemon.pod_names(), ["default/pod"]);
}

#[test]
fn bad_requests_get_clear_errors_and_change_nothing() {
    privileged!();
    let TestNode { root, node, state } = TestNode::new("badreq");
    let daemon = Daemon::start(&root, &node, &state);
    let mut stream = daemon.connect();
    let mut ask = |line: &str| redirector_tests::daemon::ask(&mut stream, line);
    let answer = ask("{not json");
    assert_eq!(answer["ok"], false);
    assert!(
        answer["error"].as_str().unwrap().starts_with("bad request"),
        "{answer}"
    );
    let answer = ask(r#"{"op":"explode"}"#);
    assert_eq!(answer["ok"], false, "{answer}");
    let answer = ask(r#"{"op":"add","netns":"/run/netns/rdt-no-such-pod","args":["-p","15001"]}"#);
    assert_eq!(answer["ok"], false);
    assert_contains(answer["error"].as_str().unwrap(), "rdt-no-such-pod");
    let answer = ask(r#"{"op":"add","netns":"/proc/self/ns/net","args":["-p","0"]}"#);
    assert_eq!(answer["ok"], false);
    assert!(answer["error"].as_str().unwrap().contains("-p"), "{answer}");
    let answer = ask(r#"{"op":"add","netns":"/proc/self/ns/net","args":["--cleanup-only"]}"#);
    assert_eq!(answer["ok"], false);
    assert_contains(answer["error"].as_str().unwrap(), "--cleanup-only");
    let answer = ask(r#"{"op":"check","name":"nobody/here"}"#);
    assert_eq!(answer["ok"], false, "{answer}");
    // The connection still serves, and nothing was added.
    let answer = ask(r#"{"op":"list"}"#);
    assert_eq!(answer["ok"], true);
    assert!(daemon.pods().is_empty());
    let status = redirector_tests::redirector::status(&root);
    assert!(
        status["objects"][0]["pods"].as_array().unwrap().is_empty(),
        "{status}"
    );
}

/// The decision counter `reason` of the daemon's first pod.
fn counted(daemon: &Daemon, reason: &str) -> u64 {
    let pods = daemon.pods();
    let counters = pods[0]["counters"].as_array().cloned().unwrap_or_default();
    counters
        .iter()
        .find(|pair| pair[0] == reason)
        .and_then(|pair| pair[1].as_u64())
        .unwrap_or_default()
}

/// An upgrade to a kernel side whose map definitions differ — a capacity, and longer
/// values in a pod's configuration and counters (fields appended, as a later release adds
/// them) — copies what the changed maps hold, converting each value; the maps of
/// connections in flight keep their entries' shape, so the new programs use them as they
/// are (a connection that meets the old programs at connect and the new ones at accept
/// keeps its original destination), even where the new object asks for another capacity.
/// Then the rollback to the first object does the same, cutting the values back. A daemon
/// pod and an init-container pod connect throughout: no connection escapes the proxy or
/// loses its original destination, one held open across both switches still answers
/// `SO_ORIGINAL_DST` and `getpeername`, and the counters carry over.
#[test]
fn an_upgrade_that_copies_maps_and_its_rollback_lose_no_connection() {
    privileged!();
    let TestNode { root, node, state } = TestNode::new("copyup");
    let daemon = Daemon::start(&root, &node, &state);
    let daemon_pod = ProxiedPod::under(&node, "copyd");
    daemon.add(&daemon_pod.topo.pod, "default/app", &STANDARD_INJECTION);
    let init_pod = ProxiedPod::under(&node, "copyi");
    init_pod.install(&root, &STANDARD_INJECTION);
    let first = object_ids(&root);
    assert_eq!(first.len(), 1, "{first:?}");
    let next = NextObject::with_changes(&[
        MapChange::Capacity("PORT_SETS", 16384),
        MapChange::LongerValues("POD_CONFIG", 8),
        MapChange::LongerValues("COUNTERS", 8),
        MapChange::Capacity("ORIG_DST_BY_CONN", 16384),
    ]);
    let maps = |object: &str| {
        let dir = root.path().join("objects").join(object).join("maps");
        ["PORT_SETS", "POD_CONFIG", "COUNTERS", "ORIG_DST_BY_CONN"]
            .map(|m| pinned_map(&dir.join(m)))
    };
    let before = maps(&first[0]);

    let stop = AtomicBool::new(false);
    let made = [AtomicUsize::new(0), AtomicUsize::new(0)];
    let pods = [&daemon_pod, &init_pod];
    let targets: Vec<_> = pods.iter().map(|p| (&p.topo, p.service(false))).collect();
    let dst = daemon_pod.service(false);
    // `n` more connections of each client.
    let more = |n: usize| {
        for made in &made {
            wait_connections(made, made.load(Ordering::SeqCst) + n);
        }
    };
    let (outcomes, daemon, after_upgrade) = std::thread::scope(|scope| {
        let _stop = StopOnDrop(&stop);
        let clients: Vec<_> = targets
            .iter()
            .zip(&made)
            .map(|(&(topo, dst), made)| {
                let stop = &stop;
                scope.spawn(move || keep_connecting(topo, dst, stop, made))
            })
            .collect();
        more(3);
        // A connection open across both switches, asked again after them.
        let held = Spawn::new(probe_bin())
            .args(["hold", &dst.to_string(), "--for-ms", "2000"])
            .netns(&daemon_pod.topo.pod)
            .cgroup(&daemon_pod.topo.pod_cgroup)
            .user(APP_UID, APP_UID)
            .spawn();
        let replied = |what: &str| {
            let line = held.wait_line(what, Duration::from_secs(30), |l| {
                l.starts_with("reply") || l.starts_with("error")
            });
            ConnOutcome::parse(&line)
        };
        assert_proxied(&replied("the first reply"), dst);
        let upgraded = daemon.kill().restart_with_object(&next.path);
        more(3);
        let after_upgrade = counted(&upgraded, "redirected");
        let log = upgraded.log();
        assert!(log.contains("maps copied"), "{log}");
        let upgraded_ids = object_ids(&root);
        assert_eq!(upgraded_ids.len(), 1, "{upgraded_ids:?}");
        let [ports, config, counters, conns] = maps(&upgraded_ids[0]);
        assert_eq!(ports.2, 16384, "PORT_SETS's new capacity");
        assert_eq!(config.1, before[1].1 + 8, "POD_CONFIG's longer values");
        assert_eq!(counters.1, before[2].1 + 8, "COUNTERS's longer values");
        assert_eq!(
            conns, before[3],
            "the connections' map is the running one, its capacity unchanged"
        );
        let object = redirector_tests::redirector::built_object();
        let rolled_back = upgraded.kill().restart_with_object(&object);
        more(3);
        stop.store(true, Ordering::SeqCst);
        let outcomes: Vec<Vec<ConnOutcome>> =
            clients.into_iter().map(|c| c.join().unwrap()).collect();
        // SO_ORIGINAL_DST and getpeername of the held connection, after both switches.
        assert_proxied(&replied("the reply after the switches"), dst);
        let peer = held.wait_line("the peer", Duration::from_secs(30), |l| {
            l.starts_with("peer")
        });
        assert_eq!(peer, format!("peer {} {}", dst.ip(), dst.port()));
        (outcomes, rolled_back, after_upgrade)
    });
    let log = daemon.log();
    assert!(
        log.contains("maps copied"),
        "the rollback copies too: {log}"
    );
    assert_eq!(object_ids(&root), first, "back on the first object");
    let after = maps(&first[0]);
    for (b, a) in before.iter().zip(&after).skip(1) {
        assert_eq!(
            (b.1, b.2),
            (a.1, a.2),
            "the first object's definitions again"
        );
    }
    for (pod, outcomes) in pods.iter().zip(&outcomes) {
        let dst = pod.service(false);
        assert!(outcomes.len() >= 5, "{} connections", outcomes.len());
        assert_all_proxied(outcomes, dst);
        assert_proxied(&pod.connect(APP_UID, APP_UID, dst), dst);
    }
    let after_rollback = counted(&daemon, "redirected");
    eprintln!(
        "connections: daemon pod {}, init-container pod {}; redirected counted {after_upgrade} after the upgrade, {after_rollback} after the rollback",
        outcomes[0].len(),
        outcomes[1].len(),
    );
    assert!(
        after_upgrade > 0 && after_rollback >= after_upgrade,
        "counters carried over"
    );
}
