//! Numbers of the kernel's ABI that the programs and user space both use, defined once.

/// `SO_ORIGINAL_DST` (linux/netfilter_ipv4.h; `IP6T_SO_ORIGINAL_DST` has the same value),
/// asked at `SOL_IP` or `SOL_IPV6`.
pub const SO_ORIGINAL_DST: i32 = 80;
pub const SOL_IP: i32 = 0;
pub const SOL_IPV6: i32 = 41;
/// `SO_MARK` at `SOL_SOCKET` (asm-generic/socket.h).
pub const SOL_SOCKET: i32 = 1;
pub const SO_MARK: i32 = 36;

/// The mark of a connection from ztunnel to an app of the pod it proxies, and of the app's
/// replies to it (the value istio-cni's rules give them): the pod's policy route sends
/// what carries it back to ztunnel.
pub const ZTUNNEL_REPLY_MARK: u32 = 0x111;

/// IP protocol numbers (linux/in.h), as sockets and sk_lookup carry them.
pub const IPPROTO_TCP: u8 = 6;
pub const IPPROTO_UDP: u8 = 17;

/// The third 32-bit word of an IPv4-mapped IPv6 address (`::ffff:a.b.c.d`), in network
/// byte order as the kernel stores it.
pub const V4_MAPPED_WORD: u32 = u32::from_ne_bytes([0, 0, 0xff, 0xff]);
