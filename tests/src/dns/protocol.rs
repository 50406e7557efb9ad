//! The line protocol of the `dnsprobe` binary, written and read in one place.
//!
//! Servers print one line per event on stdout:
//! - `listening name=N proto=udp|tcp addr=A` — a listener is ready;
//! - `answered name=N proto=P local=L peer=C qname=Q qtype=T` — `dnsprobe server` answered;
//! - `forwarded name=N proto=P peer=C qname=Q qtype=T upstream=U result=ok|<error kind>` —
//!   `dnsprobe proxy` relayed a query to its upstream.
//!
//! (`Q` is the question's name with its trailing dot, `T` its type, e.g. `AAAA`.)
//!
//! Clients print one line:
//! - `reply rcode=R addrs=A,B from=S` — `dnsprobe query` got a DNS reply; `S` is the source
//!   `recvfrom` returned (UDP) or `none` (TCP, where the kernel gives no per-message source);
//! - `resolved addrs=A,B servers=S,T` — a resolver library (`dnsprobe resolve`: glibc; the
//!   kit's node script: c-ares) succeeded; `servers` are the nameservers it read from the
//!   /etc/resolv.conf it ran with;
//! - `notdns <text>` — over TCP, something that does not speak DNS answered (a `probe`
//!   server's line, e.g. when a DNS connection was captured to the inbound proxy);
//! - `error <kind> <detail>`.

use std::net::{IpAddr, SocketAddr};

use hickory_proto::op::Query;

pub use crate::probe::protocol::error_kind;
use crate::probe::protocol::{first_line, Fields};

/// DNS-specific client error kinds (besides [`error_kind`]'s).
pub mod dns_error_kind {
    /// The reply was not a DNS message, or not an answer to the question asked.
    pub const MALFORMED: &str = "malformed";
    /// glibc's `getaddrinfo` failed: `gai:<EAI name>` (e.g. `gai:again` after a timeout).
    pub const GAI_PREFIX: &str = "gai:";
    /// c-ares (node's `dns.Resolver`) failed: `cares:<code>` (e.g. `cares:ETIMEOUT`).
    pub const CARES_PREFIX: &str = "cares:";
}

pub fn listening_line(name: &str, proto: &str, addr: SocketAddr) -> String {
    format!("listening name={name} proto={proto} addr={addr}")
}

/// Parses a `listening` line into (name, proto, addr).
pub fn parse_listening(line: &str) -> Option<(String, String, SocketAddr)> {
    let fields = Fields::parse(line, "listening")?;
    Some((
        fields.get("name")?.to_owned(),
        fields.get("proto")?.to_owned(),
        fields.addr("addr")?,
    ))
}

pub fn answered_line(
    name: &str,
    proto: &str,
    local: SocketAddr,
    peer: SocketAddr,
    question: &Query,
) -> String {
    format!(
        "answered name={name} proto={proto} local={local} peer={peer} qname={} qtype={}",
        question.name(),
        question.query_type()
    )
}

pub fn forwarded_line(
    name: &str,
    proto: &str,
    peer: SocketAddr,
    question: &Query,
    upstream: SocketAddr,
    result: &str,
) -> String {
    format!(
        "forwarded name={name} proto={proto} peer={peer} qname={} qtype={} \
         upstream={upstream} result={result}",
        question.name(),
        question.query_type()
    )
}

fn join(addrs: &[IpAddr]) -> String {
    addrs
        .iter()
        .map(ToString::to_string)
        .collect::<Vec<_>>()
        .join(",")
}

fn split(list: &str) -> Option<Vec<IpAddr>> {
    list.split(',')
        .filter(|s| !s.is_empty())
        .map(|s| s.parse().ok())
        .collect()
}

pub fn reply_line(rcode: u16, addrs: &[IpAddr], from: Option<SocketAddr>) -> String {
    let from = from.map_or_else(|| "none".to_owned(), |f| f.to_string());
    format!("reply rcode={rcode} addrs={} from={from}", join(addrs))
}

pub fn resolved_line(addrs: &[IpAddr], servers: &[IpAddr]) -> String {
    format!("resolved addrs={} servers={}", join(addrs), join(servers))
}

pub fn notdns_line(text: &str) -> String {
    // One line: the other server's text with its line breaks flattened.
    format!(
        "notdns {}",
        text.split_whitespace().collect::<Vec<_>>().join(" ")
    )
}

pub use crate::probe::protocol::{
    client_exit, emit, error_line, io_error_line, millis, server_name, usage_exit,
};

/// What a `dnsprobe query` or `dnsprobe resolve` reported.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum DnsOutcome {
    /// A DNS reply (`dnsprobe query`).
    Reply {
        rcode: u16,
        addrs: Vec<IpAddr>,
        /// UDP: the reply's source as `recvfrom` returned it; TCP: `None`.
        from: Option<SocketAddr>,
    },
    /// A resolver library resolved the name (glibc or c-ares).
    Resolved {
        addrs: Vec<IpAddr>,
        /// The nameservers of the resolv.conf the client ran with.
        servers: Vec<IpAddr>,
    },
    /// Over TCP, a server that does not speak DNS answered with this line.
    NotDns(String),
    /// `<kind> <detail>`.
    Error { kind: String, detail: String },
}

impl DnsOutcome {
    /// Parses a client's stdout (its first non-empty line).
    pub fn parse(output: &str) -> DnsOutcome {
        let line = first_line(output);
        let unparsable = || DnsOutcome::Error {
            kind: error_kind::IO.to_owned(),
            detail: format!("unparsable dnsprobe output: {output:?}"),
        };
        if let Some(text) = line.strip_prefix("notdns ") {
            return DnsOutcome::NotDns(text.to_owned());
        }
        if let Some(rest) = line.strip_prefix("error ") {
            let (kind, detail) = rest.split_once(' ').unwrap_or((rest, ""));
            return DnsOutcome::Error {
                kind: kind.to_owned(),
                detail: detail.to_owned(),
            };
        }
        if let Some(fields) = Fields::parse(line, "reply") {
            let parsed = (|| {
                let from = match fields.get("from")? {
                    "none" => None,
                    addr => Some(addr.parse().ok()?),
                };
                Some(DnsOutcome::Reply {
                    rcode: fields.get("rcode")?.parse().ok()?,
                    addrs: split(fields.get("addrs")?)?,
                    from,
                })
            })();
            return parsed.unwrap_or_else(unparsable);
        }
        if let Some(fields) = Fields::parse(line, "resolved") {
            let parsed = (|| {
                Some(DnsOutcome::Resolved {
                    addrs: split(fields.get("addrs")?)?,
                    servers: split(fields.get("servers")?)?,
                })
            })();
            return parsed.unwrap_or_else(unparsable);
        }
        unparsable()
    }

    /// The answer's addresses, if there was an answer.
    pub fn addrs(&self) -> Option<&[IpAddr]> {
        match self {
            DnsOutcome::Reply {
                addrs, rcode: 0, ..
            }
            | DnsOutcome::Resolved { addrs, .. } => Some(addrs),
            _ => None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ip(s: &str) -> IpAddr {
        s.parse().unwrap()
    }

    #[test]
    fn client_lines_round_trip() {
        let addrs = [ip("192.0.2.53"), ip("2001:db8::53")];
        let from: SocketAddr = "[::ffff:10.200.1.2]:53".parse().unwrap();
        assert_eq!(
            DnsOutcome::parse(&reply_line(0, &addrs, Some(from))),
            DnsOutcome::Reply {
                rcode: 0,
                addrs: addrs.to_vec(),
                from: Some(from)
            }
        );
        assert_eq!(
            DnsOutcome::parse(&reply_line(2, &[], None)),
            DnsOutcome::Reply {
                rcode: 2,
                addrs: vec![],
                from: None
            }
        );
        assert_eq!(
            DnsOutcome::parse(&resolved_line(&addrs[..1], &[ip("10.200.1.2")])),
            DnsOutcome::Resolved {
                addrs: vec![ip("192.0.2.53")],
                servers: vec![ip("10.200.1.2")]
            }
        );
        assert_eq!(
            DnsOutcome::parse(&notdns_line("proxied name=inbound\norig=1.2.3.4:53\n")),
            DnsOutcome::NotDns("proxied name=inbound orig=1.2.3.4:53".into())
        );
        assert_eq!(
            DnsOutcome::parse("error timeout no reply in 1000 ms"),
            DnsOutcome::Error {
                kind: "timeout".into(),
                detail: "no reply in 1000 ms".into()
            }
        );
        assert!(matches!(
            DnsOutcome::parse("reply rcode=x"),
            DnsOutcome::Error { .. }
        ));
        assert!(matches!(DnsOutcome::parse(""), DnsOutcome::Error { .. }));
    }

    #[test]
    fn server_lines() {
        let addr: SocketAddr = "127.0.0.53:53".parse().unwrap();
        assert_eq!(
            parse_listening(&listening_line("pod-dns", "tcp", addr)),
            Some(("pod-dns".into(), "tcp".into(), addr))
        );
    }
}
