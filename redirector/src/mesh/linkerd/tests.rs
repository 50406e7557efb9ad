//! The whole path: argv → `LinkerdConfig`, against proxy-init's behaviour (docs/linkerd.md, "The command")
//! and Linkerd's capture semantics (§2).

use std::{collections::HashMap, net::Ipv4Addr, path::PathBuf, time::Duration};

use clap::error::ErrorKind;
use ipnet::{IpNet, Ipv4Net};

use super::*;
use crate::engine::spec::{CidrSelection, InterceptionMode, OwnerGroups, PortSelection};

/// The linkerd2 injector's command line for an init container (docs/linkerd.md, "The injector").
const INJECTOR_DEFAULTS: &[&str] = &[
    "--firewall-bin-path",
    "iptables-nft",
    "--firewall-save-bin-path",
    "iptables-nft-save",
    "--ipv6=false",
    "--incoming-proxy-port",
    "4143",
    "--outgoing-proxy-port",
    "4140",
    "--proxy-uid",
    "2102",
    "--inbound-ports-to-ignore",
    "4190,4191,4567,4568",
    "--outbound-ports-to-ignore",
    "4567,4568",
];

/// The two ports proxy-init cannot do without.
const PORTS: &[&str] = &["-p", "4143", "-o", "4140"];

fn no_env() -> HashMap<String, String> {
    HashMap::new()
}

fn argv<'a>(args: &[&'a str]) -> Vec<&'a str> {
    let mut argv = vec!["linkerd2-proxy-init"];
    argv.extend_from_slice(args);
    argv
}

#[track_caller]
fn parse_with(args: &[&str], env: &dyn Env) -> LinkerdConfig {
    parse_proxy_init(argv(args), env).unwrap_or_else(|err| panic!("{args:?}: {err}"))
}

#[track_caller]
fn parse(args: &[&str]) -> LinkerdConfig {
    parse_with(args, &no_env())
}

/// `args` after `-p 4143 -o 4140`.
#[track_caller]
fn parse_ported(args: &[&str]) -> LinkerdConfig {
    parse(&[PORTS, args].concat())
}

#[track_caller]
fn error(args: &[&str]) -> LinkerdError {
    match parse_proxy_init(argv(args), &no_env()) {
        Ok(cfg) => panic!("{args:?} parsed to {cfg:?}"),
        Err(err) => err,
    }
}

fn single(ports: &[u16]) -> Vec<PortRange> {
    ports.iter().copied().map(PortRange::single).collect()
}

fn range(first: u16, last: u16) -> PortRange {
    PortRange::new(first, last).unwrap()
}

fn net(text: &str) -> IpNet {
    text.parse().unwrap()
}

/// What the injector's default command line must give: Linkerd's rules, nothing of istio's.
fn injector_spec() -> LinkerdConfig {
    LinkerdConfig {
        capture: CaptureConfig {
            outbound_port: 4140,
            inbound_port: 4143,
            tunnel_port: 0,
            proxy_uids: vec![2102],
            proxy_gids: vec![],
            inbound_mode: InterceptionMode::Redirect,
            inbound_ports: PortSelection::All,
            inbound_exclude_ports: vec![],
            exclude_interfaces: vec![],
            outbound_cidrs: CidrSelection::All,
            exclude_cidrs: vec![],
            outbound_include_ports: vec![],
            outbound_exclude_ports: vec![],
            kube_virt_interfaces: vec![],
            tproxy_mark: 1337,
            tproxy_route_table: 133,
            owner_groups: OwnerGroups::All,
            loopback_v4_cidr: Ipv4Net::new(Ipv4Addr::new(127, 0, 0, 0), 8).unwrap(),
            redirect_dns: false,
            capture_all_dns: false,
            drop_invalid: false,
            dual_stack: false,
            fail_open: false,
            outbound_exclude_port_ranges: single(&[4567, 4568]),
            inbound_exclude_port_ranges: single(&[4190, 4191, 4567, 4568]),
            inbound_exclude_sources: vec![],
            local_destinations_pass: true,
            orig_dst_of_unredirected: true,
            ipv6_off: true,
            ztunnel: false,
        },
        run: RunOptions {
            dry_run: false,
            cleanup_only: false,
            reconcile: true,
            force_apply: false,
            skip_rule_apply: false,
            network_namespace: None,
            allow_host_netns: false,
            cgroup: None,
            resolv_conf: "/etc/resolv.conf".into(),
            pin_root: crate::store::pins::DEFAULT_ROOT.into(),
            ignored_flags: vec!["--firewall-bin-path", "--firewall-save-bin-path"],
        },
        own: ProxyInitOptions {
            close_wait_timeout: None,
            log_level: LogLevel::Info,
            log_format: LogFormat::Plain,
            dropped_entries: vec![],
            stray_args: vec![],
        },
    }
}

#[test]
fn the_clap_definition_is_consistent() {
    proxy_init_command().debug_assert();
}

#[test]
fn the_injectors_command_line_gives_linkerds_spec() {
    assert_eq!(parse(INJECTOR_DEFAULTS), injector_spec());
}

#[test]
fn without_ignore_lists_or_ids_nothing_is_exempt() {
    let c = parse(PORTS).capture;
    assert_eq!(c.proxy_uids, Vec::<u32>::new());
    assert_eq!(c.proxy_gids, Vec::<u32>::new());
    assert_eq!(c.inbound_ports, PortSelection::All);
    assert!(c.inbound_exclude_port_ranges.is_empty());
    assert!(c.outbound_exclude_port_ranges.is_empty());
    assert!(c.inbound_exclude_sources.is_empty());
    // --ipv6 defaults to true.
    assert!(c.dual_stack);
    assert!(!c.ipv6_off);
}

#[test]
fn the_proxy_ports_are_required_and_checked() {
    // The default, -1, is not a port: the message names the flag.
    let missing_in = error(&["-o", "4140"]).to_string();
    assert!(
        missing_in.contains("--incoming-proxy-port") && missing_in.contains("-1"),
        "{missing_in}"
    );
    let missing_out = error(&["-p", "4143"]).to_string();
    assert!(
        missing_out.contains("--outgoing-proxy-port"),
        "{missing_out}"
    );
    for bad in ["-1", "65536", "70000"] {
        let message = error(&["-p", bad, "-o", "4140"]).to_string();
        assert!(
            message.contains("--incoming-proxy-port") && message.contains(bad),
            "{message}"
        );
    }
    let not_int = error(&["-p", "abc", "-o", "4140"]).to_string();
    assert!(
        not_int.contains("--incoming-proxy-port") && not_int.contains("\"abc\""),
        "{not_int}"
    );
    // 0-65535 are all valid, in Go's integer syntax.
    let edge = parse(&["-p", "0", "-o", "65535"]).capture;
    assert_eq!((edge.inbound_port, edge.outbound_port), (0, 65535));
    let hex = parse(&["-p", "0x102F", "-o", "+4140"]).capture;
    assert_eq!((hex.inbound_port, hex.outbound_port), (4143, 4140));
    assert!(matches!(
        error(&["-o", "4140"]),
        LinkerdError::ProxyPort {
            flag: "--incoming-proxy-port",
            value: -1
        }
    ));
    assert_eq!(EXIT_ERROR, 1);
}

#[test]
fn short_flags() {
    let cfg = parse(&[
        "-p", "4143", "-o", "4140", "-u", "2102", "-g", "2103", "-r", "80,443", "-w",
    ]);
    let c = &cfg.capture;
    assert_eq!((c.inbound_port, c.outbound_port), (4143, 4140));
    assert_eq!(c.proxy_uids, vec![2102]);
    assert_eq!(c.proxy_gids, vec![2103]);
    assert_eq!(c.inbound_ports, PortSelection::List(vec![80, 443]));
    assert_eq!(cfg.run.ignored_flags, vec!["-w/--use-wait-flag"]);
    // Long forms, `=` forms and `-w=false`.
    let long = parse(&[
        "--incoming-proxy-port=4143",
        "--outgoing-proxy-port=4140",
        "--proxy-uid=2102",
        "--proxy-gid=2103",
        "--ports-to-redirect=80,443",
        "-w=false",
    ]);
    assert_eq!(long.capture, cfg.capture);
    assert!(long.run.ignored_flags.is_empty());
}

#[test]
fn an_owner_id_exempts_only_when_positive() {
    for id in ["0", "-1", "-5"] {
        let c = parse_ported(&["-u", id, "-g", id]).capture;
        assert_eq!(c.proxy_uids, Vec::<u32>::new(), "-u {id}");
        assert_eq!(c.proxy_gids, Vec::<u32>::new(), "-g {id}");
    }
    let c = parse_ported(&["-u", "1", "-g", "4294967295"]).capture;
    assert_eq!((c.proxy_uids, c.proxy_gids), (vec![1], vec![u32::MAX]));
    let message = error(&[PORTS, &["-u", "4294967296"]].concat()).to_string();
    assert!(message.contains("--proxy-uid"), "{message}");
}

#[test]
fn bad_port_entries_are_dropped_and_reported_and_the_run_goes_on() {
    let cfg = parse_ported(&[
        "--inbound-ports-to-ignore",
        "abc,70000,25-23, 22,4190,1-2-3,,4191-",
        "--outbound-ports-to-ignore",
        "-5,4567",
    ]);
    assert_eq!(cfg.capture.inbound_exclude_port_ranges, single(&[4190]));
    assert_eq!(cfg.capture.outbound_exclude_port_ranges, single(&[4567]));
    let dropped: Vec<(&str, &str)> = cfg
        .own
        .dropped_entries
        .iter()
        .map(|d| (d.flag, d.entry.as_str()))
        .collect();
    let inbound = "--inbound-ports-to-ignore";
    let outbound = "--outbound-ports-to-ignore";
    assert_eq!(
        dropped,
        vec![
            (inbound, "abc"),
            (inbound, "70000"),
            (inbound, "25-23"),
            (inbound, " 22"),
            (inbound, "1-2-3"),
            (inbound, ""),
            (inbound, "4191-"),
            (outbound, "-5"),
        ]
    );
    let problems: Vec<&PortEntryProblem> =
        cfg.own.dropped_entries.iter().map(|d| &d.problem).collect();
    assert_eq!(problems[2], &PortEntryProblem::Reversed);
    assert_eq!(problems[4], &PortEntryProblem::NotARange);
    assert_eq!(problems[6], &PortEntryProblem::UpperBound(String::new()));
    // The log line names the entry, blanks included, and its flag.
    let line = cfg.own.dropped_entries[3].to_string();
    assert!(line.contains("\" 22\"") && line.contains(inbound), "{line}");
}

#[test]
fn ignore_lists_take_ranges_and_port_zero() {
    let c = parse_ported(&[
        "--inbound-ports-to-ignore",
        "0,23-25,0-65535,+80,080,4190-4190",
        "--outbound-ports-to-ignore",
        "1-1024,65535",
    ])
    .capture;
    assert_eq!(
        c.inbound_exclude_port_ranges,
        vec![
            PortRange::single(0),
            range(23, 25),
            range(0, 65535),
            PortRange::single(80),
            PortRange::single(80),
            PortRange::single(4190),
        ]
    );
    assert_eq!(
        c.outbound_exclude_port_ranges,
        vec![range(1, 1024), PortRange::single(65535)]
    );
    // Never in istio's single-port lists.
    assert!(c.inbound_exclude_ports.is_empty());
    assert!(c.outbound_exclude_ports.is_empty());
}

#[test]
fn an_empty_list_value_is_no_entry() {
    let cfg = parse_ported(&[
        "--inbound-ports-to-ignore",
        "",
        "--subnets-to-ignore",
        "",
        "-r",
        "",
    ]);
    assert!(cfg.capture.inbound_exclude_port_ranges.is_empty());
    assert!(cfg.capture.inbound_exclude_sources.is_empty());
    assert_eq!(cfg.capture.inbound_ports, PortSelection::All);
    assert!(cfg.own.dropped_entries.is_empty());
}

#[test]
fn ports_to_redirect_are_single_ports_and_a_bad_one_fails_the_run() {
    let cfg = parse_ported(&["-r", "80,8080,0"]);
    assert_eq!(
        cfg.capture.inbound_ports,
        PortSelection::List(vec![80, 8080, 0])
    );
    for bad in ["abc", "8080-8081", "70000", " 22"] {
        let err = error(&[PORTS, &["-r", &format!("80,{bad}")]].concat()).to_string();
        assert!(
            err.contains("-r/--ports-to-redirect") && err.contains(bad),
            "{err}"
        );
    }
}

#[test]
fn an_invalid_cidr_fails_with_proxy_inits_message() {
    for (list, bad) in [
        ("10.0.0.0/8,bogus", "bogus"),
        ("10.0.0.1", "10.0.0.1"),
        ("10.0.0.0/33", "10.0.0.0/33"),
        ("fd00::/129", "fd00::/129"),
        ("10.0.0.0/8,,", ""),
    ] {
        let err = error(&[PORTS, &["--subnets-to-ignore", list]].concat());
        assert_eq!(
            err.to_string(),
            format!("{bad} is not a valid CIDR address"),
            "{list}"
        );
    }
}

#[test]
fn subnets_are_trimmed_normalised_and_mix_families() {
    let c = parse_ported(&[
        "--subnets-to-ignore",
        " 10.1.2.3/8,fd00::1/8 ",
        "--subnets-to-ignore",
        "192.168.0.0/16",
    ])
    .capture;
    assert_eq!(
        c.inbound_exclude_sources,
        vec![net("10.0.0.0/8"), net("fd00::/8"), net("192.168.0.0/16")]
    );
    // With IPv6 on (the default): each family simply has its own entries.
    assert!(c.dual_stack && !c.ipv6_off);
    // Only inbound, by source: outbound destinations stay all captured.
    assert_eq!(c.outbound_cidrs, CidrSelection::All);
    assert!(c.exclude_cidrs.is_empty());
}

#[test]
fn ipv6_is_on_unless_turned_off() {
    let off = parse_ported(&["--ipv6=false"]).capture;
    assert!(!off.dual_stack && off.ipv6_off);
    for on in [&["--ipv6"][..], &["--ipv6=true"], &["--ipv6=1"], &[]] {
        let c = parse_ported(on).capture;
        assert!(c.dual_stack && !c.ipv6_off, "{on:?}");
    }
    let message = error(&[PORTS, &["--ipv6=maybe"]].concat()).to_string();
    assert!(
        message.contains("--ipv6") && message.contains("\"maybe\""),
        "{message}"
    );
}

#[test]
fn a_stray_word_is_kept_for_a_warning_as_cobra_ignores_it() {
    // `--ipv6 false` is `--ipv6` (true) and a stray "false" in proxy-init.
    let cfg = parse_ported(&["--ipv6", "false"]);
    assert!(!cfg.capture.ipv6_off);
    assert_eq!(cfg.own.stray_args, vec!["false"]);
}

#[test]
fn repeated_list_flags_append_and_single_flags_keep_the_last() {
    let cfg = parse(&[
        "-p",
        "1",
        "-p",
        "4143",
        "-o",
        "4140",
        "--inbound-ports-to-ignore",
        "4190",
        "--inbound-ports-to-ignore",
        "4191,4567",
        "--outbound-ports-to-ignore",
        "443",
        "--outbound-ports-to-ignore=6443",
        "-r",
        "80",
        "--ports-to-redirect",
        "443",
        "--subnets-to-ignore",
        "10.0.0.0/8",
        "--subnets-to-ignore",
        "fd00::/8",
    ]);
    let c = &cfg.capture;
    assert_eq!(c.inbound_port, 4143);
    assert_eq!(c.inbound_exclude_port_ranges, single(&[4190, 4191, 4567]));
    assert_eq!(c.outbound_exclude_port_ranges, single(&[443, 6443]));
    assert_eq!(c.inbound_ports, PortSelection::List(vec![80, 443]));
    assert_eq!(
        c.inbound_exclude_sources,
        vec![net("10.0.0.0/8"), net("fd00::/8")]
    );
}

#[test]
fn iptables_plumbing_is_checked_then_ignored() {
    let cfg = parse_ported(&[
        "--iptables-mode",
        "nft",
        "--firewall-bin-path",
        "iptables",
        "--firewall-save-bin-path",
        "iptables-save",
        "--use-wait-flag",
    ]);
    assert_eq!(
        cfg.run.ignored_flags,
        vec![
            "-w/--use-wait-flag",
            "--iptables-mode",
            "--firewall-bin-path",
            "--firewall-save-bin-path"
        ]
    );
    // Nothing of it reaches the capture spec.
    assert_eq!(cfg.capture, parse(PORTS).capture);
    for mode in ["legacy", "plain", ""] {
        parse_ported(&["--iptables-mode", mode]);
    }
    for binary in ["", "iptables-legacy", "iptables-nft"] {
        parse_ported(&["--firewall-bin-path", binary]);
    }
    let mode = error(&[PORTS, &["--iptables-mode", "bogus"]].concat());
    assert!(matches!(mode, LinkerdError::IptablesMode { .. }), "{mode}");
    assert!(mode.to_string().contains("\"bogus\""), "{mode}");
    let bin = error(&[PORTS, &["--firewall-bin-path", "/sbin/iptables"]].concat()).to_string();
    assert!(
        bin.contains("--firewall-bin-path") && bin.contains("/sbin/iptables"),
        "{bin}"
    );
    let save = error(&[PORTS, &["--firewall-save-bin-path", "iptables-nft"]].concat()).to_string();
    assert!(save.contains("--firewall-save-bin-path"), "{save}");
}

#[test]
fn log_level_and_format() {
    let cfg = parse_ported(&["--log-level", "WARNING", "--log-format", "json"]);
    assert_eq!(cfg.own.log_level, LogLevel::Warn);
    assert_eq!(cfg.own.log_format, LogFormat::Json);
    assert_eq!(
        parse_ported(&["--log-level", "trace"])
            .own
            .log_level
            .filter(),
        "trace"
    );
    assert_eq!(
        parse_ported(&["--log-level", "fatal"])
            .own
            .log_level
            .filter(),
        "error"
    );
    // Any format but json is plain, as proxy-init's getFormatter has it.
    assert_eq!(
        parse_ported(&["--log-format", "text"]).own.log_format,
        LogFormat::Plain
    );
    let err = error(&[PORTS, &["--log-level", "loud"]].concat());
    assert!(matches!(err, LinkerdError::LogLevel { .. }), "{err}");
    assert!(err.to_string().contains("\"loud\""), "{err}");
}

#[test]
fn simulate_and_its_dry_run_alias_change_nothing() {
    assert!(parse_ported(&["--simulate"]).run.dry_run);
    assert!(parse_ported(&["--dry-run"]).run.dry_run);
    assert!(!parse_ported(&["--simulate=false"]).run.dry_run);
    // Only the run options differ.
    assert_eq!(
        parse(&[INJECTOR_DEFAULTS, &["--simulate"]].concat()).capture,
        injector_spec().capture
    );
}

#[test]
fn close_wait_timeout() {
    assert_eq!(parse(PORTS).own.close_wait_timeout, None);
    assert_eq!(
        parse_ported(&["--timeout-close-wait-secs", "0"])
            .own
            .close_wait_timeout,
        None
    );
    assert_eq!(
        parse_ported(&["--timeout-close-wait-secs", "3600"])
            .own
            .close_wait_timeout,
        Some(Duration::from_secs(3600))
    );
    for bad in ["-1", "abc", "4294967296"] {
        let message = error(&[PORTS, &["--timeout-close-wait-secs", bad]].concat()).to_string();
        assert!(message.contains("--timeout-close-wait-secs"), "{message}");
    }
}

#[test]
fn redirectors_own_flags() {
    let cfg = parse_ported(&[
        "--netns",
        "/var/run/netns/pod",
        "--cgroup",
        "/sys/fs/cgroup/kubepods/pod1",
        "--pin-root",
        "/sys/fs/bpf/elsewhere",
        "--cleanup-only",
        "--allow-host-netns",
        "--fail-open",
    ]);
    assert_eq!(
        cfg.run.network_namespace,
        Some(PathBuf::from("/var/run/netns/pod"))
    );
    assert_eq!(
        cfg.run.cgroup,
        Some(PathBuf::from("/sys/fs/cgroup/kubepods/pod1"))
    );
    assert_eq!(cfg.run.pin_root, PathBuf::from("/sys/fs/bpf/elsewhere"));
    assert!(cfg.run.cleanup_only && cfg.run.allow_host_netns && cfg.capture.fail_open);
    // An empty --netns is none, as in proxy-init.
    assert_eq!(parse_ported(&["--netns", ""]).run.network_namespace, None);
    let relative = error(&[PORTS, &["--pin-root", "bpf"]].concat()).to_string();
    assert!(relative.contains("--pin-root"), "{relative}");
}

#[test]
fn the_pin_root_env_var_yields_to_the_flag() {
    let env: HashMap<String, String> = [(
        "REDIRECTOR_PIN_ROOT".to_owned(),
        "/sys/fs/bpf/env".to_owned(),
    )]
    .into();
    assert_eq!(
        parse_with(PORTS, &env).run.pin_root,
        PathBuf::from("/sys/fs/bpf/env")
    );
    let flag = parse_with(&[PORTS, &["--pin-root", "/sys/fs/bpf/flag"]].concat(), &env);
    assert_eq!(flag.run.pin_root, PathBuf::from("/sys/fs/bpf/flag"));
}

#[test]
fn command_line_errors_and_help() {
    assert!(matches!(error(&["--bogus"]), LinkerdError::CommandLine(_)));
    assert!(matches!(error(&["-p"]), LinkerdError::CommandLine(_)));
    match error(&["--help"]) {
        LinkerdError::CommandLine(err) => assert_eq!(err.kind(), ErrorKind::DisplayHelp),
        other => panic!("{other}"),
    }
}

#[test]
fn the_effective_config_speaks_proxy_inits_flags() {
    let lines = parse(INJECTOR_DEFAULTS).effective_lines();
    for want in [
        "incoming-proxy-port=4143",
        "outgoing-proxy-port=4140",
        "proxy-uid=2102",
        "proxy-gid=",
        "ports-to-redirect=",
        "inbound-ports-to-ignore=4190,4191,4567,4568",
        "outbound-ports-to-ignore=4567,4568",
        "ipv6=false",
        "simulate=false",
    ] {
        assert!(lines.iter().any(|l| l == want), "{want} not in {lines:?}");
    }
    let ranges = parse_ported(&["--inbound-ports-to-ignore", "23-25"]).effective_lines();
    assert!(ranges.iter().any(|l| l == "inbound-ports-to-ignore=23-25"));
}
