//! A real Kubernetes container runtime: containerd with its CRI plugin, driven through the
//! CRI API as kubelet does, with `redirector-cni` chained after ptp + host-local and a
//! `redirector daemon` on the node. Pods are captured with no init container.

use serde_json::json;

use redirector_tests::cri::pods::{
    app_pod, assert_inbound_on_proxy, assert_lands_on_proxy, assert_reaches_service, connect,
    linkerd_sidecar, meshed_web, primary_network, serve, sidecar, LeftAlone, STATUS,
};
use redirector_tests::cri::Containerd;
use redirector_tests::host_net::ForwardingGuard;
use redirector_tests::linkerd::meshed::{A_PROXY_VERSION, INJECTOR_FLAGS, PROXY_VERSION};
use redirector_tests::prelude::*;

/// [`primary_network`], then `redirector-cni` with the default pod selection.
fn chained_network(
    cni_version: &str,
    third_octet: u8,
    ipam: &StateDir,
    root: &PinRoot,
    state: &StateDir,
) -> serde_json::Value {
    let mut network = primary_network(cni_version, third_octet, ipam);
    network["plugins"].as_array_mut().unwrap().push(json!(
        {"type": "redirector-cni", "pinRoot": root.path(), "stateDir": state.path(),
         "args": STANDARD_INJECTION, "capabilities": {"io.kubernetes.cri.pod-annotations": true}}
    ));
    network
}

/// [`primary_network`], then `redirector-cni` for Linkerd: `"dialect": "linkerd"`, the
/// injector's proxy-init flags, pods chosen by Linkerd's annotation.
fn linkerd_network(
    third_octet: u8,
    ipam: &StateDir,
    root: &PinRoot,
    state: &StateDir,
) -> serde_json::Value {
    let mut network = primary_network("1.0.0", third_octet, ipam);
    network["plugins"].as_array_mut().unwrap().push(json!(
        {"type": "redirector-cni", "dialect": "linkerd", "pinRoot": root.path(),
         "stateDir": state.path(), "args": INJECTOR_FLAGS,
         "capabilities": {"io.kubernetes.cri.pod-annotations": true}}
    ));
    network
}

/// What every test here starts from (dropped in this order): a node, its IPAM directory,
/// forwarding on.
fn cri_node(hint: &str) -> (TestNode, StateDir, ForwardingGuard) {
    (
        TestNode::new(hint),
        StateDir::new("ipam"),
        ForwardingGuard::new(),
    )
}

/// Stops and removes `sandboxes` (CNI DEL, twice): the daemon has no pod left, and none
/// of the pods of `cookies` any link.
#[track_caller]
fn remove_leaving_no_pod(
    cri: &mut Containerd,
    daemon: &Daemon,
    root: &PinRoot,
    sandboxes: &[&str],
    cookies: &[u64],
) {
    for sandbox in sandboxes {
        cri.remove_sandbox(sandbox);
    }
    assert!(daemon.pods().is_empty(), "{:?}", daemon.pod_names());
    for cookie in cookies {
        assert_eq!(pod_links(root, *cookie), None);
    }
}

#[test]
fn containerd_pods_are_captured_by_the_cni_plugin_with_no_init_container() {
    privileged!("containerd pod", &["containerd", "runc"]);
    let (TestNode { root, node, state }, ipam, _forwarding) = cri_node("cri");
    let daemon = Daemon::start(&root, &node, &state);
    let conflist = chained_network("1.0.0", 77, &ipam, &root, &state);
    let mut cri = Containerd::start(&conflist, &[("redirector-cni", &redirector_bin())]);
    let parent = node.relative_path();

    // The service: a pod the mesh leaves alone.
    let svc = cri.run_sandbox(
        "svc",
        &[("sidecar.istio.io/inject", "false")],
        &format!("{parent}/svc"),
    );
    let (svc_server, svc_addr) = serve(&mut cri, &svc);

    // The meshed pod: an app and a proxy (uid 1337), no init container.
    let (web, app, proxy, web_addr) = meshed_web(&mut cri, &parent, &[(STATUS, "{}")], sidecar);

    // Outbound: the app's connection lands on the proxy with its original destination.
    assert_lands_on_proxy(&mut cri, &app, svc_addr);
    // The proxy's own traffic passes.
    assert_reaches_service(&mut cri, &proxy, svc_addr);
    // Inbound: a connection to the app's port lands on the proxy's -z listener.
    assert_inbound_on_proxy(&mut cri, &svc_server, web_addr);

    // An annotation changes what is captured.
    let excluded = [
        (STATUS, "{}"),
        ("traffic.sidecar.istio.io/excludeOutboundPorts", "8080"),
    ];
    let (excl, excl_app) = app_pod(&mut cri, "default", "excl", &excluded, &parent);
    assert_reaches_service(&mut cri, &excl_app, svc_addr);

    assert_eq!(
        daemon.pod_names(),
        ["default/excl", "default/web"],
        "the opted-out pod is not captured"
    );

    // Stopping and removing the sandboxes (CNI DEL, twice) leaves no pod state.
    let cookies = daemon.pod_cookies();
    remove_leaving_no_pod(
        &mut cri,
        &daemon,
        &root,
        &[&web.0, &excl.0, &svc.0],
        &cookies,
    );
}

/// A node just rebooted: nothing pinned, no daemon yet, and a CNI 0.3.1 network (as
/// flannel, Calico and kindnet write theirs) with `redirector-cni` under its default
/// selection. Pods the plugin leaves alone start at once and uncaptured; an injected pod is
/// refused until a daemon has pinned the programs, and kubelet's retry then starts it
/// captured.
#[test]
fn a_rebooted_node_starts_pods_it_leaves_alone_and_holds_injected_ones_until_pinned() {
    privileged!("containerd pod", &["containerd", "runc"]);
    let (TestNode { root, node, state }, ipam, _forwarding) = cri_node("crireboot");
    let conflist = chained_network("0.3.1", 78, &ipam, &root, &state);
    let mut cri = Containerd::start(&conflist, &[("redirector-cni", &redirector_bin())]);
    let parent = node.relative_path();
    assert_eq!(pins_under(root.path()), Vec::<PathBuf>::new());

    // A pod with no sidecar annotations: the service; beside it a client with none, and
    // a kube-system pod even though the injector marked it.
    let svc = cri.run_sandbox("svc", &[], &format!("{parent}/svc"));
    let (_, svc_addr) = serve(&mut cri, &svc);
    let left_alone = LeftAlone::start(&mut cri, &parent, "");
    left_alone.assert_direct(&mut cri, svc_addr);

    // The injected pod: refused (the plugin's code 11), not started uncaptured.
    let web_parent = format!("{parent}/web");
    let refused = cri
        .try_run_sandbox("default", "web", &[(STATUS, "{}")], &web_parent)
        .map(|(id, _)| id)
        .expect_err("an injected pod must not start with nothing pinned");
    assert!(
        refused.message().contains("nothing is pinned"),
        "RunPodSandbox's error names the plugin's reason: {refused}"
    );

    // A daemon pins the node's programs; kubelet's retry of the same pod now starts it,
    // captured with no init container.
    let daemon = Daemon::start(&root, &node, &state);
    let web = cri.run_sandbox_in("default", "web", &[(STATUS, "{}")], &web_parent);
    let app = cri.start_container(&web, "app", &["sleep", "100000"], i64::from(APP_UID));
    sidecar(&mut cri, &web);
    assert_lands_on_proxy(&mut cri, &app, svc_addr);
    // The pods started before stay as they were: uncaptured, unrecorded.
    left_alone.assert_direct(&mut cri, svc_addr);
    assert_eq!(daemon.pod_names(), ["default/web"]);

    // Removing the sandboxes (CNI DEL, twice) leaves no pod state.
    let cookies = daemon.pod_cookies();
    assert_eq!(cookies.len(), 1);
    left_alone.remove(&mut cri);
    remove_leaving_no_pod(&mut cri, &daemon, &root, &[&web.0, &svc.0], &cookies);
}

/// Pods running before the plugin was chained (the DaemonSet came up after them): the
/// daemon finds them through the CRI and, by the plugin's own rules, reports them
/// (`--repair report`) or captures them (`--repair capture`, the default); new
/// connections of a repaired pod land on its proxy with their original destination.
#[test]
fn pods_started_before_the_plugin_are_repaired_through_the_cri() {
    privileged!("containerd pod", &["containerd", "runc"]);
    let (TestNode { root, node, state }, ipam, _forwarding) = cri_node("crirepair");
    let mut cri = Containerd::start(&primary_network("1.0.0", 79, &ipam), &[]);
    let parent = node.relative_path();
    // Before the plugin: a service with no sidecar, an injected pod, and pods the rules
    // leave alone (one with no sidecar, an injected kube-system pod).
    let svc = cri.run_sandbox("svc", &[], &format!("{parent}/svc"));
    let (_, svc_addr) = serve(&mut cri, &svc);
    let (web, app) = app_pod(&mut cri, "default", "web", &[(STATUS, "{}")], &parent);
    sidecar(&mut cri, &web);
    let left_alone = LeftAlone::start(&mut cri, &parent, "");
    assert_reaches_service(&mut cri, &app, svc_addr);

    let conf_dir = cri.dir().join("cni-conf");
    let socket = cri.dir().join("containerd.sock");
    let repair = |mode: &str| -> Vec<String> {
        [
            "--cri-socket",
            &socket.display().to_string(),
            "--cni-conf-dir",
            &conf_dir.display().to_string(),
            "--repair",
            mode,
            "--repair-interval",
            "1",
            "--metrics-addr",
            "127.0.0.1:0",
        ]
        .map(str::to_owned)
        .to_vec()
    };

    // Report: while the configuration has no entry of the plugin's, there are no rules
    // to repair by, and nothing is reported; then counted and logged, nothing captured.
    let args = repair("report");
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let daemon = Daemon::start_with(&root, &node, &state, &args);
    // A few rounds. The gauge starts at 0: on a slower machine this proves less, never fails.
    std::thread::sleep(Duration::from_millis(2500));
    assert!(
        daemon.has_metric("redirector_pods_uncaptured 0"),
        "{}",
        daemon.log()
    );
    // The DaemonSet's install step chains the plugin into the network's configuration.
    let (bin_dir, pins, state_dir) = (cri.dir().join("cni-bin"), root.path(), state.path());
    let install = format!(
        "install-cni --conf-dir {} --bin-dir {} --pin-root {} --state-dir {} --",
        conf_dir.display(),
        bin_dir.display(),
        pins.display(),
        state_dir.display()
    );
    assert_success(&redirector(&install).args(STANDARD_INJECTION).output());
    daemon.wait_until("no report of the uncaptured pod", || {
        daemon.has_metric("redirector_pods_uncaptured 1")
    });
    daemon.assert_logged("pod default/web");
    assert!(daemon.pod_names().is_empty());
    assert_reaches_service(&mut cri, &app, svc_addr);
    daemon.terminate();

    // Capture: the injected pod is captured by the first round; the others stay as they were.
    let args = repair("capture");
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let started = Instant::now();
    let daemon = Daemon::start_with(&root, &node, &state, &args);
    daemon.wait_until("the pod is not repaired", || {
        daemon.pod_names() == ["default/web"]
    });
    eprintln!(
        "repaired {:.0} ms after the daemon's start",
        started.elapsed().as_secs_f64() * 1e3
    );
    assert_lands_on_proxy(&mut cri, &app, svc_addr);
    left_alone.assert_direct(&mut cri, svc_addr);
    daemon.wait_until("the repair is not counted", || {
        daemon.has_metric("redirector_pods_repaired_total 1")
            && daemon.has_metric("redirector_pods_uncaptured 0")
    });

    // The repaired pod is the plugin's like any other: CNI DEL removes it.
    let cookie = daemon.pods()[0]["netns_cookie"].as_u64().unwrap();
    cri.remove_sandbox(&web.0);
    assert!(daemon.pods().is_empty());
    assert_eq!(pod_links(&root, cookie), None);
}

/// A Linkerd network (`"dialect": "linkerd"`) on containerd: a pod Linkerd's injector
/// marked (`linkerd.io/proxy-version`, delivered by containerd's pod-annotations
/// capability) starts captured with no init container — its app's connection lands on the
/// proxy's 127.0.0.1:4140 (uid 2102) with its original destination, the proxy's own goes
/// direct, inbound lands on the proxy, and its `config.linkerd.io/*` annotations apply —
/// while pods with neither mesh's annotations, with istio's only, or of kube-system start
/// uncaptured. Removing the sandboxes leaves no pod state.
#[test]
fn containerd_starts_linkerd_pods_captured_by_a_linkerd_network() {
    privileged!("containerd pod", &["containerd", "runc"]);
    let (TestNode { root, node, state }, ipam, _forwarding) = cri_node("crilk");
    let daemon = Daemon::start(&root, &node, &state);
    let conflist = linkerd_network(80, &ipam, &root, &state);
    let mut cri = Containerd::start(&conflist, &[("redirector-cni", &redirector_bin())]);
    let parent = node.relative_path();
    let marked = (PROXY_VERSION, A_PROXY_VERSION);

    // The service: a pod with neither mesh's annotations. Beside it pods the network
    // leaves alone: another with none, one istio injected, one Linkerd injected in
    // kube-system.
    let svc = cri.run_sandbox("svc", &[], &format!("{parent}/svc"));
    let (svc_server, svc_addr) = serve(&mut cri, &svc);
    let left_alone = [
        app_pod(&mut cri, "default", "plain", &[], &parent),
        app_pod(&mut cri, "default", "istio", &[(STATUS, "{}")], &parent),
        app_pod(&mut cri, "kube-system", "system", &[marked], &parent),
    ];
    for (_, app) in &left_alone {
        assert_reaches_service(&mut cri, app, svc_addr);
    }
    assert!(daemon.pods().is_empty(), "{:?}", daemon.pod_names());

    // The meshed pod: an app (uid 1000) and the proxy (uid 2102), no init container.
    let (web, app, proxy, web_addr) = meshed_web(&mut cri, &parent, &[marked], linkerd_sidecar);

    // Outbound: on the proxy's outbound listener, with the original destination.
    assert_lands_on_proxy(&mut cri, &app, svc_addr);
    let outbound: SocketAddr = "127.0.0.1:4140".parse().unwrap();
    match connect(&mut cri, &app, svc_addr) {
        ConnOutcome::Proxied { local, .. } => assert_eq!(
            local, outbound,
            "the app's connection is accepted on Linkerd's outbound port"
        ),
        other => panic!("app -> {svc_addr}: expected the proxy on {outbound}, got {other:?}"),
    }
    // The proxy's own traffic passes.
    assert_reaches_service(&mut cri, &proxy, svc_addr);
    // Inbound: a connection to the app's port lands on the proxy with the pod's address.
    assert_inbound_on_proxy(&mut cri, &svc_server, web_addr);

    // A Linkerd annotation on the pod changes what is captured.
    let skipping = [marked, ("config.linkerd.io/skip-outbound-ports", "8080")];
    let (skip, skip_app) = app_pod(&mut cri, "default", "skip", &skipping, &parent);
    assert_reaches_service(&mut cri, &skip_app, svc_addr);

    // The pods left alone are still so, and only the two Linkerd pods are the node's.
    for (_, app) in &left_alone {
        assert_reaches_service(&mut cri, app, svc_addr);
    }
    assert_eq!(daemon.pod_names(), ["default/skip", "default/web"]);

    // Stopping and removing the sandboxes (CNI DEL, twice) leaves no pod state.
    let cookies = daemon.pod_cookies();
    assert_eq!(cookies.len(), 2);
    for (sandbox, _) in &left_alone {
        cri.remove_sandbox(&sandbox.0);
    }
    remove_leaving_no_pod(
        &mut cri,
        &daemon,
        &root,
        &[&web.0, &skip.0, &svc.0],
        &cookies,
    );
}

/// The stand-in ztunnel as a process in a namespace and cgroup of its own, connected to
/// the agent at `socket`. Fields drop in order: the process before its namespace and cgroup.
struct StandInZtunnel {
    process: ChildGuard,
    _netns: NetNs,
    _cgroup: Cgroup,
}

impl StandInZtunnel {
    fn start(socket: &Path) -> Self {
        let netns = NetNs::new("criamb-zt");
        let cgroup = Cgroup::new("criamb-zt");
        let process = Spawn::new(redirector_tests::bin_path("standin-ztunnel"))
            .arg("--zds")
            .arg(socket)
            .netns(&netns)
            .cgroup(&cgroup)
            .spawn();
        StandInZtunnel {
            process,
            _netns: netns,
            _cgroup: cgroup,
        }
    }

    fn wait_line(&self, what: &str, line: &str) {
        self.process
            .wait_line(what, Duration::from_secs(30), |l| l == line);
    }
}

/// An ambient network under containerd: containerd answers PodSandboxStatus for a sandbox
/// only once its network is set up, so during the sandbox's CNI ADD the plugin finds no
/// labels. A pod labelled `istio.io/dataplane-mode=ambient` starts left alone, the plugin
/// saying why in the runtime's log; a pod annotated so is enrolled with ztunnel at its ADD,
/// and removing its sandbox takes it out.
#[test]
fn containerd_starts_an_annotated_ambient_pod_enrolled_and_a_labelled_one_left_alone() {
    privileged!("containerd pod", &["containerd", "runc"]);
    const MODE: &str = "istio.io/dataplane-mode";
    let (TestNode { root, node, state }, ipam, _forwarding) = cri_node("criamb");
    let zsocket = state.path().join("ztunnel.sock");
    let daemon = Daemon::start_with(
        &root,
        &node,
        &state,
        &["--ztunnel-socket", &zsocket.display().to_string()],
    );
    let ztunnel = StandInZtunnel::start(&zsocket);
    // The plugin's CRI socket, pointed at containerd's once it runs.
    let link = StateDir::new("crilink");
    let cri_socket = link.path().join("cri.sock");
    let mut conflist = primary_network("1.0.0", 79, &ipam);
    conflist["plugins"].as_array_mut().unwrap().push(json!(
        {"type": "redirector-cni", "dialect": "ambient", "pinRoot": root.path(),
         "stateDir": state.path(), "socket": daemon.socket(), "criSocket": cri_socket,
         "capabilities": {"io.kubernetes.cri.pod-annotations": true}}
    ));
    let mut cri = Containerd::start(&conflist, &[("redirector-cni", &redirector_bin())]);
    std::os::unix::fs::symlink(cri.dir().join("containerd.sock"), &cri_socket)
        .expect("linking the CRI socket");
    let parent = node.relative_path();

    // Labelled only: during its ADD containerd does not know the sandbox.
    let mut config = cri.sandbox_config("default", "labelled", &[], &format!("{parent}/labelled"));
    config.labels.insert(MODE.into(), "ambient".into());
    let (labelled, _) = cri
        .run_pod_sandbox(config)
        .unwrap_or_else(|e| panic!("RunPodSandbox labelled: {e}\n{}", cri.log()));
    assert!(daemon.pod_names().is_empty(), "{:?}", daemon.pod_names());
    let log = cri.log();
    assert_contains(
        &log,
        format!("sandbox {labelled}: the runtime does not know it yet"),
    );

    // Annotated: enrolled at its ADD (where the kernel serves ambient pods).
    let annotated = cri.try_run_sandbox(
        "default",
        "annotated",
        &[(MODE, "ambient")],
        &format!("{parent}/annotated"),
    );
    let ztunnel_served = redirector::store::programs::ZTUNNEL_FEATURES
        .iter()
        .all(|key| !redirector::sys::kernel::needs_fallback(key));
    if !ztunnel_served {
        let refused = annotated.expect_err("an ambient pod on a kernel that cannot serve it");
        assert!(refused.message().contains("ztunnel"), "{refused}");
        cri.remove_sandbox(&labelled);
        return;
    }
    let (annotated, _) = annotated.unwrap_or_else(|e| panic!("RunPodSandbox annotated: {e}"));
    ztunnel.wait_line("the annotated pod enrolled", "added uid-default-annotated");
    assert_eq!(daemon.pod_names(), ["default/annotated"]);

    // Removed (CNI DEL, twice): ztunnel told, nothing left.
    cri.remove_sandbox(&annotated);
    ztunnel.wait_line(
        "the annotated pod taken out",
        "deleted uid-default-annotated",
    );
    cri.remove_sandbox(&labelled);
    assert!(daemon.pods().is_empty(), "{:?}", daemon.pod_names());
}
