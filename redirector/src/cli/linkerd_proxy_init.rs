//! `redirector linkerd-proxy-init` (or the binary invoked as `linkerd2-proxy-init` or
//! `proxy-init`): the drop-in for Linkerd's proxy-init. Logs go to stdout, as proxy-init's
//! do; any error exits 1. The log: the iptables flags that were ignored, the port entries
//! that were left out, the effective config, then the set-up ([`pod_setup`]).

use std::{ffi::OsString, fs, io, io::Write as _, process::ExitCode, time::Duration};

use anyhow::Context as _;
use tracing::{error, info, warn};

use super::{
    log_sections::{Section, Stream},
    pod_setup::{self, Dialect},
};
use crate::{
    mesh::common::report::CommandLineError,
    mesh::linkerd::{parse_proxy_init, LinkerdConfig, LogFormat, ProcessEnv, EXIT_ERROR},
    store::PinRoot,
    sys::netns::Netns,
};

/// The conntrack close-wait timeout of the namespace whose thread reads it: `/proc/sys/net`
/// shows the calling thread's network namespace.
const CLOSE_WAIT_SYSCTL: &str = "/proc/sys/net/netfilter/nf_conntrack_tcp_timeout_close_wait";

/// Parse `argv` (`argv[0]` included), set logging up and run.
pub fn main(argv: Vec<OsString>) -> ExitCode {
    let cfg = match parse_proxy_init(argv, &ProcessEnv) {
        Ok(cfg) => cfg,
        Err(err) => return err.report(),
    };
    super::init_logging(
        Stream::Stdout,
        cfg.own.log_format == LogFormat::Json,
        cfg.own.log_level.filter(),
    );
    match run(&cfg) {
        Ok(()) => ExitCode::SUCCESS,
        Err(err) => {
            error!("{err:#}");
            ExitCode::from(EXIT_ERROR)
        }
    }
}

/// Set the pod up as `cfg` says (print the plan with `--simulate`, remove the pod with
/// `--cleanup-only`), after setting its close-wait timeout if asked.
pub fn run(cfg: &LinkerdConfig) -> anyhow::Result<()> {
    // First: on an old kernel even reading the pod's netns cookie fails, less clearly.
    PinRoot::new(&cfg.run.pin_root).check_kernel_unless_loaded()?;
    {
        let _section = Section::start();
        for flag in &cfg.run.ignored_flags {
            info!("{flag} is accepted for compatibility and ignored: redirector does not use iptables");
        }
        for arg in &cfg.own.stray_args {
            warn!("ignoring argument {arg:?}, which is no flag's value (as proxy-init does; boolean flags take the form --ipv6=false)");
        }
        for dropped in &cfg.own.dropped_entries {
            warn!("{dropped}");
        }
        info!("Effective config:");
        for line in cfg.effective_lines() {
            info!("{line}");
        }
    }
    let netns = pod_setup::open_pod_netns(&cfg.run)?;
    if let (Some(timeout), false) = (cfg.own.close_wait_timeout, cfg.run.cleanup_only) {
        set_close_wait_timeout(&netns, timeout, cfg.run.dry_run)?;
    }
    pod_setup::set_up_pod(&cfg.capture, &cfg.run, &netns, Dialect::ProxyInit)
}

/// `--timeout-close-wait-secs`: proxy-init runs `sysctl -w` for it, and fails if that
/// fails. The sysctl exists only where conntrack is loaded; redirector does not need
/// conntrack, so its absence is logged and the run goes on.
fn set_close_wait_timeout(netns: &Netns, timeout: Duration, dry_run: bool) -> anyhow::Result<()> {
    let secs = timeout.as_secs();
    let setting = format!("net.netfilter.nf_conntrack_tcp_timeout_close_wait={secs}");
    if dry_run {
        info!("dry run: would set {setting} in the pod's network namespace");
        return Ok(());
    }
    // Opened without O_CREAT: a missing sysctl is ENOENT, not a failed create.
    let written = netns.run(|| {
        fs::OpenOptions::new()
            .write(true)
            .open(CLOSE_WAIT_SYSCTL)
            .and_then(|mut file| file.write_all(secs.to_string().as_bytes()))
    })?;
    match written {
        Ok(()) => info!("set {setting} in the pod's network namespace"),
        Err(err) if err.kind() == io::ErrorKind::NotFound => info!(
            "{setting} not applied: {CLOSE_WAIT_SYSCTL} does not exist in the pod's network namespace (conntrack is not loaded; redirector does not use it)"
        ),
        Err(err) => {
            return Err(err).with_context(|| format!("setting {setting} ({CLOSE_WAIT_SYSCTL})"))
        }
    }
    Ok(())
}
