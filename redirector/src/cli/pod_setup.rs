//! Setting one pod up from inside it (an init container, or a command given its netns), for
//! every dialect: open its network namespace, then set it up through the engine's front
//! door (`engine::setup`), print the plan (dry run), or remove what was installed for it
//! (cleanup-only), and log what was done. Each dialect logs its own sections around this.

use tracing::{info, warn};

use super::log_sections::Section;
use crate::{
    engine::apply::Outcome,
    engine::gc::teardown,
    engine::setup::{set_up_in_pod, InPod, PlanNote},
    engine::spec::CaptureConfig,
    mesh::RunOptions,
    store::{OpenMaps, PinRoot},
    sys::cgroup::pod_cgroup,
    sys::netns::Netns,
};

/// The command line a set-up came from: only the wording of a few log lines depends on it
/// (which flag would have changed what happened).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Dialect {
    IstioIptables,
    ProxyInit,
}

/// The pod's network namespace: `run.network_namespace` (refused if it is the host's,
/// unless `run.allow_host_netns`), else our own.
pub fn open_pod_netns(run: &RunOptions) -> anyhow::Result<Netns> {
    Ok(match &run.network_namespace {
        Some(path) => {
            Netns::open_pod_and_run(path, run.allow_host_netns, || ()).map(|(netns, ())| netns)?
        }
        None => Netns::current()?,
    })
}

/// Set the pod in `netns` up as `capture` asks, as `run` says: remove it instead
/// (`cleanup_only`), install nothing (`skip_rule_apply`), or print the plan (`dry_run`).
pub fn set_up_pod(
    capture: &CaptureConfig,
    run: &RunOptions,
    netns: &Netns,
    dialect: Dialect,
) -> anyhow::Result<()> {
    let root = PinRoot::new(&run.pin_root);
    if run.cleanup_only {
        return remove_pod(&root, netns, run.dry_run);
    }
    if run.skip_rule_apply {
        info!("--skip-rule-apply: nothing applied");
        return Ok(());
    }
    apply_rules(capture, run, &root, netns, dialect)
}

/// `--cleanup-only`: every pin, link and map entry of the pod goes.
fn remove_pod(root: &PinRoot, netns: &Netns, dry_run: bool) -> anyhow::Result<()> {
    let cookie = netns.cookie();
    if dry_run {
        info!("dry run: would remove every pin, link and map entry of pod netns {cookie}");
        return Ok(());
    }
    // An init container's pod keeps its keys nowhere: its maps are read through.
    let removed = teardown(root, cookie, &mut OpenMaps::default(), None)?;
    let removed: Vec<&str> = removed.iter().map(|id| id.as_str()).collect();
    info!("cleaned up pod netns {cookie} (from objects {removed:?})");
    Ok(())
}

fn apply_rules(
    capture_config: &CaptureConfig,
    run: &RunOptions,
    root: &PinRoot,
    netns: &Netns,
    dialect: Dialect,
) -> anyhow::Result<()> {
    let cgroup = match pod_cgroup(run.cgroup.as_deref()) {
        Ok(cgroup) => cgroup,
        // A dry run prints the plan wherever it runs, as istio-iptables' does; it names the
        // cgroup it would use, or why it found none.
        Err(err) if run.dry_run && run.cgroup.is_none() => {
            warn!("no pod cgroup: {err}");
            "<no pod cgroup found: pass --cgroup>".into()
        }
        Err(err) => return Err(err.into()),
    };
    let cgroup_name = cgroup.display().to_string();
    let set_up = set_up_in_pod(InPod {
        root,
        netns,
        capture: capture_config,
        cgroup: Some(cgroup),
        resolv_conf: &run.resolv_conf,
        dry_run: run.dry_run,
        force_apply: run.force_apply,
    })?;
    if let Some(node) = &set_up.covered_by {
        info!("the node's programs (object {node}) cover cgroup {cgroup_name}: adding only the pod's entries and its namespace's link");
    }
    let plan = &set_up.planned.plan;
    for note in &set_up.planned.notes {
        match note {
            PlanNote::DnsCaptureOff => warn!(
                "--redirect-dns is set, but --capture-all-dns is not and {} names no DNS server: DNS capture disabled (as istio-iptables does)",
                run.resolv_conf.display()
            ),
            PlanNote::MissingInterface(name) => warn!("interface {name} does not exist in the pod: its rule applies to nothing (set the pod up again once it exists)"),
        }
    }
    let Some(applied) = set_up.applied else {
        println!("{plan}");
        info!("dry run: nothing applied");
        return Ok(());
    };
    let report = match applied {
        Outcome::Unchanged => {
            match dialect {
                Dialect::IstioIptables => info!("found this exact state already installed for the pod: nothing to apply (--force-apply applies it again)"),
                Dialect::ProxyInit => info!("found this exact state already installed for the pod: nothing to apply"),
            }
            return Ok(());
        }
        Outcome::Replaced(report) => {
            if !run.reconcile {
                info!("the pod had a different earlier state: replaced it (as --reconcile would; the swap is atomic, nothing doubles)");
            } else if dialect == Dialect::ProxyInit {
                info!("the pod had a different earlier state: replaced it (the swap is atomic, nothing doubles)");
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
