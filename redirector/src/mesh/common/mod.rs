//! What every mesh's command line shares: the environment and account lookups, the run
//! options a set-up takes, Go's value parsers, redirector's own flags, the effective
//! configuration's display pieces and the error report. Each mesh imports from here and
//! from the engine's spec, never from another mesh.

pub(crate) mod accounts;
pub mod duration;
pub mod effective;
pub mod env;
pub mod go;
pub mod own_flags;
pub mod pflag;
pub mod report;
pub mod run_options;

pub use env::{Env, ProcessEnv};
pub use own_flags::{path_parser, RedirectorFlags, PIN_ROOT_ENV};
pub use run_options::{MeshConfig, RunOptions};
