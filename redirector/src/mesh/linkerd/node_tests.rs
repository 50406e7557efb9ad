//! Node mode, against linkerd-cni (`cni-plugin/main.go` of linkerd/linkerd2-proxy-init):
//! its settings as flags, its annotation rules, and what `parse_proxy_init` makes of the
//! result.

use std::collections::{BTreeMap, HashMap};

use ipnet::IpNet;
use serde_json::json;

use super::{
    annotations::*, cni_config::proxy_init_args, parse_proxy_init, CaptureConfig, PortRange,
    INJECTOR_DEFAULTS,
};

/// The settings of the task's example: the injector's ignore lists written as linkerd-cni
/// settings (a chart installed with `ignoreInboundPorts`/`ignoreOutboundPorts` 4567,4568).
fn injector_like_settings() -> serde_json::Value {
    json!({
        "incoming-proxy-port": 4143,
        "outgoing-proxy-port": 4140,
        "proxy-uid": 2102,
        "proxy-gid": -1,
        "ports-to-redirect": [],
        "inbound-ports-to-ignore": ["4190", "4191", "4567", "4568"],
        "outbound-ports-to-ignore": ["4567", "4568"],
        "subnets-to-ignore": [],
        "simulate": false,
        "use-wait-flag": false,
        "iptables-mode": "nft",
        "ipv6": false
    })
}

/// What the linkerd2-cni chart writes at its defaults.
fn chart_default_settings() -> serde_json::Value {
    json!({
        "incoming-proxy-port": 4143,
        "outgoing-proxy-port": 4140,
        "proxy-uid": 2102,
        "ports-to-redirect": [],
        "inbound-ports-to-ignore": ["4191", "4190"],
        "simulate": false,
        "use-wait-flag": false,
        "iptables-mode": "nft",
        "ipv6": false
    })
}

fn map(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
    pairs
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect()
}

fn strings(words: &[&str]) -> Vec<String> {
    words.iter().map(|w| w.to_string()).collect()
}

#[track_caller]
fn capture(flags: &[String]) -> CaptureConfig {
    let argv = std::iter::once("proxy-init".to_owned()).chain(flags.iter().cloned());
    parse_proxy_init(argv, &HashMap::<String, String>::new())
        .unwrap_or_else(|err| panic!("{flags:?}: {err}"))
        .capture
}

fn single(ports: &[u16]) -> Vec<PortRange> {
    ports.iter().copied().map(PortRange::single).collect()
}

fn net(text: &str) -> IpNet {
    text.parse().unwrap()
}

/// The node's flags for a pod with `annotations` over the injector-like settings.
#[track_caller]
fn pod_flags(annotations: &[(&str, &str)], control_plane: bool) -> Vec<String> {
    let defaults = proxy_init_args(&injector_like_settings()).unwrap();
    flags(&defaults, &map(annotations), control_plane).unwrap()
}

#[test]
fn the_settings_become_proxy_init_flags() {
    assert_eq!(
        proxy_init_args(&injector_like_settings()).unwrap(),
        [
            "--incoming-proxy-port=4143",
            "--outgoing-proxy-port=4140",
            "--proxy-uid=2102",
            "--proxy-gid=-1",
            "--inbound-ports-to-ignore=4190,4191,4567,4568",
            "--outbound-ports-to-ignore=4567,4568",
            "--simulate=false",
            "--use-wait-flag=false",
            "--iptables-mode=nft",
            "--ipv6=false",
        ]
    );
}

#[test]
fn the_injector_like_settings_capture_as_the_injector_does() {
    let node = capture(&proxy_init_args(&injector_like_settings()).unwrap());
    assert_eq!(node, capture(&strings(&INJECTOR_DEFAULTS)));
    assert_eq!((node.inbound_port, node.outbound_port), (4143, 4140));
    assert_eq!(node.proxy_uids, [2102]);
    assert!(node.proxy_gids.is_empty());
    assert!(node.ipv6_off);
}

#[test]
fn the_charts_defaults_skip_only_the_proxys_own_ports() {
    let flags = proxy_init_args(&chart_default_settings()).unwrap();
    assert_eq!(
        flags,
        [
            "--incoming-proxy-port=4143",
            "--outgoing-proxy-port=4140",
            "--proxy-uid=2102",
            "--inbound-ports-to-ignore=4191,4190",
            "--simulate=false",
            "--use-wait-flag=false",
            "--iptables-mode=nft",
            "--ipv6=false",
        ]
    );
    let c = capture(&flags);
    assert_eq!(c.inbound_exclude_port_ranges, single(&[4191, 4190]));
    assert!(c.outbound_exclude_port_ranges.is_empty());
}

#[test]
fn settings_left_out_are_gos_zero_values() {
    // No "ipv6": Go's false, not proxy-init's true. No uid: 0, which exempts no one.
    let flags = proxy_init_args(&json!({
        "incoming-proxy-port": 4143,
        "outgoing-proxy-port": 4140,
        "proxy-uid": null,
        "subnets-to-ignore": []
    }))
    .unwrap();
    assert_eq!(
        flags,
        [
            "--incoming-proxy-port=4143",
            "--outgoing-proxy-port=4140",
            "--ipv6=false"
        ]
    );
    let c = capture(&flags);
    assert!(c.ipv6_off && c.proxy_uids.is_empty());
    // A missing proxy port would be port 0: refused, naming the key.
    let err = proxy_init_args(&json!({ "incoming-proxy-port": 4143 })).unwrap_err();
    assert!(err.contains("outgoing-proxy-port"), "{err}");
}

#[test]
fn keys_match_as_gos_decoder_matches_them() {
    let flags = proxy_init_args(&json!({
        "Incoming-Proxy-Port": 4143,
        "outgoing-proxy-port": 4140,
        "IPv6": true,
        "ports-to-redirect": [80, 443]
    }))
    .unwrap();
    assert_eq!(
        flags,
        [
            "--incoming-proxy-port=4143",
            "--outgoing-proxy-port=4140",
            "--ports-to-redirect=80,443",
            "--ipv6=true"
        ]
    );
    let err = proxy_init_args(&json!({ "ipv6": true, "IPV6": false })).unwrap_err();
    assert!(err.contains("same key"), "{err}");
}

#[test]
fn settings_that_linkerd_cni_would_not_decode_are_errors() {
    let ports = json!({ "incoming-proxy-port": 4143, "outgoing-proxy-port": 4140 });
    let with = |key: &str, value: serde_json::Value| {
        let mut settings = ports.clone();
        settings[key] = value;
        proxy_init_args(&settings).unwrap_err()
    };
    // camelCase is no key of linkerd-cni's.
    let err = with("incomingProxyPort", json!(4143));
    assert!(err.contains("\"incomingProxyPort\""), "{err}");
    for (key, value) in [
        ("proxy-uid", json!("2102")),
        ("proxy-uid", json!(2102.5)),
        ("incoming-proxy-port", json!(4143.0)),
        ("ports-to-redirect", json!(["80"])),
        ("inbound-ports-to-ignore", json!([4190])),
        ("inbound-ports-to-ignore", json!("4190")),
        ("ipv6", json!("false")),
        ("iptables-mode", json!(1)),
    ] {
        let err = with(key, value.clone());
        assert!(err.contains(key), "{key}={value}: {err}");
    }
    for not_an_object in [json!([]), json!("x"), json!(null)] {
        let err = proxy_init_args(&not_an_object).unwrap_err();
        assert!(err.contains("must be an object"), "{err}");
    }
}

#[test]
fn a_pod_without_annotations_keeps_the_settings() {
    let defaults = proxy_init_args(&injector_like_settings()).unwrap();
    assert_eq!(flags(&defaults, &map(&[]), false).unwrap(), defaults);
}

#[test]
fn skip_outbound_ports_replaces_the_list_in_any_form() {
    // The network's flags give the list twice, in both forms: both go.
    let defaults = strings(&[
        "-p",
        "4143",
        "-o",
        "4140",
        "--outbound-ports-to-ignore",
        "4567",
        "--outbound-ports-to-ignore=4568",
    ]);
    let got = flags(&defaults, &map(&[(SKIP_OUTBOUND_PORTS, "25,3306")]), false).unwrap();
    assert_eq!(
        got,
        [
            "-p",
            "4143",
            "-o",
            "4140",
            "--outbound-ports-to-ignore=25,3306"
        ]
    );
    assert_eq!(
        capture(&got).outbound_exclude_port_ranges,
        single(&[25, 3306])
    );
}

#[test]
fn skip_inbound_ports_is_appended() {
    let c = capture(&pod_flags(&[(SKIP_INBOUND_PORTS, "8080,9000-9010")], false));
    let mut want = single(&[4190, 4191, 4567, 4568, 8080]);
    want.push(PortRange::new(9000, 9010).unwrap());
    assert_eq!(c.inbound_exclude_port_ranges, want);
}

#[test]
fn skip_subnets_replaces() {
    let defaults = strings(&["-p", "4143", "-o", "4140", "--subnets-to-ignore=10.0.0.0/8"]);
    let got = flags(&defaults, &map(&[(SKIP_SUBNETS, "192.168.0.0/16")]), false).unwrap();
    assert_eq!(
        capture(&got).inbound_exclude_sources,
        [net("192.168.0.0/16")]
    );
}

#[test]
fn proxy_ids_must_be_integers() {
    let c = capture(&pod_flags(
        &[(PROXY_UID, "1000"), (PROXY_GID, "3000")],
        false,
    ));
    assert_eq!((c.proxy_uids, c.proxy_gids), (vec![1000], vec![3000]));
    // Atoi reads decimal: 010 is ten (proxy-init's own flag would read it as octal).
    assert_eq!(
        capture(&pod_flags(&[(PROXY_UID, "010")], false)).proxy_uids,
        [10]
    );
    // -1 parses and exempts no one, as in proxy-init.
    assert!(capture(&pod_flags(&[(PROXY_UID, "-1")], false))
        .proxy_uids
        .is_empty());
    let defaults = proxy_init_args(&injector_like_settings()).unwrap();
    for (annotation, bad) in [
        (PROXY_UID, "abc"),
        (PROXY_UID, " 1000"),
        (PROXY_GID, "1e3"),
        (PROXY_GID, "0x10"),
    ] {
        let err = flags(&defaults, &map(&[(annotation, bad)]), false).unwrap_err();
        assert!(
            err.contains(annotation) && err.contains(bad),
            "{annotation}={bad:?}: {err}"
        );
    }
}

#[test]
fn proxy_ports_follow_the_injector() {
    let c = capture(&pod_flags(
        &[(INBOUND_PORT, "5143"), (OUTBOUND_PORT, "5140")],
        false,
    ));
    assert_eq!((c.inbound_port, c.outbound_port), (5143, 5140));
    // What the injector cannot read leaves its proxy, and so the flag, at the default.
    let c = capture(&pod_flags(
        &[(INBOUND_PORT, "abc"), (OUTBOUND_PORT, "99999999999")],
        false,
    ));
    assert_eq!((c.inbound_port, c.outbound_port), (4143, 4140));
}

#[test]
fn close_wait_timeout_is_given_in_whole_seconds() {
    for (timeout, secs) in [("1h0m0s", Some(3600)), ("30s", Some(30)), ("1.9s", Some(1))] {
        let got = pod_flags(&[(CLOSE_WAIT_TIMEOUT, timeout)], false);
        let want = secs.map(|s| format!("--timeout-close-wait-secs={s}"));
        assert_eq!(got.last().cloned(), want, "{timeout}");
    }
    // Invalid, negative or under a second: nothing, as the injector gives nothing.
    let defaults = proxy_init_args(&injector_like_settings()).unwrap();
    for timeout in ["500ms", "30", "-5s", "soon"] {
        assert_eq!(pod_flags(&[(CLOSE_WAIT_TIMEOUT, timeout)], false), defaults);
    }
}

#[test]
fn an_empty_annotation_counts_as_absent() {
    let defaults = proxy_init_args(&injector_like_settings()).unwrap();
    let empty: Vec<(&str, &str)> = [
        SKIP_OUTBOUND_PORTS,
        SKIP_INBOUND_PORTS,
        SKIP_SUBNETS,
        PROXY_UID,
        PROXY_GID,
        INBOUND_PORT,
        OUTBOUND_PORT,
        CLOSE_WAIT_TIMEOUT,
    ]
    .iter()
    .map(|annotation| (*annotation, ""))
    .collect();
    assert_eq!(flags(&defaults, &map(&empty), false).unwrap(), defaults);
}

#[test]
fn the_control_plane_also_skips_the_api_server() {
    let c = capture(&pod_flags(&[], true));
    assert_eq!(
        c.outbound_exclude_port_ranges,
        single(&[4567, 4568, 443, 6443])
    );
    // After a replaced list, as linkerd-cni appends them last.
    let c = capture(&pod_flags(&[(SKIP_OUTBOUND_PORTS, "25")], true));
    assert_eq!(c.outbound_exclude_port_ranges, single(&[25, 443, 6443]));
    assert!(control_plane(&map(&[(
        CONTROL_PLANE_COMPONENT,
        "destination"
    )])));
    assert!(!control_plane(&map(&[(CONTROL_PLANE_COMPONENT, "")])));
    assert!(!control_plane(&map(&[])));
}

#[test]
fn only_injected_pods_outside_excluded_namespaces_are_captured() {
    let excluded = vec!["kube-system".to_string()];
    let injected_pod = map(&[(PROXY_VERSION, "edge-26.8.1")]);
    assert!(injected(&injected_pod));
    assert_eq!(left_alone(Some("default"), &excluded, &injected_pod), None);
    assert_eq!(left_alone(None, &excluded, &injected_pod), None);
    let why = left_alone(Some("kube-system"), &excluded, &injected_pod).unwrap();
    assert!(why.contains("kube-system"), "{why}");
    for not_injected in [map(&[]), map(&[(PROXY_VERSION, "")])] {
        assert!(!injected(&not_injected));
        let why = left_alone(Some("default"), &excluded, &not_injected).unwrap();
        assert!(why.contains(PROXY_VERSION), "{why}");
    }
}

#[test]
fn linkerd_cnis_own_test_is_on_container_names() {
    assert_eq!(
        left_alone_by_containers(&["app", PROXY_CONTAINER], &[]),
        None
    );
    // A native sidecar.
    assert_eq!(left_alone_by_containers(&["app"], &[PROXY_CONTAINER]), None);
    assert!(left_alone_by_containers(&["app"], &[]).is_some());
    let why = left_alone_by_containers(&["app", PROXY_CONTAINER], &[INIT_CONTAINER]).unwrap();
    assert!(why.contains(INIT_CONTAINER), "{why}");
}

#[test]
fn the_namespace_fills_in_what_the_pod_does_not_set() {
    let pod = map(&[
        (PROXY_VERSION, "v1"),
        (SKIP_OUTBOUND_PORTS, "25"),
        (SKIP_INBOUND_PORTS, ""),
    ]);
    let namespace = map(&[
        (SKIP_OUTBOUND_PORTS, "3306"),
        (SKIP_INBOUND_PORTS, "8080"),
        (PROXY_UID, "1000"),
        // Read from the pod alone.
        (CLOSE_WAIT_TIMEOUT, "30s"),
        (INBOUND_PORT, "5143"),
    ]);
    assert_eq!(
        with_namespace_defaults(&pod, &namespace),
        map(&[
            (PROXY_VERSION, "v1"),
            (SKIP_OUTBOUND_PORTS, "25"),
            (SKIP_INBOUND_PORTS, "8080"),
            (PROXY_UID, "1000"),
        ])
    );
}

#[test]
fn a_combined_pod_parses_to_the_expected_spec() {
    let settings = proxy_init_args(&injector_like_settings()).unwrap();
    let annotations = map(&[
        (PROXY_VERSION, "edge-26.8.1"),
        (SKIP_OUTBOUND_PORTS, "3306,5432"),
        (SKIP_INBOUND_PORTS, "9090"),
        (SKIP_SUBNETS, "10.0.0.0/8,fd00::/8"),
        (PROXY_UID, "2103"),
        (PROXY_GID, "2103"),
        (INBOUND_PORT, "4243"),
        (CLOSE_WAIT_TIMEOUT, "1h0m0s"),
    ]);
    assert_eq!(left_alone(Some("emojivoto"), &[], &annotations), None);
    let tail = flags(&settings, &annotations, true).unwrap();
    let argv = std::iter::once("proxy-init".to_owned()).chain(tail.iter().cloned());
    let cfg = parse_proxy_init(argv, &HashMap::<String, String>::new())
        .unwrap_or_else(|err| panic!("{tail:?}: {err}"));
    let c = &cfg.capture;
    assert_eq!((c.inbound_port, c.outbound_port), (4243, 4140));
    assert_eq!(
        (&c.proxy_uids[..], &c.proxy_gids[..]),
        (&[2103][..], &[2103][..])
    );
    assert_eq!(
        c.inbound_exclude_port_ranges,
        single(&[4190, 4191, 4567, 4568, 9090])
    );
    assert_eq!(
        c.outbound_exclude_port_ranges,
        single(&[3306, 5432, 443, 6443])
    );
    assert_eq!(
        c.inbound_exclude_sources,
        [net("10.0.0.0/8"), net("fd00::/8")]
    );
    assert!(c.ipv6_off && !c.dual_stack);
    assert!(c.local_destinations_pass);
    assert_eq!(
        cfg.own.close_wait_timeout,
        Some(std::time::Duration::from_secs(3600))
    );
    assert!(!cfg.run.dry_run);
    assert!(cfg.own.dropped_entries.is_empty());
}
