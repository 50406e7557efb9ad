//! The route back to a proxy's transparent sockets inside a pod's network namespace, as
//! istio ambient needs it without netfilter.
//!
//! ztunnel connects to the app from the client's address (`IP_TRANSPARENT`), so the app's
//! replies go to an address that is not the namespace's, and would leave by the default
//! route. With `tcp_fwmark_accept` on, an accepted connection takes the mark of the SYN
//! that opened it (its SYN-ACK too); a SYN marked [`REPLY_MARK`] therefore makes every
//! reply of the app's socket match the rule below, whose table delivers everything
//! locally — to ztunnel's socket, which holds the client's address. The mark is put on
//! ztunnel's upstream connections only: its other sockets must route as usual.

use std::io;

use crate::sys::netlink;

pub use redirector_common::kernel_abi::ZTUNNEL_REPLY_MARK as REPLY_MARK;
/// The bits of the mark the rule looks at.
pub const REPLY_MASK: u32 = 0xfff;
/// The routing table that delivers everything locally.
pub const REPLY_TABLE: u32 = 100;
/// The rule's priority: before the main table's (32766).
pub const REPLY_RULE_PRIORITY: u32 = 32764;

/// The sysctl that makes an accepted connection take its SYN's mark (per namespace; it
/// covers TCP over IPv6 too).
const FWMARK_ACCEPT: &str = "/proc/sys/net/ipv4/tcp_fwmark_accept";

#[derive(Debug, thiserror::Error)]
pub enum ReplyRouteError {
    #[error("setting {FWMARK_ACCEPT}: {0}")]
    Sysctl(io::Error),
    #[error("adding the rule fwmark {REPLY_MARK:#x}/{REPLY_MASK:#x} lookup {REPLY_TABLE} ({family}): {source}")]
    Rule {
        family: &'static str,
        source: io::Error,
    },
    #[error("adding the route local default dev lo table {REPLY_TABLE} ({family}): {source}")]
    Route {
        family: &'static str,
        source: io::Error,
    },
}

/// Sets the route back up in the calling thread's network namespace (run it inside the
/// pod's, `Netns::run`): the sysctl, then for IPv4 and, where the namespace has it, IPv6
/// the rule and the table's route. What is already there is left as it is.
pub fn install() -> Result<(), ReplyRouteError> {
    std::fs::write(FWMARK_ACCEPT, "1").map_err(ReplyRouteError::Sysctl)?;
    let mut families = vec![(libc::AF_INET as u8, "IPv4")];
    if std::path::Path::new("/proc/sys/net/ipv6").exists() {
        families.push((libc::AF_INET6 as u8, "IPv6"));
    }
    for (family, name) in families {
        create(rule(family)).map_err(|source| ReplyRouteError::Rule {
            family: name,
            source,
        })?;
        create(local_route(family)).map_err(|source| ReplyRouteError::Route {
            family: name,
            source,
        })?;
    }
    Ok(())
}

/// Takes the rule and the table's route out again (a failed add, a pod taken out of
/// ambient), in the calling thread's network namespace; what is not there is fine. The
/// sysctl stays: it changes nothing for connections whose SYN carries no mark.
pub fn remove() -> io::Result<()> {
    const RTM_DELROUTE: u16 = 25;
    const RTM_DELRULE: u16 = 33;
    for family in [libc::AF_INET as u8, libc::AF_INET6 as u8] {
        if family == libc::AF_INET6 as u8 && !std::path::Path::new("/proc/sys/net/ipv6").exists() {
            continue;
        }
        netlink::delete(RTM_DELRULE, &rule(family).1)?;
        netlink::delete(RTM_DELROUTE, &local_route(family).1)?;
    }
    Ok(())
}

fn attribute(body: &mut Vec<u8>, kind: u16, value: u32) {
    body.extend_from_slice(&8u16.to_ne_bytes());
    body.extend_from_slice(&kind.to_ne_bytes());
    body.extend_from_slice(&value.to_ne_bytes());
}

/// Creates a `(kind, body)` message's rule or route; one already there is fine.
fn create((kind, body): (u16, Vec<u8>)) -> io::Result<()> {
    netlink::create(kind, &body)
}

/// `lo`'s index, the same in every network namespace.
const LOOPBACK_IFINDEX: u32 = 1;

/// `ip rule add fwmark REPLY_MARK/REPLY_MASK pref REPLY_RULE_PRIORITY lookup REPLY_TABLE`.
fn rule(family: u8) -> (u16, Vec<u8>) {
    const RTM_NEWRULE: u16 = 32;
    const FR_ACT_TO_TBL: u8 = 1;
    const FRA_PRIORITY: u16 = 6;
    const FRA_FWMARK: u16 = 10;
    const FRA_TABLE: u16 = 15;
    const FRA_FWMASK: u16 = 16;
    // struct fib_rule_hdr: family, dst_len, src_len, tos, table, res1, res2, action, flags.
    let mut body = vec![family, 0, 0, 0, 0, 0, 0, FR_ACT_TO_TBL];
    body.extend_from_slice(&0u32.to_ne_bytes());
    attribute(&mut body, FRA_PRIORITY, REPLY_RULE_PRIORITY);
    attribute(&mut body, FRA_FWMARK, REPLY_MARK);
    attribute(&mut body, FRA_FWMASK, REPLY_MASK);
    attribute(&mut body, FRA_TABLE, REPLY_TABLE);
    (RTM_NEWRULE, body)
}

/// `ip route add local default dev lo table REPLY_TABLE`.
fn local_route(family: u8) -> (u16, Vec<u8>) {
    const RTM_NEWROUTE: u16 = 24;
    const RTPROT_STATIC: u8 = 4;
    const RT_SCOPE_HOST: u8 = 254;
    const RTN_LOCAL: u8 = 2;
    const RTA_OIF: u16 = 4;
    const RTA_TABLE: u16 = 15;
    // struct rtmsg: family, dst_len, src_len, tos, table, protocol, scope, type, flags.
    let mut body = vec![
        family,
        0,
        0,
        0,
        REPLY_TABLE as u8,
        RTPROT_STATIC,
        RT_SCOPE_HOST,
        RTN_LOCAL,
    ];
    body.extend_from_slice(&0u32.to_ne_bytes());
    attribute(&mut body, RTA_OIF, LOOPBACK_IFINDEX);
    attribute(&mut body, RTA_TABLE, REPLY_TABLE);
    (RTM_NEWROUTE, body)
}
