//! The programs of the eBPF object and where each one attaches.

use crate::sys::bpf_sys::attach_type;
use crate::sys::kernel::keys;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ProgramKind {
    CgroupSockAddr,
    SockOps,
    CgroupSockopt,
    SkLookup,
}

/// What a program's link attaches to.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum AttachTarget {
    /// The pod's cgroup.
    Cgroup,
    /// The pod's network namespace.
    Netns,
}

/// One program: its function name in the object (redirector-ebpf/src/main.rs), the name
/// of its pins, and its cgroup attach point.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ProgramSpec {
    pub function: &'static str,
    pub hook: &'static str,
    pub kind: ProgramKind,
    pub attach_type: u32,
    pub target: AttachTarget,
    /// The program's form for kernels without a feature it uses.
    pub variant: Option<Variant>,
}

/// A program's other form, loaded in its place (and pinned under its name) where the
/// kernel lacks `feature` (a [`crate::sys::kernel::keys`] key) or its fallback is forced.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Variant {
    pub function: &'static str,
    pub feature: &'static str,
    /// It reads the pod's netns cookie from the cgroup it is attached at (the `POD_COOKIE`
    /// cgroup storage), which user space writes after each attach.
    pub reads_cgroup_cookie: bool,
}

impl ProgramSpec {
    /// The function names the program may have been loaded from.
    pub fn functions(&self) -> impl Iterator<Item = &'static str> {
        std::iter::once(self.function).chain(self.variant.map(|v| v.function))
    }
}

/// Every program of the object. A pod gets the first [`BASE_PROGRAMS`], in this order (the
/// programs that record state — sock_ops, getsockopt — before those that create it), and
/// the UDP DNS programs after them when it captures DNS.
pub const POD_PROGRAMS: [ProgramSpec; 11] = [
    ProgramSpec {
        function: "track_sock_ops",
        hook: "sock_ops",
        kind: ProgramKind::SockOps,
        attach_type: attach_type::CGROUP_SOCK_OPS,
        target: AttachTarget::Cgroup,
        variant: Some(Variant {
            function: "track_sock_ops_cgroup_cookie",
            feature: keys::NETNS_COOKIE_SOCK_OPS,
            reads_cgroup_cookie: true,
        }),
    },
    ProgramSpec {
        function: "answer_getsockopt",
        hook: "getsockopt",
        kind: ProgramKind::CgroupSockopt,
        attach_type: attach_type::CGROUP_GETSOCKOPT,
        target: AttachTarget::Cgroup,
        variant: Some(Variant {
            function: "answer_getsockopt_cgroup_cookie",
            feature: keys::NETNS_COOKIE_GETSOCKOPT,
            reads_cgroup_cookie: true,
        }),
    },
    ProgramSpec {
        function: "steer_sk_lookup",
        hook: "sk_lookup",
        kind: ProgramKind::SkLookup,
        attach_type: attach_type::SK_LOOKUP,
        target: AttachTarget::Netns,
        variant: Some(Variant {
            function: "steer_sk_lookup_by_address",
            feature: keys::INGRESS_IFINDEX,
            reads_cgroup_cookie: false,
        }),
    },
    ProgramSpec {
        function: "capture_connect4",
        hook: "connect4",
        kind: ProgramKind::CgroupSockAddr,
        attach_type: attach_type::CGROUP_INET4_CONNECT,
        target: AttachTarget::Cgroup,
        variant: None,
    },
    ProgramSpec {
        function: "capture_connect6",
        hook: "connect6",
        kind: ProgramKind::CgroupSockAddr,
        attach_type: attach_type::CGROUP_INET6_CONNECT,
        target: AttachTarget::Cgroup,
        variant: None,
    },
    ProgramSpec {
        function: "restore_getpeername4",
        hook: "getpeername4",
        kind: ProgramKind::CgroupSockAddr,
        attach_type: attach_type::CGROUP_INET4_GETPEERNAME,
        target: AttachTarget::Cgroup,
        variant: None,
    },
    ProgramSpec {
        function: "restore_getpeername6",
        hook: "getpeername6",
        kind: ProgramKind::CgroupSockAddr,
        attach_type: attach_type::CGROUP_INET6_GETPEERNAME,
        target: AttachTarget::Cgroup,
        variant: None,
    },
    ProgramSpec {
        function: "restore_recvmsg4",
        hook: "recvmsg4",
        kind: ProgramKind::CgroupSockAddr,
        attach_type: attach_type::CGROUP_UDP4_RECVMSG,
        target: AttachTarget::Cgroup,
        variant: None,
    },
    ProgramSpec {
        function: "restore_recvmsg6",
        hook: "recvmsg6",
        kind: ProgramKind::CgroupSockAddr,
        attach_type: attach_type::CGROUP_UDP6_RECVMSG,
        target: AttachTarget::Cgroup,
        variant: None,
    },
    ProgramSpec {
        function: "capture_sendmsg4",
        hook: "sendmsg4",
        kind: ProgramKind::CgroupSockAddr,
        attach_type: attach_type::CGROUP_UDP4_SENDMSG,
        target: AttachTarget::Cgroup,
        variant: None,
    },
    ProgramSpec {
        function: "capture_sendmsg6",
        hook: "sendmsg6",
        kind: ProgramKind::CgroupSockAddr,
        attach_type: attach_type::CGROUP_UDP6_SENDMSG,
        target: AttachTarget::Cgroup,
        variant: None,
    },
];

/// How many of [`POD_PROGRAMS`] every pod gets.
pub const BASE_PROGRAMS: usize = 7;

/// Whether `spec` is one of the UDP DNS programs a pod gets only when its DNS is captured
/// ([`POD_PROGRAMS`] past [`BASE_PROGRAMS`]).
pub fn is_dns(spec: &ProgramSpec) -> bool {
    POD_PROGRAMS[BASE_PROGRAMS..].contains(spec)
}

/// The programs a pod gets when the node's cgroup links (daemon mode) already cover its
/// cgroup: only its network namespace's.
pub const NETNS_PROGRAMS: [ProgramSpec; 1] = [POD_PROGRAMS[2]];

/// The programs the daemon attaches once at the node cgroup: every cgroup program, DNS
/// ones included (each pod's configuration says whether its DNS is captured).
pub const NODE_PROGRAMS: [ProgramSpec; 10] = [
    POD_PROGRAMS[0],
    POD_PROGRAMS[1],
    POD_PROGRAMS[3],
    POD_PROGRAMS[4],
    POD_PROGRAMS[5],
    POD_PROGRAMS[6],
    POD_PROGRAMS[7],
    POD_PROGRAMS[8],
    POD_PROGRAMS[9],
    POD_PROGRAMS[10],
];

/// The programs attached at ztunnel's cgroup (Istio ambient), whose sockets live in the
/// network namespaces of the pods it proxies: they find the pod by the socket's namespace
/// (`bpf_get_netns_cookie`, which sock_ops and getsockopt programs have from Linux 5.15),
/// never by a cookie stamped on the cgroup. `track_ztunnel` is loaded with the object only
/// on such a kernel; the getsockopt program is the pods' own.
pub const ZTUNNEL_PROGRAMS: [ProgramSpec; 2] = [
    ProgramSpec {
        function: "track_ztunnel",
        hook: "sock_ops",
        kind: ProgramKind::SockOps,
        attach_type: attach_type::CGROUP_SOCK_OPS,
        target: AttachTarget::Cgroup,
        variant: None,
    },
    POD_PROGRAMS[1],
];

/// The kernel features ztunnel's programs need (no fallback serves them).
pub const ZTUNNEL_FEATURES: [&str; 2] =
    [keys::NETNS_COOKIE_SOCK_OPS, keys::NETNS_COOKIE_GETSOCKOPT];

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn node_and_netns_programs_split_the_pod_programs_by_target() {
        assert!(NETNS_PROGRAMS
            .iter()
            .all(|p| p.target == AttachTarget::Netns));
        assert!(NODE_PROGRAMS
            .iter()
            .all(|p| p.target == AttachTarget::Cgroup));
        assert_eq!(
            NETNS_PROGRAMS.len() + NODE_PROGRAMS.len(),
            POD_PROGRAMS.len()
        );
        for p in &POD_PROGRAMS {
            let in_node = NODE_PROGRAMS.iter().any(|n| n.hook == p.hook);
            let in_netns = NETNS_PROGRAMS.iter().any(|n| n.hook == p.hook);
            assert!(in_node != in_netns, "{} in exactly one", p.hook);
        }
    }
}
