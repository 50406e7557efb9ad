//! The command line: the drop-ins (istio-iptables' flags and env, Linkerd proxy-init's
//! flags, each turned into a pod spec and run options by its dialect module), and the
//! commands over the engine.

mod check;
mod daemon;
mod explain;
mod gc;
mod install_cni;
mod istio_iptables;
mod linkerd_proxy_init;
mod log_sections;
mod node_args;
mod pin_root;
mod pod;
mod pod_setup;
mod status;
mod trace;
mod validate;

use std::{ffi::OsString, path::Path, process::ExitCode};

use log_sections::Stream;

/// The exit code of a command that failed (the drop-ins' for a configuration or apply
/// error too).
const EXIT_ERROR: u8 = 1;

/// Commands other than the drop-ins `istio-iptables` and `linkerd-proxy-init` (which parse
/// their own flag syntax themselves).
#[derive(clap::Parser, Debug)]
#[command(
    name = "redirector",
    version,
    about = "eBPF transparent traffic redirection for service-mesh sidecars"
)]
#[command(
    after_help = "Also: `redirector istio-iptables [FLAGS]`, the drop-in for istio-iptables (or invoke the binary as `istio-iptables`); see `redirector istio-iptables --help`.\n\
                  And: `redirector linkerd-proxy-init [FLAGS]`, the drop-in for Linkerd's proxy-init (or invoke the binary as `linkerd2-proxy-init` or `proxy-init`); see `redirector linkerd-proxy-init --help`."
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
    /// Check whether this node can be served: every requirement, what was found, what to
    /// do; exit 0 only when it can.
    Check(check::CheckArgs),
}

/// What the binary was asked to be, from `argv[0]`'s file name or the first argument.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum WayIn {
    /// Invoked as `redirector-cni`: the CNI plugin.
    Cni,
    /// istio-iptables' command line, starting at this index of argv (its `argv[0]`).
    IstioIptables(usize),
    /// proxy-init's command line, starting at this index of argv (its `argv[0]`).
    ProxyInit(usize),
    /// One of [`Command`]'s.
    Command,
}

/// The binary's file name picks a drop-in (`istio-iptables`, `linkerd2-proxy-init`,
/// `proxy-init`) or the plugin; otherwise the first argument may name a drop-in. The flags
/// are never looked at: the dialects' short flags clash (`-p`, `-o`, `-r`).
fn way_in(argv: &[OsString]) -> WayIn {
    let invoked_as = argv
        .first()
        .and_then(|a| Path::new(a).file_name())
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    match invoked_as.as_str() {
        "redirector-cni" => return WayIn::Cni,
        "istio-iptables" => return WayIn::IstioIptables(0),
        "linkerd2-proxy-init" | "proxy-init" => return WayIn::ProxyInit(0),
        _ => {}
    }
    match argv.get(1).and_then(|a| a.to_str()) {
        Some("istio-iptables") => WayIn::IstioIptables(1),
        Some("linkerd-proxy-init") => WayIn::ProxyInit(1),
        _ => WayIn::Command,
    }
}

/// Run the binary: a drop-in (by `argv[0]` or first argument), the plugin, or a command.
pub fn main() -> ExitCode {
    let argv: Vec<OsString> = std::env::args_os().collect();
    match way_in(&argv) {
        WayIn::Cni => crate::cni::main(),
        WayIn::IstioIptables(start) => istio_iptables::main(argv[start..].to_vec()),
        WayIn::ProxyInit(start) => linkerd_proxy_init::main(argv[start..].to_vec()),
        WayIn::Command => run_command(argv),
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
        "info"
    } else {
        "warn"
    };
    init_logging(Stream::Stderr, false, level);
    let result = match &command {
        Command::Status(args) => status::run(args),
        Command::Explain(args) => explain::run(args),
        Command::Gc(args) => gc::run(args),
        Command::Daemon(args) => daemon::run(args),
        Command::InstallCni(args) => install_cni::run(args),
        Command::Pod(args) => pod::run(args),
        Command::Trace(args) => trace::run(args),
        Command::Check(args) => check::run(args),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(err) => {
            eprintln!("error: {err:#}");
            ExitCode::from(EXIT_ERROR)
        }
    }
}

/// Log to `stream` at `level` (a `tracing` filter directive), as JSON or plain text.
fn init_logging(stream: Stream, json: bool, level: &str) {
    log_sections::set_stream(stream);
    let filter = tracing_subscriber::EnvFilter::new(level);
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(|| log_sections::LogOutput)
        .with_ansi(stream.is_terminal());
    if json {
        builder.json().init();
    } else {
        builder.with_target(false).init();
    }
}

#[cfg(test)]
mod tests {
    use std::ffi::OsString;

    use super::{way_in, WayIn};

    fn argv(words: &[&str]) -> Vec<OsString> {
        words.iter().map(OsString::from).collect()
    }

    #[test]
    fn the_way_in_is_chosen_by_name_never_by_flags() {
        let cases = [
            (
                &["redirector", "linkerd-proxy-init", "-p", "4143"][..],
                WayIn::ProxyInit(1),
            ),
            (
                &["/usr/lib/linkerd/linkerd2-proxy-init", "-p", "4143"],
                WayIn::ProxyInit(0),
            ),
            (&["proxy-init", "--ipv6=false"], WayIn::ProxyInit(0)),
            (
                &["redirector", "istio-iptables", "-p", "15001"],
                WayIn::IstioIptables(1),
            ),
            (&["/usr/local/bin/istio-iptables"], WayIn::IstioIptables(0)),
            (&["/opt/cni/bin/redirector-cni"], WayIn::Cni),
            (&["redirector", "status"], WayIn::Command),
            // Flags alone never pick a dialect.
            (&["redirector", "-p", "4143"], WayIn::Command),
            (&["redirector"], WayIn::Command),
        ];
        for (words, want) in cases {
            assert_eq!(way_in(&argv(words)), want, "{words:?}");
        }
    }
}
