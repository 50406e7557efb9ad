//! istio's pod annotations: whether a pod is captured at all, and its istio-iptables flags
//! as istio's sidecar injector turns annotations into them, over default flags (the CNI
//! network's, or an API request's).
//!
//! A plugin in the cluster network's chain sees every pod of the node — CoreDNS,
//! kube-system, pods with no sidecar — and capturing a pod with no proxy sends its
//! connections to a port where nothing listens. So the plugin captures a pod only when it
//! is meant to be meshed ([`left_alone`]).

use std::collections::BTreeMap;

/// Annotations that replace one flag's value.
const FLAG_ANNOTATIONS: [(&str, &str); 9] = [
    ("traffic.sidecar.istio.io/includeOutboundIPRanges", "-i"),
    ("traffic.sidecar.istio.io/excludeOutboundIPRanges", "-x"),
    ("traffic.sidecar.istio.io/includeOutboundPorts", "-q"),
    ("traffic.sidecar.istio.io/excludeOutboundPorts", "-o"),
    ("traffic.sidecar.istio.io/includeInboundPorts", "-b"),
    ("traffic.sidecar.istio.io/excludeInboundPorts", "-d"),
    ("traffic.sidecar.istio.io/excludeInterfaces", "-c"),
    ("traffic.sidecar.istio.io/kubevirtInterfaces", "-k"),
    ("sidecar.istio.io/interceptionMode", "-m"),
];

/// The flags istio's injector gives its init container by default
/// (`istio-iptables -p 15001 -z 15006 -u 1337 -m REDIRECT -i '*' -x "" -b '*' -d 15090,15021,15020`).
pub const STANDARD_INJECTION: [&str; 16] = [
    "-p",
    "15001",
    "-z",
    "15006",
    "-u",
    "1337",
    "-m",
    "REDIRECT",
    "-i",
    "*",
    "-x",
    "",
    "-b",
    "*",
    "-d",
    "15090,15021,15020",
];

/// The proxy's own inbound ports, which the injector always adds to `-d`.
const PROXY_INBOUND_PORTS: [&str; 3] = ["15090", "15021", "15020"];

/// The annotation that opts a pod out of the mesh.
pub const INJECT: &str = "sidecar.istio.io/inject";
/// The annotation the injector sets on a pod it injected.
pub const STATUS: &str = "sidecar.istio.io/status";

/// The rules of one network configuration.
#[derive(Debug, Clone, Copy)]
pub struct Rules<'a> {
    /// Only pods carrying the injector's `sidecar.istio.io/status`.
    pub require_status: bool,
    /// Namespaces whose pods are never captured.
    pub exclude_namespaces: &'a [String],
}

/// Why a pod is left alone; `None` when it is to be captured.
pub fn left_alone(
    rules: Rules<'_>,
    namespace: Option<&str>,
    annotations: &BTreeMap<String, String>,
) -> Option<String> {
    if let Some(ns) = namespace.filter(|ns| rules.exclude_namespaces.iter().any(|e| e == ns)) {
        return Some(format!("namespace {ns} is excluded (excludeNamespaces)"));
    }
    let opted_out = annotations
        .get(INJECT)
        .is_some_and(|v| v.trim().eq_ignore_ascii_case("false"));
    if opted_out {
        return Some(format!("{INJECT} is false"));
    }
    if rules.require_status && !annotations.contains_key(STATUS) {
        return Some(format!(
            "no {STATUS} annotation: the pod was not injected (requireSidecarStatus)"
        ));
    }
    None
}

/// `defaults` with each annotated flag replaced (appended if absent).
pub fn flags(defaults: &[String], annotations: &BTreeMap<String, String>) -> Vec<String> {
    let mut flags = defaults.to_vec();
    for (annotation, flag) in FLAG_ANNOTATIONS {
        let Some(value) = annotations.get(annotation) else {
            continue;
        };
        let mut value = value.trim().to_owned();
        if flag == "-d" {
            let mut ports: Vec<&str> = value
                .split(',')
                .map(str::trim)
                .filter(|p| !p.is_empty())
                .collect();
            for port in PROXY_INBOUND_PORTS {
                if !ports.contains(&port) {
                    ports.push(port);
                }
            }
            value = ports.join(",");
        }
        match flags.iter().position(|f| f == flag) {
            Some(at) if at + 1 < flags.len() => flags[at + 1] = value,
            _ => flags.extend([flag.to_owned(), value]),
        }
    }
    flags
}

#[cfg(test)]
mod tests {
    use super::*;

    fn map(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    #[test]
    fn annotations_replace_the_networks_flags() {
        let defaults: Vec<String> = ["-p", "15001", "-o", "", "-d", "15090,15021,15020"]
            .map(String::from)
            .to_vec();
        let got = flags(
            &defaults,
            &map(&[
                ("traffic.sidecar.istio.io/excludeOutboundPorts", "3306"),
                ("traffic.sidecar.istio.io/excludeInboundPorts", "8081"),
                (
                    "traffic.sidecar.istio.io/includeOutboundIPRanges",
                    "10.0.0.0/8",
                ),
            ]),
        );
        assert_eq!(
            got,
            [
                "-p",
                "15001",
                "-o",
                "3306",
                "-d",
                "8081,15090,15021,15020",
                "-i",
                "10.0.0.0/8"
            ]
        );
    }

    #[test]
    fn only_injected_pods_outside_excluded_namespaces_are_captured() {
        let excluded = vec!["kube-system".to_string()];
        let rules = Rules {
            require_status: true,
            exclude_namespaces: &excluded,
        };
        let injected = map(&[(STATUS, "{}")]);
        assert_eq!(left_alone(rules, Some("default"), &injected), None);
        assert_eq!(left_alone(rules, None, &injected), None);
        let why = left_alone(rules, Some("kube-system"), &injected).unwrap();
        assert!(why.contains("kube-system"), "{why}");
        let why = left_alone(rules, Some("default"), &map(&[])).unwrap();
        assert!(why.contains(STATUS), "{why}");
        let opted_out = map(&[(STATUS, "{}"), (INJECT, " False ")]);
        assert!(left_alone(rules, Some("default"), &opted_out).is_some());
    }

    #[test]
    fn without_required_status_every_pod_not_opted_out_is_captured() {
        let rules = Rules {
            require_status: false,
            exclude_namespaces: &[],
        };
        assert_eq!(left_alone(rules, Some("kube-system"), &map(&[])), None);
        assert!(left_alone(rules, Some("default"), &map(&[(INJECT, "false")])).is_some());
    }
}
