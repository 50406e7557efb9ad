//! redirector's own flags, the same in every mesh's command: one clap struct flattened
//! into each command line, so that a flag reads and behaves alike whichever mesh's
//! syntax surrounds it.

use std::path::PathBuf;

use clap::{
    builder::{OsStringValueParser, TypedValueParser},
    Args,
};

/// Flags every mesh's set-up command adds to its own.
#[derive(Args, Debug, Clone, Default, PartialEq, Eq)]
pub struct RedirectorFlags {
    /// Remove everything installed, install nothing
    #[arg(long = "cleanup-only", value_name = "BOOL")]
    pub cleanup_only: Option<String>,

    /// The pod's cgroup v2 directory to attach to [default: parent of our own cgroup]
    #[arg(long = "cgroup", value_name = "PATH", value_parser = path_parser())]
    pub cgroup: Option<PathBuf>,

    /// bpffs directory for redirector's pins [env: REDIRECTOR_PIN_ROOT] [default: /sys/fs/bpf/redirector]
    #[arg(long = "pin-root", value_name = "PATH", value_parser = path_parser())]
    pub pin_root: Option<PathBuf>,

    /// Accept the host's own network namespace as the pod's (refused otherwise)
    #[arg(long = "allow-host-netns", value_name = "BOOL")]
    pub allow_host_netns: Option<String>,

    /// Let a connection through uncaptured if its state cannot be recorded
    #[arg(long = "fail-open", value_name = "BOOL")]
    pub fail_open: Option<String>,
}

/// The env var that names the pin root when `--pin-root` is not given.
pub const PIN_ROOT_ENV: &str = "REDIRECTOR_PIN_ROOT";

/// Paths as given, empty ones included (an empty network namespace path means none, as
/// in the meshes' own commands); clap's own path parser refuses empty values.
pub fn path_parser() -> impl TypedValueParser<Value = PathBuf> {
    OsStringValueParser::new().map(PathBuf::from)
}
