//! Repair of an ambient network's pods, where the daemon is ztunnel's node agent: every
//! ready sandbox the plugin's ambient rules choose that nothing enrolled is enrolled now.
//! That is a pod chosen by its label alone on containerd, which answers for a sandbox only
//! once its CNI ADD is done (so the plugin could not read the label then), and any ambient
//! pod that started before the plugin was chained. The enrollment is the API's own
//! (`ambient::enroll`: programs and map entries, the route back, ztunnel's ack; all or
//! nothing); one that fails is logged, counted uncaptured and tried again next round.
//!
//! Until then the pod's connections go direct; from its enrollment on, its new ones go
//! through ztunnel.

use std::sync::Arc;

use tokio::sync::Mutex;

use super::{
    ambient::{blocking, enroll},
    repair::{chosen, Chosen, Round},
};
use crate::{
    api::Request,
    cni::conf::NetConf,
    cri::Sandbox,
    pods::Pods,
    zds::agent::{Agent, Ztunnel},
};

/// One round over `sandboxes` by the ambient rules of `conf`: each pod they choose that
/// is still to be enrolled is enrolled (with `capture` false, only counted and logged).
/// The node state is taken for one pod at a time, so that the API is not held while
/// ztunnel is waited for.
pub async fn round(
    pods: Arc<Pods>,
    agent: &Agent,
    owner: &Mutex<()>,
    sandboxes: &[Sandbox],
    conf: &NetConf,
    capture: bool,
) -> Round {
    let (chosen, uncaptured) = chosen(sandboxes, conf);
    let mut round = Round {
        uncaptured,
        ..Round::default()
    };
    let mut waiting_for_ztunnel = 0;
    for pod in chosen {
        let _owner = owner.lock().await;
        let sandbox = pod.sandbox.clone();
        let unrepaired = blocking(Arc::clone(&pods), move |pods| Ok(pods.unrepaired(&sandbox)));
        if !unrepaired.await.unwrap_or(false) {
            continue;
        }
        if !capture {
            pod.report();
        } else if agent.ztunnel() == Ztunnel::Away {
            // An add would wait for ztunnel and fail: tried again once it is connected.
            waiting_for_ztunnel += 1;
        } else {
            let response = enroll(Arc::clone(&pods), agent.clone(), add_request(&pod, conf)).await;
            if response.ok {
                pod.repaired();
                round.captured.push(pod.pod);
                continue;
            }
            pod.failed(&response.error.unwrap_or_else(|| "the add failed".into()));
        }
        round.uncaptured.push(pod.pod);
    }
    if waiting_for_ztunnel > 0 {
        tracing::warn!(
            "repair: {waiting_for_ztunnel} ambient pod(s) to enroll, and ztunnel is not connected: enrolled once it is"
        );
    }
    round
}

/// The add the chained plugin's ADD would have sent for `pod`: its ambient flags (the
/// network's, its annotations applied already), its sandbox recorded. Its cgroup is found
/// from its processes: the sandbox runs.
fn add_request(pod: &Chosen, conf: &NetConf) -> Request {
    Request::Add {
        netns: pod.sandbox.netns.clone(),
        name: Some(pod.pod.clone()),
        dialect: pod.flags.dialect,
        args: pod.flags.args.clone(),
        annotations: Default::default(),
        cgroup: None,
        cni: Some(pod.cni(conf)),
    }
}
