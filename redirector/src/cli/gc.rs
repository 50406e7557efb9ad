//! `redirector gc`: remove what is left of pods that are gone.

use crate::engine::gc::collect_stale;

#[derive(clap::Args, Debug)]
pub struct GcArgs {
    #[command(flatten)]
    pin_root: super::pin_root::PinRootArg,
}

pub fn run(args: &GcArgs) -> anyhow::Result<()> {
    let removed = collect_stale(&args.pin_root.root())?;
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
