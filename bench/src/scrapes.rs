//! Pod adds through the daemon's API under waves of 200 concurrent `/metrics` scrapes,
//! against the same adds alone, rounds taken in turn on one daemon
//! ([`redirector_tests::scrapes`]): what scraping costs the pods being set up.

use redirector_tests::scrapes::{adds_under_scrapes, SCRAPERS, TICK};

use crate::stats::{median, min_max};

#[derive(Debug, Default, serde::Serialize)]
pub struct Scrapes {
    pub pods: usize,
    pub scrapers: usize,
    pub tick_ms: u64,
    /// Each round's median add, alone and under scrapes.
    pub alone_ms: Vec<f64>,
    pub scraped_ms: Vec<f64>,
    /// Each round's scrapes and snapshots (different answers) while its adds ran.
    pub scrapes: Vec<(usize, usize)>,
}

impl Scrapes {
    /// Each round's median under scrapes over its median alone.
    pub fn ratios(&self) -> Vec<f64> {
        (self.scraped_ms.iter().zip(&self.alone_ms))
            .map(|(s, a)| s / a)
            .collect()
    }

    /// "1.04× (0.98–1.12)": the median of the rounds' ratios and their range.
    pub fn show(&self) -> String {
        let ratios = self.ratios();
        let (lo, hi) = min_max(&ratios);
        format!("{:.2}× ({lo:.2}–{hi:.2})", median(&ratios))
    }
}

pub fn run(pods: usize, rounds: usize) -> Scrapes {
    let run = adds_under_scrapes("bscrape", pods, rounds);
    eprintln!("bench: scrapes: {}", run.summary());
    let ms = |d: &[std::time::Duration]| {
        median(&d.iter().map(|d| d.as_secs_f64() * 1e3).collect::<Vec<_>>())
    };
    Scrapes {
        pods,
        scrapers: SCRAPERS,
        tick_ms: TICK.as_millis() as u64,
        alone_ms: run.rounds.iter().map(|r| ms(&r.alone)).collect(),
        scraped_ms: run.rounds.iter().map(|r| ms(&r.scraped)).collect(),
        scrapes: run
            .rounds
            .iter()
            .map(|r| (r.scrapes, r.snapshots))
            .collect(),
    }
}
