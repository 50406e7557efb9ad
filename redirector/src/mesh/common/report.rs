//! A command line's error as the mesh's own command reports it, before logging is set up.

use std::{fmt::Display, process::ExitCode};

use clap::error::ErrorKind;

/// A mesh command's configuration error.
pub trait CommandLineError: Display + Sized {
    /// What the mesh's command prints before the message (`error`, `Error`).
    const PREFIX: &'static str;
    /// The mesh command's exit code for any error.
    const FAILURE: u8;

    /// clap's own error, where the command line did not parse or asked for `--help`.
    fn into_clap(self) -> Result<clap::Error, Self>;

    /// Prints the error (clap's own text for a command line that does not parse, or the
    /// help it was asked for) and gives the exit code the mesh's command would: 0 for
    /// `--help`, [`Self::FAILURE`] for any error.
    fn report(self) -> ExitCode {
        match self.into_clap() {
            Ok(err) => {
                // Nothing better to do if stdout/stderr are gone.
                let _ = err.print();
                match err.kind() {
                    ErrorKind::DisplayHelp | ErrorKind::DisplayVersion => ExitCode::SUCCESS,
                    _ => ExitCode::from(Self::FAILURE),
                }
            }
            Err(err) => {
                eprintln!("{}: {err}", Self::PREFIX);
                ExitCode::from(Self::FAILURE)
            }
        }
    }
}
