//! Capturing a pod as planned: the one sequence every way in (the init container, the
//! daemon, the CNI plugin) runs once it has a plan.

use crate::{
    engine::{
        apply::{apply, Outcome},
        diff::Mode,
        error::EngineError,
        loopback,
        plan::PodPlan,
        pod_keys::PodKeys,
    },
    store::{EbpfObject, OpenMaps, PinRoot},
    sys::netns::Netns,
};

/// The pod's IPv6 loopback route for inbound passthrough when the plan handles IPv6
/// (istio's ip6tables rules need none, the kernel's sk_lookup path does), then the apply.
pub fn capture(
    root: &PinRoot,
    object: &EbpfObject,
    plan: &PodPlan,
    netns: &Netns,
    mode: Mode,
    maps: &mut OpenMaps,
    known: Option<&PodKeys>,
) -> Result<Outcome, EngineError> {
    if plan.config.flags & redirector_common::pod_flags::IPV6 != 0 {
        loopback::add_inbound_passthrough(netns)?;
    }
    apply(root, object, plan, netns, mode, maps, known)
}
