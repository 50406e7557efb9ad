//! linkerd2-proxy-init's command line, turned into a typed, validated configuration.
//!
//! The flag contract is proxy-init's own (`proxy-init/cmd/root.go` of
//! linkerd/linkerd2-proxy-init; see docs/linkerd.md, "The command"): pflag's syntax, proxy-init's defaults and
//! checks, its messages where it has them. What the flags ask for is written as the engine's
//! [`CaptureConfig`] with Linkerd's semantics (every local destination passes, ignore lists
//! as port ranges, ignored subnets matched on the inbound source, IPv6 all or nothing), so
//! the engine never learns this syntax.
//!
//! Where this dialect does better than proxy-init: a mixed IPv4/IPv6 `--subnets-to-ignore`
//! works with `--ipv6` on (each family gets its own entries).

pub mod annotations;
mod args;
mod cni_config;
mod effective;
mod error;
mod logging;
mod mesh;
#[cfg(test)]
mod node_tests;
mod parse;
mod resolve;
mod tail;
#[cfg(test)]
mod tests;

use std::{ffi::OsString, time::Duration};

pub use crate::engine::spec::{CaptureConfig, PortRange};
use crate::mesh::common::pflag;
pub use crate::mesh::common::{Env, MeshConfig, ProcessEnv, RunOptions};
pub use args::{proxy_init_command, ProxyInitArgs};
pub use error::{LinkerdError, Problem, EXIT_ERROR};
pub use logging::{LogFormat, LogLevel};
pub use mesh::Linkerd;
pub use parse::{DroppedEntry, PortEntryProblem};

/// The effective, validated configuration of one proxy-init run. Its run options:
/// `--simulate` is `dry_run`, `--netns` is `network_namespace`; proxy-init never skips the
/// apply.
pub type LinkerdConfig = MeshConfig<ProxyInitOptions>;

/// The run settings only proxy-init has.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ProxyInitOptions {
    /// `--timeout-close-wait-secs`: the conntrack close-wait timeout to set in the pod's
    /// namespace; `None` (the flag's 0) leaves it alone.
    pub close_wait_timeout: Option<Duration>,
    pub log_level: LogLevel,
    pub log_format: LogFormat,
    /// Port-list entries that do not parse: left out, and logged by the command once logging
    /// is set up (proxy-init logs them and goes on).
    pub dropped_entries: Vec<DroppedEntry>,
    /// Words that are no flag's value, accepted and ignored as cobra does (`--ipv6 false`
    /// leaves `false` here and IPv6 on).
    pub stray_args: Vec<String>,
}

/// Parses argv (`argv[0]` included); `env` is read for `REDIRECTOR_PIN_ROOT` only. `--help`
/// comes back as a [`LinkerdError::CommandLine`]; [`LinkerdError::report`] prints it and
/// exits 0.
pub fn parse_proxy_init(
    argv: impl IntoIterator<Item = impl Into<OsString> + Clone>,
    env: &dyn Env,
) -> Result<LinkerdConfig, LinkerdError> {
    let (args, _) = pflag::parse::<ProxyInitArgs>(proxy_init_command(), argv)?;
    LinkerdConfig::from_args(&args, env)
}

/// The capture flags Linkerd's injector gives proxy-init (docs/linkerd.md, "The injector"), without its
/// iptables plumbing: the default for a node's Linkerd pods.
pub const INJECTOR_DEFAULTS: [&str; 6] = [
    "--incoming-proxy-port=4143",
    "--outgoing-proxy-port=4140",
    "--proxy-uid=2102",
    "--inbound-ports-to-ignore=4190,4191,4567,4568",
    "--outbound-ports-to-ignore=4567,4568",
    "--ipv6=false",
];
