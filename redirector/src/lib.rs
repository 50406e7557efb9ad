//! redirector: eBPF transparent traffic redirection for service-mesh sidecars.
//!
//! - [`istio`]: istio-iptables' contract — flags, env vars, defaults, annotations — turned
//!   into a validated [`engine::spec::CaptureConfig`]; every way in reads it.
//! - [`linkerd`]: linkerd2-proxy-init's flags turned into the same spec, with Linkerd's
//!   semantics.
//! - [`dialect`]: a node pod's flags named with their dialect (as the daemon's API, the CNI
//!   plugin and the records carry them), turned into the engine's [`engine::spec::PodSpec`].
//! - [`engine`]: a pod set up in steps, each its own module: facts → plan → observe → diff
//!   → apply, and the removal of pods (gc); it knows pods by their network namespace and
//!   cgroup, never by a mesh's flag syntax.
//! - [`store`]: the pinned object, its maps, the bpffs layout and the node lock.
//! - [`sys`]: the kernel and filesystem interfaces the engine stands on (netlink,
//!   sock_diag, namespaces, cgroups, file-system kinds, kernel checks, fault injection).
//! - The ways in: [`cli`] (the istio-init and proxy-init drop-ins and the operator's
//!   commands), [`daemon`] (the node daemon and its API), [`cni`] (the chained plugin),
//!   [`install_cni`], and [`trace`] (the live decision trace).

pub mod cli;
pub mod cni;
pub mod daemon;
pub mod dialect;
pub mod engine;
pub mod install_cni;
pub mod istio;
pub mod linkerd;
pub mod pods;
pub mod store;
pub mod sys;
pub mod trace;
