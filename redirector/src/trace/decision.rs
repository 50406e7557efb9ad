//! A decision as `redirector trace` prints it (text or JSON) and the daemon streams it,
//! from the `TraceRecord` the programs write.

use std::net::IpAddr;

use redirector_common::{
    kernel_abi::IPPROTO_UDP,
    trace::{DST_V6, INBOUND, SRC_V6},
    RawIp, Reason, TraceRecord, AF_INET, AF_INET6,
};
use serde::Serialize;

/// One decision as printed.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Decision {
    pub netns_cookie: u64,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub pod: Option<String>,
    pub direction: &'static str,
    pub protocol: &'static str,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub uid: Option<u32>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub gid: Option<u32>,
    pub src: IpAddr,
    pub dst: IpAddr,
    pub dst_port: u16,
    pub reason: &'static str,
    /// The port it was sent or steered to; absent when it went through untouched.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub to: Option<u16>,
}

/// The record's address with its family bit.
fn ip(raw: RawIp, families: u8, v6_bit: u8) -> IpAddr {
    raw.ip(if families & v6_bit != 0 {
        AF_INET6
    } else {
        AF_INET
    })
}

impl Decision {
    /// `r` as printed; `pod` names it when the caller knows its name.
    pub fn of(r: &TraceRecord, pod: Option<String>) -> Self {
        let inbound = r.direction == INBOUND;
        Decision {
            netns_cookie: r.netns_cookie,
            pod,
            direction: if inbound { "in" } else { "out" },
            protocol: if r.protocol == IPPROTO_UDP {
                "udp"
            } else {
                "tcp"
            },
            uid: (!inbound).then_some(r.uid),
            gid: (!inbound).then_some(r.gid),
            src: ip(r.src, r.families, SRC_V6),
            dst: ip(r.dst, r.families, DST_V6),
            dst_port: r.dst_port,
            reason: Reason::ALL
                .get(usize::from(r.reason))
                .map_or("unknown", |r| r.name()),
            to: (r.to != 0).then_some(r.to),
        }
    }

    /// One line of text: where it went and why.
    pub fn text(&self) -> String {
        let pod = self
            .pod
            .clone()
            .unwrap_or_else(|| format!("netns:{}", self.netns_cookie));
        let dst = std::net::SocketAddr::new(self.dst, self.dst_port);
        let to = self.to.map(|p| format!(" -> :{p}")).unwrap_or_default();
        match (self.uid, self.gid) {
            (Some(uid), Some(gid)) => format!(
                "{pod} {} {} {dst} {}{to} uid={uid} gid={gid}",
                self.direction, self.protocol, self.reason
            ),
            _ => format!(
                "{pod} {} {} {} -> {dst} {}{to}",
                self.direction, self.protocol, self.src, self.reason
            ),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_record_prints_with_explains_reason_names() {
        let record = TraceRecord {
            format: redirector_common::trace::FORMAT,
            reason: Reason::Redirected as u8,
            direction: redirector_common::trace::OUTBOUND,
            protocol: redirector_common::kernel_abi::IPPROTO_TCP,
            dst_port: 80,
            to: 15001,
            netns_cookie: 4097,
            uid: 1000,
            gid: 1001,
            src: RawIp::from_ip(std::net::Ipv6Addr::LOCALHOST.into()),
            dst: RawIp::from_ip(std::net::Ipv4Addr::new(10, 9, 8, 7).into()),
            families: SRC_V6,
            _reserved: [0; 7],
        };
        let decision = Decision::of(&record, None);
        assert_eq!(decision.src, std::net::Ipv6Addr::LOCALHOST);
        assert_eq!(
            decision.text(),
            "netns:4097 out tcp 10.9.8.7:80 redirected -> :15001 uid=1000 gid=1001"
        );
    }
}
