//! Generated network configurations (proptest): decoding never panics, every rejection is a
//! CNI error with a code and a message, a rejected flag or annotation value is named in
//! the message, and an accepted pod's flags parse as istio-iptables flags.

use proptest::prelude::*;
use serde_json::json;

use super::*;
use crate::mesh::pod_spec;

const CASES: u32 = 2000;

const ANNOTATIONS: &[&str] = &[
    "traffic.sidecar.istio.io/includeOutboundIPRanges",
    "traffic.sidecar.istio.io/excludeOutboundPorts",
    "traffic.sidecar.istio.io/includeInboundPorts",
    "traffic.sidecar.istio.io/excludeInboundPorts",
    "traffic.sidecar.istio.io/excludeInterfaces",
    "sidecar.istio.io/interceptionMode",
    "sidecar.istio.io/inject",
];

fn value() -> impl Strategy<Value = String> {
    prop_oneof![
        "[0-9*, -]{0,12}",
        "[0-9a-f.:/,*]{0,24}",
        "(REDIRECT|TPROXY|false|true)",
        "\\PC{0,16}"
    ]
}

fn conf() -> impl Strategy<Value = Value> {
    (
        prop_oneof![
            Just("1.0.0".to_string()),
            Just("0.4.0".to_string()),
            Just("0.3.1".to_string()),
            Just("9.9.9".to_string()),
            "\\PC{0,6}"
        ],
        prop_oneof![Just("redirector-cni".to_string()), "[a-z-]{0,12}"],
        proptest::collection::vec(
            prop_oneof![Just("-p".to_string()), Just("15001".to_string()), value()],
            0..6,
        ),
        proptest::collection::btree_map(proptest::sample::select(ANNOTATIONS), value(), 0..4),
        any::<bool>(),
    )
        .prop_map(|(version, kind, args, annotations, require_status)| {
            json!({
                "cniVersion": version,
                "name": "pods",
                "type": kind,
                "args": args,
                "requireSidecarStatus": require_status,
                "runtimeConfig": { "io.kubernetes.cri.pod-annotations": annotations },
                "prevResult": { "cniVersion": version, "ips": [] },
            })
        })
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(CASES))]

    #[test]
    fn arbitrary_text_is_a_decode_error(text in "\\PC{0,64}") {
        if let Err(err) = parse_conf(&text) {
            prop_assert!(err.code != 0 && !err.msg.is_empty());
        }
    }

    #[test]
    fn generated_configurations_are_accepted_or_rejected_by_name(conf in conf()) {
        let text = conf.to_string();
        let parsed = match parse_conf(&text) {
            Ok(parsed) => parsed,
            Err(err) => {
                prop_assert!(err.code != 0 && !err.msg.is_empty());
                return Ok(());
            }
        };
        match pod_settings(&parsed, Some("default")) {
            Ok(Some((flags, _))) => prop_assert!(pod_spec(&flags).is_ok()),
            Ok(None) => {}
            Err(err) => {
                prop_assert_eq!(err.code, code::INVALID_CONFIG);
                let given: Vec<String> = conf["args"]
                    .as_array()
                    .unwrap()
                    .iter()
                    .chain(conf["runtimeConfig"]["io.kubernetes.cri.pod-annotations"].as_object().unwrap().values())
                    .filter_map(|v| v.as_str().map(str::to_owned))
                    .collect();
                // Values are quoted as Rust string literals (escapes included).
                // A value is named whole (quoted, after annotations' trim) or by one
                // of its list entries.
                let named = |g: &String| {
                    err.msg.contains(&format!("{g:?}"))
                        || err.msg.contains(&format!("{:?}", g.trim()))
                        || g.split(',').map(str::trim).filter(|e| !e.is_empty()).any(|e| {
                            err.msg.contains(e)
                                || err.msg.contains(format!("{e:?}").trim_matches('"'))
                        })
                };
                prop_assert!(
                    err.msg.contains("args must be")
                        // clap's own messages (a repeated flag) name the flag.
                        || err.msg.starts_with("error: ")
                        || given.iter().any(named),
                    "{} names none of {:?}",
                    err.msg,
                    given
                );
            }
        }
    }
}
