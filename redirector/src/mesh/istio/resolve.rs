//! Raw flags plus env vars → the effective [`IstioConfig`], in istio-iptables' order:
//! command line, then env var, then default.

use std::{
    net::Ipv4Addr,
    path::{Path, PathBuf},
    time::Duration,
};

use clap::ArgMatches;
use ipnet::Ipv4Net;

use super::{
    parse::{self, Rejected},
    source::{settings::*, Raw, Setting, Sources},
    CaptureConfig, CidrSelection, ConfigError, Env, InterceptionMode, IstioConfig,
    IstioIptablesArgs, IstioOptions, Origin, OwnerGroups, PortSelection, Problem, RunOptions,
};

const DEFAULT_OUTBOUND_PORT: u16 = 15001;
const DEFAULT_INBOUND_PORT: u16 = 15006;
const DEFAULT_TUNNEL_PORT: u16 = 15008;
const DEFAULT_PROXY_UID: u32 = 1337;
const DEFAULT_TPROXY_MARK: u32 = 1337;
const DEFAULT_TPROXY_ROUTE_TABLE: u32 = 133;
const DEFAULT_PROBE_PORT: u16 = 15002;
const DEFAULT_PROBE_TIMEOUT: Duration = Duration::from_secs(5);
const DEFAULT_PIN_ROOT: &str = crate::store::pins::DEFAULT_ROOT;
const DEFAULT_RESOLV_CONF: &str = "/etc/resolv.conf";
const DEFAULT_LOG_OUTPUT_LEVEL: &str = "default:info";
const DEFAULT_LOOPBACK_V4_CIDR: Ipv4Net = Ipv4Net::new_assert(Ipv4Addr::new(127, 0, 0, 1), 32);
/// The account whose uid is the default `-u` when `ENVOY_USER` is unset.
const DEFAULT_ENVOY_USER: &str = "istio-proxy";
const ENVOY_USER: &str = "ENVOY_USER";

impl IstioConfig {
    /// The effective configuration from parsed flags (`args`, from `matches`) and `env`.
    pub fn from_args(
        args: &IstioIptablesArgs,
        matches: &ArgMatches,
        env: &dyn Env,
    ) -> Result<Self, ConfigError> {
        let r = Resolver {
            sources: Sources::new(matches, env),
        };
        let proxy_uids = r.proxy_uids(args)?;
        let capture = CaptureConfig {
            outbound_port: r.parsed(
                &ENVOY_PORT,
                &args.envoy_port,
                DEFAULT_OUTBOUND_PORT,
                parse::port,
            )?,
            inbound_port: r.parsed(
                &INBOUND_CAPTURE_PORT,
                &args.inbound_capture_port,
                DEFAULT_INBOUND_PORT,
                parse::port,
            )?,
            tunnel_port: r.parsed(
                &INBOUND_TUNNEL_PORT,
                &args.inbound_tunnel_port,
                DEFAULT_TUNNEL_PORT,
                parse::port,
            )?,
            proxy_gids: r.proxy_gids(args, &proxy_uids)?,
            proxy_uids,
            inbound_mode: r.parsed(
                &INBOUND_INTERCEPTION_MODE,
                &args.inbound_interception_mode,
                InterceptionMode::Redirect,
                parse::interception_mode,
            )?,
            inbound_ports: r.parsed(
                &INBOUND_PORTS,
                &args.inbound_ports,
                PortSelection::None,
                parse::inbound_ports,
            )?,
            inbound_exclude_ports: r.parsed(
                &LOCAL_EXCLUDE_PORTS,
                &args.local_exclude_ports,
                vec![],
                parse::port_list,
            )?,
            exclude_interfaces: r.parsed(
                &EXCLUDE_INTERFACES,
                &args.exclude_interfaces,
                vec![],
                parse::interface_names,
            )?,
            outbound_cidrs: r.parsed(
                &SERVICE_CIDR,
                &args.service_cidr,
                CidrSelection::None,
                parse::outbound_cidrs,
            )?,
            exclude_cidrs: r.parsed(
                &SERVICE_EXCLUDE_CIDR,
                &args.service_exclude_cidr,
                vec![],
                parse::cidr_list,
            )?,
            outbound_include_ports: r.parsed(
                &OUTBOUND_PORTS,
                &args.outbound_ports,
                vec![],
                parse::port_list,
            )?,
            outbound_exclude_ports: r.parsed(
                &LOCAL_OUTBOUND_PORTS_EXCLUDE,
                &args.local_outbound_ports_exclude,
                vec![],
                parse::port_list,
            )?,
            kube_virt_interfaces: r.parsed(
                &KUBE_VIRT_INTERFACES,
                &args.kube_virt_interfaces,
                vec![],
                parse::interface_names,
            )?,
            tproxy_mark: r.parsed(
                &INBOUND_TPROXY_MARK,
                &args.inbound_tproxy_mark,
                DEFAULT_TPROXY_MARK,
                parse::integer,
            )?,
            tproxy_route_table: r.parsed(
                &INBOUND_TPROXY_ROUTE_TABLE,
                &args.inbound_tproxy_route_table,
                DEFAULT_TPROXY_ROUTE_TABLE,
                parse::integer,
            )?,
            owner_groups: r.owner_groups()?,
            loopback_v4_cidr: r.parsed(
                &IPV4_LOOPBACK_CIDR,
                &None,
                DEFAULT_LOOPBACK_V4_CIDR,
                parse::loopback_v4_cidr,
            )?,
            redirect_dns: r.flag(&REDIRECT_DNS, &args.redirect_dns)?,
            capture_all_dns: r.flag(&CAPTURE_ALL_DNS, &args.capture_all_dns)?,
            drop_invalid: r.flag(&DROP_INVALID, &args.drop_invalid)?,
            dual_stack: r.flag(&DUAL_STACK, &args.dual_stack)?,
            fail_open: r.flag(&FAIL_OPEN, &args.own.fail_open)?,
            // Linkerd's semantics, none of them istio's.
            outbound_exclude_port_ranges: vec![],
            inbound_exclude_port_ranges: vec![],
            inbound_exclude_sources: vec![],
            local_destinations_pass: false,
            orig_dst_of_unredirected: false,
            ipv6_off: false,
            ztunnel: false,
        };
        let run = RunOptions {
            dry_run: r.flag(&DRY_RUN, &args.dry_run)?,
            cleanup_only: r.flag(&CLEANUP_ONLY, &args.own.cleanup_only)?,
            reconcile: r.flag(&RECONCILE, &args.reconcile)?,
            force_apply: r.flag(&FORCE_APPLY, &args.force_apply)?,
            skip_rule_apply: r.flag(&SKIP_RULE_APPLY, &args.skip_rule_apply)?,
            network_namespace: r.optional_path(&NETWORK_NAMESPACE, args.network_namespace.as_ref()),
            allow_host_netns: r.flag(&ALLOW_HOST_NETNS, &args.own.allow_host_netns)?,
            cgroup: r.absolute_path(&CGROUP, args.own.cgroup.as_ref())?,
            resolv_conf: r
                .absolute_path(&RESOLV_CONF, args.resolv_conf.as_ref())?
                .unwrap_or_else(|| DEFAULT_RESOLV_CONF.into()),
            pin_root: r
                .absolute_path(&PIN_ROOT, args.own.pin_root.as_ref())?
                .unwrap_or_else(|| DEFAULT_PIN_ROOT.into()),
            ignored_flags: r.ignored_flags(args)?,
        };
        let own = IstioOptions {
            run_validation: r.flag(&RUN_VALIDATION, &args.run_validation)?,
            probe_port: r.parsed(
                &IPTABLES_PROBE_PORT,
                &args.iptables_probe_port,
                DEFAULT_PROBE_PORT,
                parse::port,
            )?,
            probe_timeout: r.parsed(
                &PROBE_TIMEOUT,
                &args.probe_timeout,
                DEFAULT_PROBE_TIMEOUT,
                parse::duration,
            )?,
            cni_mode: r.flag(&CNI_MODE, &args.cni_mode)?,
            log_as_json: r.flag(&LOG_AS_JSON, &args.log_as_json)?,
            log_output_level: r
                .sources
                .text(&LOG_OUTPUT_LEVEL, args.log_output_level.as_deref())
                .map_or_else(|| DEFAULT_LOG_OUTPUT_LEVEL.to_owned(), |raw| raw.text),
        };
        Ok(IstioConfig { capture, run, own })
    }
}

struct Resolver<'a> {
    sources: Sources<'a>,
}

impl Resolver<'_> {
    /// The setting parsed from the command line or env, else `default`.
    fn parsed<T>(
        &self,
        setting: &Setting,
        given: &Option<String>,
        default: T,
        parse: impl FnOnce(&str) -> Result<T, Rejected>,
    ) -> Result<T, ConfigError> {
        match self.sources.text(setting, given.as_deref()) {
            None => Ok(default),
            Some(raw) => parse(&raw.text).map_err(|rejected| raw.reject(rejected)),
        }
    }

    /// A boolean setting; all default to false.
    fn flag(&self, setting: &Setting, given: &Option<String>) -> Result<bool, ConfigError> {
        self.parsed(setting, given, false, parse::go_bool)
    }

    /// `-u`: an empty list means the default, as in istio (`ProxyUID == ""`): the uid of
    /// `ENVOY_USER` (istio-proxy), else 1337. An empty list would capture the proxy's own traffic.
    fn proxy_uids(&self, args: &IstioIptablesArgs) -> Result<Vec<u32>, ConfigError> {
        let uids = self.parsed(&PROXY_UID, &args.proxy_uid, vec![], parse::ids)?;
        if !uids.is_empty() {
            return Ok(uids);
        }
        let env = self.sources.env();
        // Unlike other env vars an empty ENVOY_USER is kept: istio looks it up, fails, uses 1337.
        let user = env
            .var(ENVOY_USER)
            .unwrap_or_else(|| DEFAULT_ENVOY_USER.to_owned());
        Ok(vec![env.user_uid(&user).unwrap_or(DEFAULT_PROXY_UID)])
    }

    /// `-g`: an empty list means the same ids as `-u`.
    fn proxy_gids(
        &self,
        args: &IstioIptablesArgs,
        proxy_uids: &[u32],
    ) -> Result<Vec<u32>, ConfigError> {
        let gids = self.parsed(&PROXY_GID, &args.proxy_gid, vec![], parse::ids)?;
        Ok(if gids.is_empty() {
            proxy_uids.to_vec()
        } else {
            gids
        })
    }

    /// istio's `ParseInterceptFilter`: an include list other than `*` wins; otherwise the exclude
    /// list, if any. istio ignores an exclude list next to an include list; we reject the pair
    /// because one of the two is not what the user meant.
    fn owner_groups(&self) -> Result<OwnerGroups, ConfigError> {
        let env = self.sources.env();
        let gids = |raw: &Raw| {
            parse::group_ids(&raw.text, |name| env.group_gid(name))
                .map_err(|rejected| raw.reject(rejected))
        };
        let include = self
            .sources
            .text(&OWNER_GROUPS_INCLUDE, None)
            .filter(|raw| !parse::is_wildcard(&raw.text));
        let exclude = self.sources.text(&OWNER_GROUPS_EXCLUDE, None);
        let include = include.filter(|raw| parse::entries(&raw.text).next().is_some());
        let exclude = exclude.filter(|raw| parse::entries(&raw.text).next().is_some());
        match (include, exclude) {
            (None, None) => Ok(OwnerGroups::All),
            (Some(include), None) => gids(&include).map(OwnerGroups::Include),
            (None, Some(exclude)) => gids(&exclude).map(OwnerGroups::Exclude),
            (Some(include), Some(exclude)) => Err(exclude.reject(Rejected {
                value: exclude.text.clone(),
                problem: Problem::ConflictsWith {
                    other: OWNER_GROUPS_INCLUDE.envs[0],
                    other_value: include.text,
                },
            })),
        }
    }

    /// A path setting where empty means none (`--network-namespace ''`).
    fn optional_path(&self, setting: &Setting, given: Option<&PathBuf>) -> Option<PathBuf> {
        self.sources
            .path(setting, given)
            .map(|(path, _)| path)
            .filter(|path| !path.as_os_str().is_empty())
    }

    /// A path setting that must be absolute when given: it names a kernel object.
    fn absolute_path(
        &self,
        setting: &Setting,
        given: Option<&PathBuf>,
    ) -> Result<Option<PathBuf>, ConfigError> {
        match self.sources.path(setting, given) {
            None => Ok(None),
            Some((path, _)) if path.is_absolute() => Ok(Some(path)),
            Some((path, origin)) => Err(relative_path(origin, &path)),
        }
    }

    /// iptables-only flags that are switched on; redirector has no use for them.
    fn ignored_flags(&self, args: &IstioIptablesArgs) -> Result<Vec<&'static str>, ConfigError> {
        let mut ignored = Vec::new();
        if self.flag(&NATIVE_NFTABLES, &args.native_nftables)? {
            ignored.push("--native-nftables");
        }
        let binary = self.sources.text(
            &FORCE_IPTABLES_BINARY,
            args.force_iptables_binary.as_deref(),
        );
        if binary.is_some_and(|raw| !raw.text.trim().is_empty()) {
            ignored.push("--force-iptables-binary");
        }
        Ok(ignored)
    }
}

fn relative_path(origin: Origin, path: &Path) -> ConfigError {
    ConfigError::InvalidValue {
        origin,
        value: path.display().to_string(),
        problem: Problem::RelativePath,
    }
}
