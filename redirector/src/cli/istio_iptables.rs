//! `redirector istio-iptables` (or the binary invoked as `istio-iptables`): the drop-in
//! for istio-init. Sections of the log follow istio-iptables': environment and effective
//! config here, then what was applied and the final state from the set-up itself
//! ([`pod_setup`]), then validation.

use tracing::info;

use super::{
    log_sections::Section,
    pod_setup::{self, Dialect},
    validate,
};
use crate::istio::IstioConfig;
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

pub fn run(cfg: &IstioConfig) -> anyhow::Result<()> {
    // First: on an old kernel even reading the pod's netns cookie fails, less clearly.
    crate::sys::kernel::check_unless_loaded(&PinRoot::new(&cfg.run.pin_root))?;
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
    if cfg.run.run_validation && !cfg.run.dry_run && !cfg.run.cleanup_only {
        netns.run(|| {
            validate::run(
                cfg.capture.outbound_port,
                cfg.capture.inbound_port,
                cfg.run.probe_port,
                cfg.run.probe_timeout,
            )
        })??;
    }
    Ok(())
}
