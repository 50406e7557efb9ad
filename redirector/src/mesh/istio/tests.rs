//! The whole path: argv + env → `IstioConfig`, against istio-iptables' behaviour.

use std::{collections::HashMap, net::IpAddr, path::PathBuf, time::Duration};

use clap::parser::ValueSource;
use ipnet::IpNet;

use super::{source::settings, *};

/// Env vars from a map and a fixed account database, so results never depend on the host.
struct FakeEnv {
    vars: HashMap<String, String>,
    users: &'static [(&'static str, u32)],
    groups: &'static [(&'static str, u32)],
}

impl Env for FakeEnv {
    fn var(&self, name: &str) -> Option<String> {
        self.vars.var(name)
    }

    fn user_uid(&self, name: &str) -> Option<u32> {
        self.users
            .iter()
            .find(|(user, _)| *user == name)
            .map(|(_, uid)| *uid)
    }

    fn group_gid(&self, name: &str) -> Option<u32> {
        self.groups
            .iter()
            .find(|(group, _)| *group == name)
            .map(|(_, gid)| *gid)
    }
}

const GROUPS: &[(&str, u32)] = &[("java", 1001), ("ftp", 50)];

fn vars(pairs: &[(&str, &str)]) -> HashMap<String, String> {
    pairs
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect()
}

/// No istio-proxy account: the default uid is istio's fallback, 1337.
fn env(pairs: &[(&str, &str)]) -> FakeEnv {
    FakeEnv {
        vars: vars(pairs),
        users: &[],
        groups: GROUPS,
    }
}

fn argv<'a>(args: &[&'a str]) -> Vec<&'a str> {
    let mut argv = vec!["istio-iptables"];
    argv.extend_from_slice(args);
    argv
}

#[track_caller]
fn parse_with(args: &[&str], env: &dyn Env) -> IstioConfig {
    parse_istio_iptables(argv(args), env).unwrap_or_else(|err| panic!("{args:?}: {err}"))
}

#[track_caller]
fn parse(args: &[&str]) -> IstioConfig {
    parse_with(args, &env(&[]))
}

#[track_caller]
fn error_with(args: &[&str], env: &dyn Env) -> ConfigError {
    match parse_istio_iptables(argv(args), env) {
        Ok(cfg) => panic!("{args:?} parsed to {cfg:?}"),
        Err(err) => err,
    }
}

/// The message of the error for `args`, checked to name `flag` and `value`.
#[track_caller]
fn error_naming(args: &[&str], env: &dyn Env, flag: &str, value: &str) -> String {
    let message = error_with(args, env).to_string();
    assert!(message.contains(flag), "{message:?} does not name {flag:?}");
    assert!(
        message.contains(&format!("{value:?}")),
        "{message:?} does not name {value:?}"
    );
    message
}

fn net(text: &str) -> IpNet {
    text.parse().unwrap()
}

/// istio-iptables' defaults (CASES.md): every case starts from these.
fn defaults() -> IstioConfig {
    IstioConfig {
        capture: CaptureConfig {
            outbound_port: 15001,
            inbound_port: 15006,
            tunnel_port: 15008,
            proxy_uids: vec![1337],
            proxy_gids: vec![1337],
            inbound_mode: InterceptionMode::Redirect,
            inbound_ports: PortSelection::None,
            inbound_exclude_ports: vec![],
            exclude_interfaces: vec![],
            outbound_cidrs: CidrSelection::None,
            exclude_cidrs: vec![],
            outbound_include_ports: vec![],
            outbound_exclude_ports: vec![],
            kube_virt_interfaces: vec![],
            tproxy_mark: 1337,
            tproxy_route_table: 133,
            owner_groups: OwnerGroups::All,
            loopback_v4_cidr: "127.0.0.1/32".parse().unwrap(),
            redirect_dns: false,
            capture_all_dns: false,
            drop_invalid: false,
            dual_stack: false,
            fail_open: false,
            outbound_exclude_port_ranges: vec![],
            inbound_exclude_port_ranges: vec![],
            inbound_exclude_sources: vec![],
            local_destinations_pass: false,
            orig_dst_of_unredirected: false,
            ipv6_off: false,
            ztunnel: false,
        },
        run: RunOptions {
            dry_run: false,
            cleanup_only: false,
            reconcile: false,
            force_apply: false,
            skip_rule_apply: false,
            network_namespace: None,
            allow_host_netns: false,
            cgroup: None,
            resolv_conf: PathBuf::from("/etc/resolv.conf"),
            pin_root: PathBuf::from("/sys/fs/bpf/redirector"),
            ignored_flags: vec![],
        },
        own: IstioOptions {
            run_validation: false,
            probe_port: 15002,
            probe_timeout: Duration::from_secs(5),
            cni_mode: false,
            log_as_json: false,
            log_output_level: "default:info".to_owned(),
        },
    }
}

use super::annotations::STANDARD_INJECTION;

#[test]
fn no_flags_no_env_gives_istio_defaults() {
    assert_eq!(parse(&[]), defaults());
}

#[test]
fn standard_injection_invocation() {
    let mut want = defaults();
    want.capture.outbound_cidrs = CidrSelection::All;
    want.capture.inbound_ports = PortSelection::All;
    want.capture.inbound_exclude_ports = vec![15090, 15021, 15020];
    assert_eq!(parse(&STANDARD_INJECTION), want);
}

#[test]
fn long_names_and_equals_forms_parse_like_short_ones() {
    let long = [
        "--envoy-port=15001",
        "--inbound-capture-port",
        "15006",
        "--proxy-uid=1337",
        "--istio-inbound-interception-mode=REDIRECT",
        "--istio-service-cidr=*",
        "--istio-service-exclude-cidr=",
        "--istio-inbound-ports",
        "*",
        "--istio-local-exclude-ports=15090,15021,15020",
    ];
    assert_eq!(parse(&long), parse(&STANDARD_INJECTION));
    assert_eq!(
        parse(&["-p15001", "-b*"]).capture.inbound_ports,
        PortSelection::All
    );
}

/// A golden case: name, flags, env vars, and how its config differs from the defaults.
type GoldenCase = (
    &'static str,
    &'static [&'static str],
    EnvVars,
    fn(&mut IstioConfig),
);
type EnvVars = &'static [(&'static str, &'static str)];

/// CASES.md: the flags (and env) of each golden case, and how the config differs from the
/// defaults. "IPv6 on" and the DNS servers come from the pod, not from flags.
#[rustfmt::skip]
const GOLDEN_CASES: &[GoldenCase] = &[
    ("empty", &[], &[], |_| {}),
    ("inbound-ports-wildcard", &["-b", "*"], &[], |c| {
        c.capture.inbound_ports = PortSelection::All;
    }),
    ("inbound-ports-include", &["-b", "32000,31000"], &[], |c| {
        c.capture.inbound_ports = PortSelection::List(vec![32000, 31000]);
    }),
    ("inbound-ports-tproxy", &["-b", "32000,31000", "-m", "TPROXY"], &[], |c| {
        c.capture.inbound_ports = PortSelection::List(vec![32000, 31000]);
        c.capture.inbound_mode = InterceptionMode::Tproxy;
    }),
    ("inbound-ports-wildcard-tproxy", &["-b", "*", "-m", "TPROXY"], &[], |c| {
        c.capture.inbound_ports = PortSelection::All;
        c.capture.inbound_mode = InterceptionMode::Tproxy;
    }),
    ("ipnets", &["-i", "10.0.0.0/8"], &[], |c| {
        c.capture.outbound_cidrs = CidrSelection::List(vec![net("10.0.0.0/8")]);
    }),
    ("ip-range",
        &["-x", "1.1.0.0/16", "-i", "9.9.0.0/16", "--redirect-dns", "-g", "1,2", "-u", "3,4", "-n"],
        &[],
        |c| {
            c.capture.exclude_cidrs = vec![net("1.1.0.0/16")];
            c.capture.outbound_cidrs = CidrSelection::List(vec![net("9.9.0.0/16")]);
            c.capture.redirect_dns = true;
            c.capture.proxy_gids = vec![1, 2];
            c.capture.proxy_uids = vec![3, 4];
            c.run.dry_run = true;
        },
    ),
    ("tproxy",
        &["-m", "TPROXY", "-b", "*", "-x", "1.1.0.0/16", "-i", "9.9.0.0/16", "--redirect-dns",
          "-u", "1337", "-g", "1337", "-c", "not-istio-nic"],
        &[],
        |c| {
            c.capture.inbound_mode = InterceptionMode::Tproxy;
            c.capture.inbound_ports = PortSelection::All;
            c.capture.exclude_cidrs = vec![net("1.1.0.0/16")];
            c.capture.outbound_cidrs = CidrSelection::List(vec![net("9.9.0.0/16")]);
            c.capture.redirect_dns = true;
            c.capture.exclude_interfaces = vec!["not-istio-nic".into()];
        },
    ),
    ("kube-virt-interfaces", &["-k", "eth1,eth2", "-i", "*"], &[], |c| {
        c.capture.kube_virt_interfaces = vec!["eth1".into(), "eth2".into()];
        c.capture.outbound_cidrs = CidrSelection::All;
    }),
    ("ipnets-with-kube-virt-interfaces", &["-k", "eth1,eth2", "-i", "10.0.0.0/8"], &[], |c| {
        c.capture.kube_virt_interfaces = vec!["eth1".into(), "eth2".into()];
        c.capture.outbound_cidrs = CidrSelection::List(vec![net("10.0.0.0/8")]);
    }),
    ("outbound-ports-include", &["-q", "32000,31000"], &[], |c| {
        c.capture.outbound_include_ports = vec![32000, 31000];
    }),
    ("loopback-outbound-iprange",
        &["-i", "127.1.2.3/32", "--redirect-dns", "-g", "1,2", "-u", "3,4"],
        &[],
        |c| {
            c.capture.outbound_cidrs = CidrSelection::List(vec![net("127.1.2.3/32")]);
            c.capture.redirect_dns = true;
            c.capture.proxy_gids = vec![1, 2];
            c.capture.proxy_uids = vec![3, 4];
        },
    ),
    ("basic-exclude-nic", &["-c", "not-istio-nic"], &[], |c| {
        c.capture.exclude_interfaces = vec!["not-istio-nic".into()];
    }),
    ("drop-invalid", &["--drop-invalid"], &[], |c| c.capture.drop_invalid = true),
    ("host-ipv4-loopback-cidr", &[], &[("ISTIO_OUTBOUND_IPV4_LOOPBACK_CIDR", "127.0.0.1/8")], |c| {
        c.capture.loopback_v4_cidr = "127.0.0.0/8".parse().unwrap();
    }),
    ("dns-uid-gid", &["--redirect-dns", "-g", "1,2", "-u", "3,4"], &[], |c| {
        c.capture.redirect_dns = true;
        c.capture.proxy_gids = vec![1, 2];
        c.capture.proxy_uids = vec![3, 4];
    }),
    ("ipv6-dns-uid-gid", &["--redirect-dns", "-g", "1,2", "-u", "3,4"], &[], |c| {
        c.capture.redirect_dns = true;
        c.capture.proxy_gids = vec![1, 2];
        c.capture.proxy_uids = vec![3, 4];
    }),
    ("outbound-owner-groups", &[], &[("ISTIO_OUTBOUND_OWNER_GROUPS", "java,202")], |c| {
        c.capture.owner_groups = OwnerGroups::Include(vec![1001, 202]);
    }),
    ("outbound-owner-groups-exclude", &[], &[("ISTIO_OUTBOUND_OWNER_GROUPS_EXCLUDE", "888,ftp")], |c| {
        c.capture.owner_groups = OwnerGroups::Exclude(vec![888, 50]);
    }),
    ("ipv6-dns-outbound-owner-groups",
        &["--redirect-dns"],
        &[("ISTIO_OUTBOUND_OWNER_GROUPS", "java,202")],
        |c| {
            c.capture.redirect_dns = true;
            c.capture.owner_groups = OwnerGroups::Include(vec![1001, 202]);
        },
    ),
    ("ipv6-dns-outbound-owner-groups-exclude",
        &["--redirect-dns"],
        &[("ISTIO_OUTBOUND_OWNER_GROUPS_EXCLUDE", "888,ftp")],
        |c| {
            c.capture.redirect_dns = true;
            c.capture.owner_groups = OwnerGroups::Exclude(vec![888, 50]);
        },
    ),
    ("ipv6-empty-inbound-ports", &["-b", ""], &[], |_| {}),
    ("ipv6-inbound-ports", &["-b", "4000,5000"], &[], |c| {
        c.capture.inbound_ports = PortSelection::List(vec![4000, 5000]);
    }),
    ("ipv6-virt-interfaces", &["-b", "4000,5000", "-k", "eth0,eth1"], &[], |c| {
        c.capture.inbound_ports = PortSelection::List(vec![4000, 5000]);
        c.capture.kube_virt_interfaces = vec!["eth0".into(), "eth1".into()];
    }),
    ("ipv6-ipnets",
        &["-b", "4000,5000", "-d", "6000,7000,", "-k", "eth0,eth1", "-x", "2001:db8::/32",
          "-i", "2001:db8::/32"],
        &[],
        |c| {
            c.capture.inbound_ports = PortSelection::List(vec![4000, 5000]);
            c.capture.inbound_exclude_ports = vec![6000, 7000];
            c.capture.kube_virt_interfaces = vec!["eth0".into(), "eth1".into()];
            c.capture.exclude_cidrs = vec![net("2001:db8::/32")];
            c.capture.outbound_cidrs = CidrSelection::List(vec![net("2001:db8::/32")]);
        },
    ),
    ("ipv6-uid-gid",
        &["-b", "4000,5000", "-d", "6000,7000", "-k", "eth0,eth1", "-g", "1,2", "-u", "3,4",
          "-x", "2001:db8::/32", "-i", "2001:db8::/32"],
        &[],
        |c| {
            c.capture.inbound_ports = PortSelection::List(vec![4000, 5000]);
            c.capture.inbound_exclude_ports = vec![6000, 7000];
            c.capture.kube_virt_interfaces = vec!["eth0".into(), "eth1".into()];
            c.capture.proxy_gids = vec![1, 2];
            c.capture.proxy_uids = vec![3, 4];
            c.capture.exclude_cidrs = vec![net("2001:db8::/32")];
            c.capture.outbound_cidrs = CidrSelection::List(vec![net("2001:db8::/32")]);
        },
    ),
    ("ipv6-outbound-ports", &["-b", "", "-q", "32000,31000"], &[], |c| {
        c.capture.outbound_include_ports = vec![32000, 31000];
    }),
];

#[test]
fn every_golden_case_parses_to_its_config() {
    for (name, args, env_vars, edit) in GOLDEN_CASES {
        let mut want = defaults();
        edit(&mut want);
        assert_eq!(parse_with(args, &env(env_vars)), want, "case {name}");
    }
}

#[test]
fn stray_commas_and_blanks_in_lists_are_skipped() {
    let cfg = parse(&[
        "-d",
        "15090,15021,15020,",
        "-q",
        ",80",
        "-o",
        "80, 81",
        "-u",
        "3,,4,",
        "-c",
        " eth0 ,",
    ]);
    assert_eq!(cfg.capture.inbound_exclude_ports, vec![15090, 15021, 15020]);
    assert_eq!(cfg.capture.outbound_include_ports, vec![80]);
    assert_eq!(cfg.capture.outbound_exclude_ports, vec![80, 81]);
    assert_eq!(cfg.capture.proxy_uids, vec![3, 4]);
    assert_eq!(cfg.capture.exclude_interfaces, vec!["eth0".to_owned()]);
    assert_eq!(
        parse(&["-b", ","]).capture.inbound_ports,
        PortSelection::None
    );
}

#[test]
fn cidrs_normalise_host_bits_and_accept_bare_addresses() {
    let cfg = parse(&["-i", "10.0.0.1/8,192.168.1.1", "-x", "fd00::1"]);
    assert_eq!(
        cfg.capture.outbound_cidrs,
        CidrSelection::List(vec![net("10.0.0.0/8"), net("192.168.1.1/32")])
    );
    assert_eq!(cfg.capture.exclude_cidrs, vec![net("fd00::1/128")]);
}

#[test]
fn empty_proxy_uid_means_the_default_and_gid_follows_uid() {
    // istio: `ProxyUID == ""` → the uid of ENVOY_USER, else 1337.
    assert_eq!(parse(&["-u", ""]).capture.proxy_uids, vec![1337]);
    let cfg = parse(&["-u", "3,4"]);
    assert_eq!(cfg.capture.proxy_gids, vec![3, 4]);
    let cfg = parse(&["-u", "3,4", "-g", ""]);
    assert_eq!(cfg.capture.proxy_gids, vec![3, 4]);
}

#[test]
fn default_proxy_uid_is_envoy_users_uid() {
    const USERS: &[(&str, u32)] = &[("istio-proxy", 1234), ("envoy", 101)];
    let with_users = |pairs: &[(&str, &str)]| FakeEnv {
        vars: vars(pairs),
        users: USERS,
        groups: GROUPS,
    };
    // ENVOY_USER defaults to istio-proxy.
    let cfg = parse_with(&[], &with_users(&[]));
    assert_eq!(
        (cfg.capture.proxy_uids, cfg.capture.proxy_gids),
        (vec![1234], vec![1234])
    );
    let cfg = parse_with(&[], &with_users(&[("ENVOY_USER", "envoy")]));
    assert_eq!(cfg.capture.proxy_uids, vec![101]);
    // An unknown user falls back to 1337, as in istio.
    assert_eq!(
        parse_with(&[], &with_users(&[("ENVOY_USER", "nobody-here")]))
            .capture
            .proxy_uids,
        vec![1337]
    );
    assert_eq!(
        parse_with(&[], &with_users(&[("ENVOY_USER", "")]))
            .capture
            .proxy_uids,
        vec![1337]
    );
    // -u beats ENVOY_USER.
    assert_eq!(
        parse_with(&["-u", "7"], &with_users(&[("ENVOY_USER", "envoy")]))
            .capture
            .proxy_uids,
        vec![7]
    );
}

#[test]
fn env_vars_fill_in_for_missing_flags() {
    let env = env(&[
        ("INBOUND_CAPTURE_PORT", "16006"),
        ("INBOUND_TUNNEL_PORT", "16008"),
        ("PROXY_UID", "5"),
        ("PROXY_GID", "6"),
        ("ISTIO_INBOUND_INTERCEPTION_MODE", "TPROXY"),
        ("ISTIO_INBOUND_PORTS", "*"),
        ("ISTIO_LOCAL_EXCLUDE_PORTS", "15090"),
        ("ISTIO_EXCLUDE_INTERFACES", "eth9"),
        ("ISTIO_SERVICE_CIDR", "10.0.0.0/8"),
        ("ISTIO_SERVICE_EXCLUDE_CIDR", "10.1.0.0/16"),
        ("ISTIO_OUTBOUND_PORTS", "8080"),
        ("ISTIO_LOCAL_OUTBOUND_PORTS_EXCLUDE", "15020"),
        ("KUBE_VIRT_INTERFACES", "eth8"),
        ("ISTIO_INBOUND_TPROXY_MARK", "7"),
        ("ISTIO_INBOUND_TPROXY_ROUTE_TABLE", "8"),
        ("DRY_RUN", "true"),
        ("IPTABLES_PROBE_PORT", "16002"),
        ("PROBE_TIMEOUT", "1m30s"),
        ("SKIP_RULE_APPLY", "1"),
        ("RUN_VALIDATION", "TRUE"),
        ("ISTIO_META_DNS_CAPTURE", "true"),
        ("CAPTURE_ALL_DNS", "t"),
        ("INVALID_DROP", "true"),
        ("ISTIO_DUAL_STACK", "true"),
        ("NETWORK_NAMESPACE", "/var/run/netns/pod"),
        ("CNI_MODE", "true"),
        ("RECONCILE", "true"),
        ("CLEANUP_ONLY", "true"),
        ("FORCE_APPLY", "true"),
        ("REDIRECTOR_PIN_ROOT", "/sys/fs/bpf/other"),
    ]);
    let cfg = parse_with(&[], &env);
    let c = &cfg.capture;
    assert_eq!(
        (c.outbound_port, c.inbound_port, c.tunnel_port),
        (15001, 16006, 16008)
    );
    assert_eq!(
        (c.proxy_uids.as_slice(), c.proxy_gids.as_slice()),
        (&[5][..], &[6][..])
    );
    assert_eq!(c.inbound_mode, InterceptionMode::Tproxy);
    assert_eq!(c.inbound_ports, PortSelection::All);
    assert_eq!(c.inbound_exclude_ports, vec![15090]);
    assert_eq!(c.exclude_interfaces, vec!["eth9".to_owned()]);
    assert_eq!(
        c.outbound_cidrs,
        CidrSelection::List(vec![net("10.0.0.0/8")])
    );
    assert_eq!(c.exclude_cidrs, vec![net("10.1.0.0/16")]);
    assert_eq!(
        (
            c.outbound_include_ports.as_slice(),
            c.outbound_exclude_ports.as_slice()
        ),
        (&[8080][..], &[15020][..])
    );
    assert_eq!(c.kube_virt_interfaces, vec!["eth8".to_owned()]);
    assert_eq!((c.tproxy_mark, c.tproxy_route_table), (7, 8));
    assert!(c.redirect_dns && c.capture_all_dns && c.drop_invalid && c.dual_stack);
    let (r, i) = (&cfg.run, &cfg.own);
    assert!(r.dry_run && r.skip_rule_apply && i.run_validation && i.cni_mode);
    assert!(r.reconcile && r.cleanup_only && r.force_apply);
    assert_eq!(
        (i.probe_port, i.probe_timeout),
        (16002, Duration::from_secs(90))
    );
    assert_eq!(
        r.network_namespace,
        Some(PathBuf::from("/var/run/netns/pod"))
    );
    assert_eq!(r.pin_root, PathBuf::from("/sys/fs/bpf/other"));
}

#[test]
fn env_names_of_long_only_booleans_work_too() {
    let cfg = parse_with(
        &[],
        &env(&[
            ("REDIRECT_DNS", "true"),
            ("DROP_INVALID", "1"),
            ("DUAL_STACK", "true"),
        ]),
    );
    assert!(cfg.capture.redirect_dns && cfg.capture.drop_invalid && cfg.capture.dual_stack);
}

#[test]
fn istios_extra_env_names_beat_the_regular_ones() {
    // istio applies `flag.AdditionalEnv` after `flag.BindEnv`.
    let cfg = parse_with(
        &[],
        &env(&[
            ("REDIRECT_DNS", "true"),
            ("ISTIO_META_DNS_CAPTURE", "false"),
        ]),
    );
    assert!(!cfg.capture.redirect_dns);
}

#[test]
fn flags_beat_env_vars() {
    let env = env(&[
        ("INBOUND_CAPTURE_PORT", "16006"),
        ("ISTIO_SERVICE_EXCLUDE_CIDR", "10.1.0.0/16"),
        ("ISTIO_INBOUND_PORTS", "80"),
        ("ISTIO_META_DNS_CAPTURE", "true"),
        ("PROXY_UID", "5"),
        ("PROBE_TIMEOUT", "1s"),
        ("REDIRECTOR_PIN_ROOT", "/sys/fs/bpf/other"),
    ]);
    let cfg = parse_with(
        &[
            "-z",
            "17006",
            "-x",
            "",
            "-b",
            "*",
            "--redirect-dns=false",
            "-u",
            "9",
            "--probe-timeout",
            "2s",
            "--pin-root",
            "/sys/fs/bpf/mine",
        ],
        &env,
    );
    assert_eq!(cfg.capture.inbound_port, 17006);
    // An empty flag still beats its env var.
    assert_eq!(cfg.capture.exclude_cidrs, vec![]);
    assert_eq!(cfg.capture.inbound_ports, PortSelection::All);
    assert!(!cfg.capture.redirect_dns);
    assert_eq!(cfg.capture.proxy_uids, vec![9]);
    assert_eq!(cfg.own.probe_timeout, Duration::from_secs(2));
    assert_eq!(cfg.run.pin_root, PathBuf::from("/sys/fs/bpf/mine"));
}

#[test]
fn envoy_port_has_no_env_var() {
    assert_eq!(
        parse_with(&[], &env(&[("ENVOY_PORT", "16001")]))
            .capture
            .outbound_port,
        15001
    );
}

#[test]
fn empty_env_vars_count_as_unset() {
    let cfg = parse_with(
        &[],
        &env(&[
            ("INBOUND_CAPTURE_PORT", ""),
            ("DRY_RUN", ""),
            ("ISTIO_OUTBOUND_OWNER_GROUPS", ""),
        ]),
    );
    assert_eq!(cfg, defaults());
}

#[test]
fn a_hash_map_is_an_env() {
    let env = vars(&[
        ("ISTIO_INBOUND_PORTS", "*"),
        ("ISTIO_OUTBOUND_OWNER_GROUPS", "0"),
    ]);
    let cfg = parse_with(&[], &env);
    assert_eq!(cfg.capture.inbound_ports, PortSelection::All);
    assert_eq!(cfg.capture.owner_groups, OwnerGroups::Include(vec![0]));
    // Group names go to the system's database: root is gid 0 everywhere.
    let cfg = parse_with(
        &[],
        &vars(&[("ISTIO_OUTBOUND_OWNER_GROUPS_EXCLUDE", "root")]),
    );
    assert_eq!(cfg.capture.owner_groups, OwnerGroups::Exclude(vec![0]));
}

#[test]
fn the_process_env_is_an_env() {
    // Only reads; PATH is set wherever tests run.
    assert!(ProcessEnv.var("PATH").is_some());
}

#[test]
fn owner_groups_follow_istios_intercept_filter() {
    let groups = |pairs: &[(&str, &str)]| parse_with(&[], &env(pairs)).capture.owner_groups;
    assert_eq!(groups(&[]), OwnerGroups::All);
    assert_eq!(
        groups(&[("ISTIO_OUTBOUND_OWNER_GROUPS", "*")]),
        OwnerGroups::All
    );
    assert_eq!(
        groups(&[("ISTIO_OUTBOUND_OWNER_GROUPS", " java , 202, ")]),
        OwnerGroups::Include(vec![1001, 202])
    );
    assert_eq!(
        groups(&[
            ("ISTIO_OUTBOUND_OWNER_GROUPS", "*"),
            ("ISTIO_OUTBOUND_OWNER_GROUPS_EXCLUDE", "ftp")
        ]),
        OwnerGroups::Exclude(vec![50])
    );
    assert_eq!(
        groups(&[("ISTIO_OUTBOUND_OWNER_GROUPS_EXCLUDE", ",")]),
        OwnerGroups::All
    );
}

#[test]
fn owner_group_include_and_exclude_together_are_rejected() {
    let env = env(&[
        ("ISTIO_OUTBOUND_OWNER_GROUPS", "java"),
        ("ISTIO_OUTBOUND_OWNER_GROUPS_EXCLUDE", "888"),
    ]);
    let message = error_naming(&[], &env, "ISTIO_OUTBOUND_OWNER_GROUPS_EXCLUDE", "888");
    assert!(
        message.contains("ISTIO_OUTBOUND_OWNER_GROUPS=\"java\""),
        "{message}"
    );
}

#[test]
fn unknown_owner_group_is_rejected() {
    let env = env(&[("ISTIO_OUTBOUND_OWNER_GROUPS", "java,nosuchgroup")]);
    let message = error_naming(&[], &env, "env ISTIO_OUTBOUND_OWNER_GROUPS", "nosuchgroup");
    assert!(message.contains("no such group"), "{message}");
}

#[test]
fn more_owner_groups_than_the_kernel_holds_are_rejected() {
    let env = env(&[("ISTIO_OUTBOUND_OWNER_GROUPS_EXCLUDE", "1,2,3,4,5,6,7,8,9")]);
    error_naming(
        &[],
        &env,
        "ISTIO_OUTBOUND_OWNER_GROUPS_EXCLUDE",
        "1,2,3,4,5,6,7,8,9",
    );
}

#[test]
fn invalid_values_name_the_flag_and_the_value() {
    let none = env(&[]);
    let cases: &[(&[&str], &str, &str)] = &[
        (&["-x", "bogus"], "-x/--istio-service-exclude-cidr", "bogus"),
        (
            &["-i", "10.0.0.0/8,10.0.0.0/33"],
            "-i/--istio-service-cidr",
            "10.0.0.0/33",
        ),
        (
            &["-i", "*,10.0.0.0/8"],
            "-i/--istio-service-cidr",
            "*,10.0.0.0/8",
        ),
        (&["-p", "70000"], "-p/--envoy-port", "70000"),
        (&["-p", "0"], "-p/--envoy-port", "0"),
        (&["-z", "abc"], "-z/--inbound-capture-port", "abc"),
        (&["-e", ""], "-e/--inbound-tunnel-port", ""),
        (&["-b", "80,70000"], "-b/--istio-inbound-ports", "70000"),
        (&["-d", "*"], "-d/--istio-local-exclude-ports", "*"),
        (&["-q", "0"], "-q/--istio-outbound-ports", "0"),
        (&["-o", "x"], "-o/--istio-local-outbound-ports-exclude", "x"),
        (
            &["-m", "tproxy"],
            "-m/--istio-inbound-interception-mode",
            "tproxy",
        ),
        (
            &["-m", "NONE"],
            "-m/--istio-inbound-interception-mode",
            "NONE",
        ),
        (
            &["-u", "1,2,3,4,5,6,7,8,9"],
            "-u/--proxy-uid",
            "1,2,3,4,5,6,7,8,9",
        ),
        (
            &["-g", "1,2,3,4,5,6,7,8,9"],
            "-g/--proxy-gid",
            "1,2,3,4,5,6,7,8,9",
        ),
        (&["-u", "istio-proxy"], "-u/--proxy-uid", "istio-proxy"),
        (&["-t", "-1"], "-t/--istio-inbound-tproxy-mark", "-1"),
        (&["-r", "x"], "-r/--istio-inbound-tproxy-route-table", "x"),
        (
            &["-c", "way-too-long-name0"],
            "-c/--istio-exclude-interfaces",
            "way-too-long-name0",
        ),
        (&["-k", "eth0:1"], "-k/--kube-virt-interfaces", "eth0:1"),
        (&["--probe-timeout", "5"], "--probe-timeout", "5"),
        (&["--probe-timeout", "-1s"], "--probe-timeout", "-1s"),
        (
            &["--iptables-probe-port", "65536"],
            "--iptables-probe-port",
            "65536",
        ),
        (&["--dry-run=yes"], "-n/--dry-run", "yes"),
        (&["--fail-open=maybe"], "--fail-open", "maybe"),
        (
            &["--pin-root", "relative/pins"],
            "--pin-root",
            "relative/pins",
        ),
        (&["--cgroup", "kubepods/pod1"], "--cgroup", "kubepods/pod1"),
    ];
    for (args, flag, value) in cases {
        error_naming(args, &none, flag, value);
    }
}

#[test]
fn error_messages_read_like_the_contract() {
    let message = error_with(&["-p", "70000"], &env(&[])).to_string();
    assert_eq!(
        message,
        r#"invalid value "70000" for -p/--envoy-port: port must be 1-65535"#
    );
    let message = error_with(&[], &env(&[("ISTIO_SERVICE_EXCLUDE_CIDR", "*")])).to_string();
    assert_eq!(
        message,
        r#"invalid value "*" for -x/--istio-service-exclude-cidr (env ISTIO_SERVICE_EXCLUDE_CIDR): '*' is not allowed"#
    );
    let message = error_with(&["-u", "1,2,3,4,5,6,7,8,9"], &env(&[])).to_string();
    assert_eq!(
        message,
        r#"invalid value "1,2,3,4,5,6,7,8,9" for -u/--proxy-uid: at most 8 entries are supported, got 9"#
    );
}

#[test]
fn invalid_env_values_name_the_env_var() {
    let cases: &[(&str, &str, &str)] = &[
        (
            "ISTIO_META_DNS_CAPTURE",
            "yes",
            "--redirect-dns (env ISTIO_META_DNS_CAPTURE)",
        ),
        ("INVALID_DROP", "2", "--drop-invalid (env INVALID_DROP)"),
        ("DRY_RUN", "on", "-n/--dry-run (env DRY_RUN)"),
        (
            "NATIVE_NFTABLES",
            "nope",
            "--native-nftables (env NATIVE_NFTABLES)",
        ),
        (
            "PROBE_TIMEOUT",
            "5 seconds",
            "--probe-timeout (env PROBE_TIMEOUT)",
        ),
        (
            "INBOUND_CAPTURE_PORT",
            "70000",
            "-z/--inbound-capture-port (env INBOUND_CAPTURE_PORT)",
        ),
        (
            "ISTIO_SERVICE_CIDR",
            "10.0.0.0/40",
            "-i/--istio-service-cidr (env ISTIO_SERVICE_CIDR)",
        ),
        (
            "ISTIO_OUTBOUND_IPV4_LOOPBACK_CIDR",
            "10.0.0.1/32",
            "env ISTIO_OUTBOUND_IPV4_LOOPBACK_CIDR",
        ),
        (
            "REDIRECTOR_PIN_ROOT",
            "pins",
            "--pin-root (env REDIRECTOR_PIN_ROOT)",
        ),
    ];
    for (name, value, origin) in cases {
        let message = error_naming(&[], &env(&[(name, value)]), origin, value);
        assert!(message.contains(name), "{message}");
    }
}

#[test]
fn boolean_flags_take_an_optional_value_like_pflag() {
    assert!(parse(&["-n"]).run.dry_run);
    assert!(parse(&["--dry-run"]).run.dry_run);
    assert!(!parse(&["--dry-run=false"]).run.dry_run);
    assert!(parse(&["-n=true"]).run.dry_run);
    // The flag's value is not the next word: `--dry-run false` leaves "false" as a stray argument.
    assert!(matches!(
        error_with(&["--dry-run", "false"], &env(&[])),
        ConfigError::CommandLine(_)
    ));
    // A flag without a value still beats its env var.
    assert!(
        parse_with(
            &["--redirect-dns"],
            &env(&[("ISTIO_META_DNS_CAPTURE", "false")])
        )
        .capture
        .redirect_dns
    );
    let cfg = parse(&[
        "--skip-rule-apply",
        "--run-validation",
        "--capture-all-dns",
        "--dual-stack",
        "--cni-mode",
        "--reconcile",
        "--cleanup-only",
        "--force-apply",
        "--log_as_json",
        "--fail-open",
    ]);
    assert!(cfg.run.skip_rule_apply && cfg.own.run_validation && cfg.capture.capture_all_dns);
    assert!(
        cfg.capture.dual_stack && cfg.own.cni_mode && cfg.run.reconcile && cfg.run.cleanup_only
    );
    assert!(cfg.run.force_apply && cfg.own.log_as_json && cfg.capture.fail_open);
}

#[test]
fn run_options_from_flags() {
    let cfg = parse(&[
        "--iptables-probe-port",
        "16002",
        "--probe-timeout",
        "500ms",
        "--network-namespace",
        "/var/run/netns/pod",
        "--cgroup",
        "/sys/fs/cgroup/kubepods/pod1",
        "--log_output_level",
        "default:debug",
    ]);
    assert_eq!(cfg.own.probe_port, 16002);
    assert_eq!(cfg.own.probe_timeout, Duration::from_millis(500));
    assert_eq!(
        cfg.run.network_namespace,
        Some(PathBuf::from("/var/run/netns/pod"))
    );
    assert_eq!(
        cfg.run.cgroup,
        Some(PathBuf::from("/sys/fs/cgroup/kubepods/pod1"))
    );
    assert_eq!(cfg.own.log_output_level, "default:debug");
    assert_eq!(
        parse(&["--network-namespace", ""]).run.network_namespace,
        None
    );
}

#[test]
fn iptables_only_flags_are_accepted_and_noted() {
    assert_eq!(
        parse(&["--native-nftables"]).run.ignored_flags,
        vec!["--native-nftables"]
    );
    assert_eq!(
        parse(&[
            "--force-iptables-binary",
            "iptables-legacy",
            "--native-nftables=true"
        ])
        .run
        .ignored_flags,
        vec!["--native-nftables", "--force-iptables-binary"]
    );
    assert_eq!(
        parse(&["--native-nftables=false"]).run.ignored_flags,
        Vec::<&str>::new()
    );
    let from_env = parse_with(
        &[],
        &env(&[
            ("NATIVE_NFTABLES", "true"),
            ("FORCE_IPTABLES_BINARY", "iptables-nft"),
        ]),
    );
    assert_eq!(
        from_env.run.ignored_flags,
        vec!["--native-nftables", "--force-iptables-binary"]
    );
    // Everything else is as if they were not given.
    let mut cfg = parse(&["--native-nftables", "--force-iptables-binary=iptables"]);
    cfg.run.ignored_flags.clear();
    assert_eq!(cfg, defaults());
}

#[test]
fn unknown_flags_and_help_are_command_line_errors() {
    let err = error_with(&["--no-such-flag"], &env(&[]));
    assert!(
        matches!(&err, ConfigError::CommandLine(e) if e.kind() == clap::error::ErrorKind::UnknownArgument)
    );
    assert!(err.to_string().contains("--no-such-flag"));
    let err = error_with(&["--help"], &env(&[]));
    assert!(
        matches!(&err, ConfigError::CommandLine(e) if e.kind() == clap::error::ErrorKind::DisplayHelp)
    );
    assert!(err.to_string().contains("--istio-service-exclude-cidr"));
}

#[test]
fn from_args_works_with_flattened_args() {
    // A caller may embed the flags in its own command (with pflag's syntax on it); ids
    // stay the field names.
    #[derive(clap::Parser)]
    struct Outer {
        #[command(flatten)]
        istio: IstioIptablesArgs,
    }
    use crate::mesh::common::pflag::pflag_syntax;
    use clap::{CommandFactory, FromArgMatches};
    let matches = pflag_syntax(Outer::command())
        .try_get_matches_from(["outer", "-b", "*", "--dry-run"])
        .unwrap();
    let outer = Outer::from_arg_matches(&matches).unwrap();
    let cfg = IstioConfig::from_args(&outer.istio, &matches, &env(&[])).unwrap();
    assert_eq!(cfg.capture.inbound_ports, PortSelection::All);
    assert!(cfg.run.dry_run);
}

#[test]
fn settings_match_the_clap_definition() {
    let command = istio_iptables_command();
    for setting in settings::WITH_FLAG {
        let id = setting.id.unwrap();
        let arg = command
            .get_arguments()
            .find(|arg| arg.get_id() == id)
            .unwrap_or_else(|| panic!("no arg {id}"));
        let long = arg.get_long().unwrap();
        let spelled = match arg.get_short() {
            Some(short) => format!("-{short}/--{long}"),
            None => format!("--{long}"),
        };
        assert_eq!(setting.flag, Some(spelled.as_str()));
        // istio's env name is the long name upper-cased with '-' → '_'.
        let derived = long.to_ascii_uppercase().replace('-', "_");
        let no_env = [
            "ENVOY_PORT",
            "LOG_OUTPUT_LEVEL",
            "LOG_AS_JSON",
            "CGROUP",
            "RESOLV_CONF",
            "PIN_ROOT",
            "FAIL_OPEN",
            "ALLOW_HOST_NETNS",
        ];
        if !no_env.contains(&derived.as_str()) {
            assert_eq!(setting.envs.last(), Some(&derived.as_str()), "{id}");
        }
    }
    let flags = command
        .get_arguments()
        .filter(|arg| arg.get_long().is_some())
        .count();
    assert_eq!(flags, settings::WITH_FLAG.len(), "a flag without a setting");
}

#[test]
fn value_source_distinguishes_given_flags() {
    let matches = istio_iptables_command()
        .try_get_matches_from(["istio-iptables", "-x", "", "--dry-run"])
        .unwrap();
    assert_eq!(
        matches.value_source("service_exclude_cidr"),
        Some(ValueSource::CommandLine)
    );
    assert_eq!(
        matches.value_source("dry_run"),
        Some(ValueSource::CommandLine)
    );
    assert_eq!(matches.value_source("service_cidr"), None);
}

#[test]
fn effective_lines_print_like_istio() {
    let lines = parse(&STANDARD_INJECTION).effective_lines();
    let want = [
        "PROXY_PORT=15001",
        "PROXY_INBOUND_CAPTURE_PORT=15006",
        "PROXY_TUNNEL_PORT=15008",
        "PROXY_UID=1337",
        "PROXY_GID=1337",
        "INBOUND_INTERCEPTION_MODE=REDIRECT",
        "INBOUND_TPROXY_MARK=1337",
        "INBOUND_TPROXY_ROUTE_TABLE=133",
        "INBOUND_PORTS_INCLUDE=*",
        "INBOUND_PORTS_EXCLUDE=15090,15021,15020",
        "OUTBOUND_OWNER_GROUPS_INCLUDE=*",
        "OUTBOUND_OWNER_GROUPS_EXCLUDE=",
        "OUTBOUND_IP_RANGES_INCLUDE=*",
        "OUTBOUND_IP_RANGES_EXCLUDE=",
        "OUTBOUND_PORTS_INCLUDE=",
        "OUTBOUND_PORTS_EXCLUDE=",
        "KUBE_VIRT_INTERFACES=",
        "ENABLE_INBOUND_IPV6=false",
        "DUAL_STACK=false",
        "DNS_CAPTURE=false",
        "DROP_INVALID=false",
        "CAPTURE_ALL_DNS=false",
        "DNS_SERVERS=[],[]",
        "NETWORK_NAMESPACE=",
        "CNI_MODE=false",
        "EXCLUDE_INTERFACES=",
        "RECONCILE=false",
        "CLEANUP_ONLY=false",
        "FORCE_APPLY=false",
        "HOST_IPV4_LOOPBACK_CIDR=127.0.0.1/32",
        "REDIRECTOR_FAIL_OPEN=false",
        "REDIRECTOR_CGROUP=",
        "REDIRECTOR_PIN_ROOT=/sys/fs/bpf/redirector",
    ];
    assert_eq!(lines, want);
}

#[test]
fn effective_lines_show_lists_groups_and_pod_facts() {
    let env = env(&[("ISTIO_OUTBOUND_OWNER_GROUPS_EXCLUDE", "888,ftp")]);
    let cfg = parse_with(
        &[
            "-m",
            "TPROXY",
            "-b",
            "4000,5000",
            "-i",
            "10.0.0.1/8,fd00::/8",
            "-k",
            "eth0,eth1",
            "-u",
            "3,4",
        ],
        &env,
    );
    let dns: [IpAddr; 3] = [
        "127.0.0.53".parse().unwrap(),
        "fd00::53".parse().unwrap(),
        "10.0.0.10".parse().unwrap(),
    ];
    let lines = cfg.effective_lines_with(true, &dns);
    for want in [
        "PROXY_UID=3,4",
        "PROXY_GID=3,4",
        "INBOUND_INTERCEPTION_MODE=TPROXY",
        "INBOUND_PORTS_INCLUDE=4000,5000",
        "OUTBOUND_OWNER_GROUPS_INCLUDE=*",
        "OUTBOUND_OWNER_GROUPS_EXCLUDE=888,50",
        "OUTBOUND_IP_RANGES_INCLUDE=10.0.0.0/8,fd00::/8",
        "KUBE_VIRT_INTERFACES=eth0,eth1",
        "ENABLE_INBOUND_IPV6=true",
        "DNS_SERVERS=[127.0.0.53 10.0.0.10],[fd00::53]",
    ] {
        assert!(
            lines.iter().any(|line| line == want),
            "{want} not in {lines:#?}"
        );
    }
}
