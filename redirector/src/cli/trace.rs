//! `redirector trace`: switch tracing on for a pod (or every pod), print each decision the
//! programs trace as it arrives, and switch it off again on exit (Ctrl-C, SIGTERM).

use std::{
    io::Write as _,
    path::{Path, PathBuf},
    sync::Mutex,
};

use anyhow::{bail, Context as _};
use redirector_common::NetnsCookie;

use crate::{
    api::{Request, DEFAULT_SOCKET},
    engine::live_pod::LivePod,
    sys::netns::Netns,
    trace::{follow, open_rings, Decision, DecisionSink, Traced, Tracer},
};

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
    #[command(flatten)]
    pin_root: super::pin_root::PinRootArg,
    /// One JSON object per line instead of text.
    #[arg(long)]
    json: bool,
}

/// The pod `--name` names, asked of the daemon.
fn cookie_by_name(socket: &Path, name: &str) -> anyhow::Result<NetnsCookie> {
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
    let root = args.pin_root.root();
    let objects = root
        .objects()
        .with_context(|| format!("listing the objects under {}", root.path().display()))?;
    if objects.is_empty() {
        bail!("nothing is set up under {}", root.path().display());
    }
    let (traced, name) = match (&args.netns, &args.name) {
        (Some(path), _) => {
            let netns = Netns::open(path).with_context(|| format!("--netns {}", path.display()))?;
            (Traced::One(netns.cookie()), None)
        }
        (None, Some(name)) => (
            Traced::One(cookie_by_name(&args.socket, name)?),
            Some(name.clone()),
        ),
        (None, None) => (Traced::All, None),
    };
    if let Traced::One(cookie) = traced {
        if LivePod::open(&root, cookie).is_err() {
            bail!(
                "no pod with netns cookie {cookie} is set up under {}",
                root.path().display()
            );
        }
    }
    let rings = open_rings(&root)?;
    rings.check(traced)?;
    if traced == Traced::All {
        for earlier in &rings.earlier {
            tracing::warn!("{earlier}");
        }
    }
    let json = args.json;
    let out = Mutex::new(std::io::stdout());
    let sink = DecisionSink::new(move |record| {
        let decision = Decision::of(&record, name.clone());
        let line = if json {
            serde_json::to_string(&decision).expect("a decision serialises")
        } else {
            decision.text()
        };
        let mut out = out.lock().unwrap_or_else(|e| e.into_inner());
        // A closed stdout (`| head`) ends nothing here; the signals end the run.
        let _ = writeln!(out, "{line}").and_then(|()| out.flush());
    });
    let tracer = Tracer::start(&root, traced)?;
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .context("starting the event loop")?;
    let result = runtime.block_on(async {
        use tokio::signal::unix::{signal, SignalKind};
        let mut term = signal(SignalKind::terminate()).context("watching SIGTERM")?;
        let mut int = signal(SignalKind::interrupt()).context("watching SIGINT")?;
        let stop = async {
            tokio::select! {
                _ = term.recv() => {}
                _ = int.recv() => {}
            }
        };
        follow(&tracer, rings.rings, sink, stop)
            .await
            .map_err(anyhow::Error::from)
    });
    let stopped = tracer.stop().context("switching tracing off");
    result.and(stopped)
}
