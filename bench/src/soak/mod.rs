//! `bench soak`: a daemon node under pod churn for a given time or number of pods, with
//! what the daemon holds measured every minute and a verdict at the end. Run by
//! `cargo xtask soak`.
//!
//! Pods are made as kubelet makes them — a network namespace, a cgroup `pod<uid>` below the
//! node cgroup — and 50 are alive at a time, each deleted after a short life. Most come
//! through the chained CNI plugin (`K8S_POD_UID`, the daemon's `stateDir` and `pinRoot`),
//! one in ten of those deleted with no CNI DEL (a node that lost a DEL: the daemon's
//! collection removes it); one pod in ten comes through the daemon's API, one in twenty
//! is an init container's (`redirector istio-iptables`), deleted without a cleanup. `/metrics` is
//! scraped every 2 s, and a long-lived meshed pod's capture is checked every 5 s.

mod process;
mod report;

use std::collections::VecDeque;
use std::os::unix::net::UnixStream;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use redirector_tests::cgroup::Cgroup;
use redirector_tests::daemon::{ask, http_get, Daemon, StateDir};
use redirector_tests::redirector::{
    istio_iptables_command, pins_under, PinRoot, STANDARD_INJECTION,
};
use redirector_tests::test_node::{CniCaller, CniPod};
use redirector_tests::{use_probe_bin, ConnOutcome, NetNs, ProxiedPod, APP_UID};

use report::{Bounds, Minute};

/// Pods alive at a time.
const ALIVE: usize = 50;
/// How often `/metrics` is scraped, and the live pod's capture checked.
const SCRAPE_EVERY: Duration = Duration::from_secs(2);
const CHECK_EVERY: Duration = Duration::from_secs(5);

pub struct Options {
    pub minutes: Option<f64>,
    pub pods: Option<usize>,
    pub bounds: Bounds,
    /// Where the table is written, after every minute and at the end.
    pub table: Option<PathBuf>,
}

const USAGE: &str = "usage: bench soak [--minutes N] [--pods N] [--warmup-pods N] [--max-rss-growth-kib N] [--table PATH]";

pub fn parse_args(mut args: impl Iterator<Item = String>) -> Result<Options, String> {
    let mut o = Options {
        minutes: None,
        pods: None,
        bounds: Bounds {
            warmup_pods: 10_000,
            max_rss_growth_kib: 1024,
        },
        table: None,
    };
    fn value<T: std::str::FromStr>(flag: &str, v: Option<String>) -> Result<T, String> {
        let v = v.ok_or(format!("{flag} needs a value"))?;
        v.parse().map_err(|_| format!("{flag} {v}: not a number"))
    }
    while let Some(a) = args.next() {
        match a.as_str() {
            "--minutes" => o.minutes = Some(value(&a, args.next())?),
            "--pods" => o.pods = Some(value(&a, args.next())?),
            "--warmup-pods" => o.bounds.warmup_pods = value(&a, args.next())?,
            "--max-rss-growth-kib" => o.bounds.max_rss_growth_kib = value(&a, args.next())?,
            "--table" => o.table = Some(args.next().ok_or("--table needs a path")?.into()),
            other => return Err(format!("unknown argument {other}\n{USAGE}")),
        }
    }
    if o.minutes.is_none() && o.pods.is_none() {
        o.minutes = Some(3.0);
    }
    Ok(o)
}

/// Set by SIGINT or SIGTERM: the churn stops, the verdict is given on what ran, and every
/// guard cleans up.
static STOP: AtomicBool = AtomicBool::new(false);

extern "C" fn on_signal(_: libc::c_int) {
    STOP.store(true, Ordering::SeqCst);
}

fn stop_on_signals() {
    let handler = on_signal as extern "C" fn(libc::c_int) as libc::sighandler_t;
    // SAFETY: the handler only stores to an atomic, which is async-signal-safe.
    unsafe {
        libc::signal(libc::SIGINT, handler);
        libc::signal(libc::SIGTERM, handler);
    }
}

/// How a churn pod came in, and what deleting it takes.
enum Pod {
    /// Through the CNI plugin; `del`: whether its DEL comes.
    Cni {
        pod: CniPod,
        del: bool,
        netns: NetNs,
        cgroup: Cgroup,
    },
    /// Through the API, removed by name.
    Api {
        name: String,
        netns: NetNs,
        cgroup: Cgroup,
    },
    /// By an init container; deleted without a cleanup.
    Init { netns: NetNs, cgroup: Cgroup },
}

/// What the churn counts from the start, and this minute's CNI ADD times.
#[derive(Default)]
struct Counts {
    pods: usize,
    failed_adds: usize,
    failed_dels: usize,
    checks: usize,
    failed_checks: usize,
    add_ms: Vec<f64>,
}

impl Counts {
    fn failed(&mut self, what: &str, err: &str) {
        if self.failed_adds + self.failed_dels < 20 {
            eprintln!("soak: {what} failed: {err}");
        }
    }
}

/// The node: the daemon, its pins and state, the plugin configured for it. Dropped in
/// this order: the daemon stops before its state directory is unmounted and its pins go.
struct Node {
    api: UnixStream,
    daemon: Daemon,
    cni: CniCaller,
    /// Its records (a tmpfs of its own).
    _state: StateDir,
    cgroup: Cgroup,
    root: PinRoot,
}

impl Node {
    fn start() -> Node {
        let root = PinRoot::new("soak");
        let cgroup = Cgroup::new("soaknode");
        let state = StateDir::on_tmpfs("soakstate");
        let daemon = Daemon::start_with(&root, &cgroup, &state, &["--metrics-addr", "127.0.0.1:0"]);
        let cni = CniCaller::new(&root, &state, daemon.socket());
        let api = daemon.connect();
        Node {
            root,
            cgroup,
            _state: state,
            daemon,
            cni,
            api,
        }
    }

    fn api(&mut self, request: serde_json::Value) -> Result<(), String> {
        let answer = ask(&mut self.api, &request.to_string());
        match answer["ok"].as_bool() {
            Some(true) => Ok(()),
            _ => Err(format!("{request}: {answer}")),
        }
    }

    /// Pod `n` set up, the way its number says.
    fn add(&mut self, n: usize, counts: &mut Counts) -> Option<Pod> {
        let netns = NetNs::new("soak");
        let result = if n % 20 == 4 {
            let cgroup = Cgroup::under(&self.cgroup, "soakinit");
            let out = istio_iptables_command(&netns, &cgroup, &self.root)
                .args(STANDARD_INJECTION)
                .output()
                .map_err(|e| format!("running istio-iptables: {e}"));
            match out {
                Ok(out) if out.status.success() => Ok(Pod::Init { netns, cgroup }),
                Ok(out) => Err(format!(
                    "istio-iptables: {}",
                    String::from_utf8_lossy(&out.stderr)
                )),
                Err(err) => Err(err),
            }
        } else if n % 10 == 9 {
            let cgroup = Cgroup::pod_under(&self.cgroup);
            let name = format!("soak/api{n}");
            self.api(serde_json::json!({
                "op": "add", "netns": netns.path(), "name": name,
                "args": STANDARD_INJECTION, "cgroup": cgroup.path(),
            }))
            .map(|()| Pod::Api {
                name,
                netns,
                cgroup,
            })
        } else {
            let pod = CniPod::numbered("soak", n, netns.path());
            let cgroup = Cgroup::named_under(&self.cgroup, &pod.cgroup_name());
            self.cni.call("ADD", &pod).map(|took| {
                counts.add_ms.push(took.as_secs_f64() * 1e3);
                Pod::Cni {
                    pod,
                    del: n % 10 != 3,
                    netns,
                    cgroup,
                }
            })
        };
        counts.pods += 1;
        match result {
            Ok(pod) => Some(pod),
            Err(err) => {
                counts.failed(&format!("add of pod {n}"), &err);
                counts.failed_adds += 1;
                None
            }
        }
    }

    /// A pod deleted as its kind is: DEL or API removal first, then its namespace and cgroup.
    fn delete(&mut self, pod: Pod, counts: &mut Counts) {
        let removed = match &pod {
            Pod::Cni { pod, del: true, .. } => self.cni.call("DEL", pod).map(drop),
            Pod::Api { name, .. } => self.api(serde_json::json!({"op": "del", "name": name})),
            Pod::Cni { del: false, .. } | Pod::Init { .. } => Ok(()),
        };
        if let Err(err) = removed {
            counts.failed("a deletion", &err);
            counts.failed_dels += 1;
        }
        let (Pod::Cni { netns, cgroup, .. }
        | Pod::Api { netns, cgroup, .. }
        | Pod::Init { netns, cgroup }) = pod;
        drop(netns);
        drop(cgroup);
    }
}

/// `/metrics` scraped every [`SCRAPE_EVERY`] until `stop`; failures counted.
fn scrape_until(addr: String, stop: Arc<AtomicBool>, failed: Arc<AtomicUsize>) {
    while !stop.load(Ordering::SeqCst) {
        match http_get(&addr, "/metrics") {
            Ok((200, _)) => {}
            _ => {
                failed.fetch_add(1, Ordering::SeqCst);
            }
        }
        std::thread::sleep(SCRAPE_EVERY);
    }
}

/// The config maps' entries (the connection maps left out: they move with traffic) and
/// POD_CONFIG's, from a `/metrics` text.
fn map_entries(metrics: &str) -> (u64, u64) {
    let (mut all, mut pod_configs) = (0, 0);
    for line in metrics.lines() {
        let Some(rest) = line.strip_prefix("redirector_map_entries{") else {
            continue;
        };
        let Some((labels, value)) = rest.split_once("} ") else {
            continue;
        };
        let Some(map) = labels
            .split(',')
            .find_map(|l| l.trim().strip_prefix("map=\""))
            .map(|m| m.trim_end_matches('"'))
        else {
            continue;
        };
        let n: u64 = value.trim().parse().unwrap_or(0);
        if map.starts_with("ORIG_DST") || map.starts_with("DNS_ORIG") {
            continue;
        }
        all += n;
        if map == "POD_CONFIG" {
            pod_configs = n;
        }
    }
    (all, pod_configs)
}

/// Whether the live pod's app is still captured: its connection reaches the proxy with
/// the service as its original destination.
fn captured(live: &ProxiedPod) -> Result<(), String> {
    let dst = live.service(false);
    match live.connect(APP_UID, APP_UID, dst) {
        ConnOutcome::Proxied { orig, .. } if orig == Some(dst) => Ok(()),
        other => Err(format!("{dst}: {other:?}")),
    }
}

pub fn run(opts: &Options) -> bool {
    stop_on_signals();
    for left in redirector_tests::remove_stale_leftovers() {
        eprintln!("soak: removed a leftover of an earlier run: {left}");
    }
    use_probe_bin(redirector_tests::probe_bin());
    let mut node = Node::start();
    let live = ProxiedPod::under(&node.cgroup, "soaklive");
    node.api(serde_json::json!({
        "op": "add", "netns": live.topo.pod.path(), "name": "soak/live",
        "args": STANDARD_INJECTION, "cgroup": live.topo.pod_cgroup.path(),
    }))
    .unwrap_or_else(|e| panic!("the live pod: {e}"));
    captured(&live).unwrap_or_else(|e| panic!("the live pod is not captured: {e}"));

    let stop_scrapes = Arc::new(AtomicBool::new(false));
    let failed_scrapes = Arc::new(AtomicUsize::new(0));
    let scraper = {
        let (addr, stop, failed) = (
            node.daemon.metrics_addr(),
            Arc::clone(&stop_scrapes),
            Arc::clone(&failed_scrapes),
        );
        std::thread::spawn(move || scrape_until(addr, stop, failed))
    };
    let deadline = opts.minutes.map(|m| Duration::from_secs_f64(m * 60.0));
    eprintln!(
        "soak: daemon pid {}, {ALIVE} pods alive at a time, until {}",
        node.daemon.pid(),
        match (deadline, opts.pods) {
            (Some(d), Some(p)) => format!("{:.1} minutes or {p} pods", d.as_secs_f64() / 60.0),
            (Some(d), None) => format!("{:.1} minutes", d.as_secs_f64() / 60.0),
            (None, Some(p)) => format!("{p} pods"),
            (None, None) => unreachable!("parse_args sets one"),
        }
    );
    eprintln!("{}", report::HEADER);
    let mut counts = Counts::default();
    let mut alive: VecDeque<Pod> = VecDeque::with_capacity(ALIVE + 1);
    let mut rows: Vec<Minute> = Vec::new();
    let started = Instant::now();
    let mut last_check = Instant::now();
    let mut next_minute = 1u32;
    let sample = |node: &Node, counts: &mut Counts, minute: f64| -> Minute {
        let held =
            process::Held::of(node.daemon.pid()).unwrap_or_else(|e| panic!("the daemon: {e}"));
        let (entries, pod_configs) = http_get(&node.daemon.metrics_addr(), "/metrics")
            .map(|(_, text)| map_entries(&text))
            .unwrap_or_default();
        let row = Minute {
            minute,
            pods: counts.pods,
            adds: counts.add_ms.len(),
            add_p50_ms: report::quantile(&counts.add_ms, 0.5),
            add_p99_ms: report::quantile(&counts.add_ms, 0.99),
            rss_kib: held.rss_kib,
            anon_kib: held.anon_kib,
            file_kib: held.file_kib,
            fds: held.fds,
            threads: held.threads,
            pins: pins_under(node.root.path()).len() as u64,
            entries,
            pod_configs,
            failed_adds: counts.failed_adds + counts.failed_dels,
            checks: counts.checks,
            failed_checks: counts.failed_checks,
            failed_scrapes: 0,
        };
        counts.add_ms.clear();
        row
    };
    let mut n = 0;
    loop {
        let elapsed = started.elapsed();
        let done = STOP.load(Ordering::SeqCst)
            || deadline.is_some_and(|d| elapsed >= d)
            || opts.pods.is_some_and(|p| counts.pods >= p);
        if done || elapsed >= Duration::from_secs(u64::from(next_minute) * 60) {
            let mut row = sample(&node, &mut counts, elapsed.as_secs_f64() / 60.0);
            row.failed_scrapes = failed_scrapes.load(Ordering::SeqCst);
            eprintln!("{}", row.row());
            rows.push(row);
            next_minute = (elapsed.as_secs() / 60) as u32 + 1;
            write_table(opts, &rows);
        }
        if done {
            break;
        }
        if last_check.elapsed() >= CHECK_EVERY {
            last_check = Instant::now();
            counts.checks += 1;
            if let Err(err) = captured(&live) {
                counts.failed_checks += 1;
                eprintln!("soak: the live pod escaped capture: {err}");
            }
        }
        if let Some(pod) = node.add(n, &mut counts) {
            alive.push_back(pod);
        }
        n += 1;
        if alive.len() > ALIVE {
            let oldest = alive.pop_front().expect("more than ALIVE");
            node.delete(oldest, &mut counts);
        }
    }
    stop_scrapes.store(true, Ordering::SeqCst);
    let _ = scraper.join();
    for pod in alive.drain(..) {
        node.delete(pod, &mut counts);
    }
    let verdict = report::verdict(&rows, opts.bounds);
    let text = report::text(&rows, &verdict);
    println!("{text}");
    write_table(opts, &rows);
    if let Some(path) = &opts.table {
        let _ = std::fs::write(path, &text);
    }
    drop((live, node));
    verdict.passed
}

/// The rows so far, to `--table`: a run stopped hard keeps its minutes.
fn write_table(opts: &Options, rows: &[Minute]) {
    let Some(path) = &opts.table else {
        return;
    };
    let mut text = format!("{}\n", report::HEADER);
    for row in rows {
        text.push_str(&row.row());
        text.push('\n');
    }
    if let Err(err) = std::fs::write(path, text) {
        eprintln!("soak: writing {}: {err}", path.display());
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn map_entries_leave_the_connection_maps_out() {
        let text = "# HELP x\nredirector_map_entries{object=\"e1\",map=\"POD_CONFIG\"} 51\nredirector_map_entries{object=\"e1\",map=\"PORT_SETS\"} 300\nredirector_map_entries{object=\"e1\",map=\"ORIG_DST_BY_CONN\"} 7\nredirector_map_capacity{object=\"e1\",map=\"POD_CONFIG\"} 4096\n";
        assert_eq!(map_entries(text), (351, 51));
    }

    #[test]
    fn options_default_to_three_minutes() {
        let o = parse_args(std::iter::empty()).unwrap();
        assert_eq!(o.minutes, Some(3.0));
        let o = parse_args(
            ["--pods", "10000", "--max-rss-growth-kib", "2048"]
                .map(String::from)
                .into_iter(),
        )
        .unwrap();
        assert_eq!((o.minutes, o.pods), (None, Some(10_000)));
        assert_eq!(o.bounds.max_rss_growth_kib, 2048);
        assert!(parse_args(["--minutes"].map(String::from).into_iter()).is_err());
    }
}
