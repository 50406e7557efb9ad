//! The daemon's `/metrics`: scrapes share one snapshot made at most once a second, so 200
//! concurrent scrapes barely slow pod adds and keep the daemon's memory bounded; by
//! default decisions are the node's totals, with no pod named; per-pod series only with
//! `--metrics-per-pod`; the probes on an address of their own; a bad address refused,
//! naming its flag.

use std::collections::HashSet;
use std::hash::{Hash, Hasher};
use std::net::TcpListener;
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use redirector_tests::daemon::{ask, http_get, rss_kib, Daemon, StateDir};
use redirector_tests::redirector::{object_ids, redirector_bin, PinRoot, STANDARD_INJECTION};
use redirector_tests::{
    assert_proxied, require_root, use_probe_bin, Cgroup, NetNs, ProxiedPod, APP_UID,
};

/// How old the daemon's snapshot may be (`redirector::daemon::snapshot::MAX_AGE`), and a
/// little more.
const MAX_AGE: Duration = Duration::from_millis(1100);

/// Pods added with scrapes and without.
const PODS: usize = 100;
/// Rounds of the adds alone and under scrapes, taken in turn.
const ROUNDS: usize = 5;
/// Scrapers, each scraping on the same ticks: a wave of this many concurrent scrapes.
const SCRAPERS: usize = 200;
/// Between waves: Prometheus scrapes every 15–60 s; 200 scrapers four times a second is
/// 12,000–48,000 times what one node's daemon sees. (Ten times a second, on 2 cores, the
/// connections alone slow the adds by ~12%: as much for `/healthz` as for `/metrics`.)
const TICK: Duration = Duration::from_millis(250);

/// The node's count of connections redirected to the proxy.
const REDIRECTED: &str = "redirector_decisions_total{reason=\"redirected\"}";

/// The daemon's `/metrics`, once.
fn scrape(daemon: &Daemon) -> String {
    let (status, body) = daemon.http_get("/metrics");
    assert_eq!(status, 200, "{body}");
    body
}

/// The lines of a scrape that are `metric`'s samples.
fn samples<'a>(body: &'a str, metric: &str) -> Vec<&'a str> {
    body.lines()
        .filter(|l| l.starts_with(metric) && !l.starts_with('#'))
        .collect()
}

#[test]
fn decisions_are_node_totals_and_two_scrapes_within_a_second_are_one_snapshot() {
    if !require_root() {
        return;
    }
    use_probe_bin(env!("CARGO_BIN_EXE_probe"));
    let root = PinRoot::new("msnap");
    let node = Cgroup::new("msnap");
    let state = StateDir::new("msnap");
    let daemon = Daemon::start_with(&root, &node, &state, &["--metrics-addr", "127.0.0.1:0"]);
    let pod = ProxiedPod::under(&node, "msnap");
    daemon.add(&pod.topo.pod, "default/app", &STANDARD_INJECTION);
    for v6 in [false, true] {
        let dst = pod.service(v6);
        assert_proxied(&pod.connect(APP_UID, APP_UID, dst), dst);
    }

    // A snapshot made now (the last one, if any, is over a second old)...
    std::thread::sleep(Duration::from_millis(1100));
    let asked = Instant::now();
    let first = scrape(&daemon);
    assert_eq!(
        samples(&first, REDIRECTED),
        [format!("{REDIRECTED} 2")],
        "node-wide totals by reason, no pod named:\n{first}"
    );
    assert!(
        !first.contains("pod=") && !first.contains("netns_cookie="),
        "no pod is named without --metrics-per-pod:\n{first}"
    );
    assert_eq!(samples(&first, "redirector_pods "), ["redirector_pods 1"]);

    // ...is what a scrape within the second gets, though a decision was made since.
    let dst = pod.service(false);
    assert_proxied(&pod.connect(APP_UID, APP_UID, dst), dst);
    let second = scrape(&daemon);
    let within = asked.elapsed();
    assert!(
        within < Duration::from_millis(900),
        "the connection and the scrape took {within:?}: too slow to show the snapshot"
    );
    assert_eq!(second, first, "two scrapes {within:?} apart");

    // A second on, a new snapshot counts it.
    std::thread::sleep(Duration::from_millis(1100));
    let third = scrape(&daemon);
    assert_eq!(
        samples(&third, REDIRECTED),
        [format!("{REDIRECTED} 3")],
        "{third}"
    );

    // The pod removed: the node's totals stay (a counter going down reads as a restart).
    assert!(daemon
        .pod(&["del", "--name", "default/app"])
        .status
        .success());
    std::thread::sleep(Duration::from_millis(1100));
    let fourth = scrape(&daemon);
    assert_eq!(samples(&fourth, "redirector_pods "), ["redirector_pods 0"]);
    assert_eq!(
        samples(&fourth, REDIRECTED),
        [format!("{REDIRECTED} 3")],
        "{fourth}"
    );
}

#[test]
fn metrics_per_pod_names_each_pod() {
    if !require_root() {
        return;
    }
    use_probe_bin(env!("CARGO_BIN_EXE_probe"));
    let root = PinRoot::new("mpod");
    let node = Cgroup::new("mpod");
    let state = StateDir::new("mpod");
    let daemon = Daemon::start_with(
        &root,
        &node,
        &state,
        &["--metrics-addr", "127.0.0.1:0", "--metrics-per-pod"],
    );
    let pod = ProxiedPod::under(&node, "mpod");
    daemon.add(&pod.topo.pod, "default/app", &STANDARD_INJECTION);
    for v6 in [false, true] {
        let dst = pod.service(v6);
        assert_proxied(&pod.connect(APP_UID, APP_UID, dst), dst);
    }
    // The first scrape since the add is over a second after the daemon's start.
    std::thread::sleep(Duration::from_millis(1100));
    let body = scrape(&daemon);
    let cookie = pod.topo.pod.cookie();
    let redirected = format!(
        "redirector_decisions_total{{pod=\"default/app\",netns_cookie=\"{cookie}\",reason=\"redirected\"}}"
    );
    assert_eq!(
        samples(&body, &redirected),
        [format!("{redirected} 2")],
        "{body}"
    );
}

#[test]
fn probes_are_served_apart_from_the_metrics() {
    if !require_root() {
        return;
    }
    let root = PinRoot::new("mhealth");
    let node = Cgroup::new("mhealth");
    let state = StateDir::new("mhealth");
    let daemon = Daemon::start_with(
        &root,
        &node,
        &state,
        &[
            "--metrics-addr",
            "127.0.0.1:0",
            "--health-addr",
            "127.0.0.1:0",
        ],
    );
    assert_eq!(daemon.health_get("/healthz"), (200, "ok\n".to_owned()));
    assert_eq!(daemon.health_get("/readyz"), (200, "ready\n".to_owned()));
    assert_eq!(daemon.health_get("/metrics").0, 404, "no metrics there");
    // The metrics server still answers the probes too (`--metrics-addr` alone, as before).
    assert_eq!(daemon.http_get("/readyz").0, 200);
    let (status, body) = daemon.http_get("/metrics");
    assert_eq!(status, 200);
    assert_eq!(samples(&body, "redirector_pods "), ["redirector_pods 0"]);
}

/// `redirector daemon` with a test's paths and `extra`, expected to exit: its exit code
/// and stderr. Killed (by its pid) if it is still running after 20 s.
fn daemon_exits(root: &PinRoot, node: &Cgroup, state: &StateDir, extra: &[&str]) -> (i32, String) {
    let mut child = Command::new(redirector_bin())
        .arg("daemon")
        .arg("--pin-root")
        .arg(root.path())
        .arg("--socket")
        .arg(state.path().join("redirector.sock"))
        .arg("--cgroup")
        .arg(node.path())
        .arg("--state-dir")
        .arg(state.path())
        .args(["--repair", "off"])
        .args(extra)
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("starting redirector daemon");
    let deadline = Instant::now() + Duration::from_secs(20);
    let status = loop {
        if let Some(status) = child.try_wait().expect("waiting for the daemon") {
            break status;
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            let _ = child.wait();
            panic!("the daemon still runs with {extra:?}");
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    let mut stderr = String::new();
    std::io::Read::read_to_string(&mut child.stderr.take().unwrap(), &mut stderr).unwrap();
    (status.code().unwrap_or(-1), stderr)
}

#[test]
fn a_bad_metrics_or_health_address_fails_the_start_naming_its_flag() {
    if !require_root() {
        return;
    }
    let root = PinRoot::new("maddr");
    let node = Cgroup::new("maddr");
    let state = StateDir::new("maddr");
    for flag in ["--metrics-addr", "--health-addr"] {
        let (code, err) = daemon_exits(&root, &node, &state, &[flag, "localhost"]);
        assert_eq!(code, 1, "{err}");
        assert!(err.contains(flag) && err.contains("localhost"), "{err}");
    }
    // An address in use: refused before anything is loaded.
    let taken = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = taken.local_addr().unwrap().to_string();
    for flag in ["--metrics-addr", "--health-addr"] {
        let (code, err) = daemon_exits(&root, &node, &state, &[flag, &addr]);
        assert_eq!(code, 1, "{err}");
        assert!(
            err.contains(&format!("binding {flag} {addr}")),
            "names the flag and the address: {err}"
        );
        assert!(object_ids(&root).is_empty(), "nothing loaded: {err}");
    }
}

/// One add or del request per pod over one API connection: how long each took.
fn each_pod(daemon: &Daemon, pods: &[NetNs], op: &str) -> Vec<Duration> {
    let mut api = daemon.connect();
    pods.iter()
        .map(|netns| {
            let request = serde_json::json!({
                "op": op,
                "netns": netns.path(),
                "name": format!("default/{}", netns.name()),
                "args": STANDARD_INJECTION,
            });
            let started = Instant::now();
            let answer = ask(&mut api, &request.to_string());
            let took = started.elapsed();
            assert_eq!(answer["ok"], true, "{op}: {answer}\n{}", daemon.log());
            took
        })
        .collect()
}

fn median(durations: &[Duration]) -> Duration {
    let mut sorted = durations.to_vec();
    sorted.sort();
    sorted[sorted.len() / 2]
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1000.0
}

/// Scrapers that scrape `/metrics` in waves: on every tick of [`TICK`] in the window
/// the test opens, each of them at once.
struct Waves<'a> {
    start: Instant,
    /// The first and the last tick to scrape on (`u64::MAX`: none yet, or open).
    window: [&'a AtomicU64; 2],
    stop: &'a AtomicBool,
    /// Scrapes begun since the window opened, scrapes not yet answered, and the most
    /// that were at once.
    scrapes: &'a AtomicUsize,
    in_flight: &'a AtomicUsize,
    most_in_flight: &'a AtomicUsize,
    /// The different answers since the window opened (by hash): the snapshots made.
    snapshots: &'a Mutex<HashSet<u64>>,
}

impl Waves<'_> {
    /// The tick in progress: the last one passed.
    fn tick(&self) -> u64 {
        (self.start.elapsed().as_nanos() / TICK.as_nanos()) as u64
    }

    fn at(&self, tick: u64) -> Instant {
        self.start + TICK * tick as u32
    }

    /// One scraper, until stopped: the answers that were not a scrape. A scraper still
    /// scraping when a tick comes skips it.
    fn scraper(&self, addr: &str) -> Vec<String> {
        let mut failures = Vec::new();
        loop {
            let tick = self.tick() + 1;
            std::thread::sleep(self.at(tick).saturating_duration_since(Instant::now()));
            if self.stop.load(Ordering::SeqCst) {
                return failures;
            }
            let [first, last] = self.window.map(|t| t.load(Ordering::SeqCst));
            if tick < first || tick > last {
                continue;
            }
            let now = self.in_flight.fetch_add(1, Ordering::SeqCst) + 1;
            self.most_in_flight.fetch_max(now, Ordering::SeqCst);
            self.scrapes.fetch_add(1, Ordering::SeqCst);
            match http_get(addr, "/metrics") {
                Ok((200, body)) if body.contains("redirector_pods ") => {
                    let mut hasher = std::hash::DefaultHasher::new();
                    body.hash(&mut hasher);
                    self.snapshots.lock().unwrap().insert(hasher.finish());
                }
                answer => failures.push(format!("{answer:?}")),
            }
            self.in_flight.fetch_sub(1, Ordering::SeqCst);
        }
    }

    /// Waves from the next tick on, returning at that tick, until [`Self::end`].
    fn begin(&self) {
        let first = self.tick() + 1;
        self.scrapes.store(0, Ordering::SeqCst);
        self.snapshots.lock().unwrap().clear();
        self.window[1].store(u64::MAX, Ordering::SeqCst);
        self.window[0].store(first, Ordering::SeqCst);
        std::thread::sleep(self.at(first).saturating_duration_since(Instant::now()));
    }

    /// No wave after the one in progress; once its scrapes are answered, how many
    /// scrapes and snapshots there were since [`Self::begin`].
    fn end(&self) -> (usize, usize) {
        let last = self.tick();
        self.window[1].store(last, Ordering::SeqCst);
        // Every scraper woken for a tick of the window has begun by the next tick.
        std::thread::sleep(self.at(last + 1).saturating_duration_since(Instant::now()));
        while self.in_flight.load(Ordering::SeqCst) > 0 {
            std::thread::sleep(Duration::from_millis(5));
        }
        let snapshots = self.snapshots.lock().unwrap().len();
        (self.scrapes.load(Ordering::SeqCst), snapshots)
    }
}

/// Sets its flag when dropped, also by a panic.
struct StopOnDrop<'a>(&'a AtomicBool);

impl Drop for StopOnDrop<'_> {
    fn drop(&mut self) {
        self.0.store(true, Ordering::SeqCst);
    }
}

/// The sum of `durations`.
fn total(durations: &[Duration]) -> Duration {
    durations.iter().sum()
}

#[test]
fn concurrent_scrapes_barely_slow_pod_adds_and_keep_memory_bounded() {
    if !require_root() {
        return;
    }
    let root = PinRoot::new("mload");
    let node = Cgroup::new("mload");
    let state = StateDir::on_tmpfs("mload");
    let daemon = Daemon::start_with(&root, &node, &state, &["--metrics-addr", "127.0.0.1:0"]);
    let addr = daemon.metrics_addr();
    let pid = daemon.pid();
    let pods: Vec<NetNs> = (0..PODS)
        .map(|i| NetNs::new(&format!("mload{i}")))
        .collect();
    // The node has as many pods already, for every walk of it to read.
    let resident: Vec<NetNs> = (0..PODS).map(|i| NetNs::new(&format!("mres{i}"))).collect();
    each_pod(&daemon, &resident, "add");

    let (first, last) = (AtomicU64::new(u64::MAX), AtomicU64::new(u64::MAX));
    let [scrapes, in_flight, most_in_flight] = [(); 3].map(|()| AtomicUsize::new(0));
    let snapshots = Mutex::new(HashSet::new());
    let stop = AtomicBool::new(false);
    let waves = Waves {
        start: Instant::now(),
        window: [&first, &last],
        stop: &stop,
        scrapes: &scrapes,
        in_flight: &in_flight,
        most_in_flight: &most_in_flight,
        snapshots: &snapshots,
    };
    let rss_before = daemon.rss_kib();
    let most_rss = AtomicUsize::new(rss_before as usize);
    let (mut quiet, mut loaded, mut per_round) = (Vec::new(), Vec::new(), Vec::new());
    let failures: Vec<String> = std::thread::scope(|scope| {
        let scrapers: Vec<_> = (0..SCRAPERS)
            .map(|_| scope.spawn(|| waves.scraper(&addr)))
            .collect();
        // Whatever happens below, the scrapers and the sampler stop.
        let _stop = StopOnDrop(&stop);
        let sampler = scope.spawn(|| {
            while !stop.load(Ordering::SeqCst) {
                most_rss.fetch_max(rss_kib(pid) as usize, Ordering::SeqCst);
                std::thread::sleep(Duration::from_millis(10));
            }
        });
        // Rounds of the 100 adds alone, then under waves of scrapes (the first wave at
        // the first add), each onto the resident pods: drift in the machine's load falls
        // on both alike. The first wave of a round finds the last snapshot over a second
        // old, so the node is walked while the adds run.
        let mut ended = Instant::now();
        for _ in 0..ROUNDS {
            quiet.extend(each_pod(&daemon, &pods, "add"));
            each_pod(&daemon, &pods, "del");
            std::thread::sleep((ended + MAX_AGE).saturating_duration_since(Instant::now()));
            waves.begin();
            loaded.extend(each_pod(&daemon, &pods, "add"));
            per_round.push(waves.end());
            ended = Instant::now();
            each_pod(&daemon, &pods, "del");
        }
        stop.store(true, Ordering::SeqCst);
        sampler.join().expect("the sampler panicked");
        scrapers
            .into_iter()
            .flat_map(|s| s.join().expect("a scraper panicked"))
            .collect()
    });

    let ratio = total(&loaded).as_secs_f64() / total(&quiet).as_secs_f64();
    let median_ratio = median(&loaded).as_secs_f64() / median(&quiet).as_secs_f64();
    let rss_most = most_rss.load(Ordering::SeqCst) as u64;
    let at_once = most_in_flight.load(Ordering::SeqCst);
    eprintln!(
        "{ROUNDS} rounds of {PODS} adds: alone {:.1} ms in all (median {:.2} ms); under \
         waves of {SCRAPERS} scrapes every {TICK:?} ((scrapes, snapshots) per round: \
         {per_round:?}; at most {at_once} at once) {:.1} ms (median {:.2} ms); ratio \
         {ratio:.3} (medians {median_ratio:.3}); daemon RSS {rss_before} KiB before, at \
         most {rss_most} KiB",
        ms(total(&quiet)),
        ms(median(&quiet)),
        ms(total(&loaded)),
        ms(median(&loaded)),
    );
    assert!(
        failures.is_empty(),
        "{} scrapes failed, e.g. {:?}",
        failures.len(),
        &failures[..failures.len().min(3)]
    );
    assert!(
        per_round.iter().all(|&(scrapes, _)| scrapes >= SCRAPERS),
        "a round of adds saw less than a wave of scrapes: {per_round:?}"
    );
    assert!(
        ratio <= 1.2,
        "the adds under scrapes took {ratio:.2}× as long as alone"
    );
    // One snapshot (about 7 KiB at 100 pods) and 200 connections' buffers (~16 KiB each)
    // are about 4 MiB; 16 MiB leaves room for the allocator's per-thread arenas. A walk
    // per scrape grew it by over 300 MiB.
    let grown = rss_most.saturating_sub(rss_before);
    assert!(
        grown <= 16 * 1024,
        "the daemon grew by {grown} KiB under {SCRAPERS} concurrent scrapes"
    );
}
