//! A sequence of pods set up one after another, as the setup and scale benches run them:
//! each pod's time, the kernel memory at milestones, and the daemon's API connection.

use std::io::{BufRead as _, BufReader, Write as _};
use std::os::unix::net::UnixStream;
use std::time::{Duration, Instant};

use crate::memory;

/// The mode of the sequence whose pods go through one API connection.
pub const API_MODE: &str = "daemon: API, one connection";

#[derive(Debug, Default, serde::Serialize)]
pub struct Sequence {
    pub mode: &'static str,
    pub pods: usize,
    pub total_s: f64,
    /// Wall time of each pod's setup, in order.
    pub per_pod_ms: Vec<f64>,
    /// Kernel memory still allocated ([`memory::retained_kernel_bytes`]) after pod 1, 10,
    /// 100, 1,000 …, less before pod 1.
    pub kernel_bytes_after: Vec<(usize, i64)>,
    /// Wall time to remove every pod again, by name, on the same API connection (the API
    /// client only).
    pub removal_s: Option<f64>,
}

impl Sequence {
    /// Whether each pod's setup starts a process (`pod add`, the CNI plugin), whose start
    /// costs at least what a bare `true` does.
    pub fn starts_a_process(&self) -> bool {
        self.mode != API_MODE && self.mode.starts_with("daemon")
    }
}

/// Kernel memory across a sequence ([`memory::retained_kernel_bytes`]), with the time
/// spent reading it kept out of the sequence's own.
pub struct MemoryMarks {
    base: u64,
    waited: Duration,
    /// The sequence's own tmpfs (the daemon's state directory), whose pages count too.
    tmpfs: Option<std::path::PathBuf>,
}

impl MemoryMarks {
    pub fn start(tmpfs: Option<&std::path::Path>) -> Self {
        MemoryMarks {
            base: memory::retained_kernel_bytes(tmpfs),
            waited: Duration::ZERO,
            tmpfs: tmpfs.map(|p| p.to_path_buf()),
        }
    }

    /// Records the memory added since the start when `pods` is a milestone.
    pub fn after(&mut self, pods: usize, seq: &mut Sequence) {
        if milestones(seq.pods).contains(&pods) {
            let reading = Instant::now();
            let bytes = memory::retained_kernel_bytes(self.tmpfs.as_deref());
            seq.kernel_bytes_after
                .push((pods, bytes as i64 - self.base as i64));
            self.waited += reading.elapsed();
        }
    }

    /// Seconds since `start`, less the time spent reading memory.
    pub fn seconds_since(&self, start: Instant) -> f64 {
        start.elapsed().saturating_sub(self.waited).as_secs_f64()
    }
}

fn milestones(pods: usize) -> Vec<usize> {
    [1, 10, 100, 1000, 10_000]
        .into_iter()
        .filter(|m| *m <= pods)
        .collect()
}

/// One connection to the daemon's API.
pub struct Api {
    reader: BufReader<UnixStream>,
    writer: UnixStream,
}

impl Api {
    pub fn connect(socket: &std::path::Path) -> Self {
        let writer = UnixStream::connect(socket).expect("connecting to the daemon");
        let reader = BufReader::new(writer.try_clone().expect("cloning the connection"));
        Api { reader, writer }
    }

    /// Send `request`; panics unless the answer contains `expected`.
    pub fn ask(&mut self, request: &serde_json::Value, expected: &str) {
        writeln!(self.writer, "{request}").expect("writing to the daemon");
        let mut line = String::new();
        self.reader
            .read_line(&mut line)
            .expect("reading the daemon's answer");
        assert!(line.contains(expected), "daemon: {line}");
    }
}
