//! Configuration errors: each names the flag or env var a value came from and the value.

use super::Origin;
use crate::mesh::common::report::CommandLineError;

/// istio-iptables' exit code for a configuration error (cobra's for a bad flag too).
const EXIT_CONFIG_ERROR: u8 = 1;

#[derive(thiserror::Error, Debug)]
pub enum ConfigError {
    /// A flag or env var holds a value istio-iptables (or redirector) cannot use.
    #[error("invalid value {value:?} for {origin}: {problem}")]
    InvalidValue {
        origin: Origin,
        value: String,
        problem: Problem,
    },
    /// argv does not parse (unknown flag, missing value) or asks for `--help`;
    /// clap's message names the flag itself.
    #[error(transparent)]
    CommandLine(#[from] clap::Error),
}

/// Printed as istio-iptables prints it, with its exit codes: 0 for `--help`, 1 for any
/// error.
impl CommandLineError for ConfigError {
    const PREFIX: &'static str = "error";
    const FAILURE: u8 = EXIT_CONFIG_ERROR;

    fn into_clap(self) -> Result<clap::Error, Self> {
        match self {
            ConfigError::CommandLine(err) => Ok(err),
            err => Err(err),
        }
    }
}

/// What is wrong with a value.
#[derive(thiserror::Error, Debug, Clone, PartialEq, Eq)]
pub enum Problem {
    #[error("port must be 1-65535")]
    Port,
    #[error("must be an integer 0-4294967295")]
    Integer,
    #[error("must be a numeric id")]
    NumericId,
    #[error("no such group")]
    UnknownGroup,
    /// The kernel side keeps a fixed number of owner ids per pod.
    #[error("at most {max} entries are supported, got {got}")]
    TooManyEntries { max: usize, got: usize },
    #[error("not an IP address or CIDR")]
    Cidr,
    #[error("'*' is not allowed")]
    WildcardNotAllowed,
    #[error("'*' cannot be combined with other entries")]
    WildcardInList,
    #[error("interface names must be 1-15 bytes without '/', ':' or whitespace")]
    InterfaceName,
    #[error("expected \"REDIRECT\" or \"TPROXY\"")]
    InterceptionMode,
    #[error("expected true, false, 1 or 0")]
    Bool,
    #[error("expected a duration such as \"5s\", \"500ms\" or \"1m30s\"")]
    Duration,
    #[error("expected an IPv4 loopback CIDR with a prefix length of 8-32")]
    LoopbackCidr,
    #[error("must be an absolute path")]
    RelativePath,
    #[error("cannot be combined with {other}={other_value:?}")]
    ConflictsWith {
        other: &'static str,
        other_value: String,
    },
}
