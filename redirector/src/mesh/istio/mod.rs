//! istio-iptables' command line and environment, turned into a typed, validated configuration.
//!
//! The flag contract is istio-iptables' own (istio's `tools/istio-iptables/pkg/cmd/root.go` and
//! `tools/common/config`): a flag given on the command line beats its env var, which beats the
//! default. Every value, whichever way it came in, is validated here, so the rest of redirector
//! only sees well-formed settings; an error names the flag (and env var) and the value.

pub mod annotations;
mod args;
mod effective;
mod error;
mod mesh;
mod parse;
#[cfg(test)]
pub(crate) mod proptests;
mod resolve;
mod source;
#[cfg(test)]
mod tests;

use std::ffi::OsString;

pub use crate::engine::spec::{
    CaptureConfig, CidrSelection, InterceptionMode, OwnerGroups, PortSelection,
};
use crate::mesh::common::pflag;
pub use crate::mesh::common::{Env, MeshConfig, ProcessEnv, RunOptions};
pub use args::{istio_iptables_command, IstioIptablesArgs};
pub use error::{ConfigError, Problem};
pub use mesh::Istio;
pub use source::Origin;

/// The effective, validated configuration.
pub type IstioConfig = MeshConfig<IstioOptions>;

/// The run settings only istio-iptables has.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct IstioOptions {
    /// `--run-validation`
    pub run_validation: bool,
    /// `--iptables-probe-port`: where validation probes connect.
    pub probe_port: u16,
    /// `--probe-timeout`: when validation gives up.
    pub probe_timeout: std::time::Duration,
    /// `--cni-mode`
    pub cni_mode: bool,
    /// `--log_as_json`
    pub log_as_json: bool,
    /// `--log_output_level`, istio's `scope:level` list.
    pub log_output_level: String,
}

/// Parses argv (argv[0] included) and `env` in one go. `--help` comes back as a
/// [`ConfigError::CommandLine`]; [`ConfigError::report`] prints it and exits 0.
pub fn parse_istio_iptables(
    argv: impl IntoIterator<Item = impl Into<OsString> + Clone>,
    env: &dyn Env,
) -> Result<IstioConfig, ConfigError> {
    let (args, matches) = pflag::parse::<IstioIptablesArgs>(istio_iptables_command(), argv)?;
    IstioConfig::from_args(&args, &matches, env)
}
