//! redirector: eBPF transparent traffic redirection for service-mesh sidecars.
//!
//! - [`mesh`]: the seam for the meshes. Each mesh's contract — istio-iptables' flags, env
//!   vars, defaults and annotations (`mesh::istio`); linkerd2-proxy-init's flags and
//!   linkerd-cni's rules (`mesh::linkerd`) — turned into a validated
//!   [`engine::spec::CaptureConfig`], with what they share in `mesh::common`; a node pod's
//!   flags named with their dialect, turned into the engine's [`engine::spec::PodSpec`].
//! - [`engine`]: a pod set up in steps, each its own module: facts → plan → observe → diff
//!   → apply, and the removal of pods (gc); it knows pods by their network namespace and
//!   cgroup, never by a mesh's flag syntax.
//! - [`zds`]: the node agent's side of ZDS, istio ambient's protocol with ztunnel.
//! - [`cri`]: a client of the container runtime's CRI socket (the node's sandboxes, the
//!   runtime's version).
//! - [`node_check`]: whether this node can be served, decided once at start by the
//!   daemon and `install-cni`, and shown by `redirector check`.
//! - [`store`]: the pinned object, its maps, the bpffs layout and the node lock.
//! - [`sys`]: the kernel and filesystem interfaces the engine stands on (netlink,
//!   sock_diag, namespaces, cgroups, file-system kinds, kernel checks, fault injection).
//! - The ways in: [`cli`] (the istio-init and proxy-init drop-ins and the operator's
//!   commands), [`daemon`] (the node daemon and its API), [`cni`] (the chained plugin),
//!   [`install_cni`], and [`trace`] (the live decision trace).

pub mod api;
pub mod cli;
pub mod cni;
pub mod cri;
pub mod daemon;
pub mod engine;
pub mod install_cni;
pub mod mesh;
pub mod node_check;
pub mod pods;
pub mod store;
pub mod sys;
pub mod trace;
pub mod zds;
