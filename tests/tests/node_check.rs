//! A node redirector cannot serve, made so three ways on this machine — a kubepods cgroup
//! given that does not exist, a kernel the probes refuse (`REDIRECTOR_FORCE_REFUSAL`), a
//! pin root off bpffs — and what each part does there: `redirector check` says why and
//! exits 1, the daemon pins nothing and stays up not ready with the reason in its metrics
//! and in `redirector status`, install-cni takes its entry out and stays up not ready.
//! And the kubepods cgroup found under either cgroup driver's name.

use std::process::Output;

use redirector_tests::cgroup::cgroup2_root;
use redirector_tests::daemon::http_get;
use redirector_tests::prelude::*;

/// One way to make this node unservable: extra arguments and env for every command, and
/// the reason it must be named by.
struct Unservable {
    reason: &'static str,
    args: Vec<String>,
    env: Vec<(&'static str, &'static str)>,
}

/// The three ways, with `off_bpffs` a directory that is not on bpffs.
fn unservable_nodes(off_bpffs: &Path) -> Vec<Unservable> {
    let gone = cgroup2_root().join(format!("rdt-{}-gone-kubepods", std::process::id()));
    vec![
        Unservable {
            reason: "kubepods_cgroup",
            args: vec![format!("--cgroup={}", gone.display())],
            env: vec![],
        },
        Unservable {
            reason: "kernel",
            args: vec![],
            env: vec![("REDIRECTOR_FORCE_REFUSAL", "sk-lookup")],
        },
        Unservable {
            reason: "bpffs",
            args: vec![format!(
                "--pin-root={}",
                off_bpffs.join("redirector").display()
            )],
            env: vec![],
        },
    ]
}

/// `base` with `node`'s arguments, each replacing a base argument of the same flag.
fn with_node_args(base: &[String], node: &Unservable) -> Vec<String> {
    let flag = |arg: &str| arg.split('=').next().unwrap_or("").to_owned();
    let mut args: Vec<String> = base
        .iter()
        .filter(|a| !node.args.iter().any(|n| flag(n) == flag(a)))
        .cloned()
        .collect();
    args.extend(node.args.iter().cloned());
    args
}

fn check(args: &[String], env: &[(&str, &str)]) -> Output {
    Spawn::new(redirector_bin())
        .arg("check")
        .args(args)
        .envs(env)
        .output()
}

/// `redirector daemon`'s arguments for a node of `root`, `state` and `conf`, its repair off.
fn daemon_args(root: &PinRoot, state: &StateDir, conf: &StateDir) -> Vec<String> {
    vec![
        "daemon".to_owned(),
        format!("--pin-root={}", root.path().display()),
        format!("--state-dir={}", state.path().display()),
        format!("--socket={}", state.path().join("sock").display()),
        format!("--cni-conf-dir={}", conf.path().display()),
        "--repair=off".to_owned(),
    ]
}

#[test]
fn check_passes_here_and_fails_naming_the_reason_on_each_unservable_node() {
    privileged!();
    let root = PinRoot::new("check");
    let conf = StateDir::new("check-conf");
    let off_bpffs = StateDir::new("check-notbpffs");
    let base = vec![
        format!("--pin-root={}", root.path().display()),
        format!("--cni-conf-dir={}", conf.path().display()),
    ];
    let out = check(&base, &[]);
    let text = String::from_utf8_lossy(&out.stdout);
    // Shown with --nocapture: what the check finds on the kernel the suite runs on.
    eprintln!("redirector check on this machine:\n{text}");
    assert!(out.status.success(), "{text}");
    for line in [
        "pass  kernel",
        "pass  cgroup v2",
        "pass  bpffs",
        "pass  CNI configuration",
    ] {
        assert!(text.contains(line), "no {line:?} in:\n{text}");
    }
    assert!(text.ends_with("this node can be served\n"), "{text}");

    for node in unservable_nodes(off_bpffs.path()) {
        let mut args = with_node_args(&base, &node);
        let out = check(&args, &node.env);
        let text = String::from_utf8_lossy(&out.stdout);
        assert_eq!(out.status.code(), Some(1), "{}: {text}", node.reason);
        let verdict = format!("this node cannot be served ({})", node.reason);
        assert!(
            text.lines().last().is_some_and(|l| l.starts_with(&verdict)),
            "{text}"
        );
        assert!(text.contains("FAIL  "), "{text}");

        args.push("--json".into());
        let out = check(&args, &node.env);
        assert_eq!(out.status.code(), Some(1));
        let json: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
        assert_eq!(json["unservable"]["reason"], node.reason, "{json}");
        let failed: Vec<&str> = json["checks"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|c| c["outcome"] == "fail")
            .filter_map(|c| c["fix"].as_str())
            .collect();
        assert!(!failed.is_empty(), "a failure says what to do: {json}");
    }
}

/// A port on loopback nothing listens on now.
fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// GET `path` at `addr` once it answers.
fn get_when_up(child: &mut ChildGuard, addr: &str, path: &str) -> (u16, String) {
    let mut answer = None;
    let served = within(Duration::from_secs(60), || {
        answer = http_get(addr, path).ok();
        let exited = answer.is_none() && child.try_wait().is_some();
        assert!(
            !exited,
            "exited instead of serving {addr}: {}",
            child.stderr()
        );
        answer.is_some()
    });
    assert!(served.is_some(), "{addr} not served: {}", child.stderr());
    answer.unwrap()
}

/// Still running a while after it said why it is not ready: no crash loop.
fn assert_stays_up(child: &mut ChildGuard) {
    std::thread::sleep(Duration::from_secs(2));
    assert!(
        child.try_wait().is_none(),
        "exited on an unservable node: {}",
        child.stderr()
    );
}

/// SIGTERM, and an exit by it: clean, or the signal's own.
fn stop(mut child: ChildGuard) {
    use std::os::unix::process::ExitStatusExt as _;
    let status = child.terminate(Duration::from_secs(30));
    let by_sigterm = status.success() || status.signal() == Some(libc::SIGTERM);
    assert!(by_sigterm, "{status}: {}", child.stderr());
}

#[test]
fn a_daemon_on_a_node_it_cannot_serve_stays_up_not_ready_and_pins_nothing() {
    privileged!();
    let off_bpffs = StateDir::new("daemon-notbpffs");
    for node in unservable_nodes(off_bpffs.path()) {
        let root = PinRoot::new("unservable");
        let state = StateDir::new("unservable-state");
        let conf = StateDir::new("unservable-conf");
        let addr = format!("127.0.0.1:{}", free_port());
        let mut base = daemon_args(&root, &state, &conf);
        base.push(format!("--metrics-addr={addr}"));
        let args = with_node_args(&base, &node);
        let pin_root = node
            .args
            .iter()
            .find_map(|a| a.strip_prefix("--pin-root=").map(PathBuf::from))
            .unwrap_or_else(|| root.path().to_path_buf());
        let mut daemon = Spawn::new(redirector_bin())
            .args(&args)
            .envs(&node.env)
            .spawn();
        let (code, body) = get_when_up(&mut daemon, &addr, "/readyz");
        assert_eq!(code, 503, "{}: {body}", node.reason);
        assert_contains(&body, format!("cannot be served ({})", node.reason));
        assert_eq!(http_get(&addr, "/healthz").unwrap().0, 200);
        let (_, metrics) = http_get(&addr, "/metrics").unwrap();
        let series = format!("redirector_node_unservable{{reason=\"{}\"}} 1", node.reason);
        assert!(metrics.contains(&series), "no {series} in:\n{metrics}");
        assert_stays_up(&mut daemon);
        assert!(
            !pin_root.exists(),
            "{}: pinned under {}",
            node.reason,
            pin_root.display()
        );
        assert!(!state.path().join("sock").exists(), "no API socket");

        let (state_dir, pins) = (state.path().display(), root.path().display());
        let status =
            redirector(&format!("status --state-dir {state_dir} --pin-root {pins}")).output();
        let text = String::from_utf8_lossy(&status.stdout);
        assert!(
            text.starts_with(&format!(
                "node: this node cannot be served ({})",
                node.reason
            )),
            "{text}"
        );
        stop(daemon);
    }
}

/// A conflist of one network, with redirector's entry chained by `install-cni`.
fn chained_conf_dir(conf: &Path, bin: &Path) {
    std::fs::write(
        conf.join("10-net.conflist"),
        r#"{"cniVersion":"1.0.0","name":"net","plugins":[{"type":"bridge"}]}"#,
    )
    .unwrap();
    let (conf_dir, bin_dir) = (conf.display(), bin.display());
    let install = format!("install-cni --conf-dir={conf_dir} --bin-dir={bin_dir}");
    assert_success(&redirector(&install).output());
    assert!(chained(conf), "install-cni chained nothing");
}

fn chained(conf: &Path) -> bool {
    std::fs::read_to_string(conf.join("10-net.conflist"))
        .unwrap()
        .contains("redirector-cni")
}

#[test]
fn install_cni_on_a_node_it_cannot_serve_takes_its_entry_out_and_stays_up_not_ready() {
    privileged!();
    let off_bpffs = StateDir::new("cni-notbpffs");
    for node in unservable_nodes(off_bpffs.path()) {
        let conf = StateDir::new("unservable-cni-conf");
        let bin = StateDir::new("unservable-cni-bin");
        chained_conf_dir(conf.path(), bin.path());
        let addr = format!("127.0.0.1:{}", free_port());
        let mut install = Spawn::new(redirector_bin())
            .args(["install-cni", "--watch"])
            .arg(format!("--conf-dir={}", conf.path().display()))
            .arg(format!("--bin-dir={}", bin.path().display()))
            .arg(format!("--health-addr={addr}"))
            .args(&node.args)
            .envs(&node.env)
            .spawn();
        let (code, body) = get_when_up(&mut install, &addr, "/readyz");
        let out = within(Duration::from_secs(30), || !chained(conf.path()));
        assert!(out.is_some(), "the entry stays: {}", install.stderr());
        // Asked before the verdict (`starting`): ask again until it is given.
        let mut answer = (code, body);
        within(Duration::from_secs(30), || {
            let given = answer.0 == 503 && answer.1.contains("cannot be served");
            if !given {
                answer = http_get(&addr, "/readyz").unwrap();
            }
            given
        });
        let (code, body) = answer;
        assert_eq!(code, 503, "{}: {body}", node.reason);
        assert_contains(&body, format!("cannot be served ({})", node.reason));
        assert_stays_up(&mut install);
        assert!(!chained(conf.path()), "chained again");
        stop(install);
    }
}

#[test]
fn the_daemon_finds_the_kubepods_cgroup_under_either_driver() {
    privileged!();
    assert!(
        std::env::var_os("REDIRECTOR_CGROUP").is_none(),
        "the tests run with REDIRECTOR_CGROUP unset"
    );
    for name in ["kubepods.slice", "kubepods"] {
        let kubepods = Cgroup::named_at_root(name);
        let root = PinRoot::new("kubepods");
        let state = StateDir::new("kubepods-state");
        let conf = StateDir::new("kubepods-conf");
        let daemon = Spawn::new(redirector_bin())
            .args(daemon_args(&root, &state, &conf))
            .spawn();
        let attached = format!(
            "and at {} while a pod relies on it",
            kubepods.path().display()
        );
        let fail = || format!("{name}: no {attached:?} in {}", daemon.stderr());
        let found = within(Duration::from_secs(120), || {
            assert!(!daemon.stderr().contains("ERROR"), "{}", fail());
            daemon.stderr().contains(&attached)
        });
        assert!(found.is_some(), "{}", fail());
        let noted = std::fs::read_to_string(state.path().join("node-cgroup")).unwrap();
        assert_eq!(noted.trim(), kubepods.path().display().to_string());
        stop(daemon);
    }
}

/// `redirector-cni` called as a runtime calls it, for a pod the injector marked, in
/// `netns`: success and the answer's JSON.
fn plugin(command: &str, root: &Path, state: &Path, netns: &Path) -> (bool, serde_json::Value) {
    let conf = serde_json::json!({
        "cniVersion": "1.0.0",
        "name": "pods",
        "type": "redirector-cni",
        "pinRoot": root,
        "stateDir": state,
        "runtimeConfig": {
            "io.kubernetes.cri.pod-annotations": {"sidecar.istio.io/status": "{}"}
        },
        "prevResult": {"cniVersion": "1.0.0", "ips": [{"address": "10.1.2.3/24"}]}
    });
    CniPlugin::new().call(command, "c-unservable", &netns.display().to_string(), &conf)
}

#[test]
fn the_plugin_answers_a_gone_node_cgroup_as_a_node_not_served_yet() {
    privileged!();
    let TestNode { root, node, state } = TestNode::pinned("gonenode");
    // The state directory outlives the daemon's cgroup.
    let gone = node.path().to_path_buf();
    drop(node);
    assert!(!gone.exists());
    let pod = NetNs::new("gonenode");
    let (ok, answer) = plugin("ADD", root.path(), state.path(), &pod.path());
    assert!(!ok);
    assert_eq!(answer["code"], 11, "try again later: {answer}");
    assert_contains(answer["msg"].as_str().unwrap(), "is gone");
    let (ok, answer) = plugin("STATUS", root.path(), state.path(), &pod.path());
    assert!(!ok);
    assert_eq!(answer["code"], 50, "{answer}");
}

#[test]
fn where_the_daemon_found_the_node_unservable_the_plugin_is_ready_and_captures_nothing() {
    privileged!();
    let root = PinRoot::new("markednode");
    let state = StateDir::new("markednode-state");
    let conf = StateDir::new("markednode-conf");
    let gone = cgroup2_root().join(format!("rdt-{}-gone-node", std::process::id()));
    let mut daemon = Spawn::new(redirector_bin())
        .args(daemon_args(&root, &state, &conf))
        .arg(format!("--cgroup={}", gone.display()))
        .spawn();
    let marked = within(Duration::from_secs(60), || {
        assert!(daemon.try_wait().is_none(), "{}", daemon.stderr());
        state.path().join("unservable").exists()
    });
    assert!(marked.is_some(), "no marker: {}", daemon.stderr());
    stop(daemon);
    let pod = NetNs::new("markednode");
    let (ok, answer) = plugin("STATUS", root.path(), state.path(), &pod.path());
    assert!(ok, "STATUS: {answer}");
    let (ok, answer) = plugin("ADD", root.path(), state.path(), &pod.path());
    assert!(ok, "ADD: {answer}");
    assert_eq!(
        answer["ips"][0]["address"], "10.1.2.3/24",
        "passed on: {answer}"
    );
    assert!(!root.path().exists(), "nothing pinned");
    assert!(
        !state.path().join("pods").exists()
            || std::fs::read_dir(state.path().join("pods"))
                .unwrap()
                .next()
                .is_none(),
        "nothing recorded"
    );
}
