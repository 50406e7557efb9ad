//! Pod churn on an init-container node: pods set up one after another by `redirector
//! istio-iptables`, a few alive at a time, each deleted the way Kubernetes deletes a pod
//! (network namespace and cgroup removed, no `--cleanup-only`), as on a node that runs
//! CronJobs or scales deployments up and down.

use std::collections::VecDeque;
use std::time::Instant;

use crate::redirector::{install, PinRoot, STANDARD_INJECTION};
use crate::{Cgroup, NetNs};

/// A pod of the churn: its namespace goes first on drop, then its cgroup.
pub type ChurnPod = (NetNs, Cgroup);

/// What a churn did.
pub struct Churn {
    /// Wall time of each pod's `redirector istio-iptables`, in order, in ms.
    pub setup_ms: Vec<f64>,
    /// The pods still alive at the end, oldest first.
    pub alive: Vec<ChurnPod>,
}

/// Sets up `pods` pods under `root` with istio's standard injection, deleting the oldest
/// whenever `alive` are up, and calls `checkpoint(deleted)` after every 100 deletions.
pub fn churn(
    root: &PinRoot,
    pods: usize,
    alive: usize,
    mut checkpoint: impl FnMut(usize),
) -> Churn {
    let mut up: VecDeque<ChurnPod> = VecDeque::with_capacity(alive + 1);
    let mut setup_ms = Vec::with_capacity(pods);
    let mut deleted = 0;
    for _ in 0..pods {
        let pod = (NetNs::new("churn"), Cgroup::new("churn"));
        let started = Instant::now();
        install(&pod.0, &pod.1, root, &STANDARD_INJECTION);
        setup_ms.push(started.elapsed().as_secs_f64() * 1e3);
        up.push_back(pod);
        if up.len() > alive {
            drop(up.pop_front());
            deleted += 1;
            if deleted % 100 == 0 {
                checkpoint(deleted);
            }
        }
    }
    Churn {
        setup_ms,
        alive: up.into(),
    }
}
