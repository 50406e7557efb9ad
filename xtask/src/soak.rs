//! `cargo xtask soak`: the shipped daemon under pod churn for a time or a number of pods
//! (bench/src/soak), its per-minute table and verdict; fails when the verdict does.

use std::process::Command;

use anyhow::Result;

use crate::workspace::{cargo, status, target_dir};

/// The soak's own flags, as `bench soak` takes them.
#[derive(clap::Args, Debug)]
pub struct SoakArgs {
    /// Run for this many minutes (default 3 when neither this nor --pods is given).
    #[arg(long)]
    pub minutes: Option<f64>,
    /// Stop after this many pods.
    #[arg(long)]
    pub pods: Option<usize>,
    /// The verdict's baseline: the first minute with at least this many pods added.
    #[arg(long, default_value_t = 10_000)]
    pub warmup_pods: usize,
    /// How far the daemon's RSS may grow past the baseline, KiB.
    #[arg(long, default_value_t = 1024)]
    pub max_rss_growth_kib: u64,
}

impl SoakArgs {
    /// The arguments of `bench soak`.
    fn to_bench_args(&self) -> Vec<String> {
        let mut args = vec!["soak".to_string()];
        if let Some(minutes) = self.minutes {
            args.extend(["--minutes".into(), minutes.to_string()]);
        }
        if let Some(pods) = self.pods {
            args.extend(["--pods".into(), pods.to_string()]);
        }
        args.extend([
            "--warmup-pods".into(),
            self.warmup_pods.to_string(),
            "--max-rss-growth-kib".into(),
            self.max_rss_growth_kib.to_string(),
        ]);
        args
    }
}

/// Builds the shipped (static release) redirector, then the bench and the probe, which
/// only drive it (pods in, connections through), in the debug profile `cargo xtask test`
/// has built already; runs `bench soak`, which writes its table under target/soak/.
pub fn run(args: &SoakArgs) -> Result<()> {
    let redirector = crate::image::static_release_binary(crate::arch::Arch::Amd64)?;
    let mut build = cargo();
    build.args([
        "build",
        "--package",
        "redirector-tests",
        "--package",
        "redirector-bench",
    ]);
    build.arg("--bins");
    status(build)?;
    let out = target_dir().join("soak");
    std::fs::create_dir_all(&out)?;
    let bin = target_dir().join("debug");
    let mut cmd = Command::new(bin.join("bench"));
    cmd.args(args.to_bench_args())
        .arg("--table")
        .arg(out.join("soak.md"))
        .env("REDIRECTOR_BIN", redirector)
        .env("PROBE_BIN", bin.join("probe"));
    status(cmd)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bench_gets_the_flags_given_and_the_bounds() {
        let args = SoakArgs {
            minutes: Some(60.0),
            pods: None,
            warmup_pods: 10_000,
            max_rss_growth_kib: 1024,
        };
        assert_eq!(
            args.to_bench_args().join(" "),
            "soak --minutes 60 --warmup-pods 10000 --max-rss-growth-kib 1024"
        );
    }
}
