//! `redirector check`: the operator's pre-flight. Every requirement of this node with what
//! was found and, for a failure, what to do; exit 0 only when the node can be served.

use crate::node_check::{assess, render_text};

#[derive(clap::Args, Debug)]
pub struct CheckArgs {
    #[command(flatten)]
    node: super::node_args::NodeArgs,
    #[command(flatten)]
    pin_root: super::pin_root::PinRootArg,
    #[command(flatten)]
    runtime: super::node_args::RuntimeArgs,
    /// Print JSON instead of text.
    #[arg(long)]
    json: bool,
}

/// Prints the report, whose last line is the verdict; exits 1 when the node cannot be
/// served.
pub fn run(args: &CheckArgs) -> anyhow::Result<()> {
    let mut options = args.node.options(
        args.pin_root.path.clone(),
        Some(args.runtime.cni_conf_dir.clone()),
    );
    options.cri_socket = args.runtime.cri_socket();
    let report = assess(&options);
    if args.json {
        println!("{}", serde_json::to_string_pretty(&report)?);
    } else {
        print!("{}", render_text(&report));
    }
    if !report.servable() {
        std::io::Write::flush(&mut std::io::stdout())?;
        std::process::exit(1);
    }
    Ok(())
}
