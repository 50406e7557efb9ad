//! The command line: istio-iptables' flags and env turned into a pod spec and run options
//! (`config`), and the commands over the engine.

mod daemon;
mod explain;
mod gc;
mod install_cni;
mod istio_iptables;
mod log_sections;
mod pin_root;
mod pod;
mod status;
mod trace;
mod validate;

use std::{ffi::OsString, path::Path, process::ExitCode};

use crate::istio::{parse_istio_iptables, ProcessEnv};

/// istio-iptables' exit code for a configuration or apply error.
const EXIT_ERROR: u8 = 1;

/// Commands other than `istio-iptables` (which parses istio's own flag syntax itself).
#[derive(clap::Parser, Debug)]
#[command(
    name = "redirector",
    version,
    about = "eBPF transparent traffic redirection for service-mesh sidecars"
)]
#[command(
    after_help = "Also: `redirector istio-iptables [FLAGS]`, the drop-in for istio-iptables (or invoke the binary as `istio-iptables`); see `redirector istio-iptables --help`."
)]
enum Command {
    /// Show what is attached and pinned, map fill and per-pod counters.
    Status(status::StatusArgs),
    /// Show which rule decides a connection of a pod and where it lands.
    Explain(explain::ExplainArgs),
    /// Remove what is left of pods that are gone (their cgroup and netns no longer exist).
    Gc(gc::GcArgs),
    /// Run the node-level daemon: pods captured by their network namespace, no init container.
    Daemon(daemon::DaemonArgs),
    /// Install the CNI plugin on the node: the binary into the CNI bin dir and its entry
    /// chained into the cluster network's configuration (`--watch` keeps it there).
    InstallCni(install_cni::InstallCniArgs),
    /// Talk to the daemon: add, delete, list and check pods.
    Pod(pod::PodArgs),
    /// Watch a pod's decisions (or every pod's) as they happen, with their reasons.
    Trace(trace::TraceArgs),
}

/// Run the binary: `istio-iptables` (by argv[0] or first argument) or a command.
pub fn main() -> ExitCode {
    let argv: Vec<OsString> = std::env::args_os().collect();
    let invoked_as = argv
        .first()
        .and_then(|a| Path::new(a).file_name())
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    if invoked_as == "redirector-cni" {
        return crate::cni::main();
    }
    let istio_argv = if invoked_as == "istio-iptables" {
        argv
    } else if argv.get(1).is_some_and(|a| a == "istio-iptables") {
        argv[1..].to_vec()
    } else {
        return run_command(argv);
    };
    let cfg = match parse_istio_iptables(istio_argv, &ProcessEnv) {
        Ok(cfg) => cfg,
        Err(err) => return err.report(),
    };
    init_logging(cfg.run.log_as_json, &cfg.run.log_output_level);
    match istio_iptables::run(&cfg) {
        Ok(()) => ExitCode::SUCCESS,
        Err(err) => {
            tracing::error!("{err}");
            if err.downcast_ref::<validate::ValidationError>().is_some() {
                ExitCode::from(validate::EXIT_VALIDATION_FAILED)
            } else {
                ExitCode::from(EXIT_ERROR)
            }
        }
    }
}

fn run_command(argv: Vec<OsString>) -> ExitCode {
    let command = match <Command as clap::Parser>::try_parse_from(argv) {
        Ok(command) => command,
        Err(err) => {
            let _ = err.print();
            return if err.use_stderr() {
                ExitCode::from(EXIT_ERROR)
            } else {
                ExitCode::SUCCESS
            };
        }
    };
    // The daemon says what it does; the other commands print their results.
    let level = if matches!(command, Command::Daemon(_) | Command::InstallCni(_)) {
        "default:info"
    } else {
        "default:warn"
    };
    init_logging(false, level);
    let result = match &command {
        Command::Status(args) => status::run(args),
        Command::Explain(args) => explain::run(args),
        Command::Gc(args) => gc::run(args),
        Command::Daemon(args) => daemon::run(args),
        Command::InstallCni(args) => install_cni::run(args),
        Command::Pod(args) => pod::run(args),
        Command::Trace(args) => trace::run(args),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(err) => {
            eprintln!("error: {err:#}");
            ExitCode::from(EXIT_ERROR)
        }
    }
}

fn init_logging(json: bool, istio_levels: &str) {
    let filter = tracing_subscriber::EnvFilter::new(log_level(istio_levels));
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(|| log_sections::Stderr)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()));
    if json {
        builder.json().init();
    } else {
        builder.with_target(false).init();
    }
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
