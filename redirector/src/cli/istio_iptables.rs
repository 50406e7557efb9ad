//! `redirector istio-iptables` (or the binary invoked as `istio-iptables`): the drop-in
//! for istio-init. Sections of the log follow istio-iptables': environment, effective
//! config, what was applied, final state.

use std::path::{Path, PathBuf};

use anyhow::{bail, Context as _};
use tracing::{info, warn};

use super::{log_sections::Section, validate};
use crate::istio::IstioConfig;
use crate::{
    engine::apply::Outcome,
    engine::capture::capture,
    engine::diff::Mode,
    engine::facts::PodFacts,
    engine::gc::teardown,
    engine::node::covering,
    engine::plan::{dns_capture_enabled, plan_pod},
    store::{pins::BPFFS_MOUNT, EbpfObject, OpenMaps, PinRoot, OBJECT_OVERRIDE_ENV},
    sys::cgroup::pod_cgroup,
    sys::fs_kind::nearest_is_bpffs,
    sys::netns::Netns,
};

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
    let netns = match &cfg.run.network_namespace {
        Some(path) => Netns::open_pod_and_run(path, cfg.run.allow_host_netns, || ())
            .map(|(netns, ())| netns)?,
        None => Netns::current()?,
    };

    let root = PinRoot::new(&cfg.run.pin_root);
    let cookie = netns.cookie();
    if cfg.run.cleanup_only {
        if cfg.run.dry_run {
            info!("dry run: would remove every pin, link and map entry of pod netns {cookie}");
            return Ok(());
        }
        // An init container's pod keeps its keys nowhere: its maps are read through.
        let removed = teardown(&root, cookie, &mut OpenMaps::default(), None)?;
        let removed: Vec<&str> = removed.iter().map(|id| id.as_str()).collect();
        info!("cleaned up pod netns {cookie} (from objects {removed:?})");
        return Ok(());
    }
    if cfg.run.skip_rule_apply {
        info!("--skip-rule-apply: nothing applied");
    } else {
        apply_rules(cfg, &root, &netns)?;
    }
    if cfg.run.run_validation && !cfg.run.dry_run {
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

fn apply_rules(cfg: &IstioConfig, root: &PinRoot, netns: &Netns) -> anyhow::Result<()> {
    let cgroup = match pod_cgroup(cfg.run.cgroup.as_deref()) {
        Ok(cgroup) => cgroup,
        // A dry run prints the plan wherever it runs, as istio-iptables' does; it names the
        // cgroup it would use, or why it found none.
        Err(err) if cfg.run.dry_run && cfg.run.cgroup.is_none() => {
            warn!("no pod cgroup: {err}");
            PathBuf::from("<no pod cgroup found: pass --cgroup>")
        }
        Err(err) => return Err(err.into()),
    };
    // A node daemon's programs may already cover this pod's cgroup: then the pod gets only
    // its entries (in the daemon's object) and its namespace's link, so that no program
    // runs twice on its sockets.
    let node_object = if cgroup.exists() {
        covering(root, &cgroup)?
    } else {
        None
    };
    if let Some(node) = &node_object {
        info!(
            "the node's programs (object {}) cover cgroup {}: adding only the pod's entries and its namespace's link",
            node.id(),
            cgroup.display()
        );
    }
    let pod_cgroup = node_object.is_none().then_some(cgroup);
    let facts = PodFacts::gather(netns, pod_cgroup, &cfg.run.resolv_conf)?;
    let plan = plan_pod(&cfg.capture, &facts);
    if cfg.capture.redirect_dns && !dns_capture_enabled(&cfg.capture, &facts) {
        warn!(
            "--redirect-dns is set, but --capture-all-dns is not and {} names no DNS server: DNS capture disabled (as istio-iptables does)",
            cfg.run.resolv_conf.display()
        );
    }
    for name in cfg
        .capture
        .exclude_interfaces
        .iter()
        .chain(&cfg.capture.kube_virt_interfaces)
    {
        if !facts.interfaces.iter().any(|(n, _)| n == name) {
            warn!("interface {name} does not exist in the pod: its rule applies to nothing (set the pod up again once it exists)");
        }
    }
    if cfg.run.dry_run {
        println!("{plan}");
        info!("dry run: nothing applied");
        return Ok(());
    }
    require_bpffs(root.path())?;
    let object = match node_object {
        Some(node) => EbpfObject::pinned(node.id().clone()),
        None => EbpfObject::configured()?,
    };
    let mode = if cfg.run.force_apply {
        Mode::Everything
    } else {
        Mode::Changes
    };
    let report = match capture(
        root,
        &object,
        &plan,
        netns,
        mode,
        &mut OpenMaps::default(),
        None,
    )? {
        Outcome::Unchanged => {
            info!("found this exact state already installed for the pod: nothing to apply (--force-apply applies it again)");
            return Ok(());
        }
        Outcome::Replaced(report) => {
            if !cfg.run.reconcile {
                info!("the pod had a different earlier state: replaced it (as --reconcile would; the swap is atomic, nothing doubles)");
            }
            report
        }
        Outcome::New(report) => report,
    };
    let _section = Section::start();
    info!("Applied:");
    for line in plan.to_string().lines() {
        info!("{line}");
    }
    let object = match report.object_load_time {
        Some(t) => format!("loaded now in {:.1} ms", t.as_secs_f64() * 1e3),
        None => "already loaded on this node".to_owned(),
    };
    info!(
        "object {} ({object}), pod attached in {:.2} ms{}",
        report.object_id,
        report.pod_time.as_secs_f64() * 1e3,
        if report.moved_from.is_empty() {
            String::new()
        } else {
            let ids: Vec<&str> = report.moved_from.iter().map(|id| id.as_str()).collect();
            format!(", moved from objects {ids:?}")
        }
    );
    for listener in &report.listeners {
        info!("registered the proxy's existing listener on {listener}");
    }
    // The apply renamed exactly the plan's links into place under the report's object, and
    // moved the pod off every other: no need to read bpffs again to say so.
    info!("Final state:");
    let pod = root.object(&report.object_id).pod(plan.netns_cookie);
    for program in plan.programs {
        info!("pinned link {}", pod.link(program.hook).display());
    }
    Ok(())
}

pub(super) fn require_bpffs(root: &Path) -> anyhow::Result<()> {
    let on_bpffs = nearest_is_bpffs(root).context("pin root has no existing ancestor")?;
    if !on_bpffs {
        bail!(
            "{} is not on a bpffs mount: mount one with `mount -t bpf bpf {BPFFS_MOUNT}` (in a container, mount the host's {BPFFS_MOUNT})",
            root.display()
        );
    }
    Ok(())
}
