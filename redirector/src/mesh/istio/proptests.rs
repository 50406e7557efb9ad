//! Generated input for the istio-iptables flags and env vars (proptest): parsing never
//! panics, every rejection names the flag or env var and a value that was given, and every
//! accepted configuration plans (the plan carries its ports and owners exactly).

use std::collections::HashMap;

use proptest::prelude::*;
use redirector_common::{NetnsCookie, PortSet};

use super::*;
use crate::{engine::facts::PodFacts, engine::plan::plan_pod};

/// Cases per property; the note of each run counts them.
const CASES: u32 = 3000;

/// Flags that take a value, as a user would spell them.
pub(crate) const VALUE_FLAGS: &[&str] = &[
    "-p",
    "-z",
    "-e",
    "-u",
    "-g",
    "-m",
    "-b",
    "-d",
    "-i",
    "-x",
    "-o",
    "-q",
    "-k",
    "-c",
    "--probe-timeout",
    "--iptables-probe-port",
    "--istio-inbound-tproxy-mark",
    "--istio-inbound-tproxy-route-table",
    "--istio-local-outbound-ports-exclude",
    "--redirect-dns",
    "--capture-all-dns",
    "--dual-stack",
    "--drop-invalid",
    "--fail-open",
];

/// Env vars istio-iptables reads.
const ENV_VARS: &[&str] = &[
    "ENVOY_PORT",
    "INBOUND_CAPTURE_PORT",
    "ISTIO_INBOUND_INTERCEPTION_MODE",
    "ISTIO_INBOUND_PORTS",
    "ISTIO_LOCAL_EXCLUDE_PORTS",
    "ISTIO_SERVICE_CIDR",
    "ISTIO_SERVICE_EXCLUDE_CIDR",
    "ISTIO_OUTBOUND_PORTS",
    "ISTIO_EXCLUDE_INTERFACES",
    "ISTIO_META_DNS_CAPTURE",
    "PROXY_UID",
    "PROXY_GID",
    "ISTIO_OUTBOUND_OWNER_GROUPS",
    "ISTIO_OUTBOUND_IPV4_LOOPBACK_CIDR",
    "ISTIO_DUAL_STACK",
    "KUBE_VIRT_INTERFACES",
    "INVALID_DROP",
];

/// Values near the valid ones (numbers, lists, CIDRs, names) and arbitrary text.
fn value() -> impl Strategy<Value = String> {
    prop_oneof![
        "[0-9]{0,6}",
        "[0-9*, -]{0,16}",
        "[0-9a-fA-F.:/,* ]{0,40}",
        "(REDIRECT|TPROXY|redirect|true|false|1|0|[a-z]{1,8})",
        "[a-z0-9_.:-]{0,20}",
        "\\PC{0,24}",
    ]
}

fn facts() -> PodFacts {
    PodFacts {
        netns_cookie: NetnsCookie(7),
        local_addrs: vec!["10.244.1.5".parse().unwrap(), "fd00::5".parse().unwrap()],
        cgroup: Some("/sys/fs/cgroup/pod".into()),
        interfaces: vec![("lo".into(), 1), ("eth0".into(), 2)],
        dns_servers: vec!["10.96.0.10".parse().unwrap()],
        routes: vec![("0.0.0.0/0".parse().unwrap(), 2)],
        ids: None,
    }
}

/// Checks one parse result against the inputs it came from.
fn check(result: Result<IstioConfig, ConfigError>, given: &[String]) -> Result<(), TestCaseError> {
    match result {
        Err(ConfigError::InvalidValue { origin, value, .. }) => {
            prop_assert!(
                origin.flag.is_some() || origin.env.is_some(),
                "no origin named"
            );
            prop_assert!(
                given.iter().any(|g| g.contains(value.trim())),
                "the rejected value {value:?} is none of the given {given:?}"
            );
        }
        Err(ConfigError::CommandLine(err)) => {
            prop_assert!(!err.to_string().trim().is_empty());
        }
        Ok(cfg) => {
            let plan = plan_pod(&cfg.capture, &facts());
            let c = &cfg.capture;
            prop_assert_eq!(plan.config.outbound_port, c.outbound_port);
            prop_assert_eq!(plan.config.inbound_port, c.inbound_port);
            for (ports, set) in [
                (&c.inbound_exclude_ports, PortSet::InboundExclude),
                (&c.outbound_exclude_ports, PortSet::OutboundExclude),
            ] {
                for port in ports {
                    prop_assert!(
                        plan.ports
                            .iter()
                            .any(|k| k.port == *port && k.set == set as u16),
                        "port {port} of {set:?} is not in the plan"
                    );
                }
            }
            let uids = &plan.config.proxy_uids[..plan.config.proxy_uid_count as usize];
            prop_assert_eq!(uids.len(), c.proxy_uids.len());
        }
    }
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(CASES))]

    #[test]
    fn generated_flags_are_parsed_or_rejected_by_name(
        pairs in proptest::collection::vec((proptest::sample::select(VALUE_FLAGS), value()), 1..5)
    ) {
        let mut argv = vec!["istio-iptables".to_string()];
        let mut given = Vec::new();
        for (flag, value) in &pairs {
            argv.push(format!("{flag}={value}"));
            given.push(value.clone());
        }
        let result = parse_istio_iptables(&argv, &HashMap::<String, String>::new());
        check(result, &given)?;
    }

    #[test]
    fn generated_env_is_parsed_or_rejected_by_name(
        pairs in proptest::collection::vec((proptest::sample::select(ENV_VARS), value()), 1..5)
    ) {
        let env: HashMap<String, String> =
            pairs.iter().map(|(k, v)| (k.to_string(), v.clone())).collect();
        let given: Vec<String> = env.values().cloned().collect();
        let result = parse_istio_iptables(["istio-iptables"], &env);
        check(result, &given)?;
    }
}
