//! A stand-in for a socket load-balancer (Cilium's, Calico's connect-time one): a cgroup
//! connect4 program that rewrites connections to one "ClusterIP" address and port to a
//! backend, attached with BPF_F_ALLOW_MULTI at a cgroup as Cilium 1.14+ attaches at the
//! root. Built from raw instructions, so no compiler is needed, and loaded and attached
//! through redirector's own bpf(2) calls; detached on drop.

use std::net::SocketAddrV4;
use std::os::fd::{AsFd, OwnedFd};

use redirector::sys::bpf_sys::{self, attach_type, insn, op, prog_type};

use crate::Cgroup;

/// `struct bpf_sock_addr`: `user_ip4` and `user_port`, both in network byte order.
const USER_IP4: i16 = 4;
const USER_PORT: i16 = 24;

pub struct SocketLb {
    prog: OwnedFd,
    cgroup: std::fs::File,
}

/// An address or port as the program reads it: network byte order, loaded as a u32.
fn be_ip(addr: &SocketAddrV4) -> i32 {
    u32::from_ne_bytes(addr.ip().octets()) as i32
}

fn be_port(addr: &SocketAddrV4) -> i32 {
    i32::from(u16::from_ne_bytes(addr.port().to_be_bytes()))
}

impl SocketLb {
    /// Connections to `cluster_ip` from processes in `cgroup` or below go to `backend`.
    pub fn attach(cgroup: &Cgroup, cluster_ip: SocketAddrV4, backend: SocketAddrV4) -> Self {
        use op::{EXIT, JNE32_IMM, LDX_W, MOV32_IMM, MOV64_IMM, STX_W};
        let program = [
            insn(LDX_W, 2, 1, USER_IP4, 0),
            insn(JNE32_IMM, 2, 0, 6, be_ip(&cluster_ip)),
            insn(LDX_W, 2, 1, USER_PORT, 0),
            insn(JNE32_IMM, 2, 0, 4, be_port(&cluster_ip)),
            insn(MOV32_IMM, 3, 0, 0, be_ip(&backend)),
            insn(STX_W, 1, 3, USER_IP4, 0),
            insn(MOV32_IMM, 3, 0, 0, be_port(&backend)),
            insn(STX_W, 1, 3, USER_PORT, 0),
            insn(MOV64_IMM, 0, 0, 0, 1),
            insn(EXIT, 0, 0, 0, 0),
        ];
        let prog = bpf_sys::prog_load(
            prog_type::CGROUP_SOCK_ADDR,
            attach_type::CGROUP_INET4_CONNECT,
            &program,
            "socket_lb",
            &mut [],
        )
        .expect("loading the stand-in socket LB");
        let cgroup = std::fs::File::open(cgroup.path()).expect("opening the cgroup");
        bpf_sys::prog_attach(
            prog.as_fd(),
            cgroup.as_fd(),
            attach_type::CGROUP_INET4_CONNECT,
            None,
        )
        .expect("attaching the stand-in socket LB");
        SocketLb { prog, cgroup }
    }
}

impl Drop for SocketLb {
    fn drop(&mut self) {
        let detached = bpf_sys::prog_detach(
            self.prog.as_fd(),
            self.cgroup.as_fd(),
            attach_type::CGROUP_INET4_CONNECT,
        );
        if let Err(err) = detached {
            eprintln!("warning: detaching the stand-in socket LB: {err}");
        }
    }
}
