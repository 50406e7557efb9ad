//! ZDS's messages (package `istio.workload.zds`), as protobuf, one message per packet.
//! Written from the protocol's field numbers; the agent sends [`WorkloadRequest`]s and
//! ztunnel answers each with a [`WorkloadResponse`], after a [`ZdsHello`] of its own.

use prost::Message as _;

/// Neither side takes a message larger than this: a longer one is cut, and refused.
pub const MAX_MESSAGE: usize = 1024;

#[derive(Clone, Copy, Debug, PartialEq, Eq, prost::Enumeration)]
#[repr(i32)]
pub enum Version {
    NotUsed = 0,
    V1 = 1,
}

/// ztunnel's first message on a connection.
#[derive(Clone, PartialEq, prost::Message)]
pub struct ZdsHello {
    #[prost(enumeration = "Version", tag = "1")]
    pub version: i32,
}

/// The workload ztunnel must find in what it knows (xDS), on its node.
#[derive(Clone, PartialEq, Eq, prost::Message)]
pub struct WorkloadInfo {
    #[prost(string, tag = "1")]
    pub name: String,
    #[prost(string, tag = "2")]
    pub namespace: String,
    #[prost(string, tag = "3")]
    pub service_account: String,
}

/// A pod to proxy; its network namespace travels beside it as the one fd of the packet.
#[derive(Clone, PartialEq, prost::Message)]
pub struct AddWorkload {
    #[prost(string, tag = "1")]
    pub uid: String,
    #[prost(message, optional, tag = "2")]
    pub workload_info: Option<WorkloadInfo>,
}

/// In a snapshot only: a pod the agent knows without its network namespace at hand.
#[derive(Clone, PartialEq, prost::Message)]
pub struct KeepWorkload {
    #[prost(string, tag = "1")]
    pub uid: String,
}

/// A pod gone or no longer enrolled. (Its uid is field 2, unlike the others'.)
#[derive(Clone, PartialEq, prost::Message)]
pub struct DelWorkload {
    #[prost(string, tag = "2")]
    pub uid: String,
}

/// The end of a snapshot: ztunnel drains every proxy it did not name.
#[derive(Clone, PartialEq, prost::Message)]
pub struct SnapshotSent {}

#[derive(Clone, PartialEq, prost::Message)]
pub struct WorkloadRequest {
    #[prost(oneof = "Request", tags = "1, 2, 3, 5")]
    pub payload: Option<Request>,
}

#[derive(Clone, PartialEq, prost::Oneof)]
pub enum Request {
    #[prost(message, tag = "1")]
    Add(AddWorkload),
    #[prost(message, tag = "2")]
    Del(DelWorkload),
    #[prost(message, tag = "3")]
    SnapshotSent(SnapshotSent),
    #[prost(message, tag = "5")]
    Keep(KeepWorkload),
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct WorkloadResponse {
    #[prost(oneof = "Response", tags = "1")]
    pub payload: Option<Response>,
}

#[derive(Clone, PartialEq, prost::Oneof)]
pub enum Response {
    #[prost(message, tag = "1")]
    Ack(Ack),
}

/// ztunnel's answer to every request: an empty error is success.
#[derive(Clone, PartialEq, prost::Message)]
pub struct Ack {
    #[prost(string, tag = "1")]
    pub error: String,
}

impl Request {
    /// The request as it goes on the wire.
    pub fn to_bytes(self) -> Vec<u8> {
        WorkloadRequest {
            payload: Some(self),
        }
        .encode_to_vec()
    }

    /// What a request names, for logs: `add <uid>`, `snapshot sent`.
    pub fn describe(&self) -> String {
        match self {
            Request::Add(add) => format!("add {}", add.uid),
            Request::Del(del) => format!("del {}", del.uid),
            Request::Keep(keep) => format!("keep {}", keep.uid),
            Request::SnapshotSent(_) => "snapshot sent".to_owned(),
        }
    }
}

/// A message from ztunnel that is not what the protocol allows there.
#[derive(Debug, thiserror::Error)]
pub enum WireError {
    #[error("not a ZDS message: {0}")]
    Decode(#[from] prost::DecodeError),
    #[error("a response without an ack")]
    NoAck,
}

/// A response that is an [`Ack`]: `Ok` on success, `Err` with ztunnel's reason.
pub fn decode_ack(bytes: &[u8]) -> Result<Result<(), String>, WireError> {
    match WorkloadResponse::decode(bytes)?.payload {
        Some(Response::Ack(ack)) if ack.error.is_empty() => Ok(Ok(())),
        Some(Response::Ack(ack)) => Ok(Err(ack.error)),
        None => Err(WireError::NoAck),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The bytes are the protocol's, field by field (tag = field << 3 | wire type).
    #[test]
    fn requests_carry_the_protocols_field_numbers() {
        let add = Request::Add(AddWorkload {
            uid: "u1".into(),
            workload_info: Some(WorkloadInfo {
                name: "p".into(),
                namespace: "n".into(),
                service_account: "s".into(),
            }),
        });
        // add = 1 (len 15): uid = 1 "u1", workload_info = 2 (len 9): 1 "p", 2 "n", 3 "s".
        assert_eq!(
            add.to_bytes(),
            [0x0a, 15, 0x0a, 2, b'u', b'1', 0x12, 9, 0x0a, 1, b'p', 0x12, 1, b'n', 0x1a, 1, b's']
        );
        // del = 2, its uid field 2.
        let del = Request::Del(DelWorkload { uid: "u1".into() });
        assert_eq!(del.to_bytes(), [0x12, 4, 0x12, 2, b'u', b'1']);
        // snapshot_sent = 3, empty.
        assert_eq!(Request::SnapshotSent(SnapshotSent {}).to_bytes(), [0x1a, 0]);
        // keep = 5.
        let keep = Request::Keep(KeepWorkload { uid: "u1".into() });
        assert_eq!(keep.to_bytes(), [0x2a, 4, 0x0a, 2, b'u', b'1']);
    }

    #[test]
    fn acks_and_hellos_are_read() {
        // ack = 1, empty: success.
        assert_eq!(decode_ack(&[0x0a, 0]).unwrap(), Ok(()));
        // ack = 1 with error = 1 "no".
        assert_eq!(
            decode_ack(&[0x0a, 4, 0x0a, 2, b'n', b'o']).unwrap(),
            Err("no".to_owned())
        );
        assert!(decode_ack(&[]).is_err(), "no payload is no ack");
        assert_eq!(
            ZdsHello::decode(&[0x08, 1][..]).unwrap().version(),
            Version::V1
        );
    }
}
