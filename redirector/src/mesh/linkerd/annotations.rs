//! Linkerd's pod annotations in node mode: whether a pod is captured at all, and its
//! proxy-init flags as linkerd-cni derives them from its configuration's flags and the
//! pod's `config.linkerd.io/*` annotations.
//!
//! A plugin in the cluster network's chain sees every pod of the node, and capturing a pod
//! with no Linkerd proxy sends its connections to a port where nothing listens; so only
//! pods the injector injected are captured ([`left_alone`]).
//!
//! The override rules are linkerd-cni's (`cmdAdd` in `cni-plugin/main.go` of
//! linkerd/linkerd2-proxy-init), in its order, plus three the injector applies to its
//! init container and linkerd-cni misses ([`flags`]).

use std::collections::BTreeMap;

use super::tail::without_flag;
use crate::mesh::common::duration::parse_go_duration;

/// The annotation the injector puts on every pod it injects.
pub const PROXY_VERSION: &str = "linkerd.io/proxy-version";
/// The label of the pods of Linkerd's control plane (its value names the component).
pub const CONTROL_PLANE_COMPONENT: &str = "linkerd.io/control-plane-component";
/// The proxy's container (a native sidecar is an init container of that name).
pub const PROXY_CONTAINER: &str = "linkerd-proxy";
/// The init container that runs proxy-init itself when the injector is not in CNI mode.
pub const INIT_CONTAINER: &str = "linkerd-init";

/// Replaces the outbound ignore list (`--outbound-ports-to-ignore`).
pub const SKIP_OUTBOUND_PORTS: &str = "config.linkerd.io/skip-outbound-ports";
/// Appended to the inbound ignore list (`--inbound-ports-to-ignore`).
pub const SKIP_INBOUND_PORTS: &str = "config.linkerd.io/skip-inbound-ports";
/// Replaces the ignored inbound source subnets (`--subnets-to-ignore`).
pub const SKIP_SUBNETS: &str = "config.linkerd.io/skip-subnets";
/// The proxy's uid (`--proxy-uid`); must be an integer.
pub const PROXY_UID: &str = "config.linkerd.io/proxy-uid";
/// The proxy's gid (`--proxy-gid`); must be an integer.
pub const PROXY_GID: &str = "config.linkerd.io/proxy-gid";
/// The proxy's inbound port (`--incoming-proxy-port`): the injector's rule, not linkerd-cni's.
pub const INBOUND_PORT: &str = "config.linkerd.io/inbound-port";
/// The proxy's outbound port (`--outgoing-proxy-port`): the injector's rule, not linkerd-cni's.
pub const OUTBOUND_PORT: &str = "config.linkerd.io/outbound-port";
/// A Go duration (`1h0m0s`) → `--timeout-close-wait-secs`: the injector's rule, not linkerd-cni's.
pub const CLOSE_WAIT_TIMEOUT: &str = "config.linkerd.io/close-wait-timeout";

/// The annotations linkerd-cni reads from the pod's namespace when the pod has none.
pub const NAMESPACE_DEFAULTED: [&str; 5] = [
    SKIP_OUTBOUND_PORTS,
    SKIP_INBOUND_PORTS,
    SKIP_SUBNETS,
    PROXY_UID,
    PROXY_GID,
];

/// The API server's ports a control-plane pod reaches directly. linkerd-cni reads them
/// from the `default/kubernetes` Service (each port and numeric target port) and falls back
/// to these when it cannot; these are what a pure function can know.
pub const API_SERVER_PORTS: [&str; 2] = ["443", "6443"];

/// Whether Linkerd's injector injected the pod: it carries a non-empty
/// `linkerd.io/proxy-version`.
pub fn injected(annotations: &BTreeMap<String, String>) -> bool {
    annotations
        .get(PROXY_VERSION)
        .is_some_and(|version| !version.is_empty())
}

/// Why a pod is left alone; `None` when it is to be captured: an injected pod
/// ([`injected`]) outside `excluded_namespaces`.
pub fn left_alone(
    namespace: Option<&str>,
    excluded_namespaces: &[String],
    annotations: &BTreeMap<String, String>,
) -> Option<String> {
    if let Some(ns) = namespace.filter(|ns| excluded_namespaces.iter().any(|e| e == ns)) {
        return Some(format!("namespace {ns} is excluded (excludeNamespaces)"));
    }
    if !injected(annotations) {
        return Some(format!(
            "no {PROXY_VERSION} annotation: Linkerd did not inject the pod"
        ));
    }
    None
}

/// linkerd-cni's own test, on the pod's container names: left alone unless it has a
/// `linkerd-proxy` container (or native-sidecar init container) and no `linkerd-init`
/// init container, which captures the pod itself.
pub fn left_alone_by_containers(containers: &[&str], init_containers: &[&str]) -> Option<String> {
    if init_containers.contains(&INIT_CONTAINER) {
        return Some(format!(
            "the {INIT_CONTAINER} init container captures the pod itself"
        ));
    }
    if !containers.contains(&PROXY_CONTAINER) && !init_containers.contains(&PROXY_CONTAINER) {
        return Some(format!("no {PROXY_CONTAINER} container"));
    }
    None
}

/// Whether the pod is part of Linkerd's control plane: a non-empty
/// `linkerd.io/control-plane-component` label (the `control_plane` of [`flags`]).
pub fn control_plane(labels: &BTreeMap<String, String>) -> bool {
    labels
        .get(CONTROL_PLANE_COMPONENT)
        .is_some_and(|component| !component.is_empty())
}

/// The annotations [`flags`] reads, as linkerd-cni finds them: each of
/// [`NAMESPACE_DEFAULTED`] from the pod when non-empty there, else from its namespace;
/// every other one from the pod alone.
pub fn with_namespace_defaults(
    pod: &BTreeMap<String, String>,
    namespace: &BTreeMap<String, String>,
) -> BTreeMap<String, String> {
    let mut merged = pod.clone();
    for key in NAMESPACE_DEFAULTED {
        if given(pod, key).is_none() {
            if let Some(value) = given(namespace, key) {
                merged.insert(key.to_owned(), value.to_owned());
            }
        }
    }
    merged
}

/// The pod's proxy-init flags: `defaults` (the network's flags, linkerd-cni's settings
/// among them) with the pod's annotations applied, as an argv tail `parse_proxy_init`
/// reads (later single-valued flags win; a replaced list's earlier occurrences are
/// dropped). An empty annotation counts as absent; `control_plane` pods also skip the API
/// server's ports outbound ([`API_SERVER_PORTS`]). `Err` (ADD fails) when
/// `config.linkerd.io/proxy-uid` or `proxy-gid` is not an integer.
///
/// In linkerd-cni's order: `skip-outbound-ports` replaces, `skip-inbound-ports` appends,
/// `skip-subnets` replaces, `proxy-uid` and `proxy-gid` replace, the API server's ports are
/// appended last. linkerd-cni ignores the other annotations; the injector's rules for
/// three of them are applied too, so a pod is captured as its init container would have
/// captured it (the proxy listens where the injector told it to):
/// `inbound-port`/`outbound-port` replace the proxy ports when they read as the injector
/// reads them (a decimal int32; anything else leaves the proxy, and so the flag, at its
/// default), and `close-wait-timeout`, a Go duration, gives `--timeout-close-wait-secs`
/// in whole seconds (an invalid, negative or sub-second one gives nothing).
pub fn flags(
    defaults: &[String],
    annotations: &BTreeMap<String, String>,
    control_plane: bool,
) -> Result<Vec<String>, String> {
    let mut flags = defaults.to_vec();
    if let Some(ports) = given(annotations, SKIP_OUTBOUND_PORTS) {
        flags = without_flag(&flags, "outbound-ports-to-ignore");
        flags.push(format!("--outbound-ports-to-ignore={ports}"));
    }
    if let Some(ports) = given(annotations, SKIP_INBOUND_PORTS) {
        flags.push(format!("--inbound-ports-to-ignore={ports}"));
    }
    if let Some(subnets) = given(annotations, SKIP_SUBNETS) {
        flags = without_flag(&flags, "subnets-to-ignore");
        flags.push(format!("--subnets-to-ignore={subnets}"));
    }
    for (annotation, flag) in [(PROXY_UID, "proxy-uid"), (PROXY_GID, "proxy-gid")] {
        if let Some(text) = given(annotations, annotation) {
            // Go's strconv.Atoi: decimal, an optional sign, int64. Written back in decimal,
            // since proxy-init's own flag would read `010` as octal.
            let id: i64 = text
                .parse()
                .map_err(|_| format!("{annotation}: {text:?} is not an integer"))?;
            flags.push(format!("--{flag}={id}"));
        }
    }
    for (annotation, flag) in [
        (INBOUND_PORT, "incoming-proxy-port"),
        (OUTBOUND_PORT, "outgoing-proxy-port"),
    ] {
        // The injector's strconv.ParseInt(text, 10, 32).
        if let Some(port) = given(annotations, annotation).and_then(|p| p.parse::<i32>().ok()) {
            flags.push(format!("--{flag}={port}"));
        }
    }
    let close_wait_secs = given(annotations, CLOSE_WAIT_TIMEOUT)
        .and_then(parse_go_duration)
        .map(|timeout| timeout.as_secs())
        .filter(|&secs| secs > 0);
    if let Some(secs) = close_wait_secs {
        flags.push(format!("--timeout-close-wait-secs={secs}"));
    }
    if control_plane {
        let ports = API_SERVER_PORTS.join(",");
        flags.push(format!("--outbound-ports-to-ignore={ports}"));
    }
    Ok(flags)
}

/// An annotation's value; an empty one counts as absent, as in linkerd-cni.
fn given<'a>(annotations: &'a BTreeMap<String, String>, key: &str) -> Option<&'a str> {
    annotations
        .get(key)
        .map(String::as_str)
        .filter(|value| !value.is_empty())
}
