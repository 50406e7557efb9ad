//! Asking the running kernel whether it has a feature, as libbpf, bpftool and Cilium do:
//! by loading a program of two or three instructions that needs it (a program type with
//! its attach type, a helper call, a context field read), by a bpf(2) command's answer to
//! an argument it must refuse, or by a socket option. A version number cannot tell:
//! distribution kernels carry features under older numbers, or lack them under newer ones.

use std::io;

use aya_obj::generated::bpf_insn;

use crate::sys::bpf_sys::{self, insn, op};
/// The program types, attach types and helpers the probes name.
pub use crate::sys::bpf_sys::{attach_type as attach, helper, prog_type};

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

/// `offsetof(struct bpf_sk_lookup, ingress_ifindex)`.
pub const SK_LOOKUP_INGRESS_IFINDEX: i16 = 64;

/// `r0 = 1; exit`: accepted by every program type the probes load (1 is "allow" or
/// "pass" for each).
fn return_one() -> [bpf_insn; 2] {
    [insn(op::MOV64_IMM, 0, 0, 0, 1), insn(op::EXIT, 0, 0, 0, 0)]
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
            let call = insn(op::CALL, 0, 0, 0, helper);
            loads(prog_type, attach, &[call, ret, exit])
        }
        Probe::ContextField {
            prog_type,
            attach,
            offset,
        } => {
            let read = insn(op::LDX_W, 2, 1, offset, 0);
            loads(prog_type, attach, &[read, ret, exit])
        }
        Probe::LinkCreate => bpf_sys::link_create_known(),
        Probe::SocketOption(option) => socket_option_answers(option),
    }
}

/// Whether the program loads: refused as invalid (EINVAL: unknown type, attach type or
/// helper) or as an access the verifier does not allow (EACCES: an unknown context field)
/// means the kernel lacks what it needs; any other error is the probe failing.
fn loads(prog_type: u32, attach: u32, insns: &[bpf_insn]) -> io::Result<bool> {
    let mut log = vec![0u8; 4096];
    match bpf_sys::prog_load(prog_type, attach, insns, "", &mut log) {
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
