//! `redirector daemon`: the node-level mode. It loads the object once (or uses the one
//! already pinned), attaches the cgroup programs once at the node cgroup, and sets pods up
//! by their network namespace alone through its local API. Everything it does stays
//! pinned: a daemon that exits, crashes or is killed leaves every pod captured, and a new
//! one rebuilds its view from the pins and its records before it serves.

mod ambient;
mod ambient_repair;
mod decision_totals;
mod heap;
pub mod http;
pub mod metrics;
mod new_addrs;
#[cfg(test)]
mod proptests;
pub mod repair;
mod requests;
mod snapshot;
mod trace;
mod ztunnel;

use std::{
    net::SocketAddr,
    os::unix::fs::PermissionsExt,
    path::{Path, PathBuf},
    sync::Arc,
    time::Instant,
};

use anyhow::Context as _;
use tokio::{
    io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader},
    net::{UnixListener, UnixStream},
    signal::unix::{signal, SignalKind},
    sync::{Mutex, Semaphore},
};
use tracing::info;

use self::metrics::Metrics;
use crate::api::{Request, Response};
use crate::node_check::Unservable;
use crate::pods::{records::Records, Pods};
use crate::zds::agent::Agent;
use crate::{
    engine::node::{claim_node, detach_node, node_object, upgrade},
    store::{EbpfObject, OpenMaps, PinRoot},
};

/// How the daemon runs.
#[derive(Clone, Debug)]
pub struct DaemonConfig {
    pub pin_root: PathBuf,
    pub socket: PathBuf,
    /// The node cgroup the cgroup programs attach to.
    pub cgroup: PathBuf,
    pub state_dir: PathBuf,
    /// Where `/metrics`, `/healthz` and `/readyz` are served, if anywhere.
    pub metrics_addr: Option<SocketAddr>,
    /// Where `/healthz` and `/readyz` alone are served, if anywhere.
    pub health_addr: Option<SocketAddr>,
    /// Decisions by pod in `/metrics`, not only the node's totals.
    pub metrics_per_pod: bool,
    /// How often the daemon removes pods that are gone (a missed CNI DEL); `None`: only
    /// at start.
    pub gc_interval: Option<std::time::Duration>,
    /// Capture of pods the plugin never saw, through the runtime's CRI; `None`: off.
    pub repair: Option<repair::RepairConfig>,
    /// The pods the node's object is sized for (`--max-pods`).
    pub max_pods: crate::store::PodCapacity,
    /// Where ztunnel (istio ambient) connects for the node's pods, if anywhere.
    pub ztunnel_socket: Option<PathBuf>,
}

/// Start-up: the object (the pinned one if the node has it), the node-level links, and
/// the reconcile of what is installed with the records — all before serving.
fn start(config: &DaemonConfig) -> anyhow::Result<Pods> {
    let root = PinRoot::new(&config.pin_root);
    let records = Records::new(&config.state_dir);
    // For the plugin: where pods' cgroups are, and where to attach for a pod whose own
    // cgroup it cannot find.
    records.save_node_cgroup(&config.cgroup)?;
    let configured = EbpfObject::configured_for(config.max_pods)?;
    let object = match node_object(&root)? {
        // This binary's kernel side is newer, or sized for another number of pods: the
        // node moves to it, with no gap.
        Some(pinned) if pinned.id() != configured.id() && !configured.bytes().is_empty() => {
            refuse_fewer_pods_than_installed(&pinned, config.max_pods)?;
            let pod_cgroups: Vec<_> = records
                .all()?
                .into_iter()
                .filter_map(|r| r.cgroup)
                .collect();
            if let Some(moved) = upgrade(&root, &configured, &pod_cgroups)? {
                info!(
                    "upgraded the node from object {} to {}: {} pod(s), {} link(s) switched in place, maps {}",
                    moved.from,
                    moved.to,
                    moved.pods,
                    moved.links,
                    if moved.shared_maps { "shared" } else { "copied" }
                );
            }
            configured
        }
        Some(pinned) => EbpfObject::pinned(pinned.id().clone()),
        None => configured,
    };
    let claimed = claim_node(&root, &object)?;
    info!(
        "object {}: programs attached at each pod's cgroup, and at {} while a pod relies on it",
        claimed.id(),
        config.cgroup.display()
    );
    let pods = Pods::new(root, object, records).with_node_cgroup(config.cgroup.clone());
    let (removed, kept) = pods.reconcile().map_err(anyhow::Error::msg)?;
    info!(
        "reconciled: {kept} pod(s) kept as they are, {} gone pod(s) removed {removed:?}",
        removed.len()
    );
    Ok(pods)
}

/// A node holding more pods than `max_pods` is not moved to an object that small: the
/// copy of its pods would fail part way.
fn refuse_fewer_pods_than_installed(
    pinned: &crate::store::ObjectPins,
    max_pods: crate::store::PodCapacity,
) -> anyhow::Result<()> {
    let installed = pinned
        .pods()
        .map_err(crate::sys::fs_error::fs_err("listing", &pinned.links_dir()))?
        .len();
    if installed > max_pods.pods() as usize {
        anyhow::bail!(
            "--max-pods {} is fewer than the {installed} pods the node holds (object {}): start the daemon with --max-pods {installed} or more, or remove pods first",
            max_pods.pods(),
            pinned.id()
        );
    }
    Ok(())
}

/// Run until SIGTERM or SIGINT, then exit leaving every pod captured.
pub fn run(config: DaemonConfig) -> anyhow::Result<()> {
    heap::settle();
    crate::sys::kernel::check_running()?;
    let metrics = Arc::new(Metrics::new(config.metrics_per_pod));
    start_http(&config, &metrics)?;
    runtime()?.block_on(serve(config, metrics))
}

/// On a node that cannot be served: pin nothing, serve `/healthz` (ok), `/readyz` (not
/// ready, with the reason) and `/metrics` (`redirector_node_unservable`), and stay up
/// until SIGTERM or SIGINT — a container that exited would be restarted, again and again.
pub fn idle(config: &DaemonConfig, why: Unservable) -> anyhow::Result<()> {
    let metrics = Arc::new(Metrics::new(config.metrics_per_pod));
    metrics.unservable_node(why);
    start_http(config, &metrics)?;
    runtime()?.block_on(async {
        let mut term = signal(SignalKind::terminate())?;
        let mut int = signal(SignalKind::interrupt())?;
        tokio::select! {
            _ = term.recv() => {}
            _ = int.recv() => {}
        }
        info!("stopped; nothing was pinned");
        Ok(())
    })
}

/// The HTTP servers, bound before the start-up: a bad address fails the start, having
/// changed nothing.
fn start_http(config: &DaemonConfig, metrics: &Arc<Metrics>) -> anyhow::Result<()> {
    let servers: Vec<_> = [
        (http::Server::Metrics, config.metrics_addr),
        (http::Server::Health, config.health_addr),
    ]
    .into_iter()
    .filter_map(|(server, addr)| Some((server, addr?)))
    .collect();
    Ok(http::start(&servers, metrics)?)
}

fn runtime() -> anyhow::Result<tokio::runtime::Runtime> {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .context("starting the async runtime")
}

async fn serve(config: DaemonConfig, metrics: Arc<Metrics>) -> anyhow::Result<()> {
    let ztunnel = config
        .ztunnel_socket
        .as_deref()
        .map(ztunnel::bind)
        .transpose()?;
    let start_config = config.clone();
    let pods = tokio::task::spawn_blocking(move || start(&start_config)).await??;
    let pods = Arc::new(pods);
    let agent = ztunnel.map(|bound| ztunnel::serve(bound, pods.records.clone(), pods.root.clone()));
    if let Some(agent) = &agent {
        metrics.ztunnel(agent.clone());
    }
    metrics.ready(Arc::clone(&pods));
    let listener = bind(&config.socket)?;
    info!("ready: serving on {}", config.socket.display());
    // One owner of the node state: requests are handled one at a time.
    let owner = Arc::new(Mutex::new(()));
    let connections = Arc::new(Semaphore::new(MAX_CONNECTIONS));
    let mut term = signal(SignalKind::terminate())?;
    let mut int = signal(SignalKind::interrupt())?;
    if let Some(repair) = config.repair.clone() {
        let (pods, owner, metrics) = (Arc::clone(&pods), Arc::clone(&owner), Arc::clone(&metrics));
        tokio::spawn(repair_rounds(repair, pods, owner, metrics, agent.clone()));
    }
    tokio::spawn(adopt_new_addresses(Arc::clone(&pods), Arc::clone(&owner)));
    tokio::spawn(heap::trim_now_and_then());
    let mut gc = config.gc_interval.map(|every| {
        let mut ticks = tokio::time::interval_at(tokio::time::Instant::now() + every, every);
        ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        ticks
    });
    loop {
        tokio::select! {
            _ = async { gc.as_mut().expect("only polled when set").tick().await }, if gc.is_some() => {
                let (pods, owner) = (Arc::clone(&pods), Arc::clone(&owner));
                tokio::spawn(async move {
                    let _owner = owner.lock().await;
                    match tokio::task::spawn_blocking(move || pods.reconcile()).await {
                        Ok(Ok((removed, _))) if !removed.is_empty() => {
                            info!("removed {} gone pod(s): {removed:?}", removed.len())
                        }
                        Ok(Ok(_)) => {}
                        Ok(Err(err)) => tracing::warn!("removing gone pods: {err}"),
                        Err(err) => tracing::warn!("removing gone pods: {err}"),
                    }
                });
            }
            accepted = listener.accept() => match accepted {
                Ok((stream, _)) => {
                    // Past the cap a client is closed at once: the daemon keeps its memory
                    // and descriptors for the clients it serves.
                    let Ok(permit) = Arc::clone(&connections).try_acquire_owned() else {
                        tracing::warn!("{MAX_CONNECTIONS} API connections open: closing a new one");
                        continue;
                    };
                    let (pods, owner, metrics) = (Arc::clone(&pods), Arc::clone(&owner), Arc::clone(&metrics));
                    let agent = agent.clone();
                    tokio::spawn(async move {
                        connection(stream, pods, owner, metrics, agent).await;
                        drop(permit);
                    });
                }
                Err(err) => tracing::warn!("accepting a connection: {err}"),
            },
            _ = term.recv() => break,
            _ = int.recv() => break,
        }
    }
    // Never detach on shutdown: pods stay captured while no daemon runs.
    if let Err(err) = std::fs::remove_file(&config.socket) {
        tracing::warn!("removing {}: {err}", config.socket.display());
    }
    info!("stopped; every pod stays captured");
    Ok(())
}

/// Pods' addresses added after their setup, looked for every [`new_addrs::INTERVAL`]; the
/// node state is taken only when there are some.
async fn adopt_new_addresses(pods: Arc<Pods>, owner: Arc<Mutex<()>>) {
    let mut ticks = tokio::time::interval(new_addrs::INTERVAL);
    ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut misses = new_addrs::Misses::default();
    loop {
        ticks.tick().await;
        let wanted = misses.take(&pods);
        if wanted.is_empty() {
            continue;
        }
        let _owner = owner.lock().await;
        let (pods, asked) = (Arc::clone(&pods), wanted.clone());
        match tokio::task::spawn_blocking(move || pods.adopt_addresses(&asked)).await {
            Ok(claimed) => misses.unclaimed(&wanted, &claimed),
            Err(err) => tracing::warn!("pods' new addresses: {err}"),
        }
    }
}

/// A repair round now and then every `config.interval`, for as long as the daemon runs.
/// A runtime that cannot be reached or a configuration with no entry of the plugin's
/// makes a round do nothing, with a warning. An ambient network's pods are repaired only
/// where the daemon is ztunnel's agent (`agent`).
async fn repair_rounds(
    config: repair::RepairConfig,
    pods: Arc<Pods>,
    owner: Arc<Mutex<()>>,
    metrics: Arc<Metrics>,
    agent: Option<Agent>,
) {
    let capture = config.mode == repair::RepairMode::Capture;
    let mut runtime: Option<crate::cri::Runtime> = None;
    let mut ticks = tokio::time::interval(config.interval);
    ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut told_no_agent = false;
    loop {
        ticks.tick().await;
        let conf = match repair::plugin_conf(&config.cni_conf_dir) {
            Ok(Some(conf)) => conf,
            Ok(None) => {
                tracing::debug!(
                    "repair: no redirector-cni entry in {} yet",
                    config.cni_conf_dir.display()
                );
                continue;
            }
            Err(err) => {
                tracing::warn!("repair: {err:#}");
                continue;
            }
        };
        let ambient = conf.dialect == crate::mesh::Dialect::Ambient;
        if ambient && agent.is_none() {
            if !told_no_agent {
                tracing::warn!(
                    "repair: the plugin's network is ambient's, and ambient pods are enrolled by ztunnel's node agent: without --ztunnel-socket they are not repaired"
                );
                told_no_agent = true;
            }
            continue;
        }
        if runtime.is_none() {
            match crate::cri::Runtime::connect(&config.cri_socket).await {
                Ok(connected) => runtime = Some(connected),
                Err(err) => {
                    tracing::warn!("repair: {err:#}");
                    continue;
                }
            }
        }
        let listed = runtime
            .as_mut()
            .expect("connected above")
            .ready_sandboxes()
            .await;
        let sandboxes = match listed {
            Ok(sandboxes) => sandboxes,
            Err(err) => {
                tracing::warn!("repair: {err:#}");
                runtime = None;
                continue;
            }
        };
        let round = match &agent {
            Some(agent) if ambient => {
                let pods = Arc::clone(&pods);
                ambient_repair::round(pods, agent, &owner, &sandboxes, &conf, capture).await
            }
            _ => {
                let _owner = owner.lock().await;
                let pods = Arc::clone(&pods);
                let repaired =
                    tokio::task::spawn_blocking(move || pods.repair(&sandboxes, &conf, capture));
                match repaired.await {
                    Ok(round) => round,
                    Err(err) => {
                        tracing::warn!("repair: {err}");
                        continue;
                    }
                }
            }
        };
        metrics.repaired(round.captured.len(), round.uncaptured.len());
    }
}

/// The socket a killed daemon left behind, if no daemon answers on it.
fn remove_stale_socket(path: &Path) -> anyhow::Result<()> {
    match std::os::unix::net::UnixStream::connect(path) {
        Err(err) if err.kind() == std::io::ErrorKind::ConnectionRefused => {
            std::fs::remove_file(path)
                .with_context(|| format!("removing the old socket {}", path.display()))
        }
        Ok(_) => {
            tracing::warn!("a daemon still serves on {}: keeping it", path.display());
            Ok(())
        }
        Err(_) => Ok(()),
    }
}

/// The socket, root only (mode 0600), replacing one a killed daemon left behind.
fn bind(path: &Path) -> anyhow::Result<UnixListener> {
    if let Some(dir) = path.parent() {
        std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    }
    match std::fs::remove_file(path) {
        Err(err) if err.kind() != std::io::ErrorKind::NotFound => {
            return Err(err).with_context(|| format!("removing the old socket {}", path.display()))
        }
        _ => {}
    }
    let listener =
        UnixListener::bind(path).with_context(|| format!("binding {}", path.display()))?;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o600))
        .with_context(|| format!("restricting {}", path.display()))?;
    Ok(listener)
}

/// The longest request line the API reads; a longer one is refused and its client closed.
pub const MAX_REQUEST: usize = 64 * 1024;
/// API connections served at once.
pub const MAX_CONNECTIONS: usize = 256;

/// Only root may use the API: the socket is 0600, and the peer's credentials are checked
/// too, so that a socket made reachable (a bind mount, changed permissions) still refuses.
fn refusal(stream: &UnixStream) -> Option<String> {
    match stream.peer_cred() {
        Ok(cred) if cred.uid() == 0 => None,
        Ok(cred) => Some(format!(
            "only root may use this socket (caller uid {})",
            cred.uid()
        )),
        Err(err) => Some(format!("cannot read the caller's credentials: {err}")),
    }
}

async fn connection(
    stream: UnixStream,
    pods: Arc<Pods>,
    owner: Arc<Mutex<()>>,
    metrics: Arc<Metrics>,
    agent: Option<Agent>,
) {
    let refused = refusal(&stream);
    let (reader, mut writer) = stream.into_split();
    if let Some(why) = refused {
        tracing::warn!("API: {why}");
        let _ = writer
            .write_all(&response_line(&Response::failed(why)))
            .await;
        return;
    }
    let mut reader = BufReader::new(reader);
    let mut line = Vec::new();
    loop {
        line.clear();
        let read = (&mut reader)
            .take(MAX_REQUEST as u64 + 1)
            .read_until(b'\n', &mut line)
            .await;
        match read {
            Ok(0) => return,
            Ok(n) if n > MAX_REQUEST => {
                let why = format!("request longer than {MAX_REQUEST} bytes: closing");
                let _ = writer
                    .write_all(&response_line(&Response::failed(why)))
                    .await;
                return;
            }
            Ok(_) => {}
            Err(err) => {
                tracing::debug!("reading a request: {err}");
                return;
            }
        }
        let text = String::from_utf8_lossy(&line);
        if text.trim().is_empty() {
            continue;
        }
        let response = match serde_json::from_str::<Request>(&text) {
            Ok(Request::Trace(pod)) => {
                // The connection becomes the stream.
                trace::stream(reader.into_inner(), writer, pods, pod).await;
                return;
            }
            Ok(request) => {
                let _owner = owner.lock().await;
                let op = request.op();
                let started = Instant::now();
                let pods = Arc::clone(&pods);
                let response = if ambient::concerns(&request, agent.as_ref()) {
                    ambient::handle(pods, agent.clone(), request).await
                } else {
                    tokio::task::spawn_blocking(move || pods.handle(request))
                        .await
                        .unwrap_or_else(|err| {
                            Response::failed(format!("the request failed: {err}"))
                        })
                };
                metrics.observe(op, started.elapsed().as_secs_f64(), !response.ok);
                response
            }
            Err(err) => Response::failed(format!("bad request: {err}")),
        };
        if let Err(err) = writer.write_all(&response_line(&response)).await {
            tracing::debug!("writing a response: {err}");
            return;
        }
    }
}

/// A response as one JSON line.
fn response_line(response: &Response) -> Vec<u8> {
    let mut json = serde_json::to_vec(response).unwrap_or_else(|err| {
        format!(r#"{{"ok":false,"error":"encoding the response: {err}"}}"#).into_bytes()
    });
    json.push(b'\n');
    json
}

/// `--uninstall`: remove every pod under the pin root, the node-level links, the records
/// and the objects. Capture ends for every pod on the node.
pub fn uninstall(config: &DaemonConfig) -> anyhow::Result<()> {
    let root = PinRoot::new(&config.pin_root);
    let records = Records::new(&config.state_dir);
    let mut pods = 0;
    let mut maps = OpenMaps::default();
    if root.path().exists() {
        for object in root.objects().context("listing pinned objects")? {
            for cookie in object.pods().context("listing pods")? {
                let record = records.get(cookie)?;
                if let Some(cgroup) = record.as_ref().and_then(|r| r.cgroup.as_ref()) {
                    crate::engine::pod_cgroup::detach_ours(cgroup)?;
                }
                let known = record.and_then(|r| r.keys);
                crate::engine::gc::teardown(&root, cookie, &mut maps, known.as_ref())?;
                records.remove(cookie)?;
                pods += 1;
            }
        }
    }
    for record in records.all()? {
        if let Some(cgroup) = &record.cgroup {
            crate::engine::pod_cgroup::detach_ours(cgroup)?;
        }
        records.remove(record.cookie())?;
    }
    records.forget_node_cgroup()?;
    records.forget_unservable()?;
    let detached = detach_node(&root)?;
    remove_stale_socket(&config.socket)?;
    for dir in [root.objects_dir(), root.path().to_path_buf()] {
        if let Err(err) = std::fs::remove_dir(&dir) {
            tracing::debug!("keeping {}: {err}", dir.display());
        }
    }
    info!("uninstalled: {pods} pod(s) removed, node links of {detached:?} detached");
    Ok(())
}
