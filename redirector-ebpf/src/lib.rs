//! Present so that `redirector`'s build script can depend on this crate; the programs
//! live in the `redirector` binary target (src/main.rs).
#![no_std]
