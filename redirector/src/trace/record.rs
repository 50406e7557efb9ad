//! A trace ring's record read back: its bytes, as the programs wrote them, into the
//! [`TraceRecord`] of the format they open with.

use redirector_common::{trace::FORMAT, TraceRecord};

/// A record this release does not read.
#[derive(Debug, PartialEq, Eq, thiserror::Error)]
pub enum RecordError {
    #[error("an empty trace record")]
    Empty,
    #[error("a trace record of format {0}, and this redirector reads format {FORMAT} (a newer release's programs wrote it)")]
    UnknownFormat(u8),
    #[error("a trace record of format {FORMAT} with {0} bytes, not {len}", len = size_of::<TraceRecord>())]
    Length(usize),
}

/// `bytes`, one record of the ring, as the record it holds.
pub fn decode(bytes: &[u8]) -> Result<TraceRecord, RecordError> {
    match bytes.first() {
        None => Err(RecordError::Empty),
        Some(&format) if format != FORMAT => Err(RecordError::UnknownFormat(format)),
        Some(_) if bytes.len() != size_of::<TraceRecord>() => Err(RecordError::Length(bytes.len())),
        Some(_) => Ok(bytemuck::pod_read_unaligned(bytes)),
    }
}

#[cfg(test)]
mod tests {
    use std::net::{Ipv4Addr, Ipv6Addr};

    use redirector_common::{
        kernel_abi::IPPROTO_TCP,
        trace::{DST_V6, INBOUND, OUTBOUND, SRC_V6},
        RawIp, Reason,
    };

    use super::*;

    fn record() -> TraceRecord {
        TraceRecord {
            format: FORMAT,
            reason: Reason::Redirected as u8,
            direction: OUTBOUND,
            protocol: IPPROTO_TCP,
            dst_port: 80,
            to: 15001,
            netns_cookie: 4097,
            uid: 1000,
            gid: 1001,
            src: RawIp::from_ip(Ipv6Addr::LOCALHOST.into()),
            dst: RawIp::from_ip(Ipv4Addr::new(10, 9, 8, 7).into()),
            families: SRC_V6,
            _reserved: [0; 7],
        }
    }

    #[test]
    fn format_1_bytes_read_back_field_by_field() {
        // Format 1 as the programs (bpfel) write it, byte by byte: a change of the layout
        // that keeps the format fails here.
        let mut bytes = [0u8; 64];
        bytes[..8].copy_from_slice(&[
            1,
            Reason::SteeredInbound as u8,
            INBOUND,
            6,
            0x1f,
            0x90,
            0x7e,
            0x3a,
        ]);
        bytes[8..16].copy_from_slice(&77u64.to_le_bytes());
        bytes[24..28].copy_from_slice(&[10, 0, 0, 1]);
        bytes[40..56].copy_from_slice(&Ipv6Addr::LOCALHOST.octets());
        bytes[56] = DST_V6;
        let got = decode(&bytes).unwrap();
        assert_eq!(
            got,
            TraceRecord {
                format: 1,
                reason: Reason::SteeredInbound as u8,
                direction: INBOUND,
                protocol: IPPROTO_TCP,
                dst_port: u16::from_le_bytes([0x1f, 0x90]),
                to: u16::from_le_bytes([0x7e, 0x3a]),
                netns_cookie: 77,
                uid: 0,
                gid: 0,
                src: RawIp::from_ip(Ipv4Addr::new(10, 0, 0, 1).into()),
                dst: RawIp::from_ip(Ipv6Addr::LOCALHOST.into()),
                families: DST_V6,
                _reserved: [0; 7],
            }
        );
    }

    #[test]
    fn a_record_reads_back_as_written() {
        let record = record();
        assert_eq!(decode(bytemuck::bytes_of(&record)), Ok(record));
    }

    #[test]
    fn an_unknown_format_or_a_wrong_length_is_refused() {
        let record = record();
        let bytes = bytemuck::bytes_of(&record);
        let mut newer = bytes.to_vec();
        newer[0] = FORMAT + 1;
        assert_eq!(decode(&newer), Err(RecordError::UnknownFormat(FORMAT + 1)));
        // A record of format 0 would be one a program wrote with the field unset.
        newer[0] = 0;
        assert_eq!(decode(&newer), Err(RecordError::UnknownFormat(0)));
        assert_eq!(decode(&bytes[..56]), Err(RecordError::Length(56)));
        let mut longer = bytes.to_vec();
        longer.extend([0; 8]);
        assert_eq!(decode(&longer), Err(RecordError::Length(72)));
        assert_eq!(decode(&[]), Err(RecordError::Empty));
        let err = decode(&[FORMAT + 1; 64]).unwrap_err().to_string();
        let (newer, ours) = (
            format!("format {}", FORMAT + 1),
            format!("reads format {FORMAT}"),
        );
        assert!(err.contains(&newer) && err.contains(&ours), "{err}");
    }
}
