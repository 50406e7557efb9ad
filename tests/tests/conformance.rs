//! The conformance suite: for each configuration of istio's golden rule sets that does not
//! need TPROXY, plus the standard sidecar injection and a few derived configurations, every
//! scenario (who connects, to which address and port; for DNS cases, who sends which DNS
//! query how) runs against istio's own iptables rules and against redirector, each in a
//! fresh pod, and must land on the same listener with the same SO_ORIGINAL_DST (DNS: get
//! the same answerer, from the same source). A case fails listing every scenario that
//! differs. See docs/conformance.md.
//!
//! Run as root, one thread:
//! `cargo build -p redirector -p redirector-tests --bins && REDIRECTOR_BIN=$PWD/target/debug/redirector
//!  cargo test -p redirector-tests --test conformance -- --test-threads=1 --nocapture`

use std::collections::BTreeSet;

use redirector_tests::conformance::cases::{
    case, cases, cases_md_names, Case, SKIPPED_GOLDEN_CASES,
};
use redirector_tests::conformance::rules::{
    derive_v6, table, without_v6_only_rules, V6Origin, DEFAULT_LOOPBACK_V4,
};
use redirector_tests::conformance::{run_case, run_scenarios, PassthroughV6, Scenarios};
use redirector_tests::dns::use_dnsprobe_bin;
use redirector_tests::golden_dir;
use redirector_tests::iptables::golden;
use redirector_tests::prelude::*;
use redirector_tests::redirector::{fallback_in_use, install_with_interfaces, INGRESS_IFINDEX};
use redirector_tests::scenario::{Family, Scenario};

/// Runs one case on both sides, prints its table, and fails listing every mismatch.
fn check(name: &str) {
    privileged!();
    use_dnsprobe_bin(env!("CARGO_BIN_EXE_dnsprobe"));
    let case = case(name);
    if let Some(flag) = interface_list_of_the_pod(&case) {
        if fallback_in_use(INGRESS_IFINDEX) {
            // Without ingress_ifindex (a kernel before 5.17) the list is refused instead.
            let topo = Topology::new("confiface");
            let root = PinRoot::new("confiface");
            let flags: Vec<&str> = case.flags.iter().map(String::as_str).collect();
            assert!(!install_with_interfaces(
                &topo.pod,
                &topo.pod_cgroup,
                &root,
                &flags,
                flag
            ));
            println!("{name}: refused, naming {flag} (the programs do without ingress_ifindex)");
            return;
        }
    }
    run_case(&case).assert_conforms();
}

/// The interface list (`-c` or `-k`) of `case` that names an interface of the test pods
/// (eth0), if any.
fn interface_list_of_the_pod(case: &Case) -> Option<&'static str> {
    case.flags.windows(2).find_map(|w| {
        let flag = match w[0].as_str() {
            "-c" => "-c",
            "-k" => "-k",
            _ => return None,
        };
        w[1].split(',').any(|i| i == "eth0").then_some(flag)
    })
}

redirector_tests::case_tests! {
    check:
    standard_injection => "standard-injection",
    empty => "empty",
    inbound_ports_wildcard => "inbound-ports-wildcard",
    inbound_ports_include => "inbound-ports-include",
    ipnets => "ipnets",
    kube_virt_interfaces => "kube-virt-interfaces",
    ipnets_with_kube_virt_interfaces => "ipnets-with-kube-virt-interfaces",
    outbound_ports_include => "outbound-ports-include",
    basic_exclude_nic => "basic-exclude-nic",
    drop_invalid => "drop-invalid",
    host_ipv4_loopback_cidr => "host-ipv4-loopback-cidr",
    ipv6_empty_inbound_ports => "ipv6-empty-inbound-ports",
    ipv6_inbound_ports => "ipv6-inbound-ports",
    ipv6_virt_interfaces => "ipv6-virt-interfaces",
    ipv6_ipnets => "ipv6-ipnets",
    ipv6_uid_gid => "ipv6-uid-gid",
    ipv6_outbound_ports => "ipv6-outbound-ports",
    outbound_owner_groups => "outbound-owner-groups",
    outbound_owner_groups_exclude => "outbound-owner-groups-exclude",
    outbound_owner_groups_capture_all => "outbound-owner-groups+capture-all",
    outbound_owner_groups_exclude_capture_all => "outbound-owner-groups-exclude+capture-all",
    ip_range => "ip-range",
    loopback_outbound_iprange => "loopback-outbound-iprange",
    dns_uid_gid => "dns-uid-gid",
    ipv6_dns_uid_gid => "ipv6-dns-uid-gid",
    ipv6_dns_outbound_owner_groups => "ipv6-dns-outbound-owner-groups",
    ipv6_dns_outbound_owner_groups_exclude => "ipv6-dns-outbound-owner-groups-exclude",
    outbound_exclusions => "outbound-exclusions",
    loopback_include => "loopback-include",
    uid_gid_capture_all => "uid-gid+capture-all",
}

/// The proxy's IPv6 inbound passthrough — envoy binds `::6` and connects to the app — works
/// after redirector's setup as after istio-iptables', which adds `::6/128` to `lo`. The case
/// tests above give both pods that address up front (so they compare capture decisions);
/// here the redirector pod has only what redirector itself set up. With `-b '*'`, so that
/// inbound capture must also leave these pod-internal connections alone.
#[test]
fn ipv6_passthrough_source_works_after_setup() {
    privileged!();
    let case = case("standard-injection");
    let scenarios: Vec<Scenario> = case
        .outbound_scenarios()
        .into_iter()
        .filter(|s| s.who.passthrough && s.dst.family == Family::V6)
        .collect();
    assert!(scenarios.len() >= 3, "{scenarios:?}");
    let scenarios = Scenarios {
        outbound: scenarios,
        ..Scenarios::default()
    };
    run_scenarios(&case, &scenarios, PassthroughV6::LeftToRedirector).assert_conforms();
}

/// No case of the table is left without a test, and no test names a case not in it.
#[test]
fn every_case_of_the_table_has_a_test() {
    let table: BTreeSet<String> = cases().into_iter().map(|c| c.name).collect();
    let tested: BTreeSet<String> = TESTED.iter().map(|s| (*s).to_owned()).collect();
    assert_eq!(table, tested);
    for case in cases() {
        let scenarios = case.outbound_scenarios();
        assert!(
            scenarios.len() >= 50,
            "{}: only {} scenarios",
            case.name,
            scenarios.len()
        );
        assert!(
            !case.inbound_scenarios().is_empty(),
            "{}: no inbound rows",
            case.name
        );
        // Every case whose flags capture DNS has DNS rows, and only those.
        let redirects_dns = case.flags.iter().any(|f| f == "--redirect-dns");
        assert_eq!(
            case.dns.is_some(),
            redirects_dns,
            "{}: DNS setup",
            case.name
        );
        assert_eq!(
            !case.dns_scenarios().is_empty(),
            redirects_dns,
            "{}: DNS rows",
            case.name
        );
    }
}

/// Every CASES.md case is either run (under its own name) or skipped with a reason.
#[test]
fn every_golden_case_is_run_or_skipped_with_a_reason() {
    let listed: BTreeSet<String> = cases_md_names().into_iter().collect();
    assert!(listed.len() >= 27, "CASES.md table not found: {listed:?}");
    let run: BTreeSet<String> = cases().into_iter().filter_map(|c| c.golden).collect();
    let skipped: BTreeSet<String> = SKIPPED_GOLDEN_CASES
        .iter()
        .map(|(n, _)| (*n).to_owned())
        .collect();
    assert!(
        run.is_disjoint(&skipped),
        "run and skipped: {:?}",
        run.intersection(&skipped)
    );
    let covered: BTreeSet<String> = run.union(&skipped).cloned().collect();
    assert_eq!(covered, listed, "CASES.md cases neither run nor skipped");
    for (name, reason) in SKIPPED_GOLDEN_CASES {
        assert!(
            reason.starts_with("TPROXY"),
            "{name} is skipped for {reason:?}: only TPROXY cases may be"
        );
    }
}

/// The rule that derives an IPv6 section from an IPv4 one reproduces istio's own IPv6
/// section for every golden file that has one, apart from the IPv6-only CIDR rules it
/// cannot know. (DNS cases are left out: istio adds their per-family jumps only for
/// families that have a DNS server.)
#[test]
fn derived_ipv6_sections_match_istios() {
    let mut checked = 0;
    for entry in std::fs::read_dir(golden_dir())
        .expect("golden dir")
        .flatten()
    {
        let path = entry.path();
        let Some(name) = path.file_stem().and_then(|s| s.to_str()) else {
            continue;
        };
        if path.extension().is_none_or(|e| e != "golden") || name.contains("dns") {
            continue;
        }
        let (v4, Some(v6)) = golden(name) else {
            continue;
        };
        if v4.contains("--redirect-dns") || v4.contains("ISTIO_OUTPUT_DNS") {
            continue;
        }
        assert_eq!(
            derive_v6(&v4, DEFAULT_LOOPBACK_V4),
            without_v6_only_rules(&v6),
            "{name}: derived IPv6 section differs from istio's"
        );
        checked += 1;
    }
    assert!(
        checked >= 6,
        "only {checked} golden files with an IPv6 section checked"
    );
    for case in cases() {
        if case.rules.v6_origin == V6Origin::Derived {
            assert!(
                !case.rules.v6.contains("127.0.0."),
                "{}: IPv4 address in IPv6 rules",
                case.name
            );
        }
    }
}

/// For a DNS configuration with IPv4 servers only, the derivation reproduces the IPv6 nat
/// and raw tables istio writes: `tproxy.golden` is the one golden file with IPv6 on and an
/// IPv4-only DNS server (its mangle table is TPROXY's, not derived here).
#[test]
fn derived_ipv6_dns_tables_match_istios() {
    let (v4, Some(v6)) = golden("tproxy") else {
        panic!("tproxy.golden has an IPv6 section");
    };
    assert!(
        v4.contains("-d 127.0.0.53/32"),
        "tproxy.golden has an IPv4 DNS server"
    );
    let derived = derive_v6(&v4, DEFAULT_LOOPBACK_V4);
    for name in ["nat", "raw"] {
        assert_eq!(
            table(&derived, name),
            without_v6_only_rules(&table(&v6, name)),
            "tproxy: derived IPv6 {name} table differs from istio's"
        );
    }
    // The cases derived this way keep no jump to an empty DNS chain.
    for case in ["ip-range", "loopback-outbound-iprange"] {
        let rules = &redirector_tests::conformance::cases::case(case).rules;
        assert_eq!(rules.v6_origin, V6Origin::Derived, "{case}");
        let (nat, raw) = (table(&rules.v6, "nat"), table(&rules.v6, "raw"));
        assert!(!nat.contains("ISTIO_OUTPUT_DNS"), "{case}:\n{nat}");
        assert!(!raw.contains("ISTIO_INBOUND"), "{case}:\n{raw}");
        assert!(
            rules.v6.contains("--dport 53"),
            "{case}: port-53 owner rules:\n{}",
            rules.v6
        );
    }
}

/// The derived `loopback-include` case has the shape istio gives `-i 127.1.2.3/32`.
#[test]
fn loopback_include_follows_istios_loopback_iprange_rules() {
    let (istio, _) = golden("loopback-outbound-iprange");
    let ours = case("loopback-include").rules.v4;
    for rules in [&istio, &ours] {
        assert!(
            !rules.contains("-o lo -m owner !"),
            "lo RETURN rules present:\n{rules}"
        );
        assert!(
            rules.contains("-A ISTIO_OUTPUT -d 127.1.2.3/32 -j ISTIO_REDIRECT"),
            "no include rule:\n{rules}"
        );
    }
}

/// The derived `uid-gid+capture-all` keeps only outbound rules: it is `empty` with the
/// owner rules of `-u 3,4 -g 1,2` and `-i '*'`.
#[test]
fn uid_gid_capture_all_is_empty_with_other_owners() {
    let owner_free = |s: &str| -> Vec<String> {
        s.lines()
            .filter(|l| !l.contains("-owner") && *l != "-A ISTIO_OUTPUT -j ISTIO_REDIRECT")
            .map(str::to_owned)
            .collect()
    };
    let derived = case("uid-gid+capture-all").rules;
    let empty = case("empty").rules;
    assert_eq!(owner_free(&derived.v4), owner_free(&empty.v4));
    assert_eq!(owner_free(&derived.v6), owner_free(&empty.v6));
    assert_eq!(
        derived.v4.matches("--uid-owner 3 ").count(),
        3,
        "{}",
        derived.v4
    );
    assert!(derived
        .v4
        .trim_end()
        .ends_with("-A ISTIO_OUTPUT -j ISTIO_REDIRECT\nCOMMIT"));
}
