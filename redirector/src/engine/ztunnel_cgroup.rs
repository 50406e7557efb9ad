//! Istio ambient: the programs at ztunnel's cgroup. ztunnel's sockets are made in the
//! network namespaces of the pods it proxies, but by its own process, in its own cgroup:
//! the pods' cgroup programs never see them, and these find the pod by the socket's
//! namespace. Pinned under the node's object, so that they outlive the daemon; moved when
//! ztunnel comes back in another cgroup (restarted, upgraded).

use std::path::Path;

use crate::{
    engine::{error::EngineError, node::pin_cgroup_links},
    store::{
        programs::{ZTUNNEL_FEATURES, ZTUNNEL_PROGRAMS},
        NodeLock, ObjectPins, PinRoot,
    },
};

/// Attach ztunnel's programs at `cgroup`, under the node's object. Returns the hooks
/// attached now (none when they already were there).
pub fn attach(root: &PinRoot, cgroup: &Path) -> Result<Vec<&'static str>, EngineError> {
    let _lock = NodeLock::acquire(root)?;
    let object = crate::engine::node::node_object(root)?.ok_or(EngineError::NoNodeObject)?;
    check_served(&object)?;
    pin_cgroup_links(&object, &object.ztunnel(), &ZTUNNEL_PROGRAMS, cgroup)
}

/// Whether the node's object can serve ambient pods: it was loaded with ztunnel's programs,
/// in the forms that find a pod by the socket's namespace.
pub fn check_served(object: &ObjectPins) -> Result<(), EngineError> {
    let loaded = ZTUNNEL_PROGRAMS
        .iter()
        .all(|spec| object.program(spec.function).exists() && !object.uses_variant(spec));
    if loaded {
        return Ok(());
    }
    let missing: Vec<String> = ZTUNNEL_FEATURES
        .iter()
        .filter(|key| crate::sys::kernel::needs_fallback(key))
        .map(|key| crate::sys::kernel::describe(key))
        .collect();
    Err(EngineError::AmbientUnsupported {
        why: if missing.is_empty() {
            "the node's programs were loaded without them (by an earlier release, or with a fallback forced); they are loaded with the next object".to_owned()
        } else {
            format!("this kernel lacks {}", missing.join(", "))
        },
    })
}
