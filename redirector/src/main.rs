//! redirector: eBPF transparent traffic redirection for service-mesh sidecars.

mod apply;
mod bpf_sys;
mod config;
mod istio_iptables;
mod node_maps;
mod object;
mod pins;
mod plan;
mod pod;
mod programs;

use std::{ffi::OsString, path::Path, process::ExitCode};

use crate::config::{parse_istio_iptables, ProcessEnv};

/// istio-iptables' exit code for a configuration or apply error.
const EXIT_ERROR: u8 = 1;

const USAGE: &str = "\
redirector: eBPF transparent traffic redirection for service-mesh sidecars

Usage:
  redirector istio-iptables [FLAGS]   drop-in for istio-iptables (also: invoke as `istio-iptables`)

Run `redirector istio-iptables --help` for the flags.";

fn main() -> ExitCode {
    let argv: Vec<OsString> = std::env::args_os().collect();
    let invoked_as = argv
        .first()
        .and_then(|a| Path::new(a).file_name())
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    let istio_argv = if invoked_as == "istio-iptables" {
        argv
    } else if argv.get(1).is_some_and(|a| a == "istio-iptables") {
        argv[1..].to_vec()
    } else {
        eprintln!("{USAGE}");
        let asked_for_help = argv.get(1).is_some_and(|a| a == "--help" || a == "-h");
        return if asked_for_help { ExitCode::SUCCESS } else { ExitCode::from(EXIT_ERROR) };
    };
    let cfg = match parse_istio_iptables(istio_argv, &ProcessEnv) {
        Ok(cfg) => cfg,
        Err(err) => return err.report(),
    };
    init_logging(cfg.run.log_as_json, &cfg.run.log_output_level);
    match istio_iptables::run(&cfg) {
        Ok(()) => ExitCode::SUCCESS,
        Err(err) => {
            tracing::error!("{err:#}");
            ExitCode::from(EXIT_ERROR)
        }
    }
}

fn init_logging(json: bool, level: &str) {
    let filter = tracing_subscriber::EnvFilter::try_new(level)
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
    let builder = tracing_subscriber::fmt().with_env_filter(filter).with_writer(std::io::stderr);
    if json {
        builder.json().init();
    } else {
        builder.with_target(false).init();
    }
}
