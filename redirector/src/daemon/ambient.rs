//! The API's requests for ambient pods (`--dialect ambient`): a pod is set up as any other
//! (its programs and map entries), then given the route back to ztunnel's transparent
//! sockets, then enrolled with ztunnel, whose ack ends the add. All or nothing: a step
//! that fails takes the earlier ones out again, and the add fails (the pod's start is
//! retried). The repair rounds enroll a pod through the same add ([`enroll`]). A removal
//! tells ztunnel first, so that it closes its sockets in the pod before the capture goes.

use std::{path::Path, sync::Arc};

use tracing::warn;

use crate::api::{PodRef, Request, Response};
use crate::{
    mesh::{ztunnel_workload, Dialect, PodFlags},
    pods::Pods,
    sys::netns::Netns,
    zds::agent::{Agent, Workload, Ztunnel},
};

/// Whether `request` may concern an ambient pod: an add in the dialect, or, where the
/// daemon is ztunnel's agent, a removal (the pod's record says whether it is one).
pub fn concerns(request: &Request, agent: Option<&Agent>) -> bool {
    match request {
        Request::Add { dialect, .. } => *dialect == Dialect::Ambient,
        Request::Del(_) => agent.is_some(),
        _ => false,
    }
}

/// Answers `request` ([`concerns`] said yes).
pub async fn handle(pods: Arc<Pods>, agent: Option<Agent>, request: Request) -> Response {
    match request {
        Request::Add { .. } => {
            let Some(agent) = agent else {
                return Response::failed(
                    "ambient pods need the daemon to be ztunnel's node agent: start it with --ztunnel-socket",
                );
            };
            enroll(pods, agent, request).await
        }
        Request::Del(pod) => del_pod(pods, agent, pod).await,
        other => answer(blocking(pods, move |pods| Ok(pods.handle(other))).await),
    }
}

/// Enrolls the ambient pod of `add` (an add request): set up, its route back, ztunnel's
/// ack; all or nothing. The one way an ambient pod is added, for the API (the plugin's
/// ADD, `pod add`) and the repair rounds alike.
pub(super) async fn enroll(pods: Arc<Pods>, agent: Agent, add: Request) -> Response {
    let Request::Add { netns, .. } = &add else {
        return Response::failed("only an add enrolls a pod");
    };
    let netns = netns.clone();
    let peer = match agent.ztunnel() {
        Ztunnel::Syncing(peer) | Ztunnel::Synced(peer) => Some(peer),
        Ztunnel::Away => None,
    };
    let at = netns.clone();
    let set_up = blocking(Arc::clone(&pods), move |pods| {
        prepare(pods, peer)?;
        let add = with_node_addresses(add)?;
        let response = pods.handle(add);
        if !response.ok {
            return Err(response);
        }
        let route = Netns::open(&at).map_err(|e| e.to_string()).and_then(|ns| {
            ns.run(crate::sys::reply_route::install)
                .map_err(|e| e.to_string())?
                .map_err(|e| e.to_string())
        });
        let workload = pods
            .records
            .find(None, Some(&at))
            .ok()
            .flatten()
            .and_then(|record| ztunnel_workload(&record.flags(), &at));
        match (route, workload) {
            (Ok(()), Some(workload)) => Ok((response, workload)),
            (Err(why), _) => Err(undo(pods, &at, format!("the route back to ztunnel: {why}"))),
            (_, None) => Err(undo(pods, &at, "the pod's record is not ambient's".into())),
        }
    });
    let (response, workload): (Response, Workload) = match set_up.await {
        Ok(done) => done,
        Err(failed) => return failed,
    };
    match agent.add(workload).await {
        Ok(()) => response,
        Err(err) => {
            let why = format!("enrolling the pod with ztunnel: {err}");
            answer(blocking(pods, move |pods| Ok(undo(pods, &netns, why))).await)
        }
    }
}

/// What must hold before an ambient pod is set up: the node's object has ztunnel's
/// programs, attached where ztunnel runs if it is connected.
fn prepare(pods: &Pods, peer: Option<crate::zds::seqpacket::Peer>) -> Result<(), Response> {
    let object = crate::engine::node::node_object(&pods.root)
        .map_err(Response::failed)?
        .ok_or_else(|| Response::failed(crate::engine::error::EngineError::NoNodeObject))?;
    crate::engine::ztunnel_cgroup::check_served(&object).map_err(Response::failed)?;
    if let Some(peer) = peer {
        super::ztunnel::attach_at(&pods.root, peer)
            .map_err(|why| Response::failed(format!("ztunnel (pid {}): {why}", peer.pid)))?;
    }
    Ok(())
}

/// The add with the node's addresses in its flags: connections from them (kubelet's
/// probes, host-network pods) are never captured inbound.
fn with_node_addresses(mut add: Request) -> Result<Request, Response> {
    if let Request::Add { args, .. } = &mut add {
        let addresses = crate::engine::facts::local_addresses()
            .map_err(|e| Response::failed(format!("reading the node's addresses: {e}")))?;
        for address in addresses {
            args.extend(["--node-address".to_owned(), address.to_string()]);
        }
    }
    Ok(add)
}

/// Take the pod out again after `why`, and answer with `why`.
fn undo(pods: &Pods, netns: &Path, why: String) -> Response {
    let removed = pods.handle(Request::Del(PodRef {
        netns: Some(netns.to_path_buf()),
        name: None,
    }));
    if !removed.ok {
        warn!(
            "taking out the ambient pod at {} after a failed add: {}",
            netns.display(),
            removed.error.unwrap_or_default()
        );
    }
    remove_route(netns);
    Response::failed(format!("{why}; nothing of the pod was kept"))
}

/// Take the route back out of the pod's namespace at `netns`, if it is still there.
fn remove_route(netns: &Path) {
    let Ok(ns) = Netns::open(netns) else {
        return;
    };
    let removed = ns
        .run(crate::sys::reply_route::remove)
        .map_err(|e| e.to_string())
        .and_then(|r| r.map_err(|e| e.to_string()));
    if let Err(err) = removed {
        warn!("removing the route back in {}: {err}", netns.display());
    }
}

async fn del_pod(pods: Arc<Pods>, agent: Option<Agent>, pod: PodRef) -> Response {
    let asked = pod.clone();
    let workload = blocking(Arc::clone(&pods), move |pods| {
        let record = pods
            .records
            .find(asked.name.as_deref(), asked.netns.as_deref())
            .ok()
            .flatten();
        Ok(record.and_then(|r| {
            let flags: PodFlags = r.flags();
            ztunnel_workload(&flags, &r.netns)
        }))
    })
    .await
    .ok()
    .flatten();
    if let (Some(workload), Some(agent)) = (&workload, agent) {
        if let Err(err) = agent.del(&workload.uid).await {
            warn!("telling ztunnel pod {} is gone: {err}", workload.uid);
        }
    }
    answer(
        blocking(pods, move |pods| {
            let response = pods.handle(Request::Del(pod));
            if let (true, Some(workload)) = (response.ok, workload) {
                remove_route(&workload.netns);
            }
            Ok(response)
        })
        .await,
    )
}

/// `work` on the pods, off the async threads.
pub(super) async fn blocking<T: Send + 'static>(
    pods: Arc<Pods>,
    work: impl FnOnce(&Pods) -> Result<T, Response> + Send + 'static,
) -> Result<T, Response> {
    tokio::task::spawn_blocking(move || work(&pods))
        .await
        .unwrap_or_else(|err| Err(Response::failed(format!("the request failed: {err}"))))
}

/// A response either way.
fn answer(result: Result<Response, Response>) -> Response {
    result.unwrap_or_else(|failed| failed)
}
