//! Linkerd in node mode: the redirector daemon and its CNI plugin standing in for
//! linkerd-cni. For a pod of the node, in this order:
//!
//! 1. [`left_alone`]: only pods Linkerd injected are captured;
//! 2. [`proxy_init_args`]: linkerd-cni's `"linkerd": {…}` settings as proxy-init flags;
//! 3. [`flags`]: the pod's annotations ([`with_namespace_defaults`] where the namespace's
//!    are at hand) applied over them, control-plane pods ([`control_plane`]) skipping the
//!    API server;
//! 4. [`parse_proxy_init`](super::parse_proxy_init) on `["proxy-init", flags…]`.

pub use super::annotations::{
    control_plane, flags, injected, left_alone, left_alone_by_containers, with_namespace_defaults,
    API_SERVER_PORTS, CLOSE_WAIT_TIMEOUT, CONTROL_PLANE_COMPONENT, INBOUND_PORT, INIT_CONTAINER,
    NAMESPACE_DEFAULTED, OUTBOUND_PORT, PROXY_CONTAINER, PROXY_GID, PROXY_UID, PROXY_VERSION,
    SKIP_INBOUND_PORTS, SKIP_OUTBOUND_PORTS, SKIP_SUBNETS,
};
pub use super::cni_config::proxy_init_args;
