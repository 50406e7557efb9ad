//! The `redirector` binary (also run as `istio-iptables`): everything is in the library.

fn main() -> std::process::ExitCode {
    redirector::cli::main()
}
