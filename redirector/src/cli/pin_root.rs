//! `--pin-root`, declared once for every command that reads or writes the pins.

use std::path::PathBuf;

use crate::store::{pins::DEFAULT_ROOT, PinRoot};

#[derive(clap::Args, Debug, Clone)]
pub struct PinRootArg {
    /// The bpffs directory redirector pins its object, maps and links under.
    #[arg(
        long = "pin-root",
        value_name = "DIR",
        env = "REDIRECTOR_PIN_ROOT",
        default_value = DEFAULT_ROOT
    )]
    pub path: PathBuf,
}

impl PinRootArg {
    pub fn root(&self) -> PinRoot {
        PinRoot::new(&self.path)
    }
}
