//! A command line's error as the mesh's own command reports it, before logging is set up.

use std::{fmt::Display, process::ExitCode};

use clap::error::ErrorKind;

/// Prints `err` (clap's own text for a command line that does not parse, or the help it
/// was asked for; `prefix` and the message for any other) and gives the exit code both
/// meshes' commands use: 0 for `--help`, `failure` for any error.
pub fn report(err: Result<clap::Error, impl Display>, prefix: &str, failure: u8) -> ExitCode {
    match err {
        Ok(err) => {
            // Nothing better to do if stdout/stderr are gone.
            let _ = err.print();
            match err.kind() {
                ErrorKind::DisplayHelp | ErrorKind::DisplayVersion => ExitCode::SUCCESS,
                _ => ExitCode::from(failure),
            }
        }
        Err(err) => {
            eprintln!("{prefix}: {err}");
            ExitCode::from(failure)
        }
    }
}
