//! Pod adds through the daemon's API, alone and under waves of concurrent `/metrics`
//! scrapes, in rounds taken in turn on one daemon: what the metrics test checks (every
//! scrape answered, one snapshot a second, memory bounded, no gross slowdown) and what the
//! bench reports as a ratio.

use std::collections::HashSet;
use std::hash::{Hash, Hasher};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use crate::daemon::{ask, http_get, rss_kib, Daemon, StateDir};
use crate::process::StopOnDrop;
use crate::redirector::{PinRoot, STANDARD_INJECTION};
use crate::{Cgroup, NetNs};

/// How old the daemon's snapshot may be (`redirector::daemon::snapshot::MAX_AGE`).
pub const SNAPSHOT_AGE: Duration = Duration::from_secs(1);
/// [`SNAPSHOT_AGE`] and a little more: a wait after which the next scrape makes a new one.
pub const MAX_AGE: Duration = Duration::from_millis(1100);
/// Scrapers, each scraping on the same ticks: a wave of this many concurrent scrapes.
pub const SCRAPERS: usize = 200;
/// Between waves: Prometheus scrapes every 15–60 s; 200 scrapers four times a second is
/// 12,000–48,000 times what one node's daemon sees. (Ten times a second, on 2 cores, the
/// connections alone slow the adds by ~12%: as much for `/healthz` as for `/metrics`.)
pub const TICK: Duration = Duration::from_millis(250);

/// One round: the pods added alone, then again under waves of scrapes.
#[derive(Debug)]
pub struct Round {
    pub alone: Vec<Duration>,
    pub scraped: Vec<Duration>,
    /// Scrapes begun while the scraped adds ran, and the different answers among them.
    pub scrapes: usize,
    pub snapshots: usize,
    /// From the first wave to the last scrape answered.
    pub window: Duration,
}

impl Round {
    /// The most snapshots a window may see: one per [`SNAPSHOT_AGE`] it spans, and the
    /// first.
    pub fn snapshot_bound(&self) -> usize {
        1 + (self.window.as_nanos() / SNAPSHOT_AGE.as_nanos()) as usize
    }
}

/// Every round of one run, and what the scrapes and the daemon's memory did over it.
#[derive(Debug)]
pub struct ScrapeRun {
    pub pods: usize,
    pub rounds: Vec<Round>,
    /// The answers that were not a scrape.
    pub failures: Vec<String>,
    pub most_at_once: usize,
    pub rss_before_kib: u64,
    pub rss_most_kib: u64,
}

impl ScrapeRun {
    /// The median of every scraped add over the median of every add alone.
    pub fn median_ratio(&self) -> f64 {
        let all = |f: fn(&Round) -> &Vec<Duration>| -> Vec<Duration> {
            self.rounds
                .iter()
                .flat_map(|r| f(r).iter().copied())
                .collect()
        };
        median(&all(|r| &r.scraped)).as_secs_f64() / median(&all(|r| &r.alone)).as_secs_f64()
    }

    pub fn summary(&self) -> String {
        let per_round: Vec<_> = self
            .rounds
            .iter()
            .map(|r| {
                format!(
                    "{} scrapes, {} snapshots in {:.0} ms, medians {:.2}/{:.2} ms",
                    r.scrapes,
                    r.snapshots,
                    ms(r.window),
                    ms(median(&r.alone)),
                    ms(median(&r.scraped))
                )
            })
            .collect();
        format!(
            "{} rounds of {} adds alone then under waves of {SCRAPERS} scrapes every \
             {TICK:?} (at most {} at once): {per_round:?}; median ratio {:.3}; daemon RSS \
             {} KiB before, at most {} KiB",
            self.rounds.len(),
            self.pods,
            self.most_at_once,
            self.median_ratio(),
            self.rss_before_kib,
            self.rss_most_kib,
        )
    }
}

/// A daemon serving `/metrics` on loopback with `pods` resident pods, then `rounds` rounds
/// of `pods` more added alone and under scrapes (removed after each), onto the resident
/// ones: drift in the machine's load falls on both alike. `hint` names the run's netns,
/// cgroup and pins.
pub fn adds_under_scrapes(hint: &str, pods: usize, rounds: usize) -> ScrapeRun {
    let root = PinRoot::new(hint);
    let node = Cgroup::new(hint);
    let state = StateDir::on_tmpfs(hint);
    let daemon = Daemon::start_with(&root, &node, &state, &["--metrics-addr", "127.0.0.1:0"]);
    let addr = daemon.metrics_addr();
    let pid = daemon.pid();
    let added: Vec<NetNs> = (0..pods)
        .map(|i| NetNs::new(&format!("{hint}{i}")))
        .collect();
    // The node has as many pods already, for every walk of it to read.
    let resident: Vec<NetNs> = (0..pods)
        .map(|i| NetNs::new(&format!("{hint}r{i}")))
        .collect();
    each_pod(&daemon, &resident, "add");

    let (first, last) = (AtomicU64::new(u64::MAX), AtomicU64::new(u64::MAX));
    let [scrapes, in_flight, most_in_flight] = [(); 3].map(|()| AtomicUsize::new(0));
    let snapshots = Mutex::new(HashSet::new());
    let stop = AtomicBool::new(false);
    let seen: Vec<AtomicU64> = (0..SCRAPERS).map(|_| AtomicU64::new(0)).collect();
    let waves = Waves {
        start: Instant::now(),
        window: [&first, &last],
        seen: &seen,
        stop: &stop,
        scrapes: &scrapes,
        in_flight: &in_flight,
        most_in_flight: &most_in_flight,
        snapshots: &snapshots,
    };
    let rss_before_kib = daemon.rss_kib();
    let most_rss = AtomicU64::new(rss_before_kib);
    let mut done = Vec::new();
    let failures: Vec<String> = std::thread::scope(|scope| {
        let (waves, addr) = (&waves, &addr);
        let scrapers: Vec<_> = (0..SCRAPERS)
            .map(|i| scope.spawn(move || waves.scraper(i, addr)))
            .collect();
        // Whatever happens below, the scrapers and the sampler stop.
        let _stop = StopOnDrop(&stop);
        let sampler = scope.spawn(|| {
            while !stop.load(Ordering::SeqCst) {
                most_rss.fetch_max(rss_kib(pid), Ordering::SeqCst);
                std::thread::sleep(Duration::from_millis(10));
            }
        });
        // The first wave of a round finds the last snapshot over a second old, so the node
        // is walked while the adds run.
        let mut ended = Instant::now();
        for _ in 0..rounds {
            let alone = each_pod(&daemon, &added, "add");
            each_pod(&daemon, &added, "del");
            std::thread::sleep((ended + MAX_AGE).saturating_duration_since(Instant::now()));
            let began = waves.begin();
            let scraped = each_pod(&daemon, &added, "add");
            let (scrapes, snapshots) = waves.end();
            ended = Instant::now();
            done.push(Round {
                alone,
                scraped,
                scrapes,
                snapshots,
                window: ended - began,
            });
            each_pod(&daemon, &added, "del");
        }
        stop.store(true, Ordering::SeqCst);
        sampler.join().expect("the sampler panicked");
        scrapers
            .into_iter()
            .flat_map(|s| s.join().expect("a scraper panicked"))
            .collect()
    });
    ScrapeRun {
        pods,
        rounds: done,
        failures,
        most_at_once: most_in_flight.load(Ordering::SeqCst),
        rss_before_kib,
        rss_most_kib: most_rss.load(Ordering::SeqCst),
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
/// the run opens, each of them at once.
struct Waves<'a> {
    start: Instant,
    /// The first and the last tick to scrape on (`u64::MAX`: none yet, or open).
    window: [&'a AtomicU64; 2],
    /// Each scraper's last tick woken for: once past the window's last, it has begun
    /// every scrape of the window it takes (on a loaded machine a thread may wake late).
    seen: &'a [AtomicU64],
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
    fn scraper(&self, index: usize, addr: &str) -> Vec<String> {
        let mut failures = Vec::new();
        loop {
            let tick = self.tick() + 1;
            std::thread::sleep(self.at(tick).saturating_duration_since(Instant::now()));
            self.seen[index].store(tick, Ordering::SeqCst);
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

    /// Waves from the next tick on, returning at that tick (the first wave), until
    /// [`Self::end`].
    fn begin(&self) -> Instant {
        let first = self.tick() + 1;
        self.scrapes.store(0, Ordering::SeqCst);
        self.snapshots.lock().unwrap().clear();
        self.window[1].store(u64::MAX, Ordering::SeqCst);
        self.window[0].store(first, Ordering::SeqCst);
        let at = self.at(first);
        std::thread::sleep(at.saturating_duration_since(Instant::now()));
        at
    }

    /// No wave after the one in progress; once its scrapes are answered, how many
    /// scrapes and snapshots there were since [`Self::begin`].
    fn end(&self) -> (usize, usize) {
        let last = self.tick();
        self.window[1].store(last, Ordering::SeqCst);
        while self.seen.iter().any(|t| t.load(Ordering::SeqCst) <= last) {
            std::thread::sleep(Duration::from_millis(5));
        }
        while self.in_flight.load(Ordering::SeqCst) > 0 {
            std::thread::sleep(Duration::from_millis(5));
        }
        let snapshots = self.snapshots.lock().unwrap().len();
        (self.scrapes.load(Ordering::SeqCst), snapshots)
    }
}
