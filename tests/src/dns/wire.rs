//! The DNS messages the tests exchange, over hickory-proto: one-question queries, the
//! servers' replies (one A or AAAA record, or SERVFAIL), and a relay's rewrite of a reply's
//! addresses. Used by `dnsprobe` and the stand-in ztunnel.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use hickory_proto::op::{Message, MessageType, OpCode, Query, ResponseCode};
use hickory_proto::rr::rdata::{A, AAAA};
use hickory_proto::rr::{Name, RData, Record, RecordType};
use hickory_proto::ProtoError;

const TTL: u32 = 30;

/// A standard query (RD set) for `name` of type `qtype`.
pub fn query(id: u16, name: &str, qtype: RecordType) -> Result<Message, ProtoError> {
    let mut name = Name::from_ascii(name)?;
    // As a name comes off the wire, so that the reply's question compares equal.
    name.set_fqdn(true);
    let mut msg = Message::new(id, MessageType::Query, OpCode::Query);
    msg.metadata.recursion_desired = true;
    msg.add_query(Query::query(name, qtype));
    Ok(msg)
}

/// The question of a message that has exactly one.
pub fn question(msg: &Message) -> Option<&Query> {
    match msg.queries.as_slice() {
        [question] => Some(question),
        _ => None,
    }
}

/// A reply to `query` without records: its ID, RD and question, RA set.
fn reply(query: &Message, rcode: ResponseCode) -> Message {
    let mut msg = Message::response(query.metadata.id, query.metadata.op_code);
    msg.metadata.recursion_desired = query.metadata.recursion_desired;
    msg.metadata.recursion_available = true;
    msg.metadata.response_code = rcode;
    msg.queries = query.queries.clone();
    msg
}

/// The answer to `query`: for A one record with `v4`, for AAAA one with `v6` if given; any
/// other question gets an empty NOERROR reply. `None` unless `query` has one question.
pub fn answer(query: &Message, v4: Ipv4Addr, v6: Option<Ipv6Addr>) -> Option<Message> {
    let question = question(query)?;
    let rdata = match question.query_type() {
        RecordType::A => Some(RData::A(A(v4))),
        RecordType::AAAA => v6.map(|v6| RData::AAAA(AAAA(v6))),
        _ => None,
    };
    let mut msg = reply(query, ResponseCode::NoError);
    msg.answers
        .extend(rdata.map(|rdata| Record::from_rdata(question.name().clone(), TTL, rdata)));
    Some(msg)
}

/// A SERVFAIL reply to `query` (the proxy's answer when its upstream failed).
pub fn servfail(query: &Message) -> Message {
    reply(query, ResponseCode::ServFail)
}

/// Replaces the address of every A record of `reply`'s answer with `v4` and, when given, of
/// every AAAA record with `v6`.
pub fn rewrite_addrs(reply: &mut Message, v4: Ipv4Addr, v6: Option<Ipv6Addr>) {
    for record in &mut reply.answers {
        match (&mut record.data, v6) {
            (RData::A(a), _) => a.0 = v4,
            (RData::AAAA(aaaa), Some(v6)) => aaaa.0 = v6,
            _ => {}
        }
    }
}

/// The addresses of the A and AAAA records of `msg`'s answer, in order.
pub fn addrs(msg: &Message) -> Vec<IpAddr> {
    msg.answers
        .iter()
        .filter_map(|record| match record.data {
            RData::A(a) => Some(a.0.into()),
            RData::AAAA(aaaa) => Some(aaaa.0.into()),
            _ => None,
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    const V4: Ipv4Addr = Ipv4Addr::new(192, 0, 2, 1);

    /// `msg` encoded and decoded again, as its receiver sees it.
    fn sent(msg: &Message) -> Message {
        Message::from_vec(&msg.to_vec().unwrap()).unwrap()
    }

    #[test]
    fn answer_copies_id_and_question() {
        let q = query(0xbeef, "svc.rdt.test", RecordType::A).unwrap();
        let reply = answer(&sent(&q), V4, None).unwrap();
        let bytes = reply.to_vec().unwrap();
        let parsed = Message::from_vec(&bytes).unwrap();
        assert_eq!(parsed.metadata.id, 0xbeef);
        assert_eq!(parsed.metadata.message_type, MessageType::Response);
        assert_eq!(parsed.metadata.response_code, ResponseCode::NoError);
        assert_eq!(parsed.queries, q.queries);
        assert_eq!(addrs(&parsed), vec![IpAddr::from(V4)]);
        // QR, RD (copied), RA.
        assert_eq!(bytes[2..4], [0x81, 0x80]);
    }

    #[test]
    fn aaaa_answered_only_with_an_ipv6_address() {
        let q = query(7, "svc.rdt.test.", RecordType::AAAA).unwrap();
        assert_eq!(
            addrs(&sent(&answer(&q, V4, None).unwrap())),
            Vec::<IpAddr>::new()
        );
        let v6: Ipv6Addr = "2001:db8::1".parse().unwrap();
        assert_eq!(
            addrs(&sent(&answer(&q, V4, Some(v6)).unwrap())),
            vec![IpAddr::from(v6)]
        );
    }

    #[test]
    fn rewrite_replaces_addresses() {
        let v6: Ipv6Addr = "2001:db8::1".parse().unwrap();
        let ask = |id, qtype| query(id, "x.test", qtype).unwrap();
        let mut a = sent(&answer(&ask(1, RecordType::A), V4, None).unwrap());
        let mut aaaa = sent(&answer(&ask(2, RecordType::AAAA), V4, Some(v6)).unwrap());
        let new4 = Ipv4Addr::new(192, 0, 2, 53);
        let new6: Ipv6Addr = "2001:db8::53".parse().unwrap();
        rewrite_addrs(&mut a, new4, Some(new6));
        assert_eq!(addrs(&sent(&a)), vec![IpAddr::from(new4)]);
        rewrite_addrs(&mut aaaa, new4, None);
        assert_eq!(addrs(&aaaa), vec![IpAddr::from(v6)]);
        rewrite_addrs(&mut aaaa, new4, Some(new6));
        assert_eq!(addrs(&sent(&aaaa)), vec![IpAddr::from(new6)]);
    }

    #[test]
    fn servfail_keeps_the_question() {
        let q = query(9, "x.test", RecordType::A).unwrap();
        let parsed = sent(&servfail(&q));
        assert_eq!(
            (parsed.metadata.id, parsed.metadata.response_code),
            (9, ResponseCode::ServFail)
        );
        assert_eq!((parsed.queries, parsed.answers.len()), (q.queries, 0));
    }

    #[test]
    fn malformed_messages_are_errors_not_panics() {
        let q = query(1, "x.test", RecordType::A).unwrap().to_vec().unwrap();
        for cut in 0..q.len() {
            assert!(Message::from_vec(&q[..cut]).is_err(), "cut at {cut}");
        }
        assert!(query(1, "a..b", RecordType::A).is_err());
        // Not DNS at all: a probe server's line.
        assert!(Message::from_vec(b"proxied name=inbound local=127.0.0.1:15006").is_err());
    }
}
