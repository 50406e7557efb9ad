//! A stand-in for a socket load-balancer (Cilium's, Calico's connect-time one): a cgroup
//! connect4 program that rewrites connections to one "ClusterIP" address and port to a
//! backend, attached with BPF_F_ALLOW_MULTI at a cgroup as Cilium 1.14+ attaches at the
//! root. Built from raw instructions, so no compiler is needed; detached on drop.

use std::io;
use std::net::SocketAddrV4;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};

use crate::Cgroup;

const BPF_PROG_LOAD: libc::c_long = 5;
const BPF_PROG_ATTACH: libc::c_long = 8;
const BPF_PROG_DETACH: libc::c_long = 9;
const BPF_PROG_TYPE_CGROUP_SOCK_ADDR: u32 = 18;
const BPF_CGROUP_INET4_CONNECT: u32 = 10;
const BPF_F_ALLOW_MULTI: u32 = 2;

/// `struct bpf_sock_addr`: `user_ip4` and `user_port`, both in network byte order.
const USER_IP4: i16 = 4;
const USER_PORT: i16 = 24;

pub struct SocketLb {
    prog: OwnedFd,
    cgroup: std::fs::File,
}

fn insn(code: u8, dst: u8, src: u8, off: i16, imm: i32) -> u64 {
    u64::from(code)
        | u64::from(dst | (src << 4)) << 8
        | u64::from(off as u16) << 16
        | u64::from(imm as u32) << 32
}

fn bpf(cmd: libc::c_long, attr: &mut [u32; 32]) -> io::Result<i64> {
    // SAFETY: `attr` is a zero-filled `union bpf_attr` of the size passed.
    let ret = unsafe { libc::syscall(libc::SYS_bpf, cmd, attr.as_mut_ptr(), 128u32) };
    if ret < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(ret)
    }
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
        const LDX_W: u8 = 0x61; // r_dst = *(u32 *)(r_src + off)
        const STX_W: u8 = 0x63; // *(u32 *)(r_dst + off) = r_src
        const JNE32_K: u8 = 0x56; // if (u32)r_dst != imm goto +off
        const MOV_K: u8 = 0xb7; // r_dst = imm
        const MOV32_K: u8 = 0xb4; // w_dst = imm (zero-extended)
        const EXIT: u8 = 0x95;
        let program = [
            insn(LDX_W, 2, 1, USER_IP4, 0),
            insn(JNE32_K, 2, 0, 6, be_ip(&cluster_ip)),
            insn(LDX_W, 2, 1, USER_PORT, 0),
            insn(JNE32_K, 2, 0, 4, be_port(&cluster_ip)),
            insn(MOV32_K, 3, 0, 0, be_ip(&backend)),
            insn(STX_W, 1, 3, USER_IP4, 0),
            insn(MOV32_K, 3, 0, 0, be_port(&backend)),
            insn(STX_W, 1, 3, USER_PORT, 0),
            insn(MOV_K, 0, 0, 0, 1),
            insn(EXIT, 0, 0, 0, 0),
        ];
        let license = c"GPL";
        let mut attr = [0u32; 32];
        attr[0] = BPF_PROG_TYPE_CGROUP_SOCK_ADDR;
        attr[1] = program.len() as u32;
        let insns = program.as_ptr() as u64;
        (attr[2], attr[3]) = (insns as u32, (insns >> 32) as u32);
        let lic = license.as_ptr() as u64;
        (attr[4], attr[5]) = (lic as u32, (lic >> 32) as u32);
        // prog_name (bytes 48..64): "socket_lb".
        let name = *b"socket_lb\0\0\0\0\0\0\0";
        for (i, chunk) in name.chunks(4).enumerate() {
            attr[12 + i] = u32::from_ne_bytes(chunk.try_into().unwrap());
        }
        attr[17] = BPF_CGROUP_INET4_CONNECT;
        let fd = bpf(BPF_PROG_LOAD, &mut attr).expect("loading the stand-in socket LB");
        // SAFETY: the kernel returned a new descriptor that we now own.
        let prog = unsafe { OwnedFd::from_raw_fd(fd as i32) };
        let cgroup = std::fs::File::open(cgroup.path()).expect("opening the cgroup");
        let mut attr = [0u32; 32];
        attr[0] = cgroup.as_raw_fd() as u32;
        attr[1] = prog.as_raw_fd() as u32;
        attr[2] = BPF_CGROUP_INET4_CONNECT;
        attr[3] = BPF_F_ALLOW_MULTI;
        bpf(BPF_PROG_ATTACH, &mut attr).expect("attaching the stand-in socket LB");
        SocketLb { prog, cgroup }
    }
}

impl Drop for SocketLb {
    fn drop(&mut self) {
        let mut attr = [0u32; 32];
        attr[0] = self.cgroup.as_raw_fd() as u32;
        attr[1] = self.prog.as_raw_fd() as u32;
        attr[2] = BPF_CGROUP_INET4_CONNECT;
        if let Err(err) = bpf(BPF_PROG_DETACH, &mut attr) {
            eprintln!("warning: detaching the stand-in socket LB: {err}");
        }
    }
}
