//! DNS messages on the wire (RFC 1035 §4.1), just what the tests need: one-question queries,
//! replies with one A or AAAA record (the owner name a pointer to the question), and
//! rewriting the A/AAAA records of a reply in place. Used by `dnsprobe` and the kit.

use std::fmt;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

pub const TYPE_A: u16 = 1;
pub const TYPE_AAAA: u16 = 28;
const CLASS_IN: u16 = 1;
const HEADER_LEN: usize = 12;
const FLAG_QR: u16 = 0x8000;
const FLAG_RD: u16 = 0x0100;
const FLAG_RA: u16 = 0x0080;
const RCODE_MASK: u16 = 0x000f;
pub const RCODE_SERVFAIL: u16 = 2;
/// A compression pointer to offset 12: the question's name, right after the header.
const POINTER_TO_QUESTION: [u8; 2] = [0xc0, 0x0c];
const TTL: u32 = 30;
/// More jumps than any sane message needs: a pointer loop ends here.
const MAX_POINTERS: usize = 16;

#[derive(Clone, Debug, PartialEq, Eq)]
pub enum WireError {
    /// The message ends inside a field.
    Truncated,
    /// A label longer than 63 bytes, a name longer than 255, or an empty label.
    BadName(String),
    /// Too many compression pointers (a loop).
    PointerLoop,
    /// A query must have exactly one question.
    QuestionCount(u16),
}

impl fmt::Display for WireError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            WireError::Truncated => write!(f, "message truncated"),
            WireError::BadName(name) => write!(f, "bad name {name:?}"),
            WireError::PointerLoop => write!(f, "compression pointer loop"),
            WireError::QuestionCount(n) => write!(f, "{n} questions, expected 1"),
        }
    }
}

impl std::error::Error for WireError {}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Question {
    /// Without the trailing dot, lower case as sent.
    pub name: String,
    pub qtype: u16,
}

/// The parts of a message the tests look at.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Message {
    pub id: u16,
    pub is_response: bool,
    pub rcode: u16,
    pub question: Question,
    /// The addresses of the A and AAAA records of the answer section, in order.
    pub addrs: Vec<IpAddr>,
    /// Where the question ends (the answer section starts).
    question_end: usize,
    /// Offsets of the A/AAAA record data, parallel to `addrs`.
    addr_offsets: Vec<usize>,
}

fn be16(msg: &[u8], at: usize) -> Result<u16, WireError> {
    let bytes = msg.get(at..at + 2).ok_or(WireError::Truncated)?;
    Ok(u16::from_be_bytes([bytes[0], bytes[1]]))
}

/// `name` as labels, e.g. `svc.rdt.test` → `3svc3rdt4test0`.
fn encode_name(name: &str) -> Result<Vec<u8>, WireError> {
    let bad = || WireError::BadName(name.to_owned());
    let mut out = Vec::new();
    for label in name.trim_end_matches('.').split('.') {
        if label.is_empty() || label.len() > 63 {
            return Err(bad());
        }
        out.push(label.len() as u8);
        out.extend_from_slice(label.as_bytes());
    }
    out.push(0);
    if out.len() > 255 {
        return Err(bad());
    }
    Ok(out)
}

/// Reads the name at `at` (following pointers); returns it and the offset after it in the
/// message as laid out (after the first pointer, if any).
fn read_name(msg: &[u8], at: usize) -> Result<(String, usize), WireError> {
    let mut labels: Vec<String> = Vec::new();
    let mut pos = at;
    let mut end = None;
    let mut jumps = 0;
    loop {
        let len = *msg.get(pos).ok_or(WireError::Truncated)?;
        match len {
            0 => {
                let name = labels.join(".");
                return Ok((name, end.unwrap_or(pos + 1)));
            }
            l if l & 0xc0 == 0xc0 => {
                jumps += 1;
                if jumps > MAX_POINTERS {
                    return Err(WireError::PointerLoop);
                }
                let target = usize::from(be16(msg, pos)? & 0x3fff);
                end.get_or_insert(pos + 2);
                pos = target;
            }
            l if l > 63 => return Err(WireError::BadName(format!("label length {l}"))),
            l => {
                let label = msg
                    .get(pos + 1..pos + 1 + usize::from(l))
                    .ok_or(WireError::Truncated)?;
                labels.push(String::from_utf8_lossy(label).into_owned());
                pos += 1 + usize::from(l);
            }
        }
    }
}

/// A standard query (RD set) for `name` of type `qtype`.
pub fn query(id: u16, name: &str, qtype: u16) -> Result<Vec<u8>, WireError> {
    let mut msg = Vec::with_capacity(HEADER_LEN + name.len() + 6);
    msg.extend_from_slice(&id.to_be_bytes());
    msg.extend_from_slice(&FLAG_RD.to_be_bytes());
    msg.extend_from_slice(&[0, 1, 0, 0, 0, 0, 0, 0]); // 1 question, no records
    msg.extend_from_slice(&encode_name(name)?);
    msg.extend_from_slice(&qtype.to_be_bytes());
    msg.extend_from_slice(&CLASS_IN.to_be_bytes());
    Ok(msg)
}

/// Parses a query or a reply with exactly one question.
pub fn parse(msg: &[u8]) -> Result<Message, WireError> {
    let id = be16(msg, 0)?;
    let flags = be16(msg, 2)?;
    let questions = be16(msg, 4)?;
    let answers = be16(msg, 6)?;
    if questions != 1 {
        return Err(WireError::QuestionCount(questions));
    }
    let (name, after_name) = read_name(msg, HEADER_LEN)?;
    let qtype = be16(msg, after_name)?;
    be16(msg, after_name + 2)?; // class
    let question_end = after_name + 4;
    let mut pos = question_end;
    let mut addrs = Vec::new();
    let mut addr_offsets = Vec::new();
    for _ in 0..answers {
        let (_, after_owner) = read_name(msg, pos)?;
        let rtype = be16(msg, after_owner)?;
        let rdlen = usize::from(be16(msg, after_owner + 8)?);
        let rdata_at = after_owner + 10;
        let rdata = msg
            .get(rdata_at..rdata_at + rdlen)
            .ok_or(WireError::Truncated)?;
        let addr = match (rtype, rdlen) {
            (TYPE_A, 4) => Some(IpAddr::from(<[u8; 4]>::try_from(rdata).expect("4 bytes"))),
            (TYPE_AAAA, 16) => Some(IpAddr::from(<[u8; 16]>::try_from(rdata).expect("16 bytes"))),
            _ => None,
        };
        if let Some(addr) = addr {
            addrs.push(addr);
            addr_offsets.push(rdata_at);
        }
        pos = rdata_at + rdlen;
    }
    Ok(Message {
        id,
        is_response: flags & FLAG_QR != 0,
        rcode: flags & RCODE_MASK,
        question: Question { name, qtype },
        addrs,
        question_end,
        addr_offsets,
    })
}

/// The reply header for `query` (its ID and RD, QR and RA set) and its question.
fn reply_head(query: &[u8], parsed: &Message, rcode: u16, answers: u16) -> Vec<u8> {
    let rd = be16(query, 2).unwrap_or(0) & FLAG_RD;
    let mut msg = Vec::with_capacity(parsed.question_end + 28);
    msg.extend_from_slice(&parsed.id.to_be_bytes());
    msg.extend_from_slice(&(FLAG_QR | rd | FLAG_RA | rcode).to_be_bytes());
    msg.extend_from_slice(&[0, 1]);
    msg.extend_from_slice(&answers.to_be_bytes());
    msg.extend_from_slice(&[0, 0, 0, 0]);
    msg.extend_from_slice(&query[HEADER_LEN..parsed.question_end]);
    msg
}

/// The answer to `query`: for A one record with `v4`, for AAAA one with `v6` if given; any
/// other question gets an empty NOERROR reply.
pub fn answer(query: &[u8], v4: Ipv4Addr, v6: Option<Ipv6Addr>) -> Result<Vec<u8>, WireError> {
    let parsed = parse(query)?;
    let rdata: Option<Vec<u8>> = match parsed.question.qtype {
        TYPE_A => Some(v4.octets().to_vec()),
        TYPE_AAAA => v6.map(|v6| v6.octets().to_vec()),
        _ => None,
    };
    let mut msg = reply_head(query, &parsed, 0, u16::from(rdata.is_some()));
    if let Some(rdata) = rdata {
        msg.extend_from_slice(&POINTER_TO_QUESTION);
        msg.extend_from_slice(&parsed.question.qtype.to_be_bytes());
        msg.extend_from_slice(&CLASS_IN.to_be_bytes());
        msg.extend_from_slice(&TTL.to_be_bytes());
        msg.extend_from_slice(&(rdata.len() as u16).to_be_bytes());
        msg.extend_from_slice(&rdata);
    }
    Ok(msg)
}

/// A SERVFAIL reply to `query` (the proxy's answer when its upstream failed).
pub fn servfail(query: &[u8]) -> Result<Vec<u8>, WireError> {
    let parsed = parse(query)?;
    Ok(reply_head(query, &parsed, RCODE_SERVFAIL, 0))
}

/// Replaces the address of every A record of `reply` with `v4` and, when given, of every
/// AAAA record with `v6`; returns how many records were rewritten.
pub fn rewrite_addrs(
    reply: &mut [u8],
    v4: Ipv4Addr,
    v6: Option<Ipv6Addr>,
) -> Result<usize, WireError> {
    let parsed = parse(reply)?;
    let mut rewritten = 0;
    for (addr, &at) in parsed.addrs.iter().zip(&parsed.addr_offsets) {
        let new = match (addr, v6) {
            (IpAddr::V4(_), _) => v4.octets().to_vec(),
            (IpAddr::V6(_), Some(v6)) => v6.octets().to_vec(),
            (IpAddr::V6(_), None) => continue,
        };
        reply[at..at + new.len()].copy_from_slice(&new);
        rewritten += 1;
    }
    Ok(rewritten)
}

#[cfg(test)]
mod tests {
    use super::*;

    const V4: Ipv4Addr = Ipv4Addr::new(192, 0, 2, 1);

    #[test]
    fn answer_copies_id_and_question_and_points_at_it() {
        let q = query(0xbeef, "svc.rdt.test", TYPE_A).unwrap();
        let reply = answer(&q, V4, None).unwrap();
        let parsed = parse(&reply).unwrap();
        assert_eq!(parsed.id, 0xbeef);
        assert!(parsed.is_response);
        assert_eq!(parsed.rcode, 0);
        assert_eq!(
            parsed.question,
            Question {
                name: "svc.rdt.test".into(),
                qtype: TYPE_A
            }
        );
        assert_eq!(parsed.addrs, vec![IpAddr::from(V4)]);
        // QR, RD (copied), RA.
        assert_eq!(be16(&reply, 2).unwrap(), 0x8180);
        // The record's owner is a pointer to the question name.
        assert_eq!(&reply[q.len()..q.len() + 2], &POINTER_TO_QUESTION);
    }

    #[test]
    fn aaaa_answered_only_with_an_ipv6_address() {
        let q = query(7, "svc.rdt.test.", TYPE_AAAA).unwrap();
        assert_eq!(
            parse(&answer(&q, V4, None).unwrap()).unwrap().addrs,
            Vec::<IpAddr>::new()
        );
        let v6: Ipv6Addr = "2001:db8::1".parse().unwrap();
        assert_eq!(
            parse(&answer(&q, V4, Some(v6)).unwrap()).unwrap().addrs,
            vec![IpAddr::from(v6)]
        );
    }

    #[test]
    fn rewrite_replaces_addresses_in_place() {
        let v6: Ipv6Addr = "2001:db8::1".parse().unwrap();
        let mut a = answer(&query(1, "x.test", TYPE_A).unwrap(), V4, None).unwrap();
        let mut aaaa = answer(&query(2, "x.test", TYPE_AAAA).unwrap(), V4, Some(v6)).unwrap();
        let new4 = Ipv4Addr::new(192, 0, 2, 53);
        let new6: Ipv6Addr = "2001:db8::53".parse().unwrap();
        assert_eq!(rewrite_addrs(&mut a, new4, Some(new6)).unwrap(), 1);
        assert_eq!(parse(&a).unwrap().addrs, vec![IpAddr::from(new4)]);
        assert_eq!(rewrite_addrs(&mut aaaa, new4, None).unwrap(), 0);
        assert_eq!(rewrite_addrs(&mut aaaa, new4, Some(new6)).unwrap(), 1);
        assert_eq!(parse(&aaaa).unwrap().addrs, vec![IpAddr::from(new6)]);
    }

    #[test]
    fn servfail_keeps_the_question() {
        let q = query(9, "x.test", TYPE_A).unwrap();
        let parsed = parse(&servfail(&q).unwrap()).unwrap();
        assert_eq!(
            (parsed.id, parsed.rcode, parsed.addrs.len()),
            (9, RCODE_SERVFAIL, 0)
        );
    }

    #[test]
    fn malformed_messages_are_errors_not_panics() {
        let q = query(1, "x.test", TYPE_A).unwrap();
        for cut in 0..q.len() {
            assert!(parse(&q[..cut]).is_err(), "cut at {cut}");
        }
        let mut looped = q.clone();
        looped[HEADER_LEN..HEADER_LEN + 2].copy_from_slice(&POINTER_TO_QUESTION);
        assert_eq!(parse(&looped), Err(WireError::PointerLoop));
        assert!(matches!(
            query(1, "a..b", TYPE_A),
            Err(WireError::BadName(_))
        ));
        // Not DNS at all: a probe server's line.
        assert!(parse(b"proxied name=inbound local=127.0.0.1:15006").is_err());
    }
}
