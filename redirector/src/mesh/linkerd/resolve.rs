//! Raw proxy-init flags → the effective [`LinkerdConfig`]: proxy-init's defaults and checks,
//! and Linkerd's capture semantics written as a [`CaptureConfig`].

use std::{
    net::Ipv4Addr,
    path::{Path, PathBuf},
    time::Duration,
};

use ipnet::Ipv4Net;

use super::{
    error::Problem,
    logging::{LogFormat, LogLevel},
    parse, LinkerdConfig, LinkerdError, ProxyInitArgs, ProxyInitOptions,
};
use crate::{
    engine::spec::{
        CaptureConfig, CidrSelection, InterceptionMode, OwnerGroups, PortRange, PortSelection,
    },
    mesh::common::{go, Env, RunOptions, PIN_ROOT_ENV},
};

/// proxy-init's default for `-p`, `-o`, `-u` and `-g`: not set (and, for the ports, invalid).
const UNSET: i64 = -1;
/// Linkerd leaves all of 127.0.0.0/8 alone: every connection leaving through `lo` passes.
const LOOPBACK_V4_CIDR: Ipv4Net = Ipv4Net::new_assert(Ipv4Addr::new(127, 0, 0, 0), 8);
/// istio-iptables' TPROXY defaults (`-t`, `-r`): unused in REDIRECT mode, kept the same so
/// that both dialects describe an untouched setting alike.
const TPROXY_MARK: u32 = 1337;
const TPROXY_ROUTE_TABLE: u32 = 133;
const DEFAULT_PIN_ROOT: &str = crate::store::pins::DEFAULT_ROOT;
/// Read only for DNS capture, which this dialect never turns on.
const RESOLV_CONF: &str = "/etc/resolv.conf";

const IPTABLES_MODES: [&str; 3] = ["legacy", "nft", "plain"];
const FIREWALL_BINS: [&str; 4] = ["", "iptables-legacy", "iptables-nft", "iptables"];
const FIREWALL_SAVE_BINS: [&str; 4] = [
    "",
    "iptables-legacy-save",
    "iptables-nft-save",
    "iptables-save",
];

impl LinkerdConfig {
    /// The effective configuration from parsed flags; `env` is read for
    /// `REDIRECTOR_PIN_ROOT` only (proxy-init itself reads no env var).
    pub fn from_args(args: &ProxyInitArgs, env: &dyn Env) -> Result<Self, LinkerdError> {
        // Flag values first, as pflag rejects them before proxy-init runs.
        let incoming_port = int("-p/--incoming-proxy-port", &args.incoming_proxy_port, UNSET)?;
        let outgoing_port = int("-o/--outgoing-proxy-port", &args.outgoing_proxy_port, UNSET)?;
        let proxy_uid = int("-u/--proxy-uid", &args.proxy_uid, UNSET)?;
        let proxy_gid = int("-g/--proxy-gid", &args.proxy_gid, UNSET)?;
        let close_wait_secs = int(
            "--timeout-close-wait-secs",
            &args.timeout_close_wait_secs,
            0,
        )?;
        let simulate = flag("--simulate", &args.simulate, false)?;
        let ipv6 = flag("--ipv6", &args.ipv6, true)?;
        let use_wait_flag = flag("-w/--use-wait-flag", &args.use_wait_flag, false)?;

        // Then proxy-init's own checks, in its order.
        let log_level = match &args.log_level {
            None => LogLevel::Info,
            Some(text) => LogLevel::parse(text).ok_or_else(|| LinkerdError::LogLevel {
                value: text.clone(),
            })?,
        };
        let log_format = args
            .log_format
            .as_deref()
            .map_or(LogFormat::Plain, LogFormat::parse);
        let ignored_flags = ignored_flags(args, use_wait_flag)?;
        let inbound_port = proxy_port("--incoming-proxy-port", incoming_port)?;
        let outbound_port = proxy_port("--outgoing-proxy-port", outgoing_port)?;
        let subnets = parse::subnets(&args.subnets_to_ignore)?;

        // proxy-init takes -r as a list of integers: an entry that is not one fails the
        // run (a dropped entry would leave its port uncaptured, or every port captured).
        let (redirect_ports, mut dropped) =
            parse::ports("-r/--ports-to-redirect", &args.ports_to_redirect);
        if let Some(bad) = dropped.first() {
            return Err(LinkerdError::InvalidValue {
                flag: bad.flag,
                value: bad.entry.clone(),
                problem: Problem::OutOfRange { max: 65535 },
            });
        }
        let (inbound_ignored, dropped_in) =
            parse::port_ranges("--inbound-ports-to-ignore", &args.inbound_ports_to_ignore);
        let (outbound_ignored, dropped_out) =
            parse::port_ranges("--outbound-ports-to-ignore", &args.outbound_ports_to_ignore);
        dropped.extend(dropped_in);
        dropped.extend(dropped_out);

        let capture = capture_config(CaptureSettings {
            inbound_port,
            outbound_port,
            proxy_uid: owner_id("-u/--proxy-uid", proxy_uid)?,
            proxy_gid: owner_id("-g/--proxy-gid", proxy_gid)?,
            redirect_ports,
            inbound_ignored,
            outbound_ignored,
            subnets,
            ipv6,
            fail_open: flag("--fail-open", &args.own.fail_open, false)?,
        });
        let run = RunOptions {
            dry_run: simulate,
            cleanup_only: flag("--cleanup-only", &args.own.cleanup_only, false)?,
            // Re-running proxy-init replaces what an earlier run installed.
            reconcile: true,
            force_apply: false,
            skip_rule_apply: false,
            network_namespace: args
                .netns
                .clone()
                .filter(|path| !path.as_os_str().is_empty()),
            allow_host_netns: flag("--allow-host-netns", &args.own.allow_host_netns, false)?,
            cgroup: absolute_path("--cgroup", args.own.cgroup.clone())?,
            resolv_conf: RESOLV_CONF.into(),
            pin_root: absolute_path(
                "--pin-root",
                args.own.pin_root.clone().or_else(|| {
                    env.var(PIN_ROOT_ENV)
                        .filter(|v| !v.is_empty())
                        .map(PathBuf::from)
                }),
            )?
            .unwrap_or_else(|| DEFAULT_PIN_ROOT.into()),
            ignored_flags,
        };
        let own = ProxyInitOptions {
            close_wait_timeout: close_wait_timeout(close_wait_secs)?,
            log_level,
            log_format,
            dropped_entries: dropped,
            stray_args: args.stray_args.clone(),
        };
        Ok(LinkerdConfig { capture, run, own })
    }
}

/// The settings proxy-init's flags give, checked and typed.
struct CaptureSettings {
    inbound_port: u16,
    outbound_port: u16,
    proxy_uid: Option<u32>,
    proxy_gid: Option<u32>,
    redirect_ports: Vec<u16>,
    inbound_ignored: Vec<PortRange>,
    outbound_ignored: Vec<PortRange>,
    subnets: Vec<ipnet::IpNet>,
    ipv6: bool,
    fail_open: bool,
}

/// Linkerd's rules (docs/linkerd.md, "What is captured") as a capture spec: REDIRECT both ways, the proxy's uid
/// and gid exempt, every local destination passing, ignore lists as port ranges, ignored
/// subnets matched on the inbound source, IPv6 all or nothing.
fn capture_config(s: CaptureSettings) -> CaptureConfig {
    CaptureConfig {
        outbound_port: s.outbound_port,
        inbound_port: s.inbound_port,
        // Linkerd has no tunnel port.
        tunnel_port: 0,
        proxy_uids: s.proxy_uid.into_iter().collect(),
        proxy_gids: s.proxy_gid.into_iter().collect(),
        inbound_mode: InterceptionMode::Redirect,
        inbound_ports: if s.redirect_ports.is_empty() {
            PortSelection::All
        } else {
            PortSelection::List(s.redirect_ports)
        },
        inbound_exclude_ports: vec![],
        exclude_interfaces: vec![],
        outbound_cidrs: CidrSelection::All,
        exclude_cidrs: vec![],
        outbound_include_ports: vec![],
        outbound_exclude_ports: vec![],
        kube_virt_interfaces: vec![],
        tproxy_mark: TPROXY_MARK,
        tproxy_route_table: TPROXY_ROUTE_TABLE,
        owner_groups: OwnerGroups::All,
        loopback_v4_cidr: LOOPBACK_V4_CIDR,
        redirect_dns: false,
        capture_all_dns: false,
        drop_invalid: false,
        dual_stack: s.ipv6,
        fail_open: s.fail_open,
        outbound_exclude_port_ranges: s.outbound_ignored,
        inbound_exclude_port_ranges: s.inbound_ignored,
        inbound_exclude_sources: s.subnets,
        local_destinations_pass: true,
        orig_dst_of_unredirected: true,
        ipv6_off: !s.ipv6,
        ztunnel: false,
    }
}

/// An int flag (Go's syntax), `default` when absent.
fn int(flag: &'static str, given: &Option<String>, default: i64) -> Result<i64, LinkerdError> {
    match given {
        None => Ok(default),
        Some(text) => go::parse_int(text).ok_or_else(|| LinkerdError::InvalidValue {
            flag,
            value: text.clone(),
            problem: Problem::Integer,
        }),
    }
}

/// A boolean flag, `default` when absent.
fn flag(flag: &'static str, given: &Option<String>, default: bool) -> Result<bool, LinkerdError> {
    match given {
        None => Ok(default),
        Some(text) => go::parse_bool(text).ok_or_else(|| LinkerdError::InvalidValue {
            flag,
            value: text.clone(),
            problem: Problem::Bool,
        }),
    }
}

/// `-p`/`-o`: 0-65535, as proxy-init's `IsValidPort`.
fn proxy_port(flag: &'static str, value: i64) -> Result<u16, LinkerdError> {
    u16::try_from(value).map_err(|_| LinkerdError::ProxyPort { flag, value })
}

/// `-u`/`-g`: an exemption only for a positive id; 0 and negatives mean none.
fn owner_id(flag: &'static str, value: i64) -> Result<Option<u32>, LinkerdError> {
    if value <= 0 {
        return Ok(None);
    }
    u32::try_from(value)
        .map(Some)
        .map_err(|_| LinkerdError::InvalidValue {
            flag,
            value: value.to_string(),
            problem: Problem::OutOfRange {
                max: u32::MAX.into(),
            },
        })
}

/// `--timeout-close-wait-secs`: 0 leaves the sysctl alone; the sysctl is a C int.
fn close_wait_timeout(secs: i64) -> Result<Option<Duration>, LinkerdError> {
    match u32::try_from(secs) {
        Ok(0) => Ok(None),
        Ok(secs) if i32::try_from(secs).is_ok() => Ok(Some(Duration::from_secs(secs.into()))),
        _ => Err(LinkerdError::InvalidValue {
            flag: "--timeout-close-wait-secs",
            value: secs.to_string(),
            problem: Problem::OutOfRange {
                max: i32::MAX as u64,
            },
        }),
    }
}

/// The iptables flags given, each checked as proxy-init checks it; none changes anything
/// here, the command logs that they were ignored.
fn ignored_flags(
    args: &ProxyInitArgs,
    use_wait_flag: bool,
) -> Result<Vec<&'static str>, LinkerdError> {
    let mut ignored = Vec::new();
    if use_wait_flag {
        ignored.push("-w/--use-wait-flag");
    }
    // An empty mode is proxy-init's default: not set.
    if let Some(mode) = args.iptables_mode.as_ref().filter(|mode| !mode.is_empty()) {
        if !IPTABLES_MODES.contains(&mode.as_str()) {
            return Err(LinkerdError::IptablesMode {
                value: mode.clone(),
            });
        }
        ignored.push("--iptables-mode");
    }
    let binaries = [
        (
            "--firewall-bin-path",
            &args.firewall_bin_path,
            &FIREWALL_BINS,
            "\"iptables-legacy\", \"iptables-nft\" and \"iptables\"",
        ),
        (
            "--firewall-save-bin-path",
            &args.firewall_save_bin_path,
            &FIREWALL_SAVE_BINS,
            "\"iptables-legacy-save\", \"iptables-nft-save\" and \"iptables-save\"",
        ),
    ];
    for (flag, given, known, allowed) in binaries {
        let Some(binary) = given else { continue };
        if !known.contains(&binary.as_str()) {
            return Err(LinkerdError::FirewallBinary {
                flag,
                value: binary.clone(),
                allowed,
            });
        }
        ignored.push(flag);
    }
    Ok(ignored)
}

/// A path flag that must be absolute when given: it names a kernel object.
fn absolute_path(
    flag: &'static str,
    given: Option<PathBuf>,
) -> Result<Option<PathBuf>, LinkerdError> {
    match given {
        Some(path) if !Path::is_absolute(&path) => Err(LinkerdError::InvalidValue {
            flag,
            value: path.display().to_string(),
            problem: Problem::RelativePath,
        }),
        given => Ok(given),
    }
}
