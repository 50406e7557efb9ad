//! Asking the running kernel whether it has a feature, as libbpf, bpftool and Cilium do:
//! by loading a program of two or three instructions that needs it (a program type with
//! its attach type, a helper call, a context field read), by a bpf(2) command's answer to
//! an argument it must refuse, or by a socket option. A version number cannot tell:
//! distribution kernels carry features under older numbers, or lack them under newer ones.

use std::io;

use crate::sys::bpf_sys;

/// What a probe asks the kernel.
#[derive(Clone, Copy, Debug)]
pub enum Probe {
    /// A program of this type loads for this attach type.
    Program { prog_type: u32, attach: u32 },
    /// Such a program may call this helper (`BPF_FUNC_*`).
    Helper {
        prog_type: u32,
        attach: u32,
        helper: i32,
    },
    /// Such a program may read the 32-bit context field at this offset.
    ContextField {
        prog_type: u32,
        attach: u32,
        offset: i16,
    },
    /// bpf(2) knows BPF_LINK_CREATE.
    LinkCreate,
    /// `getsockopt(SOL_SOCKET, option)` answers on a socket.
    SocketOption(i32),
}

/// `enum bpf_prog_type` values the probes use.
pub mod prog_type {
    pub const SOCKET_FILTER: u32 = 1;
    pub const CGROUP_SOCK: u32 = 9;
    pub const SOCK_OPS: u32 = 13;
    pub const CGROUP_SOCK_ADDR: u32 = 18;
    pub const CGROUP_SOCKOPT: u32 = 25;
    pub const SK_LOOKUP: u32 = 30;
}

/// `enum bpf_attach_type` values the probes use.
pub mod attach {
    pub const NONE: u32 = 0;
    pub const CGROUP_INET_SOCK_CREATE: u32 = 2;
    pub const CGROUP_SOCK_OPS: u32 = 3;
    pub const CGROUP_INET4_CONNECT: u32 = 10;
    pub const CGROUP_UDP4_SENDMSG: u32 = 14;
    pub const CGROUP_UDP4_RECVMSG: u32 = 19;
    pub const CGROUP_GETSOCKOPT: u32 = 21;
    pub const CGROUP_INET4_GETPEERNAME: u32 = 29;
    pub const SK_LOOKUP: u32 = 36;
}

/// `BPF_FUNC_*` helper ids the probes use.
pub mod helper {
    pub const GET_NETNS_COOKIE: i32 = 122;
    /// Came with memcg accounting of BPF memory (5.11): libbpf's sign of it too.
    pub const KTIME_GET_COARSE_NS: i32 = 160;
}

/// `offsetof(struct bpf_sk_lookup, ingress_ifindex)`.
pub const SK_LOOKUP_INGRESS_IFINDEX: i16 = 64;

// Instruction codes: BPF_ALU64|BPF_MOV|BPF_K, BPF_ALU64|BPF_MOV|BPF_X,
// BPF_ALU64|BPF_RSH|BPF_K, BPF_JMP|BPF_EXIT, BPF_JMP|BPF_CALL, BPF_JMP|BPF_JNE|BPF_K,
// BPF_LDX|BPF_MEM|BPF_W, BPF_STX|BPF_MEM|BPF_W.
pub(crate) const MOV64_IMM: u8 = 0xb7;
pub(crate) const MOV64_REG: u8 = 0xbf;
pub(crate) const RSH64_IMM: u8 = 0x77;
pub(crate) const EXIT: u8 = 0x95;
pub(crate) const CALL: u8 = 0x85;
pub(crate) const JNE_IMM: u8 = 0x55;
pub(crate) const LDX_W: u8 = 0x61;
pub(crate) const STX_W: u8 = 0x63;

/// One `struct bpf_insn` as the kernel reads it from memory: its register nibbles are a C
/// bitfield, whose order follows the byte order.
pub(crate) fn insn(code: u8, dst: u8, src: u8, off: i16, imm: i32) -> u64 {
    let regs = if cfg!(target_endian = "little") {
        dst | src << 4
    } else {
        dst << 4 | src
    };
    let mut bytes = [0u8; 8];
    bytes[0] = code;
    bytes[1] = regs;
    bytes[2..4].copy_from_slice(&off.to_ne_bytes());
    bytes[4..8].copy_from_slice(&imm.to_ne_bytes());
    u64::from_ne_bytes(bytes)
}

/// `r0 = 1; exit`: accepted by every program type the probes load (1 is "allow" or
/// "pass" for each).
fn return_one() -> [u64; 2] {
    [insn(MOV64_IMM, 0, 0, 0, 1), insn(EXIT, 0, 0, 0, 0)]
}

/// Runs the probe: whether the running kernel has the feature. An error is a probe that
/// could not tell (no permission to load programs, say).
pub fn run(probe: Probe) -> io::Result<bool> {
    let [ret, exit] = return_one();
    match probe {
        Probe::Program { prog_type, attach } => loads(prog_type, attach, &[ret, exit]),
        Probe::Helper {
            prog_type,
            attach,
            helper,
        } => {
            // r1 is the context at entry, a valid first argument for the helpers probed.
            let call = insn(CALL, 0, 0, 0, helper);
            loads(prog_type, attach, &[call, ret, exit])
        }
        Probe::ContextField {
            prog_type,
            attach,
            offset,
        } => {
            let read = insn(LDX_W, 2, 1, offset, 0);
            loads(prog_type, attach, &[read, ret, exit])
        }
        Probe::LinkCreate => bpf_sys::link_create_known(),
        Probe::SocketOption(option) => socket_option_answers(option),
    }
}

/// Whether the program loads: refused as invalid (EINVAL: unknown type, attach type or
/// helper) or as an access the verifier does not allow (EACCES: an unknown context field)
/// means the kernel lacks what it needs; any other error is the probe failing.
fn loads(prog_type: u32, attach: u32, insns: &[u64]) -> io::Result<bool> {
    let mut log = vec![0u8; 4096];
    match bpf_sys::prog_load(prog_type, attach, insns, &mut log) {
        Ok(_program) => Ok(true),
        Err(e) if matches!(e.raw_os_error(), Some(libc::EINVAL | libc::EACCES)) => Ok(false),
        Err(e) => Err(io::Error::new(
            e.kind(),
            format!("loading a probe program: {e}{}", verifier_note(&log)),
        )),
    }
}

/// The verifier's log (NUL-terminated in `log`) as a note for an error, if it said anything.
pub(crate) fn verifier_note(log: &[u8]) -> String {
    let end = log.iter().position(|&b| b == 0).unwrap_or(log.len());
    match String::from_utf8_lossy(&log[..end]).trim() {
        "" => String::new(),
        log => format!(" (verifier: {log})"),
    }
}

/// Whether `getsockopt(SOL_SOCKET, option)` answers on a UDP socket (ENOPROTOOPT: the
/// kernel does not know the option).
fn socket_option_answers(option: i32) -> io::Result<bool> {
    // SAFETY: plain socket(2); the descriptor is owned below.
    let fd = unsafe { libc::socket(libc::AF_INET, libc::SOCK_DGRAM | libc::SOCK_CLOEXEC, 0) };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: `fd` is a new descriptor we own.
    let socket = unsafe { <std::os::fd::OwnedFd as std::os::fd::FromRawFd>::from_raw_fd(fd) };
    let mut value = 0u64;
    let mut len = size_of::<u64>() as libc::socklen_t;
    // SAFETY: `value` and `len` are valid for the call; the socket is open.
    let ret = unsafe {
        libc::getsockopt(
            std::os::fd::AsRawFd::as_raw_fd(&socket),
            libc::SOL_SOCKET,
            option,
            (&raw mut value).cast(),
            &mut len,
        )
    };
    if ret == 0 {
        return Ok(true);
    }
    let err = io::Error::last_os_error();
    if err.raw_os_error() == Some(libc::ENOPROTOOPT) {
        Ok(false)
    } else {
        Err(err)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn instructions_are_laid_out_as_struct_bpf_insn() {
        // r2 = *(u32 *)(r1 + 64): code 0x61, dst 2 / src 1, off 64, imm 0.
        let bytes = insn(LDX_W, 2, 1, 64, 0).to_ne_bytes();
        assert_eq!(bytes[0], 0x61);
        if cfg!(target_endian = "little") {
            assert_eq!(bytes[1], 0x12);
        }
        assert_eq!(i16::from_ne_bytes([bytes[2], bytes[3]]), 64);
        let call = insn(CALL, 0, 0, 0, helper::GET_NETNS_COOKIE).to_ne_bytes();
        assert_eq!(i32::from_ne_bytes(call[4..8].try_into().unwrap()), 122);
        assert_eq!(return_one()[1].to_ne_bytes()[0], 0x95);
    }
}
