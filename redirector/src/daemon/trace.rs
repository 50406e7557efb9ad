//! The API's `trace` request: the decisions of a pod (or of every pod) streamed to the
//! client as JSON lines, as `redirector trace --json` prints them, until it hangs up.

use std::sync::Arc;

use tokio::{
    io::{AsyncReadExt, AsyncWriteExt},
    net::unix::{OwnedReadHalf, OwnedWriteHalf},
    sync::mpsc,
};

use super::response_line;
use crate::api::{PodRef, Response};
use crate::pods::Pods;
use crate::trace::{follow, open_rings, Decision, DecisionSink, Tracer};

/// Decisions held for a slow client; past this they are dropped (and counted in the
/// daemon's log when the stream ends), never queued without bound.
const BACKLOG: usize = 8192;

pub async fn stream(
    mut reader: OwnedReadHalf,
    mut writer: OwnedWriteHalf,
    pods: Arc<Pods>,
    pod: PodRef,
) {
    let start = {
        let pods = Arc::clone(&pods);
        tokio::task::spawn_blocking(move || -> Result<_, String> {
            let (traced, names) = pods.trace_target(&pod).map_err(|e| e.to_string())?;
            let (tx, rx) = mpsc::channel(BACKLOG);
            let dropped = Arc::new(std::sync::atomic::AtomicU64::new(0));
            let counted = Arc::clone(&dropped);
            let sink = DecisionSink::new(move |record| {
                let name = names.get(&record.netns_cookie).cloned();
                if tx.try_send(Decision::of(&record, name)).is_err() {
                    counted.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                }
            });
            let rings = open_rings(&pods.root).map_err(|e| e.to_string())?;
            rings.check(traced).map_err(|e| e.to_string())?;
            let tracer = Tracer::start(&pods.root, traced).map_err(|e| e.to_string())?;
            Ok((tracer, rings, sink, rx, dropped))
        })
        .await
        .unwrap_or_else(|err| Err(format!("the request failed: {err}")))
    };
    let (tracer, rings, sink, mut rx, dropped) = match start {
        Ok(started) => started,
        Err(err) => {
            let _ = writer
                .write_all(&response_line(&Response::failed(err)))
                .await;
            return;
        }
    };
    let mut message = String::from("tracing: one decision per line until you close");
    for earlier in &rings.earlier {
        tracing::warn!("trace: {earlier}");
        message.push_str(&format!("; {earlier}"));
    }
    let answer = Response::done(message, Vec::new());
    if writer.write_all(&response_line(&answer)).await.is_ok() {
        // The client hanging up (or sending anything) ends the stream.
        let hangup = async {
            let mut byte = [0u8; 1];
            let _ = reader.read(&mut byte).await;
        };
        let forward = async {
            while let Some(decision) = rx.recv().await {
                let mut line = serde_json::to_vec(&decision).expect("a decision serialises");
                line.push(b'\n');
                if writer.write_all(&line).await.is_err() {
                    return;
                }
            }
        };
        tokio::select! {
            followed = follow(&tracer, rings.rings, sink, hangup) => {
                if let Err(err) = followed {
                    tracing::warn!("trace: {err}");
                }
            }
            () = forward => {}
        }
    }
    let lost = dropped.load(std::sync::atomic::Ordering::Relaxed);
    if lost > 0 {
        tracing::warn!("trace: {lost} decision(s) dropped for a slow client");
    }
    match tokio::task::spawn_blocking(move || tracer.stop()).await {
        Ok(Ok(())) => {}
        Ok(Err(err)) => tracing::warn!("trace: switching tracing off: {err}"),
        Err(err) => tracing::warn!("trace: switching tracing off: {err}"),
    }
}
