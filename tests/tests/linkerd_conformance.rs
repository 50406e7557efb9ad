//! The Linkerd conformance suite: for each proxy-init command line of the case table (the
//! injector's defaults, port ranges, source subnets, listed ports, a gid, uid 0, IPv6 on and off,
//! the dual-stack inbound listener, re-runs), the same connections run in a pod with the nat rules
//! Linkerd's proxy-init writes, loaded by real `iptables-restore`, and in a pod set up by
//! `redirector linkerd-proxy-init` with the same command line. Each must land on the same listener
//! with the same SO_ORIGINAL_DST. The reference side is first checked against
//! docs/linkerd.md#what-is-captured, so a fault of the suite is told apart from one of redirector.
//!
//! Run as root, one thread:
//! `cargo build -p redirector && cargo test -p redirector-tests --test linkerd_conformance
//!  -- --test-threads=1 --nocapture`

use std::collections::BTreeSet;

use redirector_tests::linkerd::cases::{case, cases};
use redirector_tests::linkerd::proxy_init::{rules_by_chain, CaptureState};
use redirector_tests::linkerd::{
    apply_reference, dual_stack, reference_rules_as_loaded, run_case, run_reference,
};
use redirector_tests::prelude::*;
use redirector_tests::scenario::Family;

/// Runs one case on both sides, prints its table, and fails listing every row that
/// differs (and every row where the reference strays from the contract).
fn check(name: &str) {
    privileged!();
    run_case(&case(name)).assert_conforms();
}

redirector_tests::case_tests! {
    check:
    defaults => "defaults",
    ipv6 => "ipv6",
    port_ranges => "port-ranges",
    wide_ranges => "wide-ranges",
    subnets => "subnets",
    subnets_ipv6 => "subnets-ipv6",
    listed_ports => "listed-ports",
    proxy_gid => "proxy-gid",
    uid_0 => "uid-0",
    dual_stack_listener => "dual-stack-listener",
    rerun => "rerun",
    rerun_replaces => "rerun-replaces",
}

/// No case of the table is left without a test, and no test names a case not in it.
#[test]
fn every_case_of_the_table_has_a_test() {
    let table: BTreeSet<&str> = cases().iter().map(|c| c.name).collect();
    let tested: BTreeSet<&str> = TESTED.iter().copied().collect();
    assert_eq!(table, tested);
}

/// Linkerd's rules alone, under real iptables, do what docs/linkerd.md#what-is-captured says: every
/// row of every case agrees with the contract, and for the injector's defaults, source subnets and
/// listed ports the key rows are written out here. This needs no redirector: it proves the
/// reference half of the suite on its own.
#[test]
fn linkerd_rules_alone_follow_the_contract() {
    privileged!();

    let defaults = run_reference(&case("defaults"));
    println!("{}", defaults.table());
    let expect = |report: &redirector_tests::linkerd::CaseReport, who, dst, landing: &str| {
        assert_eq!(
            report.row(who, dst).iptables,
            landing,
            "{}: {who} -> {dst}",
            report.case.name
        );
    };
    // Outbound: the app's connection to a remote lands on 4140 with the remote as its
    // original destination; the proxy's uid, loopback, the pod's own address and an
    // ignored port go direct; IPv6 is not captured with --ipv6=false.
    expect(&defaults, "app", "svc4:80", "outbound orig=svc4:80");
    expect(&defaults, "app", "outside4:80", "outbound orig=outside4:80");
    expect(&defaults, "root", "svc4:80", "outbound orig=svc4:80");
    expect(&defaults, "nobody", "svc4:80", "outbound orig=svc4:80");
    expect(&defaults, "uid2102", "svc4:80", "svc@svc4:80");
    expect(&defaults, "app", "127.0.0.1:8080", "app@127.0.0.1:8080");
    expect(&defaults, "root", "pod4:8080", "app@pod4:8080");
    expect(&defaults, "app", "svc4:4567", "svc@svc4:4567");
    expect(&defaults, "app", "svc4:443", "outbound orig=svc4:443");
    expect(&defaults, "app", "svc6:80", "svc@svc6:80");
    // A direct connection to a proxy port still has an original destination (conntrack).
    expect(&defaults, "app", "pod4:4143", "inbound orig=pod4:4143");
    // Inbound: redirected to 4143 with the pod's address as the original destination,
    // except ignored ports.
    expect(&defaults, "peer", "pod4:8080", "inbound orig=pod4:8080");
    expect(&defaults, "peer", "pod4:4190", "app@pod4:4190");
    expect(&defaults, "peer", "pod4:4568", "app@pod4:4568");
    expect(&defaults, "peer", "pod4:5000", "inbound orig=pod4:5000");
    expect(
        &defaults,
        "peer@outside",
        "pod4:8080",
        "inbound orig=pod4:8080",
    );
    expect(&defaults, "peer", "pod6:8080", "app@pod6:8080");

    let subnets = run_reference(&case("subnets"));
    println!("{}", subnets.table());
    // A source in --subnets-to-ignore goes direct; the subnet does not matter outbound.
    expect(&subnets, "peer@outside", "pod4:8080", "app@pod4:8080");
    expect(&subnets, "peer", "pod4:8080", "inbound orig=pod4:8080");
    expect(&subnets, "app", "outside4:80", "outbound orig=outside4:80");

    let listed = run_reference(&case("listed-ports"));
    println!("{}", listed.table());
    // -r: only the listed ports reach the proxy; an ignored listed port does not.
    expect(&listed, "peer", "pod4:8080", "inbound orig=pod4:8080");
    expect(&listed, "peer", "pod4:6000", "inbound orig=pod4:6000");
    expect(&listed, "peer", "pod4:7000", "app@pod4:7000");
    expect(&listed, "peer", "pod4:4190", "app@pod4:4190");

    let mut failures: Vec<String> = [&defaults, &subnets, &listed]
        .into_iter()
        .filter_map(|r| r.reference_failure())
        .collect();
    for case in cases() {
        if ["defaults", "subnets", "listed-ports"].contains(&case.name) {
            continue;
        }
        let report = run_reference(&case);
        println!("{}", report.table());
        failures.extend(report.reference_failure());
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

/// The rules generated for every case load into real iptables exactly as written: after
/// `iptables-restore` of every run, `iptables-save` (and `ip6tables-save` where IPv6 is
/// captured) shows the same rules, chain by chain, in the same order.
#[test]
fn generated_rules_load_as_written() {
    privileged!();
    for case in cases() {
        let netns = NetNs::new("lkrules");
        apply_reference(&netns, &case);
        let CaptureState { v4, v6 } = case.capture();
        let loaded = reference_rules_as_loaded(&netns, &case);
        let saved = |family: Family| {
            // The save output has one `*nat` section per family, IPv4 first.
            let sections: Vec<&str> = loaded.split("*nat").skip(1).collect();
            match family {
                Family::V4 => sections[0].to_owned(),
                Family::V6 => sections.get(1).map(|s| (*s).to_owned()).unwrap_or_default(),
            }
        };
        assert_eq!(
            rules_by_chain(&saved(Family::V4)),
            rules_by_chain(&v4.nat_rules(Family::V4)),
            "{}: IPv4 rules as loaded differ from the rules written:\n{loaded}",
            case.name
        );
        match v6 {
            Some(v6) => assert_eq!(
                rules_by_chain(&saved(Family::V6)),
                rules_by_chain(&v6.nat_rules(Family::V6)),
                "{}: IPv6 rules as loaded differ from the rules written:\n{loaded}",
                case.name
            ),
            None => assert!(
                !netns.run(&["ip6tables-save"]).contains("PROXY_INIT"),
                "{}: IPv6 rules loaded although IPv6 is not captured",
                case.name
            ),
        }
    }
}

/// Not a test: the process behind the dual-stack case's `[::]:4143` listener (the test
/// binary re-executed with this test selected; see `linkerd::dual_stack`). Run without its
/// environment variable, it returns at once.
#[test]
#[ignore = "a helper process of the dual-stack case, started by it"]
fn dual_stack_inbound_listener_process() {
    dual_stack::serve_if_asked();
}
