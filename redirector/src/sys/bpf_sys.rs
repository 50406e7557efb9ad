//! The few bpf(2) commands aya 0.14 does not expose for our use: loading a program from
//! raw instructions (the kernel probes), creating a cgroup link or netns link for any
//! attach type (aya cannot turn a `CgroupSockoptLink` into a pinnable link), updating and
//! detaching links, attaching at a cgroup with `BPF_F_REPLACE`, asking a cgroup which
//! programs it runs, pinning/opening objects by path, reading a hash map in batches,
//! walking its keys from a given one, and reading and writing entries as bytes of the
//! map's own sizes.
//!
//! One entry point, [`bpf`], takes the kernel's own `union bpf_attr`; each command below
//! fills in its own member of it. The kernel's definitions (`union bpf_attr`, the commands,
//! `struct bpf_prog_info`, `struct bpf_link_info`, `struct bpf_insn`, the program and
//! attach types) are aya-obj's bindings generated from the kernel's headers, for every
//! architecture.

use std::{
    ffi::CString,
    io,
    os::fd::{AsFd, AsRawFd, BorrowedFd, FromRawFd, OwnedFd},
    os::unix::ffi::OsStrExt,
    path::Path,
};

use aya_obj::generated::{
    bpf_attach_type, bpf_attr, bpf_cmd, bpf_func_id, bpf_insn, bpf_link_info, bpf_link_type,
    bpf_prog_info, bpf_prog_type, BPF_ALU, BPF_ALU64, BPF_CALL, BPF_EXIT, BPF_F_REPLACE, BPF_JMP,
    BPF_JMP32, BPF_JNE, BPF_K, BPF_LDX, BPF_MEM, BPF_MOV, BPF_RSH, BPF_STX, BPF_W, BPF_X,
};

/// How a program was attached at a cgroup (BPF_PROG_QUERY's flags).
pub use aya_obj::generated::{BPF_F_ALLOW_MULTI, BPF_F_ALLOW_OVERRIDE};

/// `enum bpf_prog_type` values this crate loads or probes.
pub mod prog_type {
    use super::bpf_prog_type as t;
    pub const SOCKET_FILTER: u32 = t::BPF_PROG_TYPE_SOCKET_FILTER as u32;
    pub const CGROUP_SOCK: u32 = t::BPF_PROG_TYPE_CGROUP_SOCK as u32;
    pub const SOCK_OPS: u32 = t::BPF_PROG_TYPE_SOCK_OPS as u32;
    pub const CGROUP_SOCK_ADDR: u32 = t::BPF_PROG_TYPE_CGROUP_SOCK_ADDR as u32;
    pub const CGROUP_SOCKOPT: u32 = t::BPF_PROG_TYPE_CGROUP_SOCKOPT as u32;
    pub const SK_LOOKUP: u32 = t::BPF_PROG_TYPE_SK_LOOKUP as u32;
}

/// `enum bpf_attach_type` values of the hooks this crate attaches to or probes.
pub mod attach_type {
    use super::bpf_attach_type as t;
    /// No expected attach type, for a program type that has none (a socket filter).
    pub const NONE: u32 = 0;
    pub const CGROUP_INET_SOCK_CREATE: u32 = t::BPF_CGROUP_INET_SOCK_CREATE as u32;
    pub const CGROUP_SOCK_OPS: u32 = t::BPF_CGROUP_SOCK_OPS as u32;
    pub const CGROUP_INET4_CONNECT: u32 = t::BPF_CGROUP_INET4_CONNECT as u32;
    pub const CGROUP_INET6_CONNECT: u32 = t::BPF_CGROUP_INET6_CONNECT as u32;
    pub const CGROUP_UDP4_SENDMSG: u32 = t::BPF_CGROUP_UDP4_SENDMSG as u32;
    pub const CGROUP_UDP6_SENDMSG: u32 = t::BPF_CGROUP_UDP6_SENDMSG as u32;
    pub const CGROUP_UDP4_RECVMSG: u32 = t::BPF_CGROUP_UDP4_RECVMSG as u32;
    pub const CGROUP_UDP6_RECVMSG: u32 = t::BPF_CGROUP_UDP6_RECVMSG as u32;
    pub const CGROUP_GETSOCKOPT: u32 = t::BPF_CGROUP_GETSOCKOPT as u32;
    pub const CGROUP_INET4_GETPEERNAME: u32 = t::BPF_CGROUP_INET4_GETPEERNAME as u32;
    pub const CGROUP_INET6_GETPEERNAME: u32 = t::BPF_CGROUP_INET6_GETPEERNAME as u32;
    pub const SK_LOOKUP: u32 = t::BPF_SK_LOOKUP as u32;
}

/// `BPF_FUNC_*` helper ids the probes use.
pub mod helper {
    use super::bpf_func_id as f;
    pub const GET_NETNS_COOKIE: i32 = f::BPF_FUNC_get_netns_cookie as i32;
    /// Came with memcg accounting of BPF memory (5.11): libbpf's sign of it too.
    pub const KTIME_GET_COARSE_NS: i32 = f::BPF_FUNC_ktime_get_coarse_ns as i32;
}

/// The instruction codes of the programs built here from raw instructions.
pub mod op {
    use super::*;
    /// `r_dst = imm`
    pub const MOV64_IMM: u8 = (BPF_ALU64 | BPF_MOV | BPF_K) as u8;
    /// `r_dst = r_src`
    pub const MOV64_REG: u8 = (BPF_ALU64 | BPF_MOV | BPF_X) as u8;
    /// `w_dst = imm` (zero-extended)
    pub const MOV32_IMM: u8 = (BPF_ALU | BPF_MOV | BPF_K) as u8;
    /// `r_dst >>= imm`
    pub const RSH64_IMM: u8 = (BPF_ALU64 | BPF_RSH | BPF_K) as u8;
    pub const EXIT: u8 = (BPF_JMP | BPF_EXIT) as u8;
    /// Call helper `imm`.
    pub const CALL: u8 = (BPF_JMP | BPF_CALL) as u8;
    /// `if r_dst != imm goto +off`
    pub const JNE_IMM: u8 = (BPF_JMP | BPF_JNE | BPF_K) as u8;
    /// `if (u32)r_dst != imm goto +off`
    pub const JNE32_IMM: u8 = (BPF_JMP32 | BPF_JNE | BPF_K) as u8;
    /// `r_dst = *(u32 *)(r_src + off)`
    pub const LDX_W: u8 = (BPF_LDX | BPF_MEM | BPF_W) as u8;
    /// `*(u32 *)(r_dst + off) = r_src`
    pub const STX_W: u8 = (BPF_STX | BPF_MEM | BPF_W) as u8;
}

/// One instruction (`struct bpf_insn`; its register nibbles a bitfield, laid out by the
/// bindings for the target's byte order).
pub fn insn(code: u8, dst: u8, src: u8, off: i16, imm: i32) -> bpf_insn {
    bpf_insn {
        code,
        _bitfield_align_1: [],
        _bitfield_1: bpf_insn::new_bitfield_1(dst, src),
        off,
        imm,
    }
}

/// A `union bpf_attr` of zeroes: the kernel requires the bytes a command does not use to
/// be zero, and each member, all plain integers, is valid as zeroes.
fn attr() -> bpf_attr {
    // SAFETY: all-zero bytes are a valid value of every member (integers and arrays of them).
    unsafe { std::mem::zeroed() }
}

/// A pointer as a `__aligned_u64` field of `union bpf_attr` holds it.
fn ptr<T: ?Sized>(p: *const T) -> u64 {
    p.cast::<u8>() as usize as u64
}

/// bpf(2): `cmd` with `attr`, whose member for `cmd` the caller filled in; any pointer in
/// it must be valid for the call, for what the command reads or writes there.
fn bpf(cmd: bpf_cmd, attr: &mut bpf_attr) -> io::Result<libc::c_long> {
    // SAFETY: `attr` is a whole, initialised `union bpf_attr` of the size passed; the buffers
    // its pointers name are the caller's, alive for the call.
    let ret = unsafe {
        libc::syscall(
            libc::SYS_bpf,
            cmd as libc::c_long,
            attr as *mut bpf_attr,
            size_of::<bpf_attr>() as u32,
        )
    };
    if ret < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(ret)
    }
}

/// [`bpf`] for a command whose answer is a new file descriptor.
fn bpf_fd(cmd: bpf_cmd, attr: &mut bpf_attr) -> io::Result<OwnedFd> {
    let fd = bpf(cmd, attr)?;
    // SAFETY: the kernel returned a new file descriptor that we now own.
    Ok(unsafe { OwnedFd::from_raw_fd(fd as i32) })
}

/// A file descriptor as `union bpf_attr` holds it.
fn fd(fd: BorrowedFd<'_>) -> u32 {
    fd.as_raw_fd() as u32
}

/// Loads a program of `prog_type` for `expected_attach_type` from raw instructions,
/// licensed GPL and named `name` (at most 15 bytes; empty for none): a feature probe, or a
/// stand-in in the tests. When the verifier refuses it, its log is in `log` (level 1).
pub fn prog_load(
    prog_type: u32,
    expected_attach_type: u32,
    insns: &[bpf_insn],
    name: &str,
    log: &mut [u8],
) -> io::Result<OwnedFd> {
    let license = c"GPL";
    let mut attr = attr();
    attr.__bindgen_anon_3.prog_type = prog_type;
    attr.__bindgen_anon_3.insn_cnt = insns.len() as u32;
    attr.__bindgen_anon_3.insns = ptr(insns.as_ptr());
    attr.__bindgen_anon_3.license = ptr(license.as_ptr());
    if !log.is_empty() {
        attr.__bindgen_anon_3.log_level = 1;
        attr.__bindgen_anon_3.log_size = log.len() as u32;
        attr.__bindgen_anon_3.log_buf = ptr(log.as_mut_ptr());
    }
    // The name keeps its last byte for the NUL.
    let mut prog_name = [0 as libc::c_char; 16];
    for (to, from) in prog_name[..15].iter_mut().zip(name.bytes()) {
        *to = from as libc::c_char;
    }
    attr.__bindgen_anon_3.prog_name = prog_name;
    attr.__bindgen_anon_3.expected_attach_type = expected_attach_type;
    bpf_fd(bpf_cmd::BPF_PROG_LOAD, &mut attr)
}

/// Whether the kernel has BPF_LINK_CREATE: asked with no program, it answers EBADF when it
/// knows the command and EINVAL when it does not.
pub fn link_create_known() -> io::Result<bool> {
    let mut attr = attr();
    attr.link_create.__bindgen_anon_1.prog_fd = u32::MAX; // -1
    attr.link_create.__bindgen_anon_2.target_fd = u32::MAX;
    match bpf_fd(bpf_cmd::BPF_LINK_CREATE, &mut attr) {
        // Not expected with no program; what came back is closed.
        Ok(_) => Ok(true),
        Err(e) if e.raw_os_error() == Some(libc::EBADF) => Ok(true),
        Err(e) if e.raw_os_error() == Some(libc::EINVAL) => Ok(false),
        Err(e) => Err(e),
    }
}

/// Every key and value of a hash map (not per-CPU) as raw bytes, `key_size` and
/// `value_size` apiece, read with BPF_MAP_LOOKUP_BATCH: a call per thousands of entries,
/// where walking the keys takes one per entry. Entries written meanwhile may be missed,
/// as with any walk of a live map.
pub fn hash_entries(
    map: BorrowedFd<'_>,
    key_size: usize,
    value_size: usize,
) -> io::Result<(Vec<u8>, Vec<u8>)> {
    // A call returns whole buckets; one larger than the buffer is ENOSPC (with nothing
    // returned), answered by a larger buffer.
    let mut per_call = 4096usize;
    let (mut keys, mut values) = (Vec::new(), Vec::new());
    let mut entries = 0usize;
    // Where the next call starts: a bucket index (u32) for hash maps; none at first.
    let (mut start, mut next) = (None::<u64>, 0u64);
    loop {
        keys.resize((entries + per_call) * key_size, 0);
        values.resize((entries + per_call) * value_size, 0);
        let mut attr = attr();
        attr.batch.in_batch = start.as_ref().map_or(0, |s| ptr(s));
        attr.batch.out_batch = ptr(&raw mut next);
        attr.batch.keys = ptr(keys[entries * key_size..].as_mut_ptr());
        attr.batch.values = ptr(values[entries * value_size..].as_mut_ptr());
        attr.batch.count = per_call as u32;
        attr.batch.map_fd = fd(map);
        let result = bpf(bpf_cmd::BPF_MAP_LOOKUP_BATCH, &mut attr);
        // The kernel writes back how many entries it filled.
        // SAFETY: the member just written, integers only.
        entries += unsafe { attr.batch.count } as usize;
        keys.truncate(entries * key_size);
        values.truncate(entries * value_size);
        match result {
            Ok(_) => start = Some(next),
            Err(err) if err.raw_os_error() == Some(libc::ENOENT) => return Ok((keys, values)),
            Err(err) if err.raw_os_error() == Some(libc::ENOSPC) => per_call *= 2,
            Err(err) => return Err(err),
        }
    }
}

/// BPF_MAP_* on one element: `key` (null for none), and `value` as the command reads or
/// writes it (for GET_NEXT_KEY, the next key).
fn map_elem(
    cmd: bpf_cmd,
    map: BorrowedFd<'_>,
    key: *const u8,
    value: *const u8,
    flags: u64,
) -> io::Result<()> {
    let mut attr = attr();
    attr.__bindgen_anon_2.map_fd = fd(map);
    attr.__bindgen_anon_2.key = ptr(key);
    attr.__bindgen_anon_2.__bindgen_anon_1.value = ptr(value);
    attr.__bindgen_anon_2.flags = flags;
    bpf(cmd, &mut attr).map(drop)
}

/// `Ok(false)` for ENOENT: no such key, or no key after it.
fn found(result: io::Result<()>) -> io::Result<bool> {
    match result {
        Ok(()) => Ok(true),
        Err(err) if err.raw_os_error() == Some(libc::ENOENT) => Ok(false),
        Err(err) => Err(err),
    }
}

/// The key after `key` in the map's own order (its first key for `None`, or when `key` is
/// not in it any more); `Ok(None)` after the last. Each call is one bpf call, whatever the
/// size of the map.
pub fn next_key<K: bytemuck::Pod>(map: BorrowedFd<'_>, key: Option<&K>) -> io::Result<Option<K>> {
    let mut next = K::zeroed();
    let key = key.map_or(std::ptr::null(), |k| bytemuck::bytes_of(k).as_ptr());
    let asked = map_elem(
        bpf_cmd::BPF_MAP_GET_NEXT_KEY,
        map,
        key,
        bytemuck::bytes_of_mut(&mut next).as_mut_ptr(),
        0,
    );
    Ok(found(asked)?.then_some(next))
}

/// The key after `key` (the first for `None`) as bytes: `key_size` of them.
pub fn next_key_bytes(
    map: BorrowedFd<'_>,
    key: Option<&[u8]>,
    key_size: usize,
) -> io::Result<Option<Vec<u8>>> {
    let mut next = vec![0u8; key_size];
    let key = key.map_or(std::ptr::null(), <[u8]>::as_ptr);
    let asked = map_elem(
        bpf_cmd::BPF_MAP_GET_NEXT_KEY,
        map,
        key,
        next.as_mut_ptr(),
        0,
    );
    Ok(found(asked)?.then_some(next))
}

/// The value of `key` into `value`, which holds the map's whole value (every CPU's, for a
/// per-CPU map); `Ok(false)` when the key is not in the map. The key must be the map's key
/// size.
pub fn lookup_bytes(map: BorrowedFd<'_>, key: &[u8], value: &mut [u8]) -> io::Result<bool> {
    let asked = map_elem(
        bpf_cmd::BPF_MAP_LOOKUP_ELEM,
        map,
        key.as_ptr(),
        value.as_mut_ptr(),
        0,
    );
    found(asked)
}

/// Write `value` (the map's whole value) at `key`, with `BPF_ANY`/`BPF_EXIST`-style flags.
///
/// ENOMEM is tried again a few times, a little later each: a map without preallocation
/// takes a new entry from the kernel's BPF allocator, whose caches (per-CPU values from the
/// percpu allocator's atomic pool) are refilled in the background, and a run of thousands
/// of adds can find them empty for a moment with plenty of memory free.
pub fn update_bytes(map: BorrowedFd<'_>, key: &[u8], value: &[u8], flags: u64) -> io::Result<()> {
    let update = || {
        map_elem(
            bpf_cmd::BPF_MAP_UPDATE_ELEM,
            map,
            key.as_ptr(),
            value.as_ptr(),
            flags,
        )
    };
    let mut wait = std::time::Duration::from_micros(50);
    for _ in 0..ENOMEM_RETRIES {
        match update() {
            Err(err) if err.raw_os_error() == Some(libc::ENOMEM) => {
                std::thread::sleep(wait);
                wait *= 2;
            }
            other => return other,
        }
    }
    update()
}

/// How many times [`update_bytes`] tries again after ENOMEM (about 400 ms in all).
const ENOMEM_RETRIES: u32 = 13;

/// Remove `key`; NotFound when it was not there.
pub fn delete_bytes(map: BorrowedFd<'_>, key: &[u8]) -> io::Result<()> {
    map_elem(
        bpf_cmd::BPF_MAP_DELETE_ELEM,
        map,
        key.as_ptr(),
        std::ptr::null(),
        0,
    )
}

/// Detach a link from its hook now; the link object lives on until its last reference goes.
pub fn link_detach(link: BorrowedFd<'_>) -> io::Result<()> {
    let mut attr = attr();
    attr.link_detach.link_fd = fd(link);
    bpf(bpf_cmd::BPF_LINK_DETACH, &mut attr).map(drop)
}

/// An LPM-trie key as the kernel reads it: the prefix length, then the data, unpadded.
#[repr(C, packed)]
#[derive(Clone, Copy)]
struct LpmKey<K> {
    prefix_len: u32,
    data: K,
}

// SAFETY: packed, so no padding, and both fields are Pod.
unsafe impl<K: bytemuck::Pod> bytemuck::Zeroable for LpmKey<K> {}
// SAFETY: as above.
unsafe impl<K: bytemuck::Pod> bytemuck::Pod for LpmKey<K> {}

/// Whether an LPM trie holds exactly this key. A lookup cannot tell (it answers the
/// longest prefix that matches), but the kernel's next-key walk can: after a key it holds,
/// it goes on to the next one or ends; after any other key, it starts again at the first.
/// `first` is the trie's first key, read once ([`lpm_first`]) for any number of calls.
pub fn lpm_contains<K: bytemuck::Pod + PartialEq>(
    map: BorrowedFd<'_>,
    first: Option<(u32, K)>,
    prefix_len: u32,
    data: K,
) -> io::Result<bool> {
    let Some(first) = first else {
        return Ok(false);
    };
    let key = LpmKey { prefix_len, data };
    Ok(match next_key(map, Some(&key))? {
        None => true,
        Some(next) => {
            let (len, next_data) = (next.prefix_len, next.data);
            (len, next_data) != first
        }
    })
}

/// The first key of an LPM trie in the kernel's order, as (prefix length, data).
pub fn lpm_first<K: bytemuck::Pod>(map: BorrowedFd<'_>) -> io::Result<Option<(u32, K)>> {
    Ok(next_key::<LpmKey<K>>(map, None)?.map(|k| (k.prefix_len, k.data)))
}

fn c_path(path: &Path) -> io::Result<CString> {
    CString::new(path.as_os_str().as_bytes())
        .map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "path contains NUL"))
}

/// Pin a BPF object (program, map or link) at `path` on bpffs.
pub fn obj_pin(object: BorrowedFd<'_>, path: &Path) -> io::Result<()> {
    let path = c_path(path)?;
    let mut attr = attr();
    attr.__bindgen_anon_4.pathname = ptr(path.as_ptr());
    attr.__bindgen_anon_4.bpf_fd = fd(object);
    bpf(bpf_cmd::BPF_OBJ_PIN, &mut attr).map(drop)
}

/// Open the BPF object pinned at `path`.
pub fn obj_get(path: &Path) -> io::Result<OwnedFd> {
    let path = c_path(path)?;
    let mut attr = attr();
    attr.__bindgen_anon_4.pathname = ptr(path.as_ptr());
    bpf_fd(bpf_cmd::BPF_OBJ_GET, &mut attr)
}

/// The programs attached directly at `cgroup` for `attach_type` (not its ancestors'), and
/// the flags they were attached with (`BPF_F_ALLOW_OVERRIDE`, `BPF_F_ALLOW_MULTI`).
pub fn cgroup_programs(cgroup: BorrowedFd<'_>, attach_type: u32) -> io::Result<(u32, Vec<u32>)> {
    const MOST: usize = 64;
    let mut ids = [0u32; MOST];
    let mut attr = attr();
    attr.query.__bindgen_anon_1.target_fd = fd(cgroup);
    attr.query.attach_type = attach_type;
    attr.query.prog_ids = ptr(ids.as_mut_ptr());
    attr.query.__bindgen_anon_2.prog_cnt = MOST as u32;
    bpf(bpf_cmd::BPF_PROG_QUERY, &mut attr)?;
    // SAFETY: the member just written (and written back by the kernel), integers only.
    let (flags, count) = unsafe {
        (
            attr.query.attach_flags,
            attr.query.__bindgen_anon_2.prog_cnt,
        )
    };
    Ok((flags, ids[..(count as usize).min(MOST)].to_vec()))
}

/// BPF_PROG_ATTACH or BPF_PROG_DETACH of `prog` at `cgroup`.
fn prog_attachment(
    cmd: bpf_cmd,
    prog: BorrowedFd<'_>,
    cgroup: BorrowedFd<'_>,
    attach_type: u32,
    flags: u32,
    replace: Option<BorrowedFd<'_>>,
) -> io::Result<()> {
    let mut attr = attr();
    attr.__bindgen_anon_5.__bindgen_anon_1.target_fd = fd(cgroup);
    attr.__bindgen_anon_5.attach_bpf_fd = fd(prog);
    attr.__bindgen_anon_5.attach_type = attach_type;
    let mut flags = flags;
    if let Some(old) = replace {
        flags |= BPF_F_REPLACE;
        attr.__bindgen_anon_5.replace_bpf_fd = fd(old);
    }
    attr.__bindgen_anon_5.attach_flags = flags;
    bpf(cmd, &mut attr).map(drop)
}

/// Attach `prog` at `cgroup` without a link (BPF_PROG_ATTACH, `BPF_F_ALLOW_MULTI`): the
/// attachment lives as long as the cgroup, pinned nowhere. With `replace`, `prog` takes
/// the place of that program, attached there, in one step (`BPF_F_REPLACE`): the hook
/// never runs without one of the two.
pub fn prog_attach(
    prog: BorrowedFd<'_>,
    cgroup: BorrowedFd<'_>,
    attach_type: u32,
    replace: Option<BorrowedFd<'_>>,
) -> io::Result<()> {
    prog_attachment(
        bpf_cmd::BPF_PROG_ATTACH,
        prog,
        cgroup,
        attach_type,
        BPF_F_ALLOW_MULTI,
        replace,
    )
}

/// Detach `prog`, attached at `cgroup` with [`prog_attach`].
pub fn prog_detach(
    prog: BorrowedFd<'_>,
    cgroup: BorrowedFd<'_>,
    attach_type: u32,
) -> io::Result<()> {
    prog_attachment(bpf_cmd::BPF_PROG_DETACH, prog, cgroup, attach_type, 0, None)
}

/// Attach `prog` to `target` (a cgroup or network namespace fd) with a BPF link; the link
/// lives as long as its fd or its pin.
pub fn link_create(
    prog: BorrowedFd<'_>,
    target: BorrowedFd<'_>,
    attach_type: u32,
) -> io::Result<OwnedFd> {
    let mut attr = attr();
    attr.link_create.__bindgen_anon_1.prog_fd = fd(prog);
    attr.link_create.__bindgen_anon_2.target_fd = fd(target);
    attr.link_create.attach_type = attach_type;
    bpf_fd(bpf_cmd::BPF_LINK_CREATE, &mut attr)
}

/// Replace the program of `link` with `prog` in place: atomic, the hook never runs without
/// a program.
pub fn link_update(link: BorrowedFd<'_>, prog: BorrowedFd<'_>) -> io::Result<()> {
    let mut attr = attr();
    attr.link_update.link_fd = fd(link);
    attr.link_update.__bindgen_anon_1.new_prog_fd = fd(prog);
    bpf(bpf_cmd::BPF_LINK_UPDATE, &mut attr).map(drop)
}

/// BPF_OBJ_GET_INFO_BY_FD: the kernel's `struct bpf_prog_info` or `struct bpf_link_info`
/// of `object`. A kernel older than the bindings fills in what it knows, the rest stays
/// zero.
fn info_by_fd<I: Copy>(object: BorrowedFd<'_>) -> io::Result<I> {
    // SAFETY: the info structs are integers and arrays of them (and unions of such):
    // all-zero bytes are a valid value.
    let mut info: I = unsafe { std::mem::zeroed() };
    let mut attr = attr();
    attr.info.bpf_fd = fd(object);
    attr.info.info_len = size_of::<I>() as u32;
    attr.info.info = ptr(&raw mut info);
    bpf(bpf_cmd::BPF_OBJ_GET_INFO_BY_FD, &mut attr)?;
    Ok(info)
}

/// The program with kernel id `id`, as a new file descriptor (BPF_PROG_GET_FD_BY_ID).
pub fn program_by_id(id: u32) -> io::Result<OwnedFd> {
    let mut attr = attr();
    attr.__bindgen_anon_6.__bindgen_anon_1.prog_id = id;
    bpf_fd(bpf_cmd::BPF_PROG_GET_FD_BY_ID, &mut attr)
}

/// A program's kernel id and the name it was loaded with (`struct bpf_prog_info`'s `id`
/// and `name`: at most 15 bytes).
pub fn program_id_and_name(prog: BorrowedFd<'_>) -> io::Result<(u32, String)> {
    let info: bpf_prog_info = info_by_fd(prog)?;
    let name: Vec<u8> = info
        .name
        .iter()
        .map(|&c| c as u8)
        .take_while(|&b| b != 0)
        .collect();
    Ok((info.id, String::from_utf8_lossy(&name).into_owned()))
}

/// The program a link runs, as a new file descriptor (BPF_OBJ_GET_INFO_BY_FD for its
/// program id, then BPF_PROG_GET_FD_BY_ID).
pub fn link_program_fd(link: BorrowedFd<'_>) -> io::Result<OwnedFd> {
    let info: bpf_link_info = info_by_fd(link)?;
    program_by_id(info.prog_id)
}

/// What a pinned link is attached to.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LinkTarget {
    /// A cgroup, by id (the inode of its cgroup2 directory); 0 once the cgroup is gone.
    Cgroup(u64),
    /// A network namespace, by inode; 0 once the namespace is gone.
    Netns(u32),
    Other,
}

impl LinkTarget {
    /// A link whose cgroup or namespace was removed stays pinned, but detached.
    pub fn attached(self) -> bool {
        !matches!(self, LinkTarget::Cgroup(0) | LinkTarget::Netns(0))
    }

    fn of(info: &bpf_link_info) -> LinkTarget {
        const CGROUP: u32 = bpf_link_type::BPF_LINK_TYPE_CGROUP as u32;
        const NETNS: u32 = bpf_link_type::BPF_LINK_TYPE_NETNS as u32;
        // SAFETY: the union member the link's type names, integers only.
        unsafe {
            match info.type_ {
                CGROUP => LinkTarget::Cgroup(info.__bindgen_anon_1.cgroup.cgroup_id),
                NETNS => LinkTarget::Netns(info.__bindgen_anon_1.netns.netns_ino),
                _ => LinkTarget::Other,
            }
        }
    }
}

/// The target of a link, from the kernel (BPF_OBJ_GET_INFO_BY_FD).
pub fn link_target(link: BorrowedFd<'_>) -> io::Result<LinkTarget> {
    Ok(LinkTarget::of(&info_by_fd(link)?))
}

/// The target of the link pinned at `path`.
pub fn pinned_link_target(path: &Path) -> io::Result<LinkTarget> {
    link_target(obj_get(path)?.as_fd())
}

#[cfg(test)]
mod tests {
    use std::mem::offset_of;

    use aya_obj::generated::{
        bpf_attr__bindgen_ty_10 as Query, bpf_attr__bindgen_ty_3 as Batch,
        bpf_attr__bindgen_ty_4 as ProgLoad, bpf_attr__bindgen_ty_6 as ProgAttach,
    };

    use super::*;

    /// The members' fields sit where the kernel's ABI puts them (by 32-bit word), as the
    /// commands used them before the bindings laid them out.
    #[test]
    fn bpf_attr_members_are_laid_out_as_the_kernel_reads_them() {
        assert_eq!(offset_of!(ProgLoad, insns), 2 * 4);
        assert_eq!(offset_of!(ProgLoad, log_buf), 8 * 4);
        assert_eq!(offset_of!(ProgLoad, prog_name), 12 * 4);
        assert_eq!(offset_of!(ProgLoad, expected_attach_type), 17 * 4);
        assert_eq!(offset_of!(Batch, count), 8 * 4);
        assert_eq!(offset_of!(Batch, map_fd), 9 * 4);
        assert_eq!(offset_of!(Query, attach_flags), 3 * 4);
        assert_eq!(offset_of!(Query, prog_ids), 4 * 4);
        assert_eq!(offset_of!(ProgAttach, replace_bpf_fd), 4 * 4);
        assert_eq!(offset_of!(bpf_prog_info, name), 64);
        assert_eq!(offset_of!(bpf_link_info, prog_id), 8);
        assert_eq!(offset_of!(bpf_link_info, __bindgen_anon_1), 16);
    }

    #[test]
    fn instructions_are_laid_out_as_struct_bpf_insn() {
        // r2 = *(u32 *)(r1 + 64): code 0x61, dst 2 / src 1, off 64, imm 0.
        let read = insn(op::LDX_W, 2, 1, 64, 0);
        // SAFETY: `struct bpf_insn` is 8 bytes of integers, no padding.
        let bytes: [u8; 8] = unsafe { std::mem::transmute(read) };
        assert_eq!(bytes[0], 0x61);
        if cfg!(target_endian = "little") {
            assert_eq!(bytes[1], 0x12);
        }
        assert_eq!(i16::from_ne_bytes([bytes[2], bytes[3]]), 64);
        let call = insn(op::CALL, 0, 0, 0, helper::GET_NETNS_COOKIE);
        assert_eq!((call.code, call.imm), (0x85, 122));
        assert_eq!(
            [op::MOV64_IMM, op::MOV32_IMM, op::JNE32_IMM, op::EXIT],
            [0xb7, 0xb4, 0x56, 0x95]
        );
    }

    #[test]
    fn a_link_target_is_read_from_the_member_its_type_names() {
        // SAFETY: integers only: all-zero bytes are a valid value.
        let mut info: bpf_link_info = unsafe { std::mem::zeroed() };
        info.type_ = bpf_link_type::BPF_LINK_TYPE_CGROUP as u32;
        info.__bindgen_anon_1.cgroup.cgroup_id = 0x1_0000_0002;
        assert_eq!(LinkTarget::of(&info), LinkTarget::Cgroup(0x1_0000_0002));
        info.type_ = bpf_link_type::BPF_LINK_TYPE_NETNS as u32;
        info.__bindgen_anon_1.netns.netns_ino = 4026531840;
        assert_eq!(LinkTarget::of(&info), LinkTarget::Netns(4026531840));
        assert!(!LinkTarget::Netns(0).attached());
    }
}
