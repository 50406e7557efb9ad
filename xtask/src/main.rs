//! `cargo xtask`: everything that is not plain cargo — toolchain bootstrap, the eBPF
//! build, the privileged test run and the demo.

mod arch;
mod bootstrap;
mod docs_check;
mod image;
mod msrv;
mod results;
mod run;
mod soak;
mod vm;
mod workspace;

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
    /// Bootstrap, build redirector, then check the docs against the repository: links and
    /// anchors, the paths they name, their `redirector …` and `cargo xtask …` command
    /// lines, and the files the code's comments cite.
    Docs,
    /// Bootstrap, build redirector, then run the checks `cargo xtask test` begins with: the
    /// docs check, `cargo fmt --all --check`, clippy with warnings denied, and the build with
    /// the oldest Rust the workspace names (`rust-version`).
    Check,
    /// Bootstrap, build, then check (the docs, `cargo fmt --check`, clippy) and run the
    /// unit tests and the privileged integration tests.
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
    /// Bootstrap, then measure redirector against istio's iptables rules in one run: data
    /// path (wrk through a sidecar), per-pod setup, kernel memory. Writes target/bench/.
    Bench {
        /// Fewer and shorter rounds, 100 pods instead of 1,000.
        #[arg(long)]
        quick: bool,
        /// The churn of init-container pods (deleted without a cleanup, 10 alive at a
        /// time) over 10,000 pods instead of 1,000.
        #[arg(long)]
        scale: bool,
        /// Only one part: `datapath`, `setup`, `churn` or `scale` (`--scale`'s pods through
        /// the daemon's API alone).
        #[arg(long, value_name = "PART")]
        only: Option<String>,
        /// Only these data-path modes, comma-separated (direct, explicit, iptables,
        /// redirector, redirector-daemon, redirector-traced, redirector-fallbacks,
        /// redirector-linkerd, daemon-bystander, ambient-iptables, ambient-redirector).
        #[arg(long, value_name = "NAME,...")]
        modes: Option<String>,
    },
    /// Bootstrap, then run the shipped daemon under pod churn (CNI, API and init-container
    /// pods, 50 alive at a time) and print per minute what it holds; ends with a verdict:
    /// its RSS after warm-up, fds, threads, pins, map entries, failures. Writes
    /// its table under target/soak/.
    Soak(soak::SoakArgs),
    /// Build the static release binary and write the node image as an OCI archive
    /// (target/image/redirector-<version>.oci.tar, `localhost/redirector:<version>`), with
    /// nothing pulled: load it with `podman load -i` or `ctr -n k8s.io images import`.
    Image,
    /// Build the integration tests, then run them in QEMU on other kernels (Debian's packaged
    /// 6.1/6.12 kernels or a kernel image path) and print a verdict table. With `--arch
    /// arm64`, an arm64 machine under emulation: Debian's arm64 kernel and tools, the tests
    /// cross-built.
    Vm {
        /// The guest's architecture.
        #[arg(long, value_enum, default_value = "amd64")]
        arch: arch::Arch,
        /// Kernel to boot: 6.1, 6.1-cloud, 6.12, 6.12-cloud, 6.12-rt, all (those four), 5.10
        /// (Debian 11's: the oldest kernel it runs on, on the fallbacks its probes call for),
        /// or a path to a bzImage/vmlinux. Repeatable; default 6.1.
        #[arg(long = "kernel", value_name = "SPEC")]
        kernels: Vec<String>,
        /// Run only these integration test binaries (`outbound`, `daemon`, `conformance`,
        /// …: the files in tests/tests). Repeatable; default all.
        #[arg(long = "suite", value_name = "NAME")]
        suites: Vec<String>,
        /// Arguments for every test binary in the guest (after `--`, e.g. a name filter).
        #[arg(last = true)]
        filter: Vec<String>,
    },
}

/// Whether `cargo xtask ARGS…` parses with the definitions above (asking for the help
/// counts as parsing): the docs check's judge of the `cargo xtask` lines in the docs.
pub(crate) fn xtask_parses(args: &[String]) -> std::result::Result<(), String> {
    use clap::error::ErrorKind;
    match Cli::try_parse_from(std::iter::once("xtask".to_string()).chain(args.iter().cloned())) {
        Ok(_) => Ok(()),
        Err(e) if matches!(e.kind(), ErrorKind::DisplayHelp | ErrorKind::DisplayVersion) => Ok(()),
        Err(e) => Err(e
            .to_string()
            .lines()
            .next()
            .unwrap_or("does not parse")
            .trim_start_matches("error: ")
            .to_string()),
    }
}

fn main() -> Result<()> {
    match Cli::parse().command {
        Command::Bootstrap => bootstrap::all(),
        Command::Build => {
            bootstrap::all()?;
            run::build()
        }
        Command::Docs => {
            bootstrap::all()?;
            run::build_redirector()?;
            docs_check::run(&run::redirector_bin())
        }
        Command::Check => {
            bootstrap::all()?;
            run::build_redirector()?;
            run::check()
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
        Command::Bench {
            quick,
            scale,
            only,
            modes,
        } => {
            bootstrap::all()?;
            let mut args = Vec::new();
            if quick {
                args.push("--quick".to_string());
            }
            if scale {
                args.push("--scale".to_string());
            }
            if let Some(part) = only {
                args.extend(["--only".to_string(), part]);
            }
            if let Some(modes) = modes {
                args.extend(["--modes".to_string(), modes]);
            }
            run::bench(&args)
        }
        Command::Soak(args) => {
            bootstrap::all()?;
            soak::run(&args)
        }
        Command::Image => {
            bootstrap::all()?;
            image::build().map(drop)
        }
        Command::Vm {
            arch,
            kernels,
            suites,
            filter,
        } => {
            bootstrap::all()?;
            vm::run(arch, &kernels, &suites, &filter)
        }
    }
}
