//! The soak's per-minute table and its verdict: what the daemon holds after warm-up held
//! against what it held at the end.

use std::fmt::Write as _;

/// One row: the run at the end of a minute (or at its end).
#[derive(Clone, Debug, Default, PartialEq, serde::Serialize)]
pub struct Minute {
    /// Minutes since the churn started (the last row may end part way through one).
    pub minute: f64,
    /// Pods added since the start, every way in.
    pub pods: usize,
    /// CNI ADDs in this minute, and their median and 99th percentile, ms.
    pub adds: usize,
    pub add_p50_ms: f64,
    pub add_p99_ms: f64,
    /// The daemon's resident memory: all of it, its heap (anonymous), its mapped files.
    pub rss_kib: u64,
    pub anon_kib: u64,
    pub file_kib: u64,
    pub fds: u64,
    pub threads: u64,
    /// Files pinned under the node's pin root.
    pub pins: u64,
    /// Entries of the pods' configuration maps (the connection maps, which move with
    /// traffic, left out), and of POD_CONFIG alone: one per installed pod.
    pub entries: u64,
    pub pod_configs: u64,
    /// Since the start: adds that failed (every way in), capture checks of the live pod
    /// done and failed, scrapes that failed.
    pub failed_adds: usize,
    pub checks: usize,
    pub failed_checks: usize,
    pub failed_scrapes: usize,
}

pub const HEADER: &str = "| min | pods | ADDs | ADD p50 ms | ADD p99 ms | RSS KiB | anon KiB | file KiB | fds | threads | pins | entries | POD_CONFIG | failed adds | checks (failed) |\n|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|";

impl Minute {
    pub fn row(&self) -> String {
        format!(
            "| {:.1} | {} | {} | {:.2} | {:.2} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} ({}) |",
            self.minute,
            self.pods,
            self.adds,
            self.add_p50_ms,
            self.add_p99_ms,
            self.rss_kib,
            self.anon_kib,
            self.file_kib,
            self.fds,
            self.threads,
            self.pins,
            self.entries,
            self.pod_configs,
            self.failed_adds,
            self.checks,
            self.failed_checks
        )
    }
}

/// What the verdict allows.
#[derive(Clone, Copy, Debug)]
pub struct Bounds {
    /// The row that is the baseline: the first with at least this many pods added.
    pub warmup_pods: usize,
    /// How far the daemon's RSS may grow past the baseline's.
    pub max_rss_growth_kib: u64,
}

/// The verdict: one line per measure, and whether every one holds.
pub struct Verdict {
    pub lines: Vec<String>,
    pub passed: bool,
}

/// Holds the last row against the baseline (the first row past warm-up): RSS within
/// `bounds`; fds, threads, pins and entries no higher than the most seen up to the
/// baseline, plus a little for pods in flight (the 50 alive come and go, a pod deleted
/// without a DEL waits for a collection); no failed add, capture check or scrape.
pub fn verdict(rows: &[Minute], bounds: Bounds) -> Verdict {
    let mut lines = Vec::new();
    let Some(last) = rows.last() else {
        return Verdict {
            lines: vec!["no minute measured".to_owned()],
            passed: false,
        };
    };
    let Some(base_at) = rows.iter().position(|r| r.pods >= bounds.warmup_pods) else {
        return Verdict {
            lines: vec![format!(
                "the run ended at {} pods, before the {} of warm-up: no baseline",
                last.pods, bounds.warmup_pods
            )],
            passed: false,
        };
    };
    let base = &rows[base_at];
    let warm = &rows[..=base_at];
    let mut passed = true;
    let mut check = |ok: bool, line: String| {
        passed &= ok;
        lines.push(format!("{} {line}", if ok { "ok  " } else { "FAIL" }));
    };
    let growth = last.rss_kib as i64 - base.rss_kib as i64;
    check(
        growth <= bounds.max_rss_growth_kib as i64,
        format!(
            "RSS {} KiB at {} pods (minute {:.1}), {} KiB at {} pods: {growth:+} KiB (bound {} KiB); heap {:+} KiB",
            base.rss_kib,
            base.pods,
            base.minute,
            last.rss_kib,
            last.pods,
            bounds.max_rss_growth_kib,
            last.anon_kib as i64 - base.anon_kib as i64
        ),
    );
    let flat = |name: &str, of: fn(&Minute) -> u64, slack: fn(u64) -> u64| {
        let most = warm.iter().map(of).max().unwrap_or(0);
        let bound = most + slack(most);
        (
            of(last) <= bound,
            format!(
                "{name}: {} at the end, at most {most} up to the baseline (bound {bound})",
                of(last)
            ),
        )
    };
    // A few descriptors come and go with API and scrape connections.
    let (ok, line) = flat("fds", |r| r.fds, |_| 4);
    check(ok, line);
    let (ok, line) = flat("threads", |r| r.threads, |_| 2);
    check(ok, line);
    let in_flight = |most: u64| (most / 10).max(10);
    let (ok, line) = flat("pins", |r| r.pins, in_flight);
    check(ok, line);
    let (ok, line) = flat("map entries", |r| r.entries, in_flight);
    check(ok, line);
    check(
        last.failed_adds == 0,
        format!("{} failed adds of {}", last.failed_adds, last.pods),
    );
    check(
        last.failed_checks == 0 && last.checks > 0,
        format!(
            "{} failed capture checks of {}",
            last.failed_checks, last.checks
        ),
    );
    check(
        last.failed_scrapes == 0,
        format!("{} failed scrapes", last.failed_scrapes),
    );
    Verdict { lines, passed }
}

/// The table and the verdict as text.
pub fn text(rows: &[Minute], verdict: &Verdict) -> String {
    let mut out = String::new();
    let _ = writeln!(out, "{HEADER}");
    for row in rows {
        let _ = writeln!(out, "{}", row.row());
    }
    let _ = writeln!(out);
    for line in &verdict.lines {
        let _ = writeln!(out, "{line}");
    }
    let _ = writeln!(
        out,
        "soak: {}",
        if verdict.passed { "PASSED" } else { "FAILED" }
    );
    out
}

/// The `q` quantile (0–1) of `values`, nearest rank; 0 for none.
pub fn quantile(values: &[f64], q: f64) -> f64 {
    if values.is_empty() {
        return 0.0;
    }
    let mut sorted = values.to_vec();
    sorted.sort_by(f64::total_cmp);
    let rank = ((q * sorted.len() as f64).ceil() as usize).clamp(1, sorted.len());
    sorted[rank - 1]
}

#[cfg(test)]
mod tests {
    use super::*;

    fn row(minute: f64, pods: usize, rss_kib: u64, pins: u64) -> Minute {
        Minute {
            minute,
            pods,
            rss_kib,
            fds: 27,
            threads: 5,
            pins,
            entries: 400,
            checks: 12 * minute as usize,
            ..Minute::default()
        }
    }

    const BOUNDS: Bounds = Bounds {
        warmup_pods: 10_000,
        max_rss_growth_kib: 1024,
    };

    #[test]
    fn a_flat_run_passes() {
        let rows = [
            row(1.0, 3_300, 10_000, 93),
            row(4.0, 12_400, 12_000, 95),
            row(60.0, 200_000, 12_900, 94),
        ];
        let v = verdict(&rows, BOUNDS);
        assert!(v.passed, "{}", v.lines.join("\n"));
        assert!(
            v.lines[0].contains("12000 KiB at 12400 pods"),
            "{}",
            v.lines[0]
        );
    }

    #[test]
    fn growth_past_the_bound_after_warmup_fails() {
        let rows = [row(4.0, 12_400, 12_000, 95), row(20.0, 70_000, 24_000, 95)];
        let v = verdict(&rows, BOUNDS);
        assert!(!v.passed);
        assert!(v.lines[0].starts_with("FAIL RSS"), "{}", v.lines[0]);
    }

    #[test]
    fn pins_that_pile_up_fail_and_a_run_too_short_has_no_baseline() {
        let rows = [row(4.0, 12_400, 12_000, 95), row(20.0, 70_000, 12_000, 500)];
        let v = verdict(&rows, BOUNDS);
        assert!(!v.passed);
        assert!(v.lines.iter().any(|l| l.starts_with("FAIL pins")));
        let v = verdict(&[row(1.0, 3_000, 10_000, 93)], BOUNDS);
        assert!(!v.passed && v.lines[0].contains("no baseline"));
    }

    #[test]
    fn failed_checks_fail() {
        let mut last = row(20.0, 70_000, 12_000, 95);
        last.failed_checks = 1;
        let v = verdict(&[row(4.0, 12_400, 12_000, 95), last], BOUNDS);
        assert!(!v.passed);
    }

    #[test]
    fn quantiles_by_nearest_rank() {
        let v: Vec<f64> = (1..=100).map(f64::from).collect();
        assert_eq!(quantile(&v, 0.5), 50.0);
        assert_eq!(quantile(&v, 0.99), 99.0);
        assert_eq!(quantile(&[], 0.5), 0.0);
    }
}
