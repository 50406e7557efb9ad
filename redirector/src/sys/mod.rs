//! The kernel and filesystem interfaces the engine stands on: the raw bpf(2) calls aya
//! lacks, netlink and sock_diag sockets, network and user namespaces, cgroups, mounts, file-system kinds, the running kernel's
//! features, errors naming the path they concern, and the fault injection of the tests.

pub mod bpf_sys;
pub mod cgroup;
pub mod fault;
pub mod fs_error;
pub mod fs_kind;
pub mod kernel;
pub mod kernel_probe;
pub mod mounts;
pub(crate) mod netlink;
pub mod netns;
pub mod netns_cookie;
pub mod pod_cgroup;
pub mod reply_route;
pub(crate) mod sock_diag;
pub mod user_ns;
