//! `redirector istio-iptables` (or the binary invoked as `istio-iptables`): the drop-in
//! for istio-init. Sections of the log follow istio-iptables': environment and effective
//! config here, then what was applied and the final state from the set-up itself
//! ([`pod_setup`]), then validation.

use std::{ffi::OsString, process::ExitCode};

use tracing::info;

use super::{
    log_sections::{Section, Stream},
    pod_setup::{self, Dialect},
    validate,
};
use crate::mesh::{
    common::report::CommandLineError,
    istio::{parse_istio_iptables, IstioConfig, ProcessEnv},
};
use crate::store::{PinRoot, OBJECT_OVERRIDE_ENV};

/// Environment variables istio-iptables reads, logged as its "Environment" section.
const LOGGED_ENV: [&str; 21] = [
    "ENVOY_PORT",
    "INBOUND_CAPTURE_PORT",
    "ISTIO_INBOUND_INTERCEPTION_MODE",
    "ISTIO_INBOUND_TPROXY_ROUTE_TABLE",
    "ISTIO_INBOUND_PORTS",
    "ISTIO_OUTBOUND_PORTS",
    "ISTIO_LOCAL_EXCLUDE_PORTS",
    "ISTIO_EXCLUDE_INTERFACES",
    "ISTIO_SERVICE_CIDR",
    "ISTIO_SERVICE_EXCLUDE_CIDR",
    "ISTIO_META_DNS_CAPTURE",
    "INVALID_DROP",
    "ISTIO_OUTBOUND_OWNER_GROUPS",
    "ISTIO_OUTBOUND_OWNER_GROUPS_EXCLUDE",
    "ISTIO_OUTBOUND_IPV4_LOOPBACK_CIDR",
    "ISTIO_DUAL_STACK",
    "KUBE_VIRT_INTERFACES",
    "PROXY_UID",
    "PROXY_GID",
    "REDIRECTOR_PIN_ROOT",
    OBJECT_OVERRIDE_ENV,
];

/// Parse `istio_argv` (`argv[0]` included) and env, set logging up and run.
pub fn main(istio_argv: Vec<OsString>) -> ExitCode {
    let cfg = match parse_istio_iptables(istio_argv, &ProcessEnv) {
        Ok(cfg) => cfg,
        Err(err) => return err.report(),
    };
    super::init_logging(
        Stream::Stderr,
        cfg.own.log_as_json,
        log_level(&cfg.own.log_output_level),
    );
    match run(&cfg) {
        Ok(()) => ExitCode::SUCCESS,
        Err(err) => {
            tracing::error!("{err}");
            if err.downcast_ref::<validate::ValidationError>().is_some() {
                ExitCode::from(validate::EXIT_VALIDATION_FAILED)
            } else {
                ExitCode::from(super::EXIT_ERROR)
            }
        }
    }
}

pub fn run(cfg: &IstioConfig) -> anyhow::Result<()> {
    // First: on an old kernel even reading the pod's netns cookie fails, less clearly.
    PinRoot::new(&cfg.run.pin_root).check_kernel_unless_loaded()?;
    {
        let _section = Section::start();
        for flag in &cfg.run.ignored_flags {
            info!("{flag} is accepted for compatibility and ignored: redirector does not use iptables");
        }
        info!("Environment:");
        for name in LOGGED_ENV {
            info!("{name}={}", std::env::var(name).unwrap_or_default());
        }
        info!("Effective config:");
        for line in cfg.effective_lines() {
            info!("{line}");
        }
    }
    let netns = pod_setup::open_pod_netns(&cfg.run)?;
    pod_setup::set_up_pod(&cfg.capture, &cfg.run, &netns, Dialect::IstioIptables)?;
    if cfg.own.run_validation && !cfg.run.dry_run && !cfg.run.cleanup_only {
        netns.run(|| {
            validate::run(
                cfg.capture.outbound_port,
                cfg.capture.inbound_port,
                cfg.own.probe_port,
                cfg.own.probe_timeout,
            )
        })??;
    }
    Ok(())
}

/// istio's `--log_output_level` is `scope:level[,scope:level]`; redirector has one scope,
/// so the `default` scope's level (or the only one given) applies.
fn log_level(istio_levels: &str) -> &'static str {
    let level = istio_levels
        .split(',')
        .map(|item| {
            item.rsplit_once(':')
                .map_or(("default", item), |(s, l)| (s, l))
        })
        .find(|(scope, _)| scope.trim() == "default")
        .or_else(|| {
            istio_levels
                .split(',')
                .next()
                .map(|i| ("", i.rsplit(':').next().unwrap_or(i)))
        })
        .map(|(_, level)| level.trim().to_ascii_lowercase())
        .unwrap_or_default();
    match level.as_str() {
        "debug" => "debug",
        "warn" | "warning" => "warn",
        "error" | "fatal" => "error",
        "none" => "off",
        _ => "info",
    }
}

#[cfg(test)]
mod tests {
    use super::log_level;

    #[test]
    fn istio_log_levels_map_to_tracing_levels() {
        assert_eq!(log_level("default:info"), "info");
        assert_eq!(log_level("default:debug"), "debug");
        assert_eq!(log_level("foo:error,default:warn"), "warn");
        assert_eq!(log_level("error"), "error");
        assert_eq!(log_level("default:none"), "off");
        assert_eq!(log_level(""), "info");
    }
}
