//! The installer on real directories: chaining, the watch putting the entry back after a
//! network plugin's rewrite, uninstall restoring the file, files that cannot be edited.

use std::{
    fs,
    os::unix::fs::PermissionsExt,
    sync::atomic::{AtomicBool, Ordering},
    time::{Duration, Instant},
};

use serde_json::Value;
use tempfile::TempDir;

use super::*;

const FLANNEL: &str = include_str!("testdata/flannel.conflist");

struct Node {
    _dir: TempDir,
    installer: Installer,
}

impl Node {
    fn new() -> Self {
        let dir = tempfile::tempdir().unwrap();
        let conf_dir = dir.path().join("net.d");
        let bin_dir = dir.path().join("bin");
        fs::create_dir(&conf_dir).unwrap();
        fs::create_dir(&bin_dir).unwrap();
        let plugin = dir.path().join("redirector");
        fs::write(&plugin, b"\x7fELF plugin").unwrap();
        let entry = Entry {
            dialect: Dialect::Istio,
            args: ["-p", "15001", "-z", "15006"].map(String::from).to_vec(),
            require_sidecar_status: true,
            exclude_namespaces: vec!["kube-system".into()],
            pin_root: None,
            state_dir: None,
            ambient: None,
        };
        Node {
            installer: Installer {
                conf_dir,
                bin_dir,
                plugin,
                entry: entry.to_json(),
            },
            _dir: dir,
        }
    }

    fn write(&self, name: &str, text: &str, mode: u32) {
        let path = self.installer.conf_dir.join(name);
        fs::write(&path, text).unwrap();
        fs::set_permissions(&path, fs::Permissions::from_mode(mode)).unwrap();
    }

    fn read(&self, name: &str) -> Value {
        serde_json::from_slice(&fs::read(self.installer.conf_dir.join(name)).unwrap()).unwrap()
    }

    fn names(&self) -> Vec<String> {
        let mut names: Vec<String> = fs::read_dir(&self.installer.conf_dir)
            .unwrap()
            .map(|e| e.unwrap().file_name().into_string().unwrap())
            .collect();
        names.sort();
        names
    }

    fn chained(&self, name: &str) -> bool {
        let conf = self.read(name);
        conf["plugins"]
            .as_array()
            .is_some_and(|p| p.last().is_some_and(|e| e["type"] == PLUGIN_TYPE))
    }
}

#[test]
fn install_chains_the_file_the_runtime_loads_keeps_its_mode_and_is_idempotent() {
    let node = Node::new();
    node.write("10-flannel.conflist", FLANNEL, 0o640);
    node.write(
        "99-loopback.conf",
        r#"{"cniVersion":"0.3.1","name":"lo","type":"loopback"}"#,
        0o644,
    );
    assert!(node.installer.install_plugin().unwrap());
    let change = node.installer.chain().unwrap().unwrap();
    assert!(change.contains("10-flannel.conflist"), "{change}");
    assert!(node.chained("10-flannel.conflist"));
    let mode = fs::metadata(node.installer.conf_dir.join("10-flannel.conflist"))
        .unwrap()
        .permissions()
        .mode();
    assert_eq!(mode & 0o777, 0o640);
    assert_eq!(node.installer.chain().unwrap(), None, "chained once");
    assert_eq!(node.names(), ["10-flannel.conflist", "99-loopback.conf"]);
    // The loopback file sorts after: untouched.
    assert!(node.read("99-loopback.conf").get("plugins").is_none());
}

#[test]
fn a_file_that_cannot_be_chained_is_named_and_left_untouched() {
    let node = Node::new();
    node.write("10-broken.conflist", "{\"plugins\": [", 0o644);
    let err = node.installer.chain().unwrap_err();
    assert!(err.to_string().contains("10-broken.conflist"), "{err}");
    assert_eq!(
        fs::read_to_string(node.installer.conf_dir.join("10-broken.conflist")).unwrap(),
        "{\"plugins\": ["
    );
    let empty = Node::new();
    let err = empty.installer.chain().unwrap_err();
    assert!(matches!(err, InstallError::NoConfig(_)), "{err}");
}

#[test]
fn uninstall_restores_every_file_and_removes_the_binary() {
    let node = Node::new();
    let bridge = r#"{"cniVersion":"0.4.0","name":"bridge","type":"bridge","bridge":"cni0"}"#;
    node.write("10-bridge.conf", bridge, 0o600);
    node.installer.install_plugin().unwrap();
    node.installer.chain().unwrap();
    assert_eq!(node.names(), ["10-bridge.conflist"]);
    assert!(node.chained("10-bridge.conflist"));
    // A file that sorted first earlier still has an entry.
    node.write("20-flannel.conflist", FLANNEL, 0o644);
    let mut older: Value = serde_json::from_str(FLANNEL).unwrap();
    older["plugins"]
        .as_array_mut()
        .unwrap()
        .push(node.installer.entry.clone());
    node.write("20-flannel.conflist", &older.to_string(), 0o644);

    let changes = node.installer.unchain_all().unwrap();
    assert_eq!(changes.len(), 2, "{changes:?}");
    assert!(node.installer.remove_plugin().unwrap());
    assert_eq!(node.names(), ["10-bridge.conf", "20-flannel.conflist"]);
    assert_eq!(
        node.read("10-bridge.conf"),
        serde_json::from_str::<Value>(bridge).unwrap()
    );
    let mode = fs::metadata(node.installer.conf_dir.join("10-bridge.conf"))
        .unwrap()
        .permissions()
        .mode();
    assert_eq!(mode & 0o777, 0o600);
    assert_eq!(
        node.read("20-flannel.conflist"),
        serde_json::from_str::<Value>(FLANNEL).unwrap()
    );
    assert!(!node.installer.plugin_installed());
    assert!(
        node.installer.unchain_all().unwrap().is_empty(),
        "nothing left to do"
    );
}

/// Poll for `cond` up to `limit`; how long it took.
fn within(limit: Duration, cond: impl Fn() -> bool) -> Option<Duration> {
    let start = Instant::now();
    while start.elapsed() < limit {
        if cond() {
            return Some(start.elapsed());
        }
        std::thread::sleep(Duration::from_millis(2));
    }
    None
}

#[test]
fn the_watch_puts_the_entry_back_after_a_rewrite_and_follows_the_first_file() {
    let node = Node::new();
    let stop = AtomicBool::new(false);
    std::thread::scope(|scope| {
        let installer = node.installer.clone();
        let stop = &stop;
        let watcher = scope.spawn(move || {
            let until = || stop.load(Ordering::Relaxed);
            watch(&installer, Duration::from_secs(60), Some(&until))
        });
        // Waits for the cluster network's file.
        std::thread::sleep(Duration::from_millis(100));
        node.write("10-flannel.conflist", FLANNEL, 0o644);
        let first = within(Duration::from_secs(10), || {
            node.chained("10-flannel.conflist")
        });
        assert!(
            first.is_some(),
            "the entry was not chained into the new file"
        );
        assert!(node.installer.plugin_installed());

        // flannel restarts and rewrites its file (write + rename, as installers do).
        let mut took = Vec::new();
        for _ in 0..5 {
            let tmp = node.installer.conf_dir.join(".flannel.tmp");
            fs::write(&tmp, FLANNEL).unwrap();
            fs::rename(&tmp, node.installer.conf_dir.join("10-flannel.conflist")).unwrap();
            let back = within(Duration::from_secs(1), || {
                node.chained("10-flannel.conflist")
            });
            took.push(back.expect("the entry was not back within 1 s of a rewrite"));
        }
        eprintln!("entry back after a rewrite in {took:?}");

        // A file that sorts first now: it is chained too.
        node.write("00-multus.conflist", FLANNEL, 0o644);
        assert!(within(Duration::from_secs(1), || node
            .chained("00-multus.conflist"))
        .is_some());
        // A broken file sorting first is reported and left alone.
        node.write("00-aaa.conflist", "not json", 0o644);
        std::thread::sleep(Duration::from_millis(200));
        assert_eq!(
            fs::read_to_string(node.installer.conf_dir.join("00-aaa.conflist")).unwrap(),
            "not json"
        );

        stop.store(true, Ordering::Relaxed);
        // Wake the watcher so that it sees the flag.
        fs::remove_file(node.installer.conf_dir.join("00-aaa.conflist")).unwrap();
        watcher.join().unwrap().unwrap();
    });
}

#[test]
fn the_chained_entry_is_read_as_the_runtime_hands_it_to_the_plugin() {
    let dir = TempDir::new().unwrap();
    assert_eq!(chained_entry(dir.path()).unwrap(), None, "no configuration");
    let list = r#"{"cniVersion": "0.3.1", "name": "k8s", "plugins": [{"type": "ptp"}]}"#;
    fs::write(dir.path().join("10-net.conflist"), list).unwrap();
    assert_eq!(chained_entry(dir.path()).unwrap(), None, "not chained");
    let entry = serde_json::json!({"type": "redirector-cni", "args": ["-p", "15001"]});
    let chained = conflist::chain("10-net.conflist", list, &entry).unwrap();
    let Edit::Write { contents, .. } = chained else {
        panic!("chaining writes the file")
    };
    fs::write(dir.path().join("10-net.conflist"), contents.to_string()).unwrap();
    // A later file is not the one the runtime loads.
    fs::write(dir.path().join("20-other.conflist"), "not json").unwrap();
    let found = chained_entry(dir.path()).unwrap().expect("the entry");
    assert_eq!(found["type"], "redirector-cni");
    assert_eq!(found["args"], serde_json::json!(["-p", "15001"]));
    assert_eq!(found["cniVersion"], "0.3.1");
    assert_eq!(found["name"], "k8s");
}

#[test]
fn an_ambient_entry_has_its_namespaces_and_sockets_and_reads_back_as_the_plugins() {
    let entry = Entry {
        dialect: Dialect::Ambient,
        args: vec![],
        require_sidecar_status: true,
        exclude_namespaces: vec!["kube-system".into(), "istio-system".into()],
        pin_root: None,
        state_dir: None,
        ambient: Some(AmbientEntry {
            namespaces: vec!["shop".into()],
            cri_socket: Some("/run/crio/crio.sock".into()),
            daemon_socket: None,
        }),
    }
    .to_json();
    assert_eq!(entry["dialect"], "ambient");
    assert_eq!(entry["ambientNamespaces"], json!(["shop"]));
    assert!(entry.get("requireSidecarStatus").is_none(), "{entry}");
    assert!(entry.get("socket").is_none(), "{entry}");
    let mut conf = entry.clone();
    conf["cniVersion"] = json!("1.0.0");
    let conf = crate::cni::conf::parse_conf(&conf.to_string()).unwrap();
    assert_eq!(conf.dialect, Dialect::Ambient);
    assert_eq!(conf.cri_socket, Some("/run/crio/crio.sock".into()));
    assert_eq!(conf.mesh_keys["ambientNamespaces"], json!(["shop"]));
}
