//! `cargo xtask`: everything that is not plain cargo — toolchain bootstrap, the eBPF
//! build, the privileged test run and the demo.

mod bootstrap;
mod run;

use anyhow::Result;
use clap::{Parser, Subcommand};

#[derive(Parser)]
#[command(about = "redirector's task runner")]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Install what a fresh machine lacks: Debian packages, nightly rust-src, bpf-linker;
    /// mount bpffs. Idempotent.
    Bootstrap,
    /// Bootstrap, then build redirector (with its eBPF object) and the test binaries.
    Build,
    /// Bootstrap, build, then run the unit tests and the privileged integration tests.
    Test {
        /// Extra arguments for the integration test binaries (e.g. a test name filter).
        #[arg(trailing_var_arg = true)]
        filter: Vec<String>,
    },
    /// Bootstrap, build, then set up a pod and show a connection redirected to a proxy.
    Demo {
        /// Through `redirector daemon` and `redirector pod add`, with no init container.
        #[arg(long)]
        daemon: bool,
    },
}

fn main() -> Result<()> {
    match Cli::parse().command {
        Command::Bootstrap => bootstrap::all(),
        Command::Build => {
            bootstrap::all()?;
            run::build()
        }
        Command::Test { filter } => {
            bootstrap::all()?;
            run::build()?;
            run::test(&filter)
        }
        Command::Demo { daemon } => {
            bootstrap::all()?;
            run::build()?;
            run::demo(daemon)
        }
    }
}
