//! Where a setting's raw text comes from: the command line beats the env vars, which beat the
//! default (istio's `flag.BindEnv`).

use std::{fmt, path::PathBuf};

use clap::{parser::ValueSource, ArgMatches};

use super::{parse::Rejected, ConfigError, Env};

/// One istio-iptables setting: its clap id, its flag as users spell it, and the env vars that
/// can set it, strongest first.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Setting {
    /// The clap argument id (the field name in `IstioIptablesArgs`); `None` for env-only settings.
    pub id: Option<&'static str>,
    /// `-x/--istio-service-exclude-cidr`; `None` for env-only settings.
    pub flag: Option<&'static str>,
    pub envs: &'static [&'static str],
}

impl Setting {
    const fn flag(id: &'static str, flag: &'static str, envs: &'static [&'static str]) -> Self {
        Setting {
            id: Some(id),
            flag: Some(flag),
            envs,
        }
    }

    const fn env_only(env: &'static [&'static str]) -> Self {
        Setting {
            id: None,
            flag: None,
            envs: env,
        }
    }

    fn origin(&self, env: Option<&'static str>) -> Origin {
        Origin {
            flag: self.flag,
            env,
        }
    }
}

/// Every setting. Env names follow istio: the long flag name upper-cased with `-` → `_`;
/// `-p` has none. The extra names of `--redirect-dns`, `--drop-invalid` and `--dual-stack` come
/// first because istio applies them after the regular one (`flag.AdditionalEnv`).
pub(crate) mod settings {
    use super::Setting;

    pub const ENVOY_PORT: Setting = Setting::flag("envoy_port", "-p/--envoy-port", &[]);
    pub const INBOUND_CAPTURE_PORT: Setting = Setting::flag(
        "inbound_capture_port",
        "-z/--inbound-capture-port",
        &["INBOUND_CAPTURE_PORT"],
    );
    pub const INBOUND_TUNNEL_PORT: Setting = Setting::flag(
        "inbound_tunnel_port",
        "-e/--inbound-tunnel-port",
        &["INBOUND_TUNNEL_PORT"],
    );
    pub const PROXY_UID: Setting = Setting::flag("proxy_uid", "-u/--proxy-uid", &["PROXY_UID"]);
    pub const PROXY_GID: Setting = Setting::flag("proxy_gid", "-g/--proxy-gid", &["PROXY_GID"]);
    pub const INBOUND_INTERCEPTION_MODE: Setting = Setting::flag(
        "inbound_interception_mode",
        "-m/--istio-inbound-interception-mode",
        &["ISTIO_INBOUND_INTERCEPTION_MODE"],
    );
    pub const INBOUND_PORTS: Setting = Setting::flag(
        "inbound_ports",
        "-b/--istio-inbound-ports",
        &["ISTIO_INBOUND_PORTS"],
    );
    pub const LOCAL_EXCLUDE_PORTS: Setting = Setting::flag(
        "local_exclude_ports",
        "-d/--istio-local-exclude-ports",
        &["ISTIO_LOCAL_EXCLUDE_PORTS"],
    );
    pub const EXCLUDE_INTERFACES: Setting = Setting::flag(
        "exclude_interfaces",
        "-c/--istio-exclude-interfaces",
        &["ISTIO_EXCLUDE_INTERFACES"],
    );
    pub const SERVICE_CIDR: Setting = Setting::flag(
        "service_cidr",
        "-i/--istio-service-cidr",
        &["ISTIO_SERVICE_CIDR"],
    );
    pub const SERVICE_EXCLUDE_CIDR: Setting = Setting::flag(
        "service_exclude_cidr",
        "-x/--istio-service-exclude-cidr",
        &["ISTIO_SERVICE_EXCLUDE_CIDR"],
    );
    pub const OUTBOUND_PORTS: Setting = Setting::flag(
        "outbound_ports",
        "-q/--istio-outbound-ports",
        &["ISTIO_OUTBOUND_PORTS"],
    );
    pub const LOCAL_OUTBOUND_PORTS_EXCLUDE: Setting = Setting::flag(
        "local_outbound_ports_exclude",
        "-o/--istio-local-outbound-ports-exclude",
        &["ISTIO_LOCAL_OUTBOUND_PORTS_EXCLUDE"],
    );
    pub const KUBE_VIRT_INTERFACES: Setting = Setting::flag(
        "kube_virt_interfaces",
        "-k/--kube-virt-interfaces",
        &["KUBE_VIRT_INTERFACES"],
    );
    pub const INBOUND_TPROXY_MARK: Setting = Setting::flag(
        "inbound_tproxy_mark",
        "-t/--istio-inbound-tproxy-mark",
        &["ISTIO_INBOUND_TPROXY_MARK"],
    );
    pub const INBOUND_TPROXY_ROUTE_TABLE: Setting = Setting::flag(
        "inbound_tproxy_route_table",
        "-r/--istio-inbound-tproxy-route-table",
        &["ISTIO_INBOUND_TPROXY_ROUTE_TABLE"],
    );
    pub const DRY_RUN: Setting = Setting::flag("dry_run", "-n/--dry-run", &["DRY_RUN"]);
    pub const IPTABLES_PROBE_PORT: Setting = Setting::flag(
        "iptables_probe_port",
        "--iptables-probe-port",
        &["IPTABLES_PROBE_PORT"],
    );
    pub const PROBE_TIMEOUT: Setting =
        Setting::flag("probe_timeout", "--probe-timeout", &["PROBE_TIMEOUT"]);
    pub const SKIP_RULE_APPLY: Setting =
        Setting::flag("skip_rule_apply", "--skip-rule-apply", &["SKIP_RULE_APPLY"]);
    pub const RUN_VALIDATION: Setting =
        Setting::flag("run_validation", "--run-validation", &["RUN_VALIDATION"]);
    pub const REDIRECT_DNS: Setting = Setting::flag(
        "redirect_dns",
        "--redirect-dns",
        &["ISTIO_META_DNS_CAPTURE", "REDIRECT_DNS"],
    );
    pub const CAPTURE_ALL_DNS: Setting =
        Setting::flag("capture_all_dns", "--capture-all-dns", &["CAPTURE_ALL_DNS"]);
    pub const DROP_INVALID: Setting = Setting::flag(
        "drop_invalid",
        "--drop-invalid",
        &["INVALID_DROP", "DROP_INVALID"],
    );
    pub const DUAL_STACK: Setting = Setting::flag(
        "dual_stack",
        "--dual-stack",
        &["ISTIO_DUAL_STACK", "DUAL_STACK"],
    );
    pub const NETWORK_NAMESPACE: Setting = Setting::flag(
        "network_namespace",
        "--network-namespace",
        &["NETWORK_NAMESPACE"],
    );
    pub const CNI_MODE: Setting = Setting::flag("cni_mode", "--cni-mode", &["CNI_MODE"]);
    pub const RECONCILE: Setting = Setting::flag("reconcile", "--reconcile", &["RECONCILE"]);
    pub const CLEANUP_ONLY: Setting =
        Setting::flag("cleanup_only", "--cleanup-only", &["CLEANUP_ONLY"]);
    pub const FORCE_APPLY: Setting =
        Setting::flag("force_apply", "--force-apply", &["FORCE_APPLY"]);
    pub const NATIVE_NFTABLES: Setting =
        Setting::flag("native_nftables", "--native-nftables", &["NATIVE_NFTABLES"]);
    pub const FORCE_IPTABLES_BINARY: Setting = Setting::flag(
        "force_iptables_binary",
        "--force-iptables-binary",
        &["FORCE_IPTABLES_BINARY"],
    );
    // istio's log flags are not bound to env vars.
    pub const LOG_OUTPUT_LEVEL: Setting =
        Setting::flag("log_output_level", "--log_output_level", &[]);
    pub const LOG_AS_JSON: Setting = Setting::flag("log_as_json", "--log_as_json", &[]);

    pub const CGROUP: Setting = Setting::flag("cgroup", "--cgroup", &[]);
    pub const RESOLV_CONF: Setting = Setting::flag("resolv_conf", "--resolv-conf", &[]);
    pub const PIN_ROOT: Setting = Setting::flag("pin_root", "--pin-root", &["REDIRECTOR_PIN_ROOT"]);
    pub const FAIL_OPEN: Setting = Setting::flag("fail_open", "--fail-open", &[]);
    pub const ALLOW_HOST_NETNS: Setting =
        Setting::flag("allow_host_netns", "--allow-host-netns", &[]);

    pub const OWNER_GROUPS_INCLUDE: Setting = Setting::env_only(&["ISTIO_OUTBOUND_OWNER_GROUPS"]);
    pub const OWNER_GROUPS_EXCLUDE: Setting =
        Setting::env_only(&["ISTIO_OUTBOUND_OWNER_GROUPS_EXCLUDE"]);
    pub const IPV4_LOOPBACK_CIDR: Setting =
        Setting::env_only(&["ISTIO_OUTBOUND_IPV4_LOOPBACK_CIDR"]);

    /// Every setting that has a flag, for consistency checks against the clap definition.
    #[cfg(test)]
    pub const WITH_FLAG: [Setting; 39] = [
        ENVOY_PORT,
        INBOUND_CAPTURE_PORT,
        INBOUND_TUNNEL_PORT,
        PROXY_UID,
        PROXY_GID,
        INBOUND_INTERCEPTION_MODE,
        INBOUND_PORTS,
        LOCAL_EXCLUDE_PORTS,
        EXCLUDE_INTERFACES,
        SERVICE_CIDR,
        SERVICE_EXCLUDE_CIDR,
        OUTBOUND_PORTS,
        LOCAL_OUTBOUND_PORTS_EXCLUDE,
        KUBE_VIRT_INTERFACES,
        INBOUND_TPROXY_MARK,
        INBOUND_TPROXY_ROUTE_TABLE,
        DRY_RUN,
        IPTABLES_PROBE_PORT,
        PROBE_TIMEOUT,
        SKIP_RULE_APPLY,
        RUN_VALIDATION,
        REDIRECT_DNS,
        CAPTURE_ALL_DNS,
        DROP_INVALID,
        DUAL_STACK,
        NETWORK_NAMESPACE,
        CNI_MODE,
        RECONCILE,
        CLEANUP_ONLY,
        FORCE_APPLY,
        NATIVE_NFTABLES,
        FORCE_IPTABLES_BINARY,
        LOG_OUTPUT_LEVEL,
        LOG_AS_JSON,
        CGROUP,
        RESOLV_CONF,
        PIN_ROOT,
        FAIL_OPEN,
        ALLOW_HOST_NETNS,
    ];
}

/// Where a value came from, as error messages name it: `-x/--istio-service-exclude-cidr`,
/// `-x/--istio-service-exclude-cidr (env ISTIO_SERVICE_EXCLUDE_CIDR)` or
/// `env ISTIO_OUTBOUND_OWNER_GROUPS`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Origin {
    /// The flag, as `-x/--long-name` or `--long-name`; `None` for env-only settings.
    pub flag: Option<&'static str>,
    /// The env var the value was read from; `None` when it came from the command line.
    pub env: Option<&'static str>,
}

impl fmt::Display for Origin {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match (self.flag, self.env) {
            (Some(flag), Some(env)) => write!(f, "{flag} (env {env})"),
            (Some(flag), None) => f.write_str(flag),
            (None, Some(env)) => write!(f, "env {env}"),
            (None, None) => f.write_str("default"),
        }
    }
}

/// A setting's text as given, with where it came from.
#[derive(Debug, Clone)]
pub(crate) struct Raw {
    pub text: String,
    pub origin: Origin,
}

impl Raw {
    /// The error for a value rejected by a parser; the parser names the offending part.
    pub fn reject(&self, rejected: Rejected) -> ConfigError {
        ConfigError::InvalidValue {
            origin: self.origin.clone(),
            value: rejected.value,
            problem: rejected.problem,
        }
    }
}

/// The command line and the environment, consulted in istio's order.
pub(crate) struct Sources<'a> {
    matches: &'a ArgMatches,
    env: &'a dyn Env,
}

impl<'a> Sources<'a> {
    pub fn new(matches: &'a ArgMatches, env: &'a dyn Env) -> Self {
        Sources { matches, env }
    }

    pub fn env(&self) -> &'a dyn Env {
        self.env
    }

    /// The text for `setting`: `given` (the parsed flag) if it was on the command line, else the
    /// first env var that is set, else `None` (the caller's default).
    pub fn text(&self, setting: &Setting, given: Option<&str>) -> Option<Raw> {
        match self.given(setting, given) {
            Some(text) => Some(Raw {
                text: text.to_owned(),
                origin: setting.origin(None),
            }),
            None => self.env_text(setting),
        }
    }

    /// Like [`Sources::text`] for a path flag, so non-UTF-8 paths survive the command line.
    pub fn path(&self, setting: &Setting, given: Option<&PathBuf>) -> Option<(PathBuf, Origin)> {
        match self.given(setting, given) {
            Some(path) => Some((path.clone(), setting.origin(None))),
            None => self
                .env_text(setting)
                .map(|raw| (PathBuf::from(raw.text), raw.origin)),
        }
    }

    fn given<T>(&self, setting: &Setting, given: Option<T>) -> Option<T> {
        let on_command_line = setting
            .id
            .is_some_and(|id| self.matches.value_source(id) == Some(ValueSource::CommandLine));
        given.filter(|_| on_command_line)
    }

    /// The first of the setting's env vars that is set.
    ///
    /// An empty env var counts as unset: an empty value would either mean the default anyway or,
    /// for booleans, durations and ports, be rejected where istio silently ignores it.
    fn env_text(&self, setting: &Setting) -> Option<Raw> {
        setting.envs.iter().find_map(|&name| {
            let text = self.env.var(name).filter(|v| !v.is_empty())?;
            Some(Raw {
                text,
                origin: setting.origin(Some(name)),
            })
        })
    }
}
