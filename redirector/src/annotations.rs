//! istio's pod annotations, turned into istio-iptables flags as istio's sidecar injector
//! does, over default flags (the CNI network's, or an API request's).

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

/// The proxy's own inbound ports, which the injector always adds to `-d`.
const PROXY_INBOUND_PORTS: [&str; 3] = ["15090", "15021", "15020"];

/// The annotation that opts a pod out of the mesh.
pub const INJECT: &str = "sidecar.istio.io/inject";
/// The annotation the injector sets on a pod it injected.
pub const STATUS: &str = "sidecar.istio.io/status";

/// Whether the pod is to be captured: not when `sidecar.istio.io/inject` is false, nor,
/// with `require_status`, without the injector's status annotation.
pub fn captured(annotations: &BTreeMap<String, String>, require_status: bool) -> bool {
    let opted_out = annotations
        .get(INJECT)
        .is_some_and(|v| v.trim().eq_ignore_ascii_case("false"));
    !opted_out && (!require_status || annotations.contains_key(STATUS))
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
    fn inject_false_opts_out_and_status_can_be_required() {
        assert!(captured(&map(&[]), false));
        assert!(!captured(&map(&[(INJECT, "false")]), false));
        assert!(captured(&map(&[(INJECT, "true")]), false));
        assert!(!captured(&map(&[]), true));
        assert!(captured(&map(&[(STATUS, "{}")]), true));
    }
}
