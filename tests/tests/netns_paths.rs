//! A path given as a pod's network namespace, at each of the three ways in
//! (`istio-iptables --network-namespace`, `pod add --netns`, CNI ADD's `CNI_NETNS`): the
//! host's own namespace is refused (its sk_lookup program would take the node's inbound
//! TCP), and so is a file that is not a namespace — a FIFO without blocking, which with
//! the node lock held would wedge every other setup. Exit 1, a message naming the path,
//! nothing attached, pinned or recorded.

use std::process::{Command, Output, Stdio};

use redirector_tests::prelude::*;

/// `redirector ARGS` under `timeout`, given [`EVENTUALLY`] (room for a starved emulated
/// guest): a blocked open shows as exit 124.
fn redirector(argv0: &Path, args: &[&str], env: &[(&str, &str)], stdin: &str) -> Output {
    let mut child = Command::new("timeout")
        .arg(EVENTUALLY.as_secs().to_string())
        .arg(argv0)
        .args(args)
        .envs(env.iter().copied())
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let _ = std::io::Write::write_all(&mut child.stdin.take().unwrap(), stdin.as_bytes());
    child.wait_with_output().unwrap()
}

fn text(out: &Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    )
}

#[test]
fn the_hosts_namespace_and_files_that_are_not_namespaces_are_refused_at_every_way_in() {
    privileged!();
    let TestNode { root, node, state } = TestNode::new("nspath");
    let files = StateDir::new("nsfiles");
    let fifo = files.path().join("fifo");
    run_ok(Command::new("mkfifo").arg(&fifo));
    let plain = files.path().join("plain");
    std::fs::write(&plain, "not a namespace").unwrap();
    // The host's namespace: this test's own (PID 1's cannot always be read in a sandbox).
    let host = "/proc/self/ns/net";
    let cases = [
        (host, "host's network namespace"),
        (fifo.to_str().unwrap(), "not a network namespace"),
        (plain.to_str().unwrap(), "not a network namespace"),
    ];

    // istio-iptables: nothing pinned.
    for (path, says) in cases {
        let pin_root = root.path().to_str().unwrap();
        let args = [
            "istio-iptables",
            "--network-namespace",
            path,
            "--pin-root",
            pin_root,
        ];
        let out = redirector(
            &redirector_bin(),
            &[&args[..], &STANDARD_INJECTION].concat(),
            &[],
            "",
        );
        assert_eq!(out.status.code(), Some(1), "{path}: {}", text(&out));
        assert!(
            text(&out).contains(says) && text(&out).contains(path),
            "{}",
            text(&out)
        );
        assert_eq!(pins_under(root.path()), Vec::<PathBuf>::new());
    }
    // Meant: the flag lets the host's namespace through the check (dry run: nothing made).
    let out = redirector(
        &redirector_bin(),
        &words(&format!(
            "istio-iptables --network-namespace {host} --allow-host-netns --dry-run"
        )),
        &[],
        "",
    );
    assert_lacks(&text(&out), "host's network namespace");

    // The daemon's API: refused, the daemon still serving, nothing recorded.
    let daemon = Daemon::start(&root, &node, &state);
    for (path, says) in cases {
        let args = ["add", "--netns", path, "--name", "x/y", "--"];
        let out = daemon.pod(&[&args[..], &STANDARD_INJECTION].concat());
        assert_eq!(out.status.code(), Some(1), "{path}: {}", text(&out));
        assert!(text(&out).contains(says), "{}", text(&out));
    }
    assert!(daemon.pod_names().is_empty());

    // CNI ADD: an error result naming the path, nothing recorded.
    let plugin = CniPlugin::new();
    let conf = serde_json::json!({
        "cniVersion": "1.0.0", "name": "nspath", "type": "redirector-cni",
        "pinRoot": root.path(), "stateDir": state.path(), "requireSidecarStatus": false,
        "args": STANDARD_INJECTION,
    });
    for (path, says) in cases {
        let out = redirector(
            plugin.path(),
            &[],
            &[
                ("CNI_COMMAND", "ADD"),
                ("CNI_CONTAINERID", "c1"),
                ("CNI_NETNS", path),
                ("CNI_IFNAME", "eth0"),
                ("CNI_PATH", "/opt/cni/bin"),
                ("CNI_ARGS", "K8S_POD_NAMESPACE=default;K8S_POD_NAME=web"),
            ],
            &conf.to_string(),
        );
        assert!(
            !out.status.success() && out.status.code() != Some(124),
            "{path}: {}",
            text(&out)
        );
        assert!(text(&out).contains(says), "{}", text(&out));
    }
    assert!(daemon.pod_names().is_empty());
    assert!(daemon.pods().is_empty());
}
