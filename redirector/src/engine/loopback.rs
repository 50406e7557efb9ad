//! The one address redirector adds to a pod: ::6 on `lo`.

use std::io;

use redirector_common::decision::INBOUND_PASSTHROUGH_V6;

use crate::sys::netns::{Netns, NetnsError};

#[derive(Debug, thiserror::Error)]
pub enum LoopbackError {
    #[error(transparent)]
    Netns(#[from] NetnsError),
    #[error("adding ::6/128 to lo: {0}")]
    Add(io::Error),
}

/// Add the inbound passthrough source ::6/128 to the pod's `lo` (already there: fine).
pub fn add_inbound_passthrough(netns: &Netns) -> Result<(), LoopbackError> {
    netns
        .run(add_inbound_passthrough_v6)?
        .map_err(LoopbackError::Add)
}

/// Add ::6/128 to `lo`, as istio-iptables does when IPv6 is on: the proxy binds it as the
/// source of inbound passthrough connections over IPv6 (127.0.0.6 is already in 127/8).
fn add_inbound_passthrough_v6() -> io::Result<()> {
    const RTM_NEWADDR: u16 = 20;
    const IFA_ADDRESS: u16 = 1;
    const IFA_LOCAL: u16 = 2;
    const IFA_F_NODAD: u8 = 0x02;
    const RT_SCOPE_HOST: u8 = 254;
    // SAFETY: a NUL-terminated name.
    let lo = unsafe { libc::if_nametoindex(c"lo".as_ptr()) };
    if lo == 0 {
        return Err(io::Error::last_os_error());
    }
    let addr = INBOUND_PASSTHROUGH_V6.octets();
    // struct ifaddrmsg, then two rtattrs holding the address.
    let mut body = vec![libc::AF_INET6 as u8, 128, IFA_F_NODAD, RT_SCOPE_HOST];
    body.extend_from_slice(&lo.to_ne_bytes());
    for kind in [IFA_LOCAL, IFA_ADDRESS] {
        body.extend_from_slice(&20u16.to_ne_bytes());
        body.extend_from_slice(&kind.to_ne_bytes());
        body.extend_from_slice(&addr);
    }
    crate::sys::netlink::create(RTM_NEWADDR, &body)
}
