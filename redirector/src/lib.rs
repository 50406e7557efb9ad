//! redirector's engine: everything both ways of running it — the istio-init drop-in and
//! the node daemon — share. It knows pods by their network namespace and cgroup, never by
//! istio's flag syntax (that is [`cli`]'s job).
//!
//! A pod is set up in four steps, each its own module: [`facts`] reads the pod, [`plan`]
//! turns a [`spec::CaptureConfig`] and the facts into the exact kernel state (pure data),
//! [`observe`] reads what is installed in the plan's shape and [`diff`] compares the two;
//! [`apply`] executes the difference with undo. [`gc`] removes pods, [`store`] owns the
//! pinned object, its maps and every bpffs path.

pub mod apply;
pub mod cgroup;
pub mod cli;
pub mod cni;
pub mod daemon;
pub mod diff;
pub mod facts;
pub mod fault;
pub mod fs_error;
pub mod fs_kind;
pub mod gc;
pub mod install_cni;
pub mod istio;
pub mod kernel;
pub mod listeners;
pub mod live_pod;
pub mod loopback;
pub mod neighbours;
mod netlink;
pub mod netns;
pub mod node;
pub mod observe;
pub mod plan;
pub mod pod_cgroup;
pub mod pod_keys;
mod sock_diag;
pub mod spec;
pub mod store;
pub mod trace;
pub mod user_ns;
