//! The node architectures redirector ships for, and how this x86-64 machine builds for and
//! runs each: the host's own toolchain for amd64; for arm64 Debian's cross gcc (the linker,
//! with a static glibc) and qemu-user to run what it built — all installed by the bootstrap.

use std::{path::Path, process::Command};

use anyhow::{Context as _, Result};

use crate::workspace::which;

#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum Arch {
    Amd64,
    Arm64,
}

impl Arch {
    /// Every architecture the image holds, the host's first.
    pub const ALL: [Arch; 2] = [Arch::Amd64, Arch::Arm64];

    /// The name Debian, Go and OCI use (`amd64`, `arm64`).
    pub fn name(self) -> &'static str {
        match self {
            Arch::Amd64 => "amd64",
            Arch::Arm64 => "arm64",
        }
    }

    /// Rust's target triple.
    pub fn triple(self) -> &'static str {
        match self {
            Arch::Amd64 => "x86_64-unknown-linux-gnu",
            Arch::Arm64 => "aarch64-unknown-linux-gnu",
        }
    }

    /// Whether this is the machine's own architecture (no cross toolchain, no emulation).
    pub fn is_host(self) -> bool {
        self == Arch::Amd64
    }

    /// The GNU tool prefix of the cross toolchain (`aarch64-linux-gnu-`); empty on the host.
    fn gnu_prefix(self) -> &'static str {
        match self {
            Arch::Amd64 => "",
            Arch::Arm64 => "aarch64-linux-gnu-",
        }
    }

    /// Points a cargo command building `--target <triple>` at the cross linker (and C
    /// compiler, for any crate that builds C), with `rustflags` for this target only: a
    /// target's own variable, so that the eBPF build inside build.rs does not get them.
    pub fn configure_cargo(self, cmd: &mut Command, rustflags: &str) {
        let var = self.triple().to_uppercase().replace('-', "_");
        if !self.is_host() {
            cmd.env(
                format!("CARGO_TARGET_{var}_LINKER"),
                format!("{}gcc", self.gnu_prefix()),
            )
            .env(
                format!("CC_{}", self.triple().replace('-', "_")),
                format!("{}gcc", self.gnu_prefix()),
            );
        }
        if !rustflags.is_empty() {
            cmd.env(format!("CARGO_TARGET_{var}_RUSTFLAGS"), rustflags);
        }
    }

    /// A command that runs `binary` built for this architecture on this machine.
    pub fn run(self, binary: &Path) -> Result<Command> {
        if self.is_host() {
            return Ok(Command::new(binary));
        }
        let qemu = which("qemu-aarch64-static")
            .context("qemu-aarch64-static not found (apt-get install qemu-user-static)")?;
        let mut cmd = Command::new(qemu);
        cmd.arg(binary);
        Ok(cmd)
    }

    /// The binutils program `tool` (`strip`, `readelf`) for this architecture's ELF files.
    pub fn binutil(self, tool: &str) -> String {
        format!("{}{tool}", self.gnu_prefix())
    }

    /// The machine part of Debian's multiarch triple (`x86_64`, `aarch64`): its library
    /// directories are `/lib/<machine>-linux-gnu`.
    pub fn gnu_machine(self) -> &'static str {
        match self {
            Arch::Amd64 => "x86_64",
            Arch::Arm64 => "aarch64",
        }
    }
}
