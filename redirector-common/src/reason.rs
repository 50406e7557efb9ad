//! Why a connection was (or was not) redirected: one counter per reason and pod.

/// A decision outcome worth counting. The discriminant is the index into
/// [`crate::maps::Counters::by_reason`].
#[repr(u32)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Reason {
    /// Captured to the outbound port (`-p`).
    Redirected = 0,
    /// The proxy calling its own pod through a local address: sent to the inbound port (`-z`).
    RedirectedInbound = 1,
    /// Destination port in `-o`.
    PassedExcludedPort = 2,
    /// Source 127.0.0.6 / ::6: the proxy's inbound passthrough.
    PassedInboundPassthrough = 3,
    /// A local destination from a process that is not the proxy.
    PassedLocalNotProxy = 4,
    /// The caller's uid or gid is a proxy owner (`-u`/`-g`).
    PassedProxyOwner = 5,
    /// The caller's gid is filtered out by the owner-group include/exclude lists.
    PassedOwnerGroup = 6,
    /// Destination inside the IPv4 loopback CIDR (or ::1); for a pod whose local
    /// destinations all pass, any local address.
    PassedLoopback = 7,
    /// Destination inside a `-x` CIDR; inbound, a source never captured.
    PassedExcludedCidr = 8,
    /// Destination neither in `-i` nor on a `-q` port.
    PassedNotIncluded = 9,
    /// Capture decided but the original destination could not be recorded; the connection
    /// was refused (fail closed).
    FailedClosed = 10,
    /// `SO_ORIGINAL_DST` answered for a redirected connection.
    OrigDstAnswered = 11,
    /// An inbound connection steered to the inbound capture port (`-z`).
    SteeredInbound = 12,
    /// Inbound to a port that is not captured (`-d`, not in `-b`, the tunnel port).
    PassedInboundPort = 13,
    /// Inbound capture decided, but the proxy has no listener on `-z`: dropped (fail closed).
    NoInboundListener = 14,
    /// Outbound through, or inbound on, an excluded (`-c`) interface; or inbound on a
    /// virtual (`-k`) one to a destination outside `-i`.
    PassedInterface = 15,
    /// DNS to port 53 of a pod DNS server (or any, `--capture-all-dns`) sent to 15053.
    RedirectedDns = 16,
    /// Not TCP and not captured DNS.
    PassedNotTcp = 17,
}

impl Reason {
    /// Every reason, in counter-index order.
    pub const ALL: [Reason; 18] = [
        Reason::Redirected,
        Reason::RedirectedInbound,
        Reason::PassedExcludedPort,
        Reason::PassedInboundPassthrough,
        Reason::PassedLocalNotProxy,
        Reason::PassedProxyOwner,
        Reason::PassedOwnerGroup,
        Reason::PassedLoopback,
        Reason::PassedExcludedCidr,
        Reason::PassedNotIncluded,
        Reason::FailedClosed,
        Reason::OrigDstAnswered,
        Reason::SteeredInbound,
        Reason::PassedInboundPort,
        Reason::NoInboundListener,
        Reason::PassedInterface,
        Reason::RedirectedDns,
        Reason::PassedNotTcp,
    ];

    /// Stable snake_case name, used in status output and metrics.
    pub const fn name(self) -> &'static str {
        match self {
            Reason::Redirected => "redirected",
            Reason::RedirectedInbound => "redirected_inbound",
            Reason::PassedExcludedPort => "passed_excluded_port",
            Reason::PassedInboundPassthrough => "passed_inbound_passthrough",
            Reason::PassedLocalNotProxy => "passed_local_not_proxy",
            Reason::PassedProxyOwner => "passed_proxy_owner",
            Reason::PassedOwnerGroup => "passed_owner_group",
            Reason::PassedLoopback => "passed_loopback",
            Reason::PassedExcludedCidr => "passed_excluded_cidr",
            Reason::PassedNotIncluded => "passed_not_included",
            Reason::FailedClosed => "failed_closed",
            Reason::OrigDstAnswered => "orig_dst_answered",
            Reason::SteeredInbound => "steered_inbound",
            Reason::PassedInboundPort => "passed_inbound_port",
            Reason::NoInboundListener => "no_inbound_listener",
            Reason::PassedInterface => "passed_interface",
            Reason::RedirectedDns => "redirected_dns",
            Reason::PassedNotTcp => "passed_not_tcp",
        }
    }
}
