//! The Markdown report: medians, same-run ratios with their per-round range, and the
//! targets redirector is held to.

use std::fmt::Write as _;

use crate::datapath::{DataPath, Mode};
use crate::setup::Setup;
use crate::stats::{median, min_max};
use crate::wrk::LOADS;

/// Per-round values of `f` for one mode and load, in round order.
pub fn per_round(
    dp: &DataPath,
    mode: Mode,
    load: &str,
    f: impl Fn(&crate::datapath::Sample) -> f64,
) -> Vec<f64> {
    let mut v: Vec<_> = dp
        .samples
        .iter()
        .filter(|s| s.mode == mode && s.load == load)
        .map(|s| (s.round, f(s)))
        .collect();
    v.sort_by_key(|(r, _)| *r);
    v.into_iter().map(|(_, x)| x).collect()
}

/// Per-round `a/b` of requests/s.
pub fn rps_ratio(dp: &DataPath, a: Mode, b: Mode, load: &str) -> Vec<f64> {
    let (x, y) = (
        per_round(dp, a, load, |s| s.wrk.rps),
        per_round(dp, b, load, |s| s.wrk.rps),
    );
    x.iter().zip(&y).map(|(x, y)| x / y).collect()
}

/// Per-round CPU µs per request of `a` over `b`.
pub fn added_cpu(dp: &DataPath, a: Mode, b: Mode, load: &str) -> Vec<f64> {
    let f = |s: &crate::datapath::Sample| s.cpu_us_per_req;
    let (x, y) = (per_round(dp, a, load, f), per_round(dp, b, load, f));
    x.iter().zip(&y).map(|(x, y)| x - y).collect()
}

fn range(v: &[f64], digits: usize) -> String {
    let (lo, hi) = min_max(v);
    format!("{:.d$} ({:.d$}–{:.d$})", median(v), lo, hi, d = digits)
}

pub fn markdown(dp: &DataPath, setup: &Setup, machine: &str) -> String {
    let mut s = String::new();
    let _ = writeln!(s, "{machine}\n");
    if !dp.samples.is_empty() {
        let _ = writeln!(
            s,
            "### Data path: medians of {} rounds of {} s per mode and load\n",
            dp.rounds, dp.seconds
        );
        let _ = writeln!(
            s,
            "| load | mode | req/s | p50 µs | p99 µs | CPU µs/req | errors |"
        );
        let _ = writeln!(s, "|---|---|---:|---:|---:|---:|---:|");
        for load in LOADS {
            for mode in Mode::ALL {
                let rps = per_round(dp, mode, load.name, |s| s.wrk.rps);
                if rps.is_empty() {
                    continue;
                }
                let _ = writeln!(
                    s,
                    "| {} | {} | {:.0} | {:.0} | {:.0} | {:.1} | {:.0} |",
                    load.name,
                    mode.name(),
                    median(&rps),
                    median(&per_round(dp, mode, load.name, |s| s.wrk.p50_us)),
                    median(&per_round(dp, mode, load.name, |s| s.wrk.p99_us)),
                    median(&per_round(dp, mode, load.name, |s| s.cpu_us_per_req)),
                    per_round(dp, mode, load.name, |s| s.wrk.errors as f64)
                        .iter()
                        .sum::<f64>(),
                );
            }
        }
        let _ = writeln!(
            s,
            "\n### Same-run ratios of req/s: median (min–max over rounds)\n"
        );
        let pairs = [
            (Mode::Redirector, Mode::Iptables),
            (Mode::RedirectorDaemon, Mode::Iptables),
            (Mode::Redirector, Mode::Explicit),
            (Mode::RedirectorDaemon, Mode::Explicit),
            (Mode::Iptables, Mode::Explicit),
        ];
        let _ = write!(s, "| load |");
        for (a, b) in pairs {
            let _ = write!(s, " {} / {} |", a.name(), b.name());
        }
        let _ = writeln!(s, "\n|---|{}", "---:|".repeat(pairs.len()));
        for load in LOADS {
            let _ = write!(s, "| {} |", load.name);
            for (a, b) in pairs {
                let _ = write!(s, " {} |", range(&rps_ratio(dp, a, b, load.name), 2));
            }
            let _ = writeln!(s);
        }
        let _ = writeln!(
            s,
            "\n### CPU µs per request added over `explicit`: median (min–max over rounds)\n"
        );
        let _ = writeln!(s, "| load | iptables | redirector | redirector-daemon |");
        let _ = writeln!(s, "|---|---:|---:|---:|");
        for load in LOADS {
            let _ = writeln!(
                s,
                "| {} | {} | {} | {} |",
                load.name,
                range(&added_cpu(dp, Mode::Iptables, Mode::Explicit, load.name), 1),
                range(
                    &added_cpu(dp, Mode::Redirector, Mode::Explicit, load.name),
                    1
                ),
                range(
                    &added_cpu(dp, Mode::RedirectorDaemon, Mode::Explicit, load.name),
                    1
                ),
            );
        }
        if !dp.programs.is_empty() {
            let _ = writeln!(
                s,
                "\n### eBPF programs per new connection ({}, bpf_stats on, separate run)\n",
                LOADS[0].name
            );
            let _ = writeln!(s, "| mode | program | runs/req | ns/run | ns/req |");
            let _ = writeln!(s, "|---|---|---:|---:|---:|");
            for mode in [Mode::Redirector, Mode::RedirectorDaemon] {
                let mut total = 0.0;
                for p in dp.programs.iter().filter(|p| p.mode == mode) {
                    total += p.ns_per_req;
                    let _ = writeln!(
                        s,
                        "| {} | {} | {:.2} | {:.0} | {:.0} |",
                        mode.name(),
                        p.program,
                        p.runs_per_req,
                        p.ns_per_run,
                        p.ns_per_req
                    );
                }
                let _ = writeln!(s, "| {} | **all** | | | **{:.0}** |", mode.name(), total);
            }
        }
    }
    let one = &setup.one_pod;
    if !one.redirector_ms.is_empty() {
        let ipt = median(&one.iptables_restore_ms);
        let _ = writeln!(
            s,
            "\n### Per-pod setup, object loaded: wall time, median of {} fresh network namespaces\n",
            one.samples
        );
        let _ = writeln!(
            s,
            "| command (entering the pod's netns) | ms | / iptables-restore |"
        );
        let _ = writeln!(s, "|---|---:|---:|");
        for (name, v) in [
            (
                "`redirector istio-iptables` (standard injection)",
                &one.redirector_ms,
            ),
            (
                "`iptables-restore` of istio's rules",
                &one.iptables_restore_ms,
            ),
            (
                "`iptables-restore` + `ip6tables-restore`",
                &one.iptables_restore_v4_v6_ms,
            ),
            ("`nsenter true` (the floor)", &one.nsenter_true_ms),
            ("first pod on a node (loads the object)", &one.first_pod_ms),
        ] {
            let _ = writeln!(s, "| {name} | {:.2} | {:.2} |", median(v), median(v) / ipt);
        }
    }
    if !setup.sequences.is_empty() {
        let _ = writeln!(s, "\n### Pods in sequence\n");
        let _ = writeln!(
            s,
            "| mode | pods | total s | pod 10 ms | last 10 pods ms | kernel memory per additional pod |"
        );
        let _ = writeln!(s, "|---|---:|---:|---:|---:|---:|");
        for q in &setup.sequences {
            let n = q.per_pod_ms.len();
            let tenth = q.per_pod_ms.get(9).copied().unwrap_or(f64::NAN);
            let last = median(&q.per_pod_ms[n.saturating_sub(10)..]);
            let _ = writeln!(
                s,
                "| {} | {} | {:.2} | {:.2} | {:.2} | {} |",
                q.mode,
                q.pods,
                q.total_s,
                tenth,
                last,
                per_pod_kib(q)
            );
        }
    }
    if setup.object_memlock > 0 {
        let _ = writeln!(
            s,
            "\nObject: {:.1} MiB locked (maps and programs); largest maps: {}",
            setup.object_memlock as f64 / (1 << 20) as f64,
            setup
                .map_memlock
                .iter()
                .take(4)
                .map(|(m, b)| format!("{m} {:.1} MiB", *b as f64 / (1 << 20) as f64))
                .collect::<Vec<_>>()
                .join(", ")
        );
    }
    s
}

/// KiB per pod between the first and the last milestone.
pub fn per_pod_kib(q: &crate::setup::Sequence) -> String {
    match (q.kernel_bytes_after.first(), q.kernel_bytes_after.last()) {
        (Some((n0, b0)), Some((n1, b1))) if n1 > n0 => {
            format!("{:.2} KiB", (b1 - b0) as f64 / (n1 - n0) as f64 / 1024.0)
        }
        _ => "-".into(),
    }
}
