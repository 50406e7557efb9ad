//! Configuration errors of the proxy-init dialect: each names the flag and the value. Where
//! proxy-init has a message of its own for a case, the text is its text.

use crate::mesh::common::report::CommandLineError;

/// proxy-init's exit code for any error.
pub const EXIT_ERROR: u8 = 1;

#[derive(thiserror::Error, Debug)]
pub enum LinkerdError {
    /// argv does not parse (unknown flag, missing value) or asks for `--help`; clap's
    /// message names the flag itself.
    #[error(transparent)]
    CommandLine(#[from] clap::Error),
    /// A flag's value is not of its type (an integer, a boolean, an absolute path).
    #[error("invalid argument {value:?} for {flag}: {problem}")]
    InvalidValue {
        flag: &'static str,
        value: String,
        problem: Problem,
    },
    /// `-p`/`-o` outside 0-65535; their default, -1, is one such value.
    #[error("{flag} must be a valid TCP port number (0-65535), got {value}")]
    ProxyPort { flag: &'static str, value: i64 },
    /// A `--subnets-to-ignore` entry (the only CIDR flag); proxy-init's own message.
    #[error("{value} is not a valid CIDR address")]
    InvalidCidr { value: String },
    #[error(
        "--iptables-mode valid values are only \"legacy\", \"nft\" and \"plain\", got {value:?}"
    )]
    IptablesMode { value: String },
    /// `--firewall-bin-path` or `--firewall-save-bin-path` naming a binary proxy-init does
    /// not know.
    #[error("{flag} valid values are only {allowed}, got {value:?}")]
    FirewallBinary {
        flag: &'static str,
        value: String,
        allowed: &'static str,
    },
    #[error("not a valid log level for --log-level: {value:?} (expected panic, fatal, error, warn, warning, info, debug or trace)")]
    LogLevel { value: String },
}

/// Printed as proxy-init prints it (to stderr, as cobra does), with its exit codes: 0 for
/// `--help`, 1 for any error.
impl CommandLineError for LinkerdError {
    const PREFIX: &'static str = "Error";
    const FAILURE: u8 = EXIT_ERROR;

    fn into_clap(self) -> Result<clap::Error, Self> {
        if let LinkerdError::CommandLine(err) = self {
            return Ok(err);
        }
        Err(self)
    }
}

/// What is wrong with a value.
#[derive(thiserror::Error, Debug, Clone, PartialEq, Eq)]
pub enum Problem {
    /// Go's `strconv.ParseInt(s, 0, 64)` refuses it.
    #[error("not an integer")]
    Integer,
    #[error("must be 0-{max}")]
    OutOfRange { max: u64 },
    /// Go's `strconv.ParseBool` refuses it.
    #[error("expected true, false, 1, 0, t or f")]
    Bool,
    #[error("must be an absolute path")]
    RelativePath,
}
