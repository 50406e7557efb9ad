//! `redirector-cni` invoked exactly as a container runtime does: CNI_* env vars and the
//! network configuration on stdin, against namespaces the test made, beside a daemon. In
//! both dialects: istio's (the default) and Linkerd's (`"dialect": "linkerd"`).

use serde_json::{json, Value};

use redirector_tests::linkerd::cases::LINKERD_PROXY_UID;
use redirector_tests::linkerd::meshed::{
    assert_app, assert_inbound, assert_outbound, assert_peer, MeshedPod, A_PROXY_VERSION,
    CONTROL_PORT, IGNORED_OUTBOUND_PORT, INJECTOR_FLAGS, PLAIN_PORT, PROXY_VERSION,
};
use redirector_tests::linkerd::validator;
use redirector_tests::linkerd::validator::Addrs;
use redirector_tests::prelude::*;

/// The annotation istio's injector sets on every pod it injected a sidecar into.
const STATUS: &str = "sidecar.istio.io/status";

/// The network configuration for a pod the injector marked, with `annotations` besides.
fn conf(root: &Path, state: &Path, annotations: Value) -> Value {
    let mut annotations = annotations;
    annotations[STATUS] = json!("{}");
    conf_for(root, state, annotations)
}

/// The network configuration (CNI 1.0.0, the default selection) for a pod with exactly
/// `annotations`.
fn conf_for(root: &Path, state: &Path, annotations: Value) -> Value {
    json!({
        "cniVersion": "1.0.0",
        "name": "pods",
        "type": "redirector-cni",
        "socket": state.join("redirector.sock"),
        "pinRoot": root,
        "stateDir": state,
        "args": STANDARD_INJECTION,
        "runtimeConfig": { "io.kubernetes.cri.pod-annotations": annotations },
        "prevResult": {
            "cniVersion": "1.0.0",
            "interfaces": [{"name": "eth0", "sandbox": "/var/run/netns/x"}],
            "ips": [{"address": "10.1.2.3/24", "interface": 0}]
        }
    })
}

/// A CNI 0.3.1 network configuration, as flannel, Calico and kindnet write them, for a pod
/// with exactly `annotations`, with a 0.3.1-shaped prevResult (`ips[].version`), and no
/// daemon socket.
fn conf_031(root: &Path, state: &Path, annotations: Value) -> Value {
    let mut conf = conf_for(root, state, annotations);
    conf.as_object_mut().unwrap().remove("socket");
    conf["name"] = json!("k8s-pod-network");
    conf["cniVersion"] = json!("0.3.1");
    conf["prevResult"]["cniVersion"] = json!("0.3.1");
    conf["prevResult"]["ips"][0]["version"] = json!("4");
    conf
}

/// A CNI 1.1 GC call's configuration for which the runtime knows no container.
fn gc_conf(root: &PinRoot, state: &Path) -> Value {
    gc_of(root, state, "k8s-pod-network", &[])
}

/// A CNI 1.1 GC call's configuration of network `name`, whose live containers are `valid`.
fn gc_of(root: &PinRoot, state: &Path, name: &str, valid: &[&str]) -> Value {
    let valid: Vec<Value> = valid
        .iter()
        .map(|id| json!({"containerID": id, "ifname": "eth0"}))
        .collect();
    json!({
        "cniVersion": "1.1.0",
        "name": name,
        "type": "redirector-cni",
        "pinRoot": root.path(),
        "stateDir": state,
        "cni.dev/valid-attachments": valid,
    })
}

/// What the state directory holds (the pods' records, every file under it), as text to
/// search.
fn recorded(state: &Path) -> String {
    pins_under(state)
        .iter()
        .map(|file| std::fs::read_to_string(file).unwrap_or_default())
        .collect()
}

#[test]
fn plugin_speaks_cni_version_and_errors() {
    let plugin = CniPlugin::new();
    let version = succeeded(plugin.raw("VERSION", "{}"));
    assert_eq!(version["cniVersion"], "1.1.0");
    assert_eq!(
        version["supportedVersions"],
        json!(["0.3.0", "0.3.1", "0.4.0", "1.0.0", "1.1.0"]),
        "{version}"
    );
    // Asked in the version a runtime's conflist names, VERSION answers in it.
    let version = succeeded(plugin.raw("VERSION", r#"{"cniVersion":"0.3.1"}"#));
    assert_eq!(version["cniVersion"], "0.3.1", "{version}");
    let err = failed(plugin.raw("ADD", "{not json"));
    assert_eq!(err["code"], 6, "{err}");
    let err = failed(plugin.raw(
        "EXPLODE",
        r#"{"cniVersion":"1.0.0","type":"redirector-cni"}"#,
    ));
    assert_eq!(err["code"], 4, "{err}");
    let err = failed(plugin.raw("ADD", r#"{"cniVersion":"9.9.9","type":"redirector-cni"}"#));
    assert_eq!(err["code"], 1, "{err}");
}

#[test]
fn add_captures_before_the_pod_runs_and_del_is_idempotent() {
    privileged!();
    let plugin = CniPlugin::new();
    let TestNode { root, node, state } = TestNode::new("cni");

    // Nothing pinned yet (no daemon has run): ADD says "try again later", STATUS 50.
    let pod = ProxiedPod::under(&node, "cnipod");
    let netns = pod.topo.pod.path().display().to_string();
    let conf = conf(root.path(), state.path(), json!({}));
    let err = failed(plugin.call("ADD", "c1", &netns, &conf));
    assert_eq!(err["code"], 11, "{err}");
    let err = failed(plugin.call("STATUS", "", "", &conf));
    assert_eq!(err["code"], 50, "{err}");

    // A daemon runs once (pins the node's programs), then is killed: ADD needs no daemon.
    Daemon::start(&root, &node, &state).kill();
    succeeded(plugin.call("STATUS", "", "", &conf));
    let result = succeeded(plugin.call("ADD", "c1", &netns, &conf));
    assert_eq!(
        result, conf["prevResult"],
        "prevResult passed through unchanged"
    );
    let dst = pod.service(false);
    assert_proxied(&pod.connect(APP_UID, APP_UID, dst), dst);
    succeeded(plugin.call("CHECK", "c1", &netns, &conf));

    // A daemon started now lists the pod the plugin set up.
    let daemon = Daemon::start(&root, &node, &state);
    assert_eq!(daemon.pods()[0]["name"], "default/web");

    // DEL: the pod is released; again with no netns (containerd's second DEL): fine.
    succeeded(plugin.call("DEL", "c1", &netns, &conf));
    assert_direct(&pod.connect(APP_UID, APP_UID, dst), dst);
    assert_eq!(pod_links(&root, pod.topo.pod.cookie()), None);
    succeeded(plugin.call("DEL", "c1", "", &conf));
    succeeded(plugin.call("DEL", "unknown", "", &conf));
    assert!(daemon.pods().is_empty());

    // Annotations: opted out, nothing installed; a port excluded, that port passes.
    let opted_out = self::conf(
        root.path(),
        state.path(),
        json!({"sidecar.istio.io/inject": "false"}),
    );
    succeeded(plugin.call("ADD", "c2", &netns, &opted_out));
    assert_eq!(pod_links(&root, pod.topo.pod.cookie()), None);
    assert_direct(&pod.connect(APP_UID, APP_UID, dst), dst);
    let excluded = self::conf(
        root.path(),
        state.path(),
        json!({"traffic.sidecar.istio.io/excludeOutboundPorts": dst.port().to_string()}),
    );
    succeeded(plugin.call("ADD", "c3", &netns, &excluded));
    assert_direct(&pod.connect(APP_UID, APP_UID, dst), dst);
    pod.assert_app_direct(true);
    succeeded(plugin.call("DEL", "c3", &netns, &excluded));

    // A missing namespace is an error naming it; a bad flag in the network's args too.
    let err = failed(plugin.call("ADD", "c4", "/run/netns/rdt-missing", &conf));
    assert_contains(err["msg"].as_str().unwrap(), "rdt-missing");
    let mut bad = conf.clone();
    bad["args"] = json!(["-p", "70000"]);
    let err = failed(plugin.call("ADD", "c5", &netns, &bad));
    assert_eq!(err["code"], 7, "{err}");
    assert!(err["msg"].as_str().unwrap().contains("70000"), "{err}");
}

/// The pods a node just rebooted (nothing pinned, no daemon yet) sees through a CNI 0.3.1
/// network: every pod the plugin leaves alone starts, a meshed one is held back (code 11)
/// in the network's version, and DEL, GC and STATUS answer as they should.
fn start_with_nothing_pinned(plugin: &CniPlugin, root: &PinRoot, state: &Path, netns: &str) {
    let of = |annotations| conf_031(root.path(), state, annotations);
    let unannotated = of(json!({}));
    let opted_out = of(json!({ STATUS: "{}", "sidecar.istio.io/inject": "false" }));
    // The kube-system pod is marked as the meshed one is: its namespace leaves it alone.
    let injected = of(json!({ STATUS: "{}" }));

    let started = [
        ("default", "plain-pod", &unannotated),
        ("kube-system", "system-pod", &injected),
        ("default", "optout-pod", &opted_out),
    ];
    for (namespace, id, conf) in started {
        let (ok, result) = plugin.call_in(namespace, "ADD", id, netns, conf);
        assert!(ok, "{id} starts: {result}");
        assert_eq!(result, conf["prevResult"], "prevResult passed on");
        assert_eq!(result["cniVersion"], "0.3.1");
    }

    let (ok, err) = plugin.call("ADD", "meshed-pod", netns, &injected);
    assert!(!ok, "a meshed pod must not start uncaptured: {err}");
    assert_eq!(err["code"], 11, "{err}");
    assert_eq!(err["cniVersion"], "0.3.1", "{err}");
    assert_contains(err["msg"].as_str().unwrap(), "nothing is pinned");

    // Nothing was installed or recorded for any of them.
    assert_eq!(pins_under(root.path()), Vec::<PathBuf>::new());
    let records = recorded(state);
    for (_, id, conf) in started
        .into_iter()
        .chain([("default", "meshed-pod", &injected)])
    {
        assert!(!records.contains(id), "{id} recorded: {records}");
        let (ok, err) = plugin.call("DEL", id, netns, conf);
        assert!(ok, "DEL {id}: {err}");
        let (ok, err) = plugin.call("DEL", id, "", conf);
        assert!(ok, "second DEL {id}: {err}");
    }
    let (ok, err) = plugin.call("GC", "", "", &gc_conf(root, state));
    assert!(ok, "GC: {err}");
    let err = failed(plugin.call("STATUS", "", "", &unannotated));
    assert_eq!(err["code"], 50, "{err}");
    assert_eq!(err["cniVersion"], "0.3.1", "{err}");
}

#[test]
fn a_node_with_nothing_pinned_starts_every_pod_it_leaves_alone() {
    privileged!();
    let plugin = CniPlugin::new();
    let TestNode { root, node, state } = TestNode::new("cniboot");
    let pod = ProxiedPod::under(&node, "bootpod");
    let netns = pod.topo.pod.path().display().to_string();
    let dst = pod.service(false);

    // A rebooted node: no pin root at all; then one made (bpffs mounted, the directory
    // created) with nothing in it.
    assert!(!root.path().exists());
    start_with_nothing_pinned(&plugin, &root, state.path(), &netns);
    std::fs::create_dir(root.path()).unwrap();
    start_with_nothing_pinned(&plugin, &root, state.path(), &netns);
    assert_direct(&pod.connect(APP_UID, APP_UID, dst), dst);

    // A daemon runs (pins the node's programs): the meshed pod kubelet retries now starts
    // captured; the pods left alone stay so with the programs there.
    Daemon::start(&root, &node, &state).kill();
    let of = |annotations| conf_031(root.path(), state.path(), annotations);
    let injected = of(json!({ STATUS: "{}" }));
    let result = succeeded(plugin.call("ADD", "meshed-pod", &netns, &injected));
    assert_eq!(result, injected["prevResult"]);
    assert_eq!(result["cniVersion"], "0.3.1");
    assert_proxied(&pod.connect(APP_UID, APP_UID, dst), dst);
    assert!(recorded(state.path()).contains("meshed-pod"));
    succeeded(plugin.call("DEL", "meshed-pod", &netns, &injected));
    assert_direct(&pod.connect(APP_UID, APP_UID, dst), dst);
    assert_eq!(pod_links(&root, pod.topo.pod.cookie()), None);

    let unannotated = of(json!({}));
    succeeded(plugin.call("ADD", "plain-pod", &netns, &unannotated));
    assert_direct(&pod.connect(APP_UID, APP_UID, dst), dst);
    succeeded(plugin.call_in("kube-system", "ADD", "system-pod", &netns, &injected));
    assert_direct(&pod.connect(APP_UID, APP_UID, dst), dst);
    assert_eq!(pod_links(&root, pod.topo.pod.cookie()), None);

    // The selection switched off explicitly: a pod with no annotation is captured, in
    // default and in kube-system alike.
    let mut open = of(json!({}));
    open["requireSidecarStatus"] = json!(false);
    open["excludeNamespaces"] = json!([]);
    for namespace in ["default", "kube-system"] {
        let (ok, result) = plugin.call_in(namespace, "ADD", "open-pod", &netns, &open);
        assert!(ok, "{namespace}: {result}");
        assert_proxied(&pod.connect(APP_UID, APP_UID, dst), dst);
        let (ok, err) = plugin.call_in(namespace, "DEL", "open-pod", &netns, &open);
        assert!(ok, "{namespace}: {err}");
        assert_direct(&pod.connect(APP_UID, APP_UID, dst), dst);
    }

    // An uninstall done half-way: a captured pod's record is left, the pins are gone.
    // DEL, and GC for a container the runtime no longer has, still succeed and take the
    // record; pods left alone still start.
    for command in ["DEL", "GC"] {
        Daemon::start(&root, &node, &state).kill();
        succeeded(plugin.call("ADD", "half-done", &netns, &injected));
        std::fs::remove_dir_all(root.path()).unwrap();
        assert!(recorded(state.path()).contains("half-done"));
        let (ok, err) = match command {
            "DEL" => plugin.call("DEL", "half-done", &netns, &injected),
            _ => plugin.call("GC", "", "", &gc_conf(&root, state.path())),
        };
        assert!(ok, "{command} with the pins gone: {err}");
        assert!(
            !recorded(state.path()).contains("half-done"),
            "{command} left the record"
        );
    }
    succeeded(plugin.call("ADD", "plain-pod", &netns, &unannotated));
    assert_direct(&pod.connect(APP_UID, APP_UID, dst), dst);
}

/// A DEL for a container the plugin has no record of names a namespace that another pod
/// was set up in (a `/proc/<pid>/ns/net` path whose pid was reused): that pod stays.
#[test]
fn a_del_with_no_record_leaves_another_containers_pod_alone() {
    privileged!();
    let plugin = &CniPlugin::new();
    let TestNode { root, node, state } = &TestNode::pinned("cnidel");
    let pod = ProxiedPod::under(node, "delpod");
    let netns = pod.topo.pod.path().display().to_string();
    let dst = pod.service(false);
    let conf = conf(root.path(), state.path(), json!({}));
    succeeded(plugin.call("ADD", "owner-ctr", &netns, &conf));

    succeeded(plugin.call("DEL", "reused-pid-ctr", &netns, &conf));
    assert_proxied(&pod.connect(APP_UID, APP_UID, dst), dst);
    assert!(pod_links(root, pod.topo.pod.cookie()).is_some());
    assert!(recorded(state.path()).contains("owner-ctr"));

    // The owner's own DEL removes it.
    succeeded(plugin.call("DEL", "owner-ctr", &netns, &conf));
    assert_direct(&pod.connect(APP_UID, APP_UID, dst), dst);
    assert_eq!(pod_links(root, pod.topo.pod.cookie()), None);
}

/// Removes the network name from the record of `container`, as a release before records
/// carried one wrote it.
fn forget_network(state: &Path, container: &str) {
    for shard in pins_under(state) {
        let text = std::fs::read_to_string(&shard).unwrap();
        let Ok(Value::Array(mut records)) = serde_json::from_str::<Value>(&text) else {
            continue;
        };
        for record in &mut records {
            if record["container_id"] == container {
                record.as_object_mut().unwrap().remove("network");
                std::fs::write(&shard, Value::Array(records).to_string()).unwrap();
                return;
            }
        }
    }
    panic!("no record of {container} under {}", state.display());
}

/// Two networks chain the plugin: GC of one removes only its own pods whose containers
/// the runtime no longer lists, and a record with no network only once its namespace is
/// gone.
#[test]
fn gc_of_one_network_leaves_another_networks_pods() {
    privileged!();
    let plugin = &CniPlugin::new();
    let TestNode { root, node, state } = &TestNode::pinned("cnigc");
    let first = conf(root.path(), state.path(), json!({}));
    let mut second = first.clone();
    second["name"] = json!("secondary");
    let pods: Vec<(&str, &Value, ProxiedPod)> = [
        ("a1-ctr", &first),
        ("a2-ctr", &first),
        ("b1-ctr", &second),
        ("legacy-ctr", &first),
    ]
    .into_iter()
    .map(|(id, conf)| (id, conf, ProxiedPod::under(node, id)))
    .collect();
    for (id, conf, pod) in &pods {
        let netns = pod.topo.pod.path().display().to_string();
        let (ok, result) = plugin.call("ADD", id, &netns, conf);
        assert!(ok, "{id}: {result}");
    }
    forget_network(state.path(), "legacy-ctr");
    let captured = |id: &str, yes: bool| {
        let (_, _, pod) = pods.iter().find(|(i, _, _)| *i == id).unwrap();
        let dst = pod.service(false);
        let outcome = pod.connect(APP_UID, APP_UID, dst);
        if yes {
            assert_proxied(&outcome, dst);
            assert!(recorded(state.path()).contains(id), "{id}'s record");
        } else {
            assert_direct(&outcome, dst);
            assert_eq!(pod_links(root, pod.topo.pod.cookie()), None, "{id}");
            assert!(!recorded(state.path()).contains(id), "{id}'s record");
        }
    };

    let gc = |network, valid| {
        succeeded(plugin.call("GC", "", "", &gc_of(root, state.path(), network, valid)))
    };
    // The second network's GC knows only its own container: the first's pods stay.
    gc("secondary", &["b1-ctr"]);
    for id in ["a1-ctr", "a2-ctr", "b1-ctr", "legacy-ctr"] {
        captured(id, true);
    }

    // The first network's GC without a2: exactly a2 goes; the legacy record's namespace
    // is alive, so it stays.
    gc("pods", &["a1-ctr"]);
    captured("a2-ctr", false);
    for id in ["a1-ctr", "b1-ctr", "legacy-ctr"] {
        captured(id, true);
    }

    // Once the legacy pod's namespace is gone, its record goes with the next GC.
    let mut pods = pods;
    let legacy = pods.pop().unwrap();
    drop(legacy);
    gc("pods", &["a1-ctr"]);
    assert!(!recorded(state.path()).contains("legacy-ctr"));
    for (id, _, pod) in pods.iter().filter(|(id, _, _)| *id != "a2-ctr") {
        pod.assert_app_proxied(false);
        assert!(recorded(state.path()).contains(id));
    }
}

/// A node a newer release upgraded: its pinned programs read a newer format of entries, or
/// the pod's record shard holds a newer release's records. This (older) plugin refuses
/// with code 11 naming both formats — the runtime retries until the node's plugin is the
/// newer release's — and writes nothing.
#[test]
fn an_older_plugin_never_writes_for_a_newer_format() {
    privileged!();
    let plugin = &CniPlugin::new();
    let TestNode { root, node, state } = &TestNode::pinned("cniskew");
    let pod = ProxiedPod::under(node, "skewpod");
    let netns = pod.topo.pod.path().display().to_string();
    let dst = pod.service(false);
    let conf = conf(root.path(), state.path(), json!({}));
    let newer = redirector_common::FORMAT + 1;
    let (ours, theirs) = (
        format!("format {}", redirector_common::FORMAT),
        format!("format {newer}"),
    );

    // The pinned object is marked with a newer format, as a newer release pins it.
    let object = root.path().join("objects").join(&object_ids(root)[0]);
    let marker = object.join(format!("format-{newer}"));
    std::fs::create_dir(&marker).unwrap();
    let err = failed(plugin.call("ADD", "skew-ctr", &netns, &conf));
    assert_eq!(err["code"], 11, "{err}");
    let msg = err["msg"].as_str().unwrap();
    assert!(msg.contains(&ours) && msg.contains(&theirs), "{msg}");
    assert_eq!(pod_links(root, pod.topo.pod.cookie()), None);
    assert!(!recorded(state.path()).contains("skew-ctr"));
    assert_direct(&pod.connect(APP_UID, APP_UID, dst), dst);
    std::fs::remove_dir(&marker).unwrap();

    // The pod's record shard holds a newer release's record (a rollback).
    let cookie = pod.topo.pod.cookie();
    let shard = state
        .path()
        .join("pods")
        .join(format!("shard-{:02}.json", cookie % 64));
    std::fs::create_dir_all(shard.parent().unwrap()).unwrap();
    let written = json!([{
        "netns_cookie": cookie + 64,
        "netns": "/run/netns/elsewhere",
        "name": "default/newer",
        "args": [],
        "format": newer,
        "a_field_this_release_does_not_know": true,
    }])
    .to_string();
    std::fs::write(&shard, &written).unwrap();
    let err = failed(plugin.call("ADD", "skew-ctr", &netns, &conf));
    assert_eq!(err["code"], 11, "{err}");
    let msg = err["msg"].as_str().unwrap();
    assert!(msg.contains(&ours) && msg.contains(&theirs), "{msg}");
    assert_eq!(
        std::fs::read_to_string(&shard).unwrap(),
        written,
        "the newer record kept"
    );
    assert_eq!(pod_links(root, cookie), None);
    std::fs::remove_file(&shard).unwrap();

    // Formats this release writes: captured, the record marked with its format.
    succeeded(plugin.call("ADD", "skew-ctr", &netns, &conf));
    assert_proxied(&pod.connect(APP_UID, APP_UID, dst), dst);
    let records = recorded(state.path());
    assert_contains(
        &records,
        format!("\"format\":{}", redirector_common::FORMAT),
    );
}

/// kubelet makes a pod's cgroup before it asks for the sandbox and passes the pod's UID:
/// ADD attaches the programs there, at no other pod's cgroup and not at the node's.
#[test]
fn add_attaches_the_programs_at_the_cgroup_of_the_pods_uid() {
    privileged!();
    let (node, plugin) = (TestNode::pinned("cniuid"), CniPlugin::new());
    let uid = "8c1f2a6e-93d4-4b7a-a0c2-5e6f7a8b9c0d";
    // The cgroupfs driver's layout for a Burstable pod.
    let qos = Cgroup::named_under(&node.node, "burstable");
    let pod_cgroup = Cgroup::named_under(&qos, &format!("pod{uid}"));
    // Its containers (the proxy, the app) run below it.
    let pod = ProxiedPod::under(&pod_cgroup, "cniuidpod");
    let netns = pod.topo.pod.path().display().to_string();
    let conf = conf(node.root.path(), node.state.path(), json!({}));
    let args = format!("K8S_POD_NAMESPACE=default;K8S_POD_NAME=web;K8S_POD_UID={uid}");
    succeeded(plugin.call_with_args(&args, "ADD", "uid-pod", &netns, &conf));
    // The six TCP ones: this pod's DNS is not captured, so no UDP program.
    let attached = cgroup_attachments(pod_cgroup.path());
    assert_eq!(attached.len(), 6, "{attached:?}");
    assert!(
        cgroup_attachments(node.node.path()).is_empty(),
        "nothing at the node cgroup"
    );
    assert!(
        recorded(node.state.path()).contains(&pod_cgroup.path().display().to_string()),
        "the record names the cgroup"
    );
    let dst = pod.service(false);
    assert_proxied(&pod.connect(APP_UID, APP_UID, dst), dst);
    // A process of the pod's namespace in another cgroup (another pod's) is not captured.
    let elsewhere = Cgroup::under(&node.node, "cniuidother");
    let from_elsewhere = connect_from(&pod.topo, Some(&elsewhere), APP_UID, APP_UID, dst, None);
    assert_direct(&from_elsewhere, dst);
    succeeded(plugin.call_with_args(&args, "DEL", "uid-pod", &netns, &conf));
    assert!(cgroup_attachments(pod_cgroup.path()).is_empty());
    assert_direct(&pod.connect(APP_UID, APP_UID, dst), dst);
}

/// A Linkerd network's configuration (`"dialect": "linkerd"`, the injector's proxy-init
/// flags as `args`, CNI 1.0.0) for a pod with exactly `annotations`.
fn linkerd_conf(root: &Path, state: &Path, annotations: Value) -> Value {
    let mut conf = conf_for(root, state, annotations);
    conf["dialect"] = json!("linkerd");
    conf["args"] = json!(INJECTOR_FLAGS);
    conf
}

/// [`linkerd_conf`] for a pod Linkerd's injector marked (`linkerd.io/proxy-version`), with
/// `annotations` besides.
fn linkerd_injected(root: &Path, state: &Path, annotations: Value) -> Value {
    let mut annotations = annotations;
    annotations[PROXY_VERSION] = json!(A_PROXY_VERSION);
    linkerd_conf(root, state, annotations)
}

/// A Linkerd network (`"dialect": "linkerd"`) captures a pod only when Linkerd's injector
/// marked it, and then as proxy-init's flags say: the app's connection lands on 4140 with
/// its original destination; the proxy's uid, ignored ports, local destinations and (with
/// `--ipv6=false`) IPv6 go direct; inbound lands on 4143 except ignored ports. Every other
/// pod starts and is left alone, with nothing pinned as with the programs there; DEL
/// releases the captured one.
#[test]
fn a_linkerd_network_captures_linkerd_pods_with_proxy_inits_ports_and_exemptions() {
    privileged!();
    let plugin = CniPlugin::new();
    let TestNode { root, node, state } = TestNode::new("cnilk");
    let pod = MeshedPod::under(&node, "cnilkpod");
    let netns = pod.netns_path();
    let cookie = pod.topo.pod.cookie();
    let svc = pod.peer(false, 80);

    // Pods Linkerd did not inject (no annotation, istio's only, an empty proxy version)
    // and an injected one of an excluded namespace.
    let of = |annotations| linkerd_conf(root.path(), state.path(), annotations);
    let injected = linkerd_injected(root.path(), state.path(), json!({}));
    let left_alone = [
        ("default", "plain-pod", of(json!({}))),
        ("default", "istio-pod", of(json!({ STATUS: "{}" }))),
        (
            "default",
            "no-version-pod",
            of(json!({ PROXY_VERSION: "" })),
        ),
        ("kube-system", "system-pod", injected.clone()),
    ];

    // Nothing pinned (a rebooted node, no daemon yet): those pods start, untouched; the
    // injected one is held back (code 11) rather than started uncaptured.
    assert!(!root.path().exists());
    for (namespace, id, conf) in &left_alone {
        let (ok, result) = plugin.call_in(namespace, "ADD", id, &netns, conf);
        assert!(
            ok,
            "{namespace}/{id} must start with nothing pinned: {result}"
        );
        assert_eq!(result, conf["prevResult"], "{id}: prevResult passed on");
    }
    let (ok, err) = plugin.call("ADD", "linkerd-pod", &netns, &injected);
    assert!(!ok, "an injected pod must not start uncaptured: {err}");
    assert_eq!(err["code"], 11, "{err}");
    assert_eq!(pins_under(root.path()), Vec::<PathBuf>::new());
    let records = recorded(state.path());
    for id in left_alone
        .iter()
        .map(|(_, id, _)| *id)
        .chain(["linkerd-pod"])
    {
        assert!(
            !records.contains(id),
            "{id} recorded with nothing pinned: {records}"
        );
    }
    assert_peer(&pod.connect(APP_UID, svc), svc);

    // A daemon runs once (pins the node's programs): the same pods are still left alone.
    Daemon::start(&root, &node, &state).kill();
    for (namespace, id, conf) in &left_alone {
        let (ok, result) = plugin.call_in(namespace, "ADD", id, &netns, conf);
        assert!(ok, "{namespace}/{id}: {result}");
        assert_eq!(result, conf["prevResult"], "{id}: prevResult passed on");
        assert_eq!(pod_links(&root, cookie), None, "{namespace}/{id} captured");
        assert_peer(&pod.connect(APP_UID, svc), svc);
        assert!(!recorded(state.path()).contains(id), "{id} recorded");
        let (ok, err) = plugin.call_in(namespace, "DEL", id, &netns, conf);
        assert!(ok, "DEL {id}: {err}");
    }

    // The injected pod: captured, with the network's proxy-init flags.
    let result = succeeded(plugin.call("ADD", "linkerd-pod", &netns, &injected));
    assert_eq!(result, injected["prevResult"], "prevResult passed on");
    assert!(recorded(state.path()).contains("linkerd-pod"));
    // Outbound: an ordinary uid's connection (and root's: only uid 2102 is exempt) lands on
    // 4140 with its original destination.
    assert_outbound(&pod.connect(APP_UID, svc), svc);
    assert_outbound(&pod.connect(0, svc), svc);
    let plain = pod.peer(false, PLAIN_PORT);
    assert_outbound(&pod.connect(APP_UID, plain), plain);
    // The proxy's uid, an ignored outbound port, every local destination, and IPv6
    // (--ipv6=false) go direct.
    assert_peer(&pod.connect(LINKERD_PROXY_UID, svc), svc);
    let ignored = pod.peer(false, IGNORED_OUTBOUND_PORT);
    assert_peer(&pod.connect(APP_UID, ignored), ignored);
    for local in [
        SocketAddr::new(Ipv4Addr::LOCALHOST.into(), PLAIN_PORT),
        pod.pod_addr(false, PLAIN_PORT),
    ] {
        assert_app(&pod.connect(APP_UID, local), local);
    }
    let svc6 = pod.peer(true, 80);
    assert_peer(&pod.connect(APP_UID, svc6), svc6);
    // Inbound: to 4143 with the pod's address as the original destination, except an
    // ignored inbound port (the proxy's control port).
    let app = pod.pod_addr(false, PLAIN_PORT);
    assert_inbound(&pod.connect_from_peer(app), app);
    let control = pod.pod_addr(false, CONTROL_PORT);
    assert_app(&pod.connect_from_peer(control), control);
    let (ok, err) = plugin.call("CHECK", "linkerd-pod", &netns, &injected);
    assert!(ok, "CHECK: {err}");

    // DEL releases it; again with no netns (containerd's second DEL): fine.
    succeeded(plugin.call("DEL", "linkerd-pod", &netns, &injected));
    assert_eq!(pod_links(&root, cookie), None);
    assert!(!recorded(state.path()).contains("linkerd-pod"));
    assert_peer(&pod.connect(APP_UID, svc), svc);
    assert_app(&pod.connect_from_peer(app), app);
    let (ok, err) = plugin.call("DEL", "linkerd-pod", "", &injected);
    assert!(ok, "second DEL: {err}");
}

/// ADD of `id` in `namespace` with `conf` into `pod`, then `check` while it is captured,
/// then DEL, after which nothing of it is left.
fn while_added(
    (node, plugin): (&TestNode, &CniPlugin),
    pod: &MeshedPod,
    (namespace, id): (&str, &str),
    conf: &Value,
    check: impl FnOnce(),
) {
    let netns = pod.netns_path();
    let (ok, result) = plugin.call_in(namespace, "ADD", id, &netns, conf);
    assert!(ok, "ADD {namespace}/{id}: {result}");
    check();
    let (ok, err) = plugin.call_in(namespace, "DEL", id, &netns, conf);
    assert!(ok, "DEL {namespace}/{id}: {err}");
    assert_eq!(pod_links(&node.root, pod.topo.pod.cookie()), None);
}

/// Linkerd's pod annotations override the network's flags as linkerd-cni applies them:
/// `skip-outbound-ports` replaces the list (an empty one counts as absent),
/// `skip-inbound-ports` is appended, `proxy-uid` and `outbound-port` replace; pods of the
/// control plane's namespace also skip the API server's ports; linkerd-cni's own settings
/// object works as `args` do; a `proxy-uid` or `proxy-gid` that does not parse fails ADD
/// naming the annotation, and sets nothing up.
#[test]
fn linkerd_annotations_override_the_networks_flags() {
    privileged!();
    let (node, plugin) = (TestNode::pinned("cnilkann"), CniPlugin::new());
    let pod = MeshedPod::under(&node.node, "cnilkann");
    let (root, state) = (node.root.path(), node.state.path());
    let svc = pod.peer(false, 80);
    let plain = pod.peer(false, PLAIN_PORT);
    let ignored = pod.peer(false, IGNORED_OUTBOUND_PORT);
    let default_pod = ("default", "ann-pod");
    let injected = |annotations: Value| linkerd_injected(root, state, annotations);

    // skip-outbound-ports replaces the network's list: 80 and 8080 direct, 4567 captured.
    let skip = injected(json!({"config.linkerd.io/skip-outbound-ports": "80,8080"}));
    while_added((&node, &plugin), &pod, default_pod, &skip, || {
        assert_peer(&pod.connect(APP_UID, svc), svc);
        assert_peer(&pod.connect(APP_UID, plain), plain);
        assert_outbound(&pod.connect(APP_UID, ignored), ignored);
    });
    // An empty annotation counts as absent: the network's list holds.
    let empty = injected(json!({"config.linkerd.io/skip-outbound-ports": ""}));
    while_added((&node, &plugin), &pod, default_pod, &empty, || {
        assert_outbound(&pod.connect(APP_UID, svc), svc);
        assert_peer(&pod.connect(APP_UID, ignored), ignored);
    });

    // skip-inbound-ports is appended to the network's list: 5000 and the control port
    // direct, 8080 still to 4143.
    let skip_in = injected(json!({"config.linkerd.io/skip-inbound-ports": "5000"}));
    while_added((&node, &plugin), &pod, default_pod, &skip_in, || {
        for port in [5000, CONTROL_PORT] {
            let dst = pod.pod_addr(false, port);
            assert_app(&pod.connect_from_peer(dst), dst);
        }
        let app = pod.pod_addr(false, PLAIN_PORT);
        assert_inbound(&pod.connect_from_peer(app), app);
    });

    // proxy-uid replaces the exempt uid: 3000's connections go direct, 2102's are captured.
    let uid = injected(json!({"config.linkerd.io/proxy-uid": "3000"}));
    while_added((&node, &plugin), &pod, default_pod, &uid, || {
        assert_peer(&pod.connect(3000, svc), svc);
        assert_outbound(&pod.connect(LINKERD_PROXY_UID, svc), svc);
    });

    // outbound-port replaces the outgoing port: sent to 4143 instead, where the inbound
    // listener reads the original destination.
    let port = injected(json!({"config.linkerd.io/outbound-port": "4143"}));
    while_added((&node, &plugin), &pod, default_pod, &port, || {
        assert_inbound(&pod.connect(APP_UID, svc), svc);
    });

    // The control plane's namespace (`linkerd`) also skips 443 and 6443; others do not.
    let marked = injected(json!({}));
    while_added(
        (&node, &plugin),
        &pod,
        ("linkerd", "ctl-pod"),
        &marked,
        || {
            for port in [443, 6443] {
                let api = pod.peer(false, port);
                assert_peer(&pod.connect(APP_UID, api), api);
            }
            assert_outbound(&pod.connect(APP_UID, svc), svc);
        },
    );
    while_added((&node, &plugin), &pod, default_pod, &marked, || {
        let api = pod.peer(false, 443);
        assert_outbound(&pod.connect(APP_UID, api), api);
    });

    // linkerd-cni's settings object instead of `args`, as its installer writes it.
    let mut settings = injected(json!({}));
    settings.as_object_mut().unwrap().remove("args");
    settings["linkerd"] = json!({
        "incoming-proxy-port": 4143,
        "outgoing-proxy-port": 4140,
        "proxy-uid": 2102,
        "inbound-ports-to-ignore": ["4190", "4191", "4567", "4568"],
        "outbound-ports-to-ignore": ["4567", "4568"],
        "ipv6": false,
    });
    while_added((&node, &plugin), &pod, default_pod, &settings, || {
        assert_outbound(&pod.connect(APP_UID, svc), svc);
        assert_peer(&pod.connect(LINKERD_PROXY_UID, svc), svc);
        assert_peer(&pod.connect(APP_UID, ignored), ignored);
        let app = pod.pod_addr(false, PLAIN_PORT);
        assert_inbound(&pod.connect_from_peer(app), app);
        let control = pod.pod_addr(false, CONTROL_PORT);
        assert_app(&pod.connect_from_peer(control), control);
    });

    // A proxy uid or gid that does not parse: ADD fails naming the annotation; nothing is
    // set up or recorded.
    let netns = pod.netns_path();
    for annotation in ["config.linkerd.io/proxy-uid", "config.linkerd.io/proxy-gid"] {
        let bad = injected(json!({ annotation: "not-a-number" }));
        let (ok, err) = plugin.call("ADD", "bad-pod", &netns, &bad);
        assert!(!ok, "{annotation}: ADD must fail: {err}");
        assert_eq!(err["code"], 7, "{err}");
        let msg = err["msg"].as_str().unwrap_or_default();
        assert!(
            msg.contains(annotation),
            "the message names {annotation}: {err}"
        );
        assert_eq!(pod_links(&node.root, pod.topo.pod.cookie()), None);
        assert!(
            !recorded(state).contains("bad-pod"),
            "{annotation}: recorded"
        );
        assert_peer(&pod.connect(APP_UID, svc), svc);
        let (ok, err) = plugin.call("DEL", "bad-pod", &netns, &bad);
        assert!(ok, "DEL after a failed ADD: {err}");
    }
}

/// Linkerd's network validator (docs/linkerd.md#how-linkerd-runs-it) in a pod a Linkerd network
/// captured: as uid 65534, its connection to 1.1.1.1:20001 comes back to its own listener on
/// 0.0.0.0:4140 with its token. Before ADD and after DEL it fails (exit 95). The pod's namespace
/// reaches only the test's peer namespace, which has no route to 1.1.1.1.
#[test]
fn the_network_validator_passes_in_a_pod_a_linkerd_network_captured() {
    privileged!();
    let (node, plugin) = (TestNode::pinned("cnilkval"), CniPlugin::new());
    let topo = Topology::under(&node.node, "cnilkval");
    let netns = topo.pod.path().display().to_string();
    let injected = linkerd_injected(node.root.path(), node.state.path(), json!({}));
    // The sandbox's own process, running before ADD as it does under kubelet: the plugin
    // finds the pod's cgroup by it (a kernel that reads the pod's cookie from its cgroup
    // needs one of its own).
    let _sandbox = Spawn::new("sleep")
        .arg("600")
        .netns(&topo.pod)
        .cgroup(&topo.pod_cgroup)
        .spawn();
    validator::assert_fails(&topo, Addrs::ipv4());
    succeeded(plugin.call("ADD", "validated", &netns, &injected));
    validator::assert_passes(&topo, Addrs::ipv4());
    succeeded(plugin.call("DEL", "validated", &netns, &injected));
    validator::assert_fails(&topo, Addrs::ipv4());
}

/// Not a test: Linkerd's network validator's process (the test binary re-executed with
/// this test selected; see `linkerd::validator`). Run without its environment variable,
/// it returns at once.
#[test]
#[ignore = "a helper process of the validator tests, started by them"]
fn network_validator_process() {
    validator::validate_if_asked();
}
