use super::*;

fn argv(args: &[&str]) -> Vec<String> {
    std::iter::once("ambient")
        .chain(args.iter().copied())
        .map(str::to_owned)
        .collect()
}

const POD: [&str; 6] = [
    "--pod-uid",
    "0b1c",
    "--name",
    "shop/cart-7f9",
    "--service-account",
    "cart",
];

#[test]
fn an_ambient_pod_is_captured_to_ztunnels_ports_with_no_proxy_owner() {
    let (capture, _) = Ambient.read_flags(argv(&POD)).unwrap();
    assert_eq!(
        (
            capture.outbound_port,
            capture.inbound_port,
            capture.tunnel_port
        ),
        (15001, 15006, 15008)
    );
    assert!(capture.proxy_uids.is_empty() && capture.proxy_gids.is_empty());
    assert!(capture.ztunnel && capture.local_destinations_pass);
    assert_eq!(capture.inbound_ports, PortSelection::All);
    assert!(!capture.redirect_dns);
    assert_eq!(
        capture.inbound_exclude_sources,
        vec!["169.254.7.127/32".parse::<IpNet>().unwrap()]
    );
}

#[test]
fn the_workload_ztunnel_is_told_of_comes_from_the_flags() {
    let args: Vec<String> = POD.iter().map(|a| a.to_string()).collect();
    let (uid, info) = Ambient.ztunnel_workload(&args).unwrap();
    assert_eq!(uid, "0b1c");
    assert_eq!(
        (
            info.namespace.as_str(),
            info.name.as_str(),
            info.service_account.as_str()
        ),
        ("shop", "cart-7f9", "cart")
    );
}

#[test]
fn annotations_bypass_inbound_and_turn_dns_capture_on_or_leave_the_pod_alone() {
    let args: Vec<String> = POD.iter().map(|a| a.to_string()).collect();
    let annotations: Annotations = [
        (BYPASS_INBOUND.to_owned(), "true".to_owned()),
        (DNS_CAPTURE.to_owned(), "true".to_owned()),
    ]
    .into();
    let Selection::Capture(flags) = Ambient.requested(&args, &annotations).unwrap() else {
        panic!("captured");
    };
    let (capture, _) = Ambient
        .read_flags(std::iter::once("ambient".to_owned()).chain(flags).collect())
        .unwrap();
    assert_eq!(capture.inbound_ports, PortSelection::None);
    assert!(capture.redirect_dns && capture.capture_all_dns);

    let none: Annotations = [(DATAPLANE_MODE.to_owned(), "none".to_owned())].into();
    assert!(matches!(
        Ambient.requested(&args, &none).unwrap(),
        Selection::LeftAlone(_)
    ));
    let bad: Annotations = [(DNS_CAPTURE.to_owned(), "yes".to_owned())].into();
    let err = Ambient.requested(&args, &bad).unwrap_err().to_string();
    assert!(err.contains(DNS_CAPTURE) && err.contains("yes"), "{err}");
}

#[test]
fn a_pod_without_a_uid_or_with_a_bad_name_is_refused_naming_the_flag() {
    let err = Ambient
        .read_flags(argv(&["--name", "shop/cart"]))
        .unwrap_err()
        .to_string();
    assert!(err.contains("--pod-uid"), "{err}");
    let err = Ambient
        .read_flags(argv(&["--pod-uid", "u", "--name", "cart"]))
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("--name") && err.contains("NAMESPACE/NAME"),
        "{err}"
    );
}
