//! `redirector gc`: remove what is left of pods that are gone.

use std::path::PathBuf;

use crate::{engine::gc::collect_stale, store::PinRoot};

#[derive(clap::Args, Debug)]
pub struct GcArgs {
    #[arg(long, value_name = "PATH", env = "REDIRECTOR_PIN_ROOT", default_value = crate::store::pins::DEFAULT_ROOT)]
    pin_root: PathBuf,
}

pub fn run(args: &GcArgs) -> anyhow::Result<()> {
    let removed = collect_stale(&PinRoot::new(&args.pin_root))?;
    let cookies: Vec<u64> = removed.iter().map(|c| c.get()).collect();
    println!(
        "removed {} stale pod(s){}",
        removed.len(),
        if removed.is_empty() {
            String::new()
        } else {
            format!(": netns cookies {cookies:?}")
        }
    );
    Ok(())
}
