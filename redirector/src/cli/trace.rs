//! `redirector trace`: switch tracing on for a pod (or every pod), print each decision the
//! programs log as it arrives, and switch it off again on exit (Ctrl-C, SIGTERM).
//!
//! The records come through aya-log's ring buffer of each pinned object, read by program
//! id, so this works beside whoever loaded the object (init containers, the daemon).

use std::{
    collections::BTreeMap,
    io::Write as _,
    net::{IpAddr, Ipv6Addr},
    path::PathBuf,
    sync::Mutex,
};

use anyhow::{bail, Context as _};
use aya::programs::ProgramInfo;
use aya_log::EbpfLogger;
use redirector_common::{
    trace::{INBOUND, TRACE_PREFIX},
    NetnsCookie, Reason, TraceRecord,
};
use serde::Serialize;
use tokio::io::{unix::AsyncFd, Interest};

use crate::{
    daemon::api::{Request, DEFAULT_SOCKET},
    netns::Netns,
    store::PinRoot,
    trace::{Traced, Tracer},
};

/// A program that logs; every program of an object writes to the same ring.
const LOGGING_PROGRAM: &str = "capture_connect4";

#[derive(clap::Args, Debug)]
pub struct TraceArgs {
    /// Only the pod in this network namespace.
    #[arg(long, value_name = "PATH", conflicts_with = "name")]
    netns: Option<PathBuf>,
    /// Only this daemon pod, `namespace/name` (asked of the daemon).
    #[arg(long, value_name = "NS/NAME")]
    name: Option<String>,
    /// The daemon's socket, for `--name`.
    #[arg(long, value_name = "PATH", default_value = DEFAULT_SOCKET)]
    socket: PathBuf,
    #[arg(long, value_name = "PATH", env = "REDIRECTOR_PIN_ROOT", default_value = crate::store::pins::DEFAULT_ROOT)]
    pin_root: PathBuf,
    /// One JSON object per line instead of text.
    #[arg(long)]
    json: bool,
}

/// One decision as printed.
#[derive(Debug, Serialize)]
struct Decision {
    netns_cookie: u64,
    #[serde(skip_serializing_if = "Option::is_none")]
    pod: Option<String>,
    direction: &'static str,
    protocol: &'static str,
    #[serde(skip_serializing_if = "Option::is_none")]
    uid: Option<u32>,
    #[serde(skip_serializing_if = "Option::is_none")]
    gid: Option<u32>,
    src: IpAddr,
    dst: IpAddr,
    dst_port: u16,
    reason: &'static str,
    /// The port it was sent or steered to; absent when it went through untouched.
    #[serde(skip_serializing_if = "Option::is_none")]
    to: Option<u16>,
}

fn ip(octets: [u8; 16]) -> IpAddr {
    Ipv6Addr::from(octets).to_canonical()
}

impl Decision {
    fn of(r: &TraceRecord, names: &BTreeMap<u64, String>) -> Self {
        let inbound = r.direction == INBOUND;
        Decision {
            netns_cookie: r.netns_cookie,
            pod: names.get(&r.netns_cookie).cloned(),
            direction: if inbound { "in" } else { "out" },
            protocol: if r.protocol == 17 { "udp" } else { "tcp" },
            uid: (!inbound).then_some(r.uid),
            gid: (!inbound).then_some(r.gid),
            src: ip(r.src),
            dst: ip(r.dst),
            dst_port: r.dst_port,
            reason: Reason::ALL
                .get(usize::from(r.reason))
                .map_or("unknown", |r| r.name()),
            to: (r.to != 0).then_some(r.to),
        }
    }

    fn text(&self) -> String {
        let pod = self
            .pod
            .clone()
            .unwrap_or_else(|| format!("netns:{}", self.netns_cookie));
        let dst = std::net::SocketAddr::new(self.dst, self.dst_port);
        let to = self.to.map(|p| format!(" -> :{p}")).unwrap_or_default();
        match (self.uid, self.gid) {
            (Some(uid), Some(gid)) => format!(
                "{pod} {} {} {dst} {}{to} uid={uid} gid={gid}",
                self.direction, self.protocol, self.reason
            ),
            _ => format!(
                "{pod} {} {} {} -> {dst} {}{to}",
                self.direction, self.protocol, self.src, self.reason
            ),
        }
    }
}

/// Receives aya-log's records and prints the decisions among them.
struct Printer {
    json: bool,
    names: BTreeMap<u64, String>,
    out: Mutex<std::io::Stdout>,
}

impl Printer {
    fn print(&self, message: &str) {
        let Some(record) = parse(message) else {
            return;
        };
        let decision = Decision::of(&record, &self.names);
        let line = if self.json {
            serde_json::to_string(&decision).expect("a decision serialises")
        } else {
            decision.text()
        };
        let mut out = self.out.lock().unwrap_or_else(|e| e.into_inner());
        // A closed stdout (`| head`) ends nothing here; the signal handlers end the run.
        let _ = writeln!(out, "{line}").and_then(|()| out.flush());
    }
}

/// `decision <hex bytes>` back into the record the program logged.
fn parse(message: &str) -> Option<TraceRecord> {
    let hex = message.strip_prefix(TRACE_PREFIX)?;
    let mut bytes = [0u8; size_of::<TraceRecord>()];
    if hex.len() != bytes.len() * 2 {
        return None;
    }
    for (i, b) in bytes.iter_mut().enumerate() {
        *b = u8::from_str_radix(hex.get(i * 2..i * 2 + 2)?, 16).ok()?;
    }
    Some(bytemuck::pod_read_unaligned(&bytes))
}

impl log::Log for &'static Printer {
    fn enabled(&self, _: &log::Metadata<'_>) -> bool {
        true
    }

    fn log(&self, record: &log::Record<'_>) {
        self.print(&record.args().to_string());
    }

    fn flush(&self) {}
}

/// The pod `--name` names, asked of the daemon.
fn cookie_by_name(socket: &PathBuf, name: &str) -> anyhow::Result<NetnsCookie> {
    let response = super::pod::call(socket, &Request::List)?;
    if !response.ok {
        bail!(
            "the daemon: {}",
            response.error.unwrap_or_else(|| "failed".into())
        );
    }
    response
        .pods
        .iter()
        .find(|p| p.name.as_deref() == Some(name))
        .map(|p| NetnsCookie(p.netns_cookie))
        .with_context(|| format!("--name {name}: the daemon manages no pod of that name"))
}

pub fn run(args: &TraceArgs) -> anyhow::Result<()> {
    let root = PinRoot::new(&args.pin_root);
    let objects = root
        .objects()
        .with_context(|| format!("listing the objects under {}", root.path().display()))?;
    if objects.is_empty() {
        bail!("nothing is set up under {}", root.path().display());
    }
    let mut names = BTreeMap::new();
    let traced = match (&args.netns, &args.name) {
        (Some(path), _) => Traced::One(
            Netns::open(path)
                .with_context(|| format!("--netns {}", path.display()))?
                .cookie(),
        ),
        (None, Some(name)) => {
            let cookie = cookie_by_name(&args.socket, name)?;
            names.insert(cookie.get(), name.clone());
            Traced::One(cookie)
        }
        (None, None) => Traced::All,
    };
    if let Traced::One(cookie) = traced {
        if !objects.iter().any(|o| o.pod(cookie).dir().exists()) {
            bail!(
                "no pod with netns cookie {cookie} is set up under {}",
                root.path().display()
            );
        }
    }
    // Every object's log ring, through one of its programs (they all share it).
    let printer: &'static Printer = Box::leak(Box::new(Printer {
        json: args.json,
        names,
        out: Mutex::new(std::io::stdout()),
    }));
    let mut loggers = Vec::new();
    for object in &objects {
        let path = object.program(LOGGING_PROGRAM);
        let id = ProgramInfo::from_pin(&path)
            .with_context(|| format!("opening {}", path.display()))?
            .id();
        loggers.push(
            EbpfLogger::init_from_id_with_logger(id, printer)
                .with_context(|| format!("opening the log ring of object {}", object.id()))?,
        );
    }
    let tracer = Tracer::start(&root, traced)?;
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .context("starting the event loop")?;
    let result = runtime.block_on(follow(&tracer, loggers));
    let stopped = tracer.stop().context("switching tracing off");
    result.and(stopped)
}

/// Print records as they arrive until Ctrl-C or SIGTERM; refresh the switch every second.
async fn follow(tracer: &Tracer, loggers: Vec<EbpfLogger<&'static Printer>>) -> anyhow::Result<()> {
    use tokio::signal::unix::{signal, SignalKind};

    let mut term = signal(SignalKind::terminate()).context("watching SIGTERM")?;
    let mut int = signal(SignalKind::interrupt()).context("watching SIGINT")?;
    let mut readers = tokio::task::JoinSet::new();
    for logger in loggers {
        // SAFETY: the logger owns its ring buffer's fd and keeps it open, unchanged, for
        // its whole life, which the AsyncFd holding it bounds.
        let mut fd = unsafe { AsyncFd::register_with_interest(logger, Interest::READABLE) }
            .map_err(|e| e.into_parts().1)
            .context("watching a log ring")?;
        readers.spawn(async move {
            loop {
                let mut ready = fd.readable_mut().await?;
                ready.get_inner_mut().flush();
                ready.clear_ready();
            }
            #[allow(unreachable_code)]
            Ok::<(), std::io::Error>(())
        });
    }
    let mut tick = tokio::time::interval(std::time::Duration::from_secs(1));
    loop {
        tokio::select! {
            _ = term.recv() => return Ok(()),
            _ = int.recv() => return Ok(()),
            Some(ended) = readers.join_next() => {
                ended.context("a log reader")?.context("reading a log ring")?;
            }
            _ = tick.tick() => tracer.refresh().context("refreshing the trace switch")?,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_logged_record_reads_back_and_prints_with_explains_reason_names() {
        let record = TraceRecord {
            netns_cookie: 4097,
            uid: 1000,
            gid: 1001,
            src: Ipv6Addr::UNSPECIFIED.octets(),
            dst: std::net::Ipv4Addr::new(10, 9, 8, 7)
                .to_ipv6_mapped()
                .octets(),
            dst_port: 80,
            to: 15001,
            reason: Reason::Redirected as u8,
            direction: redirector_common::trace::OUTBOUND,
            protocol: 6,
            _pad: 0,
        };
        let hex: String = bytemuck::bytes_of(&record)
            .iter()
            .map(|b| format!("{b:02x}"))
            .collect();
        let back = parse(&format!("{TRACE_PREFIX}{hex}")).unwrap();
        assert_eq!(back, record);
        let decision = Decision::of(&back, &BTreeMap::new());
        assert_eq!(
            decision.text(),
            "netns:4097 out tcp 10.9.8.7:80 redirected -> :15001 uid=1000 gid=1001"
        );
        assert!(parse("decision 00").is_none());
        assert!(parse("something else").is_none());
    }
}
