//! Load from `wrk`, run in the pod (its netns and cgroup, as the app's uid) pinned to CPU 0,
//! and its report parsed.

use redirector_tests::{Spawn, Topology, APP_UID};

/// One kind of load.
#[derive(Clone, Copy, Debug)]
pub struct Load {
    pub name: &'static str,
    pub connections: u32,
    /// A new connection per request (`Connection: close`).
    pub close: bool,
    pub path: &'static str,
}

pub const LOADS: [Load; 4] = [
    Load {
        name: "new-conn-8",
        connections: 8,
        close: true,
        path: "/",
    },
    Load {
        name: "new-conn-64",
        connections: 64,
        close: true,
        path: "/",
    },
    Load {
        name: "keepalive-8",
        connections: 8,
        close: false,
        path: "/",
    },
    Load {
        name: "bulk-1",
        connections: 1,
        close: false,
        path: "/bulk",
    },
];

/// What one wrk run reported.
#[derive(Clone, Debug, Default, serde::Serialize)]
pub struct Report {
    pub requests: u64,
    pub seconds: f64,
    pub rps: f64,
    pub p50_us: f64,
    pub p99_us: f64,
    pub bytes_per_sec: f64,
    pub errors: u64,
}

pub fn run(topo: &Topology, base: &str, load: Load, seconds: u32) -> Report {
    let url = format!("{base}{}", load.path);
    let mut args = vec![
        "-c".to_string(),
        "0".to_string(),
        "wrk".to_string(),
        "-t1".to_string(),
        format!("-c{}", load.connections),
        format!("-d{seconds}s"),
        "--latency".to_string(),
    ];
    if load.close {
        args.extend(["-H".to_string(), "Connection: close".to_string()]);
    }
    args.push(url);
    let out = Spawn::new("taskset")
        .args(&args)
        .netns(&topo.pod)
        .cgroup(&topo.pod_cgroup)
        .user(APP_UID, APP_UID)
        .output();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "wrk failed: {text}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    parse(&text).unwrap_or_else(|| panic!("cannot read wrk's report:\n{text}"))
}

/// `1.23ms`, `456.00us`, `2.00s` in microseconds.
fn duration_us(s: &str) -> Option<f64> {
    let unit_at = s.find(|c: char| c.is_ascii_alphabetic())?;
    let (n, unit) = s.split_at(unit_at);
    let n: f64 = n.parse().ok()?;
    Some(match unit {
        "us" => n,
        "ms" => n * 1e3,
        "s" => n * 1e6,
        "m" => n * 60e6,
        _ => return None,
    })
}

/// `12.34MB` in bytes.
fn size_bytes(s: &str) -> Option<f64> {
    let unit_at = s.find(|c: char| c.is_ascii_alphabetic()).unwrap_or(s.len());
    let (n, unit) = s.split_at(unit_at);
    let n: f64 = n.parse().ok()?;
    let scale = match unit {
        "" | "B" => 1.0,
        "KB" => 1024.0,
        "MB" => 1024.0 * 1024.0,
        "GB" => 1024.0 * 1024.0 * 1024.0,
        _ => return None,
    };
    Some(n * scale)
}

pub fn parse(text: &str) -> Option<Report> {
    let mut r = Report::default();
    for line in text.lines() {
        let words: Vec<&str> = line.split_whitespace().collect();
        match words.as_slice() {
            ["50%", v] => r.p50_us = duration_us(v)?,
            ["99%", v] => r.p99_us = duration_us(v)?,
            ["Requests/sec:", v] => r.rps = v.parse().ok()?,
            ["Transfer/sec:", v] => r.bytes_per_sec = size_bytes(v)?,
            [n, "requests", "in", secs, ..] => {
                r.requests = n.parse().ok()?;
                r.seconds = duration_us(secs.trim_end_matches(','))? / 1e6;
            }
            ["Socket", "errors:", rest @ ..] => {
                r.errors += rest
                    .iter()
                    .filter_map(|w| w.trim_end_matches(',').parse::<u64>().ok())
                    .sum::<u64>();
            }
            ["Non-2xx", "or", "3xx", "responses:", n] => r.errors += n.parse::<u64>().ok()?,
            _ => {}
        }
    }
    (r.requests > 0).then_some(r)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_a_wrk_report() {
        let text = "Running 2s test @ http://10.200.1.2/\n  1 threads and 8 connections\n  \
            Thread Stats   Avg      Stdev     Max   +/- Stdev\n    Latency   421.19us  120.00us   3.12ms   90.00%\n  \
            Latency Distribution\n     50%  398.00us\n     75%  450.00us\n     90%  520.00us\n     99%    1.02ms\n  \
            38000 requests in 2.00s, 5.10MB read\n  Socket errors: connect 0, read 3, write 0, timeout 1\n\
            Requests/sec:  18999.50\nTransfer/sec:      2.55MB\n";
        let r = parse(text).unwrap();
        assert_eq!(r.requests, 38000);
        assert_eq!(r.seconds, 2.0);
        assert_eq!(r.p50_us, 398.0);
        assert_eq!(r.p99_us, 1020.0);
        assert_eq!(r.rps, 18999.5);
        assert_eq!(r.errors, 4);
        assert!((r.bytes_per_sec - 2.55 * 1024.0 * 1024.0).abs() < 1.0);
    }
}
