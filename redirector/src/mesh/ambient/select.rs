//! Which pods the chained plugin enrolls in ambient, as istio-cni's node agent chooses
//! them: pods labelled `istio.io/dataplane-mode=ambient` and pods of the namespaces the
//! network configuration lists (`ambientNamespaces`: namespace labels need the API
//! server, which a node plugin does not ask). Never a pod with a sidecar, ztunnel's own
//! pods (`app=ztunnel`), pods of `excludeNamespaces`, nor a pod opted out with
//! `istio.io/dataplane-mode=none`.

use serde::Deserialize;

use super::{left_alone, with_annotations, AmbientArgs, DATAPLANE_MODE};
use crate::mesh::{Annotations, MeshError, Network, PodMeta, Selected, Selection};

/// The value of [`DATAPLANE_MODE`] that enrolls a pod.
pub const AMBIENT_MODE: &str = "ambient";
/// The pod annotation naming the service account ztunnel is told of: the runtime gives a
/// plugin none (without it ztunnel is told `default`).
pub const SERVICE_ACCOUNT: &str = "redirector.io/service-account";
/// The label istio's ztunnel chart gives ztunnel's pods.
const ZTUNNEL_LABEL: (&str, &str) = ("app", "ztunnel");

/// The ambient dialect's keys of the network configuration.
#[derive(Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
struct AmbientKeys {
    /// Every pod of these namespaces is enrolled (istio's namespace label, which a node
    /// plugin cannot read).
    #[serde(default)]
    ambient_namespaces: Vec<String>,
}

/// The chained plugin's rule for `pod` on `network`: its ambient flags (who it is, the
/// network's flags, its annotations applied), or why it is left alone.
pub fn node_flags(network: &Network<'_>, pod: &PodMeta<'_>) -> Selected {
    let keys: AmbientKeys = network.mesh_keys()?;
    let no_labels = Annotations::new();
    let labels = pod.labels.unwrap_or(&no_labels);
    if let Some(why) = network.excluded(pod.namespace) {
        return Ok(Selection::LeftAlone(why));
    }
    if labels
        .get(ZTUNNEL_LABEL.0)
        .is_some_and(|v| v == ZTUNNEL_LABEL.1)
    {
        return Ok(Selection::LeftAlone(
            "ztunnel's own pod (app=ztunnel)".into(),
        ));
    }
    // The opt-out label, then the annotations' (the opt-out annotation, a sidecar).
    if labels.get(DATAPLANE_MODE).is_some_and(|m| m == "none") {
        return Ok(Selection::LeftAlone(format!("label {DATAPLANE_MODE}=none")));
    }
    if let Some(why) = left_alone(pod.annotations) {
        return Ok(Selection::LeftAlone(why));
    }
    let ambient = |meta: &Annotations| meta.get(DATAPLANE_MODE).is_some_and(|m| m == AMBIENT_MODE);
    let listed = pod
        .namespace
        .is_some_and(|ns| keys.ambient_namespaces.iter().any(|n| n == ns));
    if !(ambient(labels) || ambient(pod.annotations) || listed) {
        let why = match pod.labels {
            Some(_) => format!("not labelled {DATAPLANE_MODE}={AMBIENT_MODE}, and its namespace is not in ambientNamespaces"),
            None => format!("its labels could not be read, and neither an annotation {DATAPLANE_MODE}={AMBIENT_MODE} nor ambientNamespaces enrolls it"),
        };
        return Ok(Selection::LeftAlone(why));
    }
    // The pod's annotations after the network's flags: theirs is the last word.
    let mut args = identity(pod)?;
    args.extend(network.arg_list()?);
    let args = with_annotations(&args, pod.annotations)?;
    // Read now, so that a bad network flag fails the pod's ADD naming it.
    AmbientArgs::of(&args)?;
    Ok(Selection::Capture(args))
}

/// The flags saying who the pod is, from what the runtime gave: ztunnel keys a pod on its
/// uid and knows it by namespace, name and service account.
fn identity(pod: &PodMeta<'_>) -> Result<Vec<String>, MeshError> {
    let (Some(namespace), Some(name), Some(uid)) = (pod.namespace, pod.name, pod.uid) else {
        return Err(MeshError::Settings(
            "an ambient pod needs its namespace, name and uid from the runtime (CNI_ARGS K8S_POD_NAMESPACE, K8S_POD_NAME, K8S_POD_UID)".into(),
        ));
    };
    let mut flags = vec![
        "--pod-uid".to_owned(),
        uid.to_owned(),
        "--name".to_owned(),
        format!("{namespace}/{name}"),
    ];
    if let Some(sa) = pod
        .annotations
        .get(SERVICE_ACCOUNT)
        .filter(|sa| !sa.is_empty())
    {
        flags.extend(["--service-account".to_owned(), sa.clone()]);
    }
    Ok(flags)
}

/// A network's flags for its ambient pods (`args`), checked as they will be read: with a
/// pod's identity before them.
pub fn check_network_args(args: &[String]) -> Result<(), MeshError> {
    let pod = ["--pod-uid", "uid", "--name", "namespace/name"];
    let argv: Vec<String> = pod
        .into_iter()
        .map(str::to_owned)
        .chain(args.iter().cloned())
        .collect();
    AmbientArgs::of(&argv).map(drop)
}

#[cfg(test)]
mod tests {
    use serde_json::{json, Map, Value};

    use super::*;

    fn meta(pairs: &[(&str, &str)]) -> Annotations {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    /// The network of an ambient entry listing `shop`, and its keys.
    struct Net {
        args: Value,
        exclude: Vec<String>,
        keys: Map<String, Value>,
    }

    impl Net {
        fn new() -> Self {
            let keys = json!({"ambientNamespaces": ["shop"], "capabilities": {}});
            Net {
                args: json!([]),
                exclude: vec!["kube-system".into(), "istio-system".into()],
                keys: keys.as_object().unwrap().clone(),
            }
        }

        fn network(&self) -> Network<'_> {
            Network {
                args: &self.args,
                exclude_namespaces: &self.exclude,
                keys: &self.keys,
            }
        }
    }

    /// The rules' answer for a pod of `namespace` with `labels` (`None`: unknown) and
    /// `annotations`.
    fn select(
        namespace: &str,
        labels: Option<&Annotations>,
        annotations: &Annotations,
    ) -> Selection {
        let net = Net::new();
        let pod = PodMeta {
            namespace: Some(namespace),
            name: Some("app-1"),
            uid: Some("uid-1"),
            annotations,
            labels,
        };
        node_flags(&net.network(), &pod).unwrap()
    }

    fn enrolled(selection: &Selection) -> bool {
        matches!(selection, Selection::Capture(_))
    }

    const AMBIENT: (&str, &str) = (DATAPLANE_MODE, AMBIENT_MODE);

    #[test]
    fn a_labelled_pod_is_enrolled_with_who_it_is() {
        let labels = meta(&[AMBIENT]);
        let Selection::Capture(args) = select("default", Some(&labels), &meta(&[])) else {
            panic!("not enrolled");
        };
        assert_eq!(args, ["--pod-uid", "uid-1", "--name", "default/app-1"]);
        let sa = meta(&[(SERVICE_ACCOUNT, "cart")]);
        let Selection::Capture(args) = select("default", Some(&labels), &sa) else {
            panic!("not enrolled");
        };
        assert!(args.ends_with(&["--service-account".into(), "cart".into()]));
    }

    #[test]
    fn a_pod_of_a_listed_namespace_is_enrolled_without_a_label() {
        assert!(enrolled(&select("shop", Some(&meta(&[])), &meta(&[]))));
        assert!(enrolled(&select("shop", None, &meta(&[]))));
    }

    #[test]
    fn an_unlabelled_pod_elsewhere_is_left_alone_saying_why() {
        let Selection::LeftAlone(why) = select("default", Some(&meta(&[])), &meta(&[])) else {
            panic!("enrolled");
        };
        assert!(why.contains("not labelled"), "{why}");
        let Selection::LeftAlone(why) = select("default", None, &meta(&[])) else {
            panic!("enrolled");
        };
        assert!(why.contains("labels could not be read"), "{why}");
        // Another mode is not ambient.
        let labels = meta(&[(DATAPLANE_MODE, "sidecar")]);
        assert!(!enrolled(&select("default", Some(&labels), &meta(&[]))));
    }

    #[test]
    fn the_annotation_enrolls_where_the_labels_are_unknown() {
        assert!(enrolled(&select("default", None, &meta(&[AMBIENT]))));
    }

    #[test]
    fn a_sidecar_ztunnel_an_excluded_namespace_and_the_opt_out_are_never_enrolled() {
        let ambient = meta(&[AMBIENT]);
        let cases = [
            (
                "default",
                Some(ambient.clone()),
                meta(&[("sidecar.istio.io/status", "{}")]),
                "sidecar",
            ),
            (
                "shop",
                Some(meta(&[("app", "ztunnel"), AMBIENT])),
                meta(&[]),
                "ztunnel",
            ),
            (
                "kube-system",
                Some(ambient.clone()),
                meta(&[AMBIENT]),
                "excluded",
            ),
            // The ztunnel's namespace, listed as ambient's and excluded: excluded wins.
            ("istio-system", None, meta(&[AMBIENT]), "excluded"),
            (
                "shop",
                Some(meta(&[(DATAPLANE_MODE, "none")])),
                meta(&[]),
                "=none",
            ),
            ("shop", None, meta(&[(DATAPLANE_MODE, "none")]), "=none"),
            (
                "default",
                Some(meta(&[(DATAPLANE_MODE, "none")])),
                meta(&[AMBIENT]),
                "=none",
            ),
        ];
        for (namespace, labels, annotations, reason) in cases {
            match select(namespace, labels.as_ref(), &annotations) {
                Selection::LeftAlone(why) => assert!(why.contains(reason), "{why}"),
                Selection::Capture(args) => panic!("{namespace} {labels:?}: enrolled {args:?}"),
            }
        }
    }

    #[test]
    fn an_enrolled_pod_without_its_identity_or_with_bad_settings_is_refused() {
        let net = Net::new();
        let labels = meta(&[AMBIENT]);
        let no_uid = PodMeta {
            namespace: Some("default"),
            name: Some("app-1"),
            uid: None,
            annotations: &meta(&[]),
            labels: Some(&labels),
        };
        let err = node_flags(&net.network(), &no_uid).unwrap_err().to_string();
        assert!(err.contains("K8S_POD_UID"), "{err}");
        let bad = meta(&[("ambient.istio.io/dns-capture", "yes")]);
        let pod = PodMeta {
            uid: Some("uid-1"),
            annotations: &bad,
            ..no_uid
        };
        let err = node_flags(&net.network(), &pod).unwrap_err().to_string();
        assert!(err.contains("dns-capture"), "{err}");
    }

    #[test]
    fn a_pods_annotation_overrides_the_networks_flag() {
        let mut net = Net::new();
        net.args = json!(["--dns-capture", "true"]);
        let off = meta(&[("ambient.istio.io/dns-capture", "false")]);
        let labels = meta(&[AMBIENT]);
        let pod = PodMeta {
            namespace: Some("default"),
            name: Some("app-1"),
            uid: Some("uid-1"),
            annotations: &off,
            labels: Some(&labels),
        };
        let Selection::Capture(args) = node_flags(&net.network(), &pod).unwrap() else {
            panic!("not enrolled");
        };
        assert!(!AmbientArgs::of(&args).unwrap().dns_capture);
        assert!(check_network_args(&["--dns-capture".into(), "true".into()]).is_ok());
        assert!(check_network_args(&["--no-such-flag".into()]).is_err());
    }

    #[test]
    fn node_addresses_still_add_up() {
        // The override of a repeated setting leaves the repeatable list whole.
        let argv = [
            "ambient",
            "--pod-uid",
            "u",
            "--name",
            "a/b",
            "--node-address",
            "10.0.0.1",
            "--node-address",
            "10.0.0.2",
        ];
        let args = AmbientArgs::read(argv.map(String::from).to_vec()).unwrap();
        assert_eq!(args.node_addresses.len(), 2);
    }
}
