//! The cookie of the calling thread's network namespace, the pod's identity everywhere (what
//! `bpf_get_netns_cookie` returns in the programs): read with SO_NETNS_COOKIE (Linux 5.14),
//! or on a kernel without that option (5.10–5.13) stamped by a tiny cgroup sock_create
//! program on a socket made in the namespace, and read back from the socket.

use std::{
    fs, io,
    os::fd::{AsFd, AsRawFd, BorrowedFd, FromRawFd, OwnedFd},
    sync::OnceLock,
};

use redirector_common::NetnsCookie;

use aya_obj::generated::bpf_insn;

use crate::sys::bpf_sys::{
    self, attach_type as attach, helper, insn,
    op::{CALL, EXIT, JNE_IMM, LDX_W, MOV64_IMM, MOV64_REG, RSH64_IMM, STX_W},
    prog_type,
};
use crate::sys::kernel::{fallback_forced_for, keys};
use crate::sys::kernel_probe::verifier_note;

/// The cookie of the calling thread's network namespace.
pub fn of_current_thread() -> io::Result<NetnsCookie> {
    // The option's own answer is the probe (no socket made for a probe first: this runs
    // for every pod); the stamp where the kernel lacks it or the fallback is forced.
    static FORCED: OnceLock<bool> = OnceLock::new();
    if !*FORCED.get_or_init(|| fallback_forced_for(keys::SO_NETNS_COOKIE)) {
        match from_socket_option() {
            Err(e) if e.raw_os_error() == Some(libc::ENOPROTOOPT) => {}
            read => return read,
        }
    }
    stamped()
}

/// SO_NETNS_COOKIE of a socket made here (any socket: a unix one ties up nothing).
fn from_socket_option() -> io::Result<NetnsCookie> {
    let sock = socket(libc::AF_UNIX, libc::SOCK_DGRAM, 0)?;
    option::<u64>(&sock, libc::SO_NETNS_COOKIE).map(NetnsCookie)
}

/// The protocol of the stamped socket: 253, kept for experimentation (RFC 3692), so no
/// other socket made in the cgroup while the program is attached has it.
const STAMPED_PROTOCOL: i32 = 253;

// `offsetof(struct bpf_sock, …)`: the fields the stamp reads and writes (mark and priority
// are writable at sock_create).
const SK_TYPE: i16 = 8;
const SK_PROTOCOL: i16 = 12;
const SK_MARK: i16 = 16;
const SK_PRIORITY: i16 = 20;

/// The stamp: on a raw socket of [`STAMPED_PROTOCOL`] only, the namespace's cookie into the
/// socket's mark (low half) and priority (high half); every socket allowed.
fn stamp_instructions() -> [bpf_insn; 11] {
    let (socket_type, netns_cookie) = (libc::SOCK_RAW, helper::GET_NETNS_COOKIE);
    [
        insn(MOV64_REG, 6, 1, 0, 0),              // r6 = ctx (a call clobbers r1)
        insn(LDX_W, 2, 1, SK_TYPE, 0),            // r2 = sk->type
        insn(JNE_IMM, 2, 0, 6, socket_type),      // not raw: to "allow"
        insn(LDX_W, 2, 1, SK_PROTOCOL, 0),        // r2 = sk->protocol
        insn(JNE_IMM, 2, 0, 4, STAMPED_PROTOCOL), // another protocol: to "allow"
        insn(CALL, 0, 0, 0, netns_cookie),        // r0 = cookie of ctx's netns
        insn(STX_W, 6, 0, SK_MARK, 0),            // sk->mark = low half
        insn(RSH64_IMM, 0, 0, 0, 32),             // r0 >>= 32
        insn(STX_W, 6, 0, SK_PRIORITY, 0),        // sk->priority = high half
        insn(MOV64_IMM, 0, 0, 0, 1),              // allow
        insn(EXIT, 0, 0, 0, 0),
    ]
}

/// The stamp program, loaded once per process and kept: only attaching it is per call.
fn stamp_program() -> io::Result<BorrowedFd<'static>> {
    static PROGRAM: OnceLock<OwnedFd> = OnceLock::new();
    if let Some(program) = PROGRAM.get() {
        return Ok(program.as_fd());
    }
    // Kernels without SO_NETNS_COOKIE charge BPF memory to RLIMIT_MEMLOCK too (memcg
    // accounting came in 5.11): a low limit refuses even this program, with EPERM.
    crate::sys::kernel::raise_memlock_where_needed();
    let mut log = vec![0u8; 64 * 1024];
    let loaded = bpf_sys::prog_load(
        prog_type::CGROUP_SOCK,
        attach::CGROUP_INET_SOCK_CREATE,
        &stamp_instructions(),
        "",
        &mut log,
    )
    .map_err(|e| {
        io::Error::new(
            e.kind(),
            format!(
                "loading the program that stamps a socket with its netns cookie: {e}{}",
                verifier_note(&log)
            ),
        )
    })?;
    // Two threads may both load it: the second's copy is closed here.
    Ok(PROGRAM.get_or_init(|| loaded).as_fd())
}

/// The cookie as the stamp program writes it on a raw socket made here: attached (by a
/// link, so a process killed meanwhile leaves nothing attached) at the calling thread's
/// cgroup for as long as one socket takes to make.
fn stamped() -> io::Result<NetnsCookie> {
    let program = stamp_program()?;
    let (cgroup, path) = thread_cgroup()?;
    let link = bpf_sys::link_create(program, cgroup.as_fd(), attach::CGROUP_INET_SOCK_CREATE)
        .map_err(context(format!(
            "attaching the netns cookie stamp at cgroup {path}"
        )))?;
    let sock = socket(libc::AF_INET, libc::SOCK_RAW, STAMPED_PROTOCOL).map_err(context(
        format!("making a raw socket of protocol {STAMPED_PROTOCOL} for the stamp"),
    ))?;
    // The program runs when a socket is made, so it can go at once.
    drop(link);
    let low = option::<u32>(&sock, libc::SO_MARK).map_err(context("reading SO_MARK".into()))?;
    let high =
        option::<u32>(&sock, libc::SO_PRIORITY).map_err(context("reading SO_PRIORITY".into()))?;
    match u64::from(high) << 32 | u64::from(low) {
        0 => Err(io::Error::other(format!(
            "the netns cookie stamp at cgroup {path} did not run on a socket made there"
        ))),
        cookie => Ok(NetnsCookie(cookie)),
    }
}

/// An error with the step that failed named before it; its kind kept.
fn context(what: String) -> impl FnOnce(io::Error) -> io::Error {
    move |e| io::Error::new(e.kind(), format!("{what}: {e}"))
}

/// The calling thread's cgroup v2 directory, open, and its path: the cgroup its sockets
/// are made in.
fn thread_cgroup() -> io::Result<(fs::File, String)> {
    let mount = crate::sys::cgroup::cgroup2_mount().map_err(io::Error::other)?;
    let own = fs::read_to_string("/proc/thread-self/cgroup")
        .map_err(context("reading /proc/thread-self/cgroup".into()))?;
    let relative = own
        .lines()
        .find_map(|l| l.strip_prefix("0::"))
        .ok_or_else(|| io::Error::other("no cgroup v2 line in /proc/thread-self/cgroup"))?;
    let dir = mount.join(relative.trim().trim_start_matches('/'));
    let path = dir.display().to_string();
    let file = fs::File::open(&dir).map_err(context(format!("opening cgroup {path}")))?;
    Ok((file, path))
}

/// A new socket, close-on-exec.
fn socket(domain: i32, kind: i32, protocol: i32) -> io::Result<OwnedFd> {
    // SAFETY: socket(2); the descriptor is owned right below.
    let fd = unsafe { libc::socket(domain, kind | libc::SOCK_CLOEXEC, protocol) };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: `fd` is a new descriptor nobody else owns.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

/// A SOL_SOCKET option of `T`'s size (a u32 for the stamp's halves, a u64 for the cookie).
fn option<T: Copy + Default>(sock: &OwnedFd, option: i32) -> io::Result<T> {
    let mut value = T::default();
    let mut len = size_of::<T>() as libc::socklen_t;
    // SAFETY: the buffer and its length describe `value`, a plain integer.
    let ret = unsafe {
        libc::getsockopt(
            sock.as_raw_fd(),
            libc::SOL_SOCKET,
            option,
            (&raw mut value).cast(),
            &mut len,
        )
    };
    if ret != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(value)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn skips_in_the_stamp_land_on_allow() {
        let program = stamp_instructions();
        let allow = |i: &bpf_insn| i.code == MOV64_IMM && i.dst_reg() == 0 && i.imm == 1;
        for (at, instruction) in program.iter().enumerate() {
            if instruction.code == JNE_IMM {
                let to = at + 1 + instruction.off as usize;
                assert!(allow(&program[to]), "the jump at {at}");
            }
        }
        assert!(allow(&program[program.len() - 2]));
    }
}
