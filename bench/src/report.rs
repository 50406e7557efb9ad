//! The Markdown report: medians, same-run ratios with their per-round range, and the
//! targets redirector is held to.

use std::fmt::Write as _;

use crate::datapath::{DataPath, Mode, ProgramCost};
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
/// The programs profiled for `mode`, with the sidecar answering itself or forwarding.
fn programs_of(dp: &DataPath, mode: Mode, answers: bool) -> Vec<&ProgramCost> {
    dp.programs
        .iter()
        .filter(|p| p.mode == mode && p.proxy_answers == answers)
        .collect()
}

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

/// Whether this run measured `mode` (`--modes` may leave modes out).
fn ran(dp: &DataPath, mode: Mode) -> bool {
    dp.samples.iter().any(|s| s.mode == mode)
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
            (Mode::RedirectorTraced, Mode::Redirector),
            (Mode::RedirectorFallbacks, Mode::Redirector),
            (Mode::RedirectorLinkerd, Mode::Explicit),
            (Mode::Bystander, Mode::Direct),
            (Mode::AmbientRedirector, Mode::AmbientIptables),
        ];
        let pairs: Vec<_> = pairs
            .into_iter()
            .filter(|(a, b)| ran(dp, *a) && ran(dp, *b))
            .collect();
        let _ = write!(s, "| load |");
        for (a, b) in &pairs {
            let _ = write!(s, " {} / {} |", a.name(), b.name());
        }
        let _ = writeln!(s, "\n|---|{}", "---:|".repeat(pairs.len()));
        for load in LOADS {
            let _ = write!(s, "| {} |", load.name);
            for (a, b) in &pairs {
                let _ = write!(s, " {} |", range(&rps_ratio(dp, *a, *b, load.name), 2));
            }
            let _ = writeln!(s);
        }
        let _ = writeln!(
            s,
            "\n### CPU µs per request added over `explicit`: median (min–max over rounds)\n"
        );
        let added = [
            Mode::Iptables,
            Mode::Redirector,
            Mode::RedirectorDaemon,
            Mode::RedirectorTraced,
            Mode::RedirectorFallbacks,
            Mode::RedirectorLinkerd,
        ];
        let added: Vec<_> = added
            .into_iter()
            .filter(|m| ran(dp, *m) && ran(dp, Mode::Explicit))
            .collect();
        let _ = write!(s, "| load |");
        for mode in &added {
            let _ = write!(s, " {} |", mode.name());
        }
        let _ = writeln!(s, "\n|---|{}", "---:|".repeat(added.len()));
        for load in LOADS {
            let _ = write!(s, "| {} |", load.name);
            for mode in &added {
                let _ = write!(
                    s,
                    " {} |",
                    range(&added_cpu(dp, *mode, Mode::Explicit, load.name), 1)
                );
            }
            let _ = writeln!(s);
        }
        if !dp.programs.is_empty() {
            let _ = writeln!(
                s,
                "\n### eBPF programs per new connection ({}, bpf_stats on, separate run)\n",
                LOADS[0].name
            );
            let _ = writeln!(
                s,
                "The sidecar forwards each request to the service, or answers it itself (no upstream connection).\n"
            );
            let _ = writeln!(
                s,
                "| mode | sidecar | program | runs/req | ns/run | ns/req |"
            );
            let _ = writeln!(s, "|---|---|---|---:|---:|---:|");
            for mode in [
                Mode::Redirector,
                Mode::RedirectorDaemon,
                Mode::RedirectorTraced,
                Mode::RedirectorFallbacks,
                Mode::RedirectorLinkerd,
                Mode::Bystander,
            ]
            .into_iter()
            .filter(|m| ran(dp, *m))
            {
                for answers in [false, true] {
                    let programs = programs_of(dp, mode, answers);
                    if programs.is_empty() {
                        continue;
                    }
                    let sidecar = if answers { "answers" } else { "forwards" };
                    for p in &programs {
                        let _ = writeln!(
                            s,
                            "| {} | {sidecar} | {} | {:.2} | {:.0} | {:.0} |",
                            mode.name(),
                            p.program,
                            p.runs_per_req,
                            p.ns_per_run,
                            p.ns_per_req
                        );
                    }
                    let total: f64 = programs.iter().map(|p| p.ns_per_req).sum();
                    let _ = writeln!(
                        s,
                        "| {} | {sidecar} | **all** | | | **{total:.0}** |",
                        mode.name()
                    );
                }
            }
        }
        if dp.profiled.contains(&Mode::Bystander) {
            let _ = writeln!(
                s,
                "\n### eBPF programs per UDP request/response of a pod not captured (`daemon-bystander`, DNS over an unconnected socket)\n"
            );
            if dp.udp_programs.is_empty() {
                let _ = writeln!(s, "None ran.");
            } else {
                let _ = writeln!(
                    s,
                    "Each exchange is one `dnsprobe query` process, so a run finds cold caches: the runs are the figure, the time an upper bound.\n"
                );
                let _ = writeln!(s, "| program | runs/exchange | ns/run | ns/exchange |");
                let _ = writeln!(s, "|---|---:|---:|---:|");
                for p in &dp.udp_programs {
                    let _ = writeln!(
                        s,
                        "| {} | {:.2} | {:.0} | {:.0} |",
                        p.program, p.runs_per_req, p.ns_per_run, p.ns_per_req
                    );
                }
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
            (
                "`nsenter true` (an init container's floor)",
                &one.nsenter_true_ms,
            ),
            (
                "`true` (one process: the floor of `pod add`, CNI ADD)",
                &one.true_ms,
            ),
            ("first pod on a node (loads the object)", &one.first_pod_ms),
        ] {
            let _ = writeln!(s, "| {name} | {:.2} | {:.2} |", median(v), median(v) / ipt);
        }
    }
    let ambient = &setup.ambient;
    if !ambient.redirector_ms.is_empty() {
        let reference = median(&ambient.istio_cni_ms);
        let _ = writeln!(
            s,
            "\n### Enrolling an ambient pod, the stand-in ztunnel's ack included: median of {}\n",
            ambient.samples
        );
        let _ = writeln!(s, "| way | ms | / istio-cni's way |");
        let _ = writeln!(s, "|---|---:|---:|");
        for (name, v) in [
            (
                "istio-cni's: `iptables-restore` + `ip6tables-restore` of its in-pod rules, the policy route, ZDS add",
                &ambient.istio_cni_ms,
            ),
            (
                "… of which its rules and the route (the rest: the ZDS add and ztunnel's ack)",
                &ambient.istio_cni_rules_ms,
            ),
            (
                "`redirector pod add --dialect ambient` (through the daemon)",
                &ambient.redirector_ms,
            ),
        ] {
            let _ = writeln!(
                s,
                "| {name} | {:.2} | {:.2} |",
                median(v),
                median(v) / reference
            );
        }
    }
    if !setup.sequences.is_empty() {
        let _ = writeln!(s, "\n### Pods in sequence\n");
        let _ = writeln!(
            s,
            "| mode | pods | total s | pods 6–15 ms | last 10 pods ms | kernel memory per additional pod | all removed again, s |"
        );
        let _ = writeln!(s, "|---|---:|---:|---:|---:|---:|---:|");
        for q in &setup.sequences {
            let (early, last) = early_and_late(q);
            let _ = writeln!(
                s,
                "| {} | {} | {:.2} | {:.2} | {:.2} | {} | {} |",
                q.mode,
                q.pods,
                q.total_s,
                early,
                last,
                per_pod_kib(q),
                q.removal_s.map_or("–".into(), |s| format!("{s:.2}"))
            );
        }
    }
    if let Some(scrapes) = &setup.scrapes {
        let _ = writeln!(
            s,
            "\n### Pod adds under `/metrics` scrapes\n\n{} pods added through the API (onto as \
             many resident), alone and then under waves of {} concurrent scrapes every {} ms, \
             rounds in turn. Each round's median add, ms:\n",
            scrapes.pods, scrapes.scrapers, scrapes.tick_ms
        );
        let _ = writeln!(
            s,
            "| round | alone | under scrapes | ratio | scrapes, snapshots |"
        );
        let _ = writeln!(s, "|---:|---:|---:|---:|---:|");
        for (i, ((a, b), (n, snaps))) in (scrapes.alone_ms.iter().zip(&scrapes.scraped_ms))
            .zip(&scrapes.scrapes)
            .enumerate()
        {
            let _ = writeln!(
                s,
                "| {} | {a:.2} | {b:.2} | {:.2}× | {n}, {snaps} |",
                i + 1,
                b / a
            );
        }
    }
    let churn = &setup.churn;
    if !churn.per_pod_ms.is_empty() {
        let (steady, last) = churn.steady_and_last();
        let _ = writeln!(
            s,
            "\n### Churn: {} init-container pods deleted without a cleanup, {} alive at a time\n",
            churn.pods, churn.alive
        );
        let most = churn.installed_every_100.iter().max().copied().unwrap_or(0);
        let _ = writeln!(
            s,
            "Setup {steady:.2} ms (pods {}–{}, the first set up while pods are deleted, median) \
             and {last:.2} ms (last 10): {:.2}×. Pods installed every 100 deletions: at most {most}.\n",
            churn.steady_start() + 1,
            churn.steady_start() + 10,
            last / steady
        );
        let _ = writeln!(
            s,
            "| after the last pod | left | then after `redirector gc` |"
        );
        let _ = writeln!(s, "|---|---:|---:|");
        let _ = writeln!(
            s,
            "| pods installed | {} | {} |",
            churn.installed_after, churn.installed_needed
        );
        let _ = writeln!(
            s,
            "| files pinned | {} | {} |",
            churn.pins_after, churn.pins_needed
        );
        for (map, entries) in &churn.map_fill_after {
            let needed = (churn.map_fill_needed.iter())
                .find_map(|(m, n)| (m == map).then_some(*n))
                .unwrap_or(0);
            let _ = writeln!(s, "| {map} entries | {entries} | {needed} |");
        }
    }
    if let Some(scale) = &setup.scale {
        let pods = scale.adds.pods;
        let _ = writeln!(
            s,
            "\n### Scale: {pods} pods through the daemon's API, one connection\n"
        );
        let _ = writeln!(s, "| pods on the node | add, ms | removal, ms |");
        let _ = writeln!(s, "|---:|---:|---:|");
        let mut rows: Vec<usize> = [10, 100, 1000, 4096, pods]
            .into_iter()
            .filter(|n| *n <= pods)
            .collect();
        rows.dedup();
        for n in rows {
            let _ = writeln!(
                s,
                "| {n} | {:.3} | {:.3} |",
                scale.add_ms_at(n),
                scale.removal_ms_with(n)
            );
        }
        let (before, after) = scale.daemon_rss_kib;
        let _ = writeln!(
            s,
            "\nAll added in {:.2} s, all removed in {:.2} s. Kernel memory per pod {}; \
             daemon memory per pod {:.2} KiB ({before} KiB resident before, {after} KiB after).\n",
            scale.adds.total_s,
            scale.adds.removal_s.unwrap_or(f64::NAN),
            per_pod_kib(&scale.adds),
            daemon_kib_per_pod(scale)
        );
        let _ = writeln!(
            s,
            "| `redirector_request_seconds` | p50 ms | p90 ms | p99 ms | requests |"
        );
        let _ = writeln!(s, "|---|---:|---:|---:|---:|");
        for (op, [p50, p90, p99], n) in &scale.request_ms {
            let _ = writeln!(s, "| {op} | {p50:.3} | {p90:.3} | {p99:.3} | {n} |");
        }
        let fill = scale
            .map_fill
            .iter()
            .filter(|(_, n)| *n > 0)
            .map(|(m, n)| format!("{m} {n}"))
            .collect::<Vec<_>>()
            .join(", ");
        let _ = writeln!(s, "\nMap entries with every pod installed: {fill}.");
        if scale.object_memlock > 0 {
            let largest: Vec<String> = scale
                .map_memlock
                .iter()
                .take(6)
                .map(|(m, b)| format!("{m} {:.0} KiB", *b as f64 / 1024.0))
                .collect();
            let _ = writeln!(
                s,
                "\nObject sized for {pods} pods (`--max-pods {pods}`): {:.2} MiB locked; largest maps: {}.",
                scale.object_memlock as f64 / (1 << 20) as f64,
                largest.join(", ")
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

/// The targets redirector is held to, each with what this run measured.
/// "6.00 runs, 284 ns" per request of `programs`; "0 runs" with none.
fn runs_and_time(programs: &[&ProgramCost]) -> String {
    if programs.is_empty() {
        return "0 runs".into();
    }
    let runs: f64 = programs.iter().map(|p| p.runs_per_req).sum();
    let ns: f64 = programs.iter().map(|p| p.ns_per_req).sum();
    format!("{runs:.2} runs, {ns:.0} ns")
}

pub fn targets(dp: &DataPath, setup: &Setup) -> String {
    let mut rows: Vec<(String, String, Option<bool>)> = Vec::new();
    let mut row = |target: &str, measured: String, met: Option<bool>| {
        rows.push((target.to_string(), measured, met))
    };
    let new_conn = ["new-conn-8", "new-conn-64"];
    let against = [Mode::Explicit, Mode::Iptables];
    if against.iter().all(|m| ran(dp, *m)) {
        for mode in [
            Mode::Redirector,
            Mode::RedirectorDaemon,
            Mode::RedirectorLinkerd,
        ]
        .into_iter()
        .filter(|m| ran(dp, *m))
        {
            let added: Vec<f64> = new_conn
                .iter()
                .map(|l| median(&added_cpu(dp, mode, Mode::Explicit, l)))
                .collect();
            row(
                &format!(
                    "{}: added CPU per new connection over `explicit` ≤ 2 µs",
                    mode.name()
                ),
                format!("{:.1} / {:.1} µs (8 / 64 conc.)", added[0], added[1]),
                Some(added.iter().all(|a| *a <= 2.0)),
            );
            // The floor: a client dialling its proxy itself. No redirection beats it, so
            // the target is the floor, not a multiple of iptables.
            let ratio: Vec<f64> = new_conn
                .iter()
                .map(|l| median(&rps_ratio(dp, mode, Mode::Explicit, l)))
                .collect();
            row(
                &format!(
                    "{}: new connections/s ≥ 0.99× `explicit` (the floor)",
                    mode.name()
                ),
                format!("{:.2}× / {:.2}× (8 / 64 conc.)", ratio[0], ratio[1]),
                Some(ratio.iter().all(|r| *r >= 0.99)),
            );
            for (answers, limit_us, what) in [
                (false, 2.5, "eBPF time per new connection"),
                (
                    true,
                    1.5,
                    "eBPF time per new connection, the sidecar answering itself",
                ),
            ] {
                let programs = programs_of(dp, mode, answers);
                if !programs.is_empty() {
                    let us = programs.iter().map(|p| p.ns_per_req).sum::<f64>() / 1e3;
                    row(
                        &format!("{}: {what} ≤ {limit_us} µs", mode.name()),
                        format!("{us:.2} µs"),
                        Some(us <= limit_us),
                    );
                }
            }
            let ka = rps_ratio(dp, mode, Mode::Explicit, "keepalive-8");
            let (lo, hi) = min_max(&ka);
            row(
                &format!("{}: keep-alive req/s = `explicit` (≥ 0.97×)", mode.name()),
                format!("{:.2}× ({lo:.2}–{hi:.2})", median(&ka)),
                Some(median(&ka) >= 0.97),
            );
        }
    }
    // What an old kernel costs: the same work with every fallback forced, beside the
    // normal programs' time.
    let ebpf_us = |mode| {
        let programs = programs_of(dp, mode, false);
        (!programs.is_empty()).then(|| programs.iter().map(|p| p.ns_per_req).sum::<f64>() / 1e3)
    };
    if let (Some(forced), Some(normal)) = (
        ebpf_us(Mode::RedirectorFallbacks),
        ebpf_us(Mode::Redirector),
    ) {
        row(
            "redirector-fallbacks (every kernel fallback forced): eBPF time per new connection ≤ 2.5 µs",
            format!("{forced:.2} µs (redirector: {normal:.2} µs)"),
            Some(forced <= 2.5),
        );
    }
    if ran(dp, Mode::Bystander) && ran(dp, Mode::Direct) {
        // A pod the daemon does not capture, against the same pod with nothing attached.
        let ratio: Vec<f64> = new_conn
            .iter()
            .map(|l| median(&rps_ratio(dp, Mode::Bystander, Mode::Direct, l)))
            .collect();
        row(
            "a pod on a daemon node not captured: new connections/s ≥ 0.99× `direct`",
            format!("{:.2}× / {:.2}× (8 / 64 conc.)", ratio[0], ratio[1]),
            Some(ratio.iter().all(|r| *r >= 0.99)),
        );
    }
    if dp.profiled.contains(&Mode::Bystander) {
        let programs = programs_of(dp, Mode::Bystander, false);
        row(
            "a pod on a daemon node not captured: 0 eBPF runs per new connection",
            runs_and_time(&programs),
            Some(programs.is_empty()),
        );
    }
    if dp.profiled.contains(&Mode::Bystander) {
        let programs: Vec<&ProgramCost> = dp.udp_programs.iter().collect();
        row(
            "a pod on a daemon node not captured: 0 eBPF runs per UDP request/response",
            runs_and_time(&programs),
            Some(programs.is_empty()),
        );
    }
    let one = &setup.one_pod;
    if !one.redirector_ms.is_empty() {
        let ipt = median(&one.iptables_restore_ms);
        let r = median(&one.redirector_ms) / ipt;
        row(
            "per-pod setup, init container ≤ 1.0× `iptables-restore`",
            format!("{r:.2}×"),
            Some(r <= 1.0),
        );
        let floor = median(&one.true_ms);
        for q in setup
            .sequences
            .iter()
            .filter(|q| q.mode.starts_with("daemon"))
        {
            let took = median(&q.per_pod_ms);
            if q.starts_a_process() {
                // No process starts faster than the floor: a process's own work is what it
                // takes beyond it.
                let over = took - floor;
                let reading = Reading::of(over, over >= 0.0);
                row(
                    &format!("per-pod setup, {}: ≤ 1 ms over `true`", q.mode),
                    reading
                        .show(|ms| format!("{ms:.2} ms over ({took:.2} ms, floor {floor:.2} ms)")),
                    reading.met(|ms| ms <= 1.0),
                );
            } else {
                let r = took / ipt;
                row(
                    &format!("per-pod setup, {} ≤ 0.25× `iptables-restore`", q.mode),
                    format!("{r:.2}×"),
                    Some(r <= 0.25),
                );
            }
        }
        let first = median(&one.first_pod_ms);
        row(
            "first pod on a node (object load) ≤ 100 ms",
            format!("{first:.0} ms"),
            Some(first <= 100.0),
        );
    }
    for q in &setup.sequences {
        if q.mode.starts_with("daemon: API") && q.pods >= 1000 {
            row(
                "1,000 pods through the daemon in under 1 s",
                format!("{:.2} s", q.total_s),
                Some(q.total_s < 1.0),
            );
        }
        if q.mode == "init-container" && q.per_pod_ms.len() >= 20 {
            let (early, late) = early_and_late(q);
            let r = late / early;
            row(
                &format!("pod {} as fast as pod 10 (init container)", q.pods),
                format!("{r:.2}×"),
                Some(r <= 1.15),
            );
        }
        if let Some(reading) = kib_per_pod(q) {
            // An init-container pod pins its own links; a daemon pod has only entries.
            let most = if q.mode == "init-container" { 4.0 } else { 2.0 };
            row(
                &format!("kernel memory per additional pod ≤ {most} KiB ({})", q.mode),
                reading.show(|kib| format!("{kib:.2} KiB")),
                reading.met(|kib| kib <= most),
            );
        }
    }
    if let Some(scrapes) = &setup.scrapes {
        let ratios = scrapes.ratios();
        row(
            &format!(
                "pod adds under {} concurrent scrapes ≤ 1.1× the same adds alone (medians over rounds)",
                scrapes.scrapers
            ),
            scrapes.show(),
            (!ratios.is_empty()).then(|| median(&ratios) <= 1.1),
        );
    }
    if let Some(scale) = &setup.scale {
        let pods = scale.adds.pods;
        let r = scale.removal_ms_with(pods) / scale.removal_ms_with(10);
        row(
            &format!("removal with {pods} pods on the node as fast as with 10 (≤ 1.15×)"),
            format!(
                "{r:.2}× ({:.3} ms / {:.3} ms)",
                scale.removal_ms_with(pods),
                scale.removal_ms_with(10)
            ),
            Some(r <= 1.15),
        );
        let r = scale.add_ms_at(pods) / scale.add_ms_at(10);
        row(
            &format!("add of pod {pods} as fast as pod 10 (≤ 1.15×)"),
            format!("{r:.2}×"),
            Some(r <= 1.15),
        );
        let daemon = daemon_kib_per_pod(scale);
        let reading = Reading::of(daemon, daemon >= 0.0);
        row(
            &format!("daemon memory per pod ≤ 2 KiB ({pods} pods)"),
            reading.show(|kib| format!("{kib:.2} KiB")),
            reading.met(|kib| kib <= 2.0),
        );
        if let Some(reading) = kib_per_pod(&scale.adds) {
            row(
                &format!("kernel memory per additional pod ≤ 2 KiB ({pods} pods, API)"),
                reading.show(|kib| format!("{kib:.2} KiB")),
                reading.met(|kib| kib <= 2.0),
            );
        }
    }
    let churn = &setup.churn;
    if churn.per_pod_ms.len() >= churn.steady_start() + 20 {
        let (steady, last) = churn.steady_and_last();
        let r = last / steady;
        row(
            &format!(
                "churn of {} pods: last 10 set up within 1.1× of pods {}–{}",
                churn.pods,
                churn.steady_start() + 1,
                churn.steady_start() + 10
            ),
            format!("{r:.2}×"),
            Some(r <= 1.1),
        );
        let gone = churn.installed_after.saturating_sub(churn.installed_needed);
        row(
            &format!(
                "churn of {} pods: pods gone but installed ≤ {}",
                churn.pods,
                2 * churn.alive
            ),
            format!(
                "{gone} ({} pins more)",
                churn.pins_after.saturating_sub(churn.pins_needed)
            ),
            Some(gone <= 2 * churn.alive as u64),
        );
    }
    if setup.object_memlock > 0 {
        let mib = setup.object_memlock as f64 / (1 << 20) as f64;
        row(
            "object ≤ 8 MiB locked",
            format!("{mib:.1} MiB"),
            Some(mib <= 8.0),
        );
    }
    let mut s = String::from("### Targets\n\n| target | measured | met |\n|---|---|---|\n");
    for (t, m, met) in rows {
        let met = match met {
            Some(true) => "yes",
            Some(false) => "**no**",
            None => "not measured",
        };
        let _ = writeln!(s, "| {t} | {m} | {met} |");
    }
    s
}

/// A measured figure, or one no run can produce (less memory with more pods, less time
/// than the floor): a failed measurement, shown as such and never judged.
#[derive(Clone, Copy, Debug)]
pub enum Reading {
    Valid(f64),
    Invalid(f64),
}

impl Reading {
    pub fn of(value: f64, possible: bool) -> Self {
        if possible && value.is_finite() {
            Reading::Valid(value)
        } else {
            Reading::Invalid(value)
        }
    }

    pub fn show(self, format: impl Fn(f64) -> String) -> String {
        match self {
            Reading::Valid(v) => format(v),
            Reading::Invalid(v) => format!("invalid reading ({}): not measured", format(v)),
        }
    }

    /// Whether the target is met; `None` (not measured) for an invalid reading.
    pub fn met(self, target: impl Fn(f64) -> bool) -> Option<bool> {
        match self {
            Reading::Valid(v) => Some(target(v)),
            Reading::Invalid(_) => None,
        }
    }
}

/// Kernel memory per pod, in KiB, between the first and the last milestone: below zero
/// is invalid (the kernel freed something else meanwhile).
pub fn kib_per_pod(q: &crate::sequence::Sequence) -> Option<Reading> {
    match (q.kernel_bytes_after.first(), q.kernel_bytes_after.last()) {
        (Some((n0, b0)), Some((n1, b1))) if n1 > n0 => {
            let kib = (b1 - b0) as f64 / (n1 - n0) as f64 / 1024.0;
            Some(Reading::of(kib, kib >= 0.0))
        }
        _ => None,
    }
}

/// The daemon's resident memory per pod over a scale run, KiB.
fn daemon_kib_per_pod(scale: &crate::scale::Scale) -> f64 {
    let (before, after) = scale.daemon_rss_kib;
    (after as f64 - before as f64) / scale.adds.pods.max(1) as f64
}

/// [`kib_per_pod`] for the table.
pub fn per_pod_kib(q: &crate::sequence::Sequence) -> String {
    kib_per_pod(q).map_or("-".into(), |r| r.show(|kib| format!("{kib:.2} KiB")))
}

/// Medians of a sequence's pods 6–15 and of its last 10 pods: one pod's time alone is
/// too noisy to compare.
fn early_and_late(q: &crate::sequence::Sequence) -> (f64, f64) {
    let n = q.per_pod_ms.len();
    (
        median(&q.per_pod_ms[n.min(5)..n.min(15)]),
        median(&q.per_pod_ms[n.saturating_sub(10)..]),
    )
}
