//! The few bpf(2) commands aya 0.14 does not expose for our use: creating a cgroup link
//! or netns link for any attach type (aya cannot turn a `CgroupSockoptLink` into a pinnable
//! link) and
//! pinning/opening objects by path, reading a hash map in batches, walking its keys
//! from a given one, and reading and writing entries as bytes of the map's own sizes.

use std::{
    ffi::CString,
    io,
    os::fd::{AsFd, AsRawFd, BorrowedFd, FromRawFd, OwnedFd},
    os::unix::ffi::OsStrExt,
    path::Path,
};

const BPF_MAP_LOOKUP_ELEM: libc::c_long = 1;
const BPF_MAP_UPDATE_ELEM: libc::c_long = 2;
const BPF_MAP_DELETE_ELEM: libc::c_long = 3;
const BPF_MAP_GET_NEXT_KEY: libc::c_long = 4;
const BPF_PROG_LOAD: libc::c_long = 5;
const BPF_OBJ_PIN: libc::c_long = 6;
const BPF_OBJ_GET: libc::c_long = 7;
const BPF_PROG_ATTACH: libc::c_long = 8;
const BPF_PROG_DETACH: libc::c_long = 9;
const BPF_OBJ_GET_INFO_BY_FD: libc::c_long = 15;
const BPF_PROG_QUERY: libc::c_long = 16;
const BPF_MAP_LOOKUP_BATCH: libc::c_long = 24;
const BPF_LINK_CREATE: libc::c_long = 28;
const BPF_LINK_UPDATE: libc::c_long = 29;
const BPF_LINK_DETACH: libc::c_long = 34;
const BPF_LINK_TYPE_CGROUP: u32 = 3;
const BPF_LINK_TYPE_NETNS: u32 = 5;

/// `union bpf_attr`, zero-filled beyond what a command uses (the kernel requires it).
#[repr(C, align(8))]
struct BpfAttr([u32; 32]);

fn bpf(cmd: libc::c_long, attr: &mut BpfAttr) -> io::Result<libc::c_long> {
    // SAFETY: `attr` is a valid, fully initialised buffer of the size we pass.
    let ret = unsafe {
        libc::syscall(
            libc::SYS_bpf,
            cmd,
            attr as *mut BpfAttr,
            size_of::<BpfAttr>() as u32,
        )
    };
    if ret < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(ret)
    }
}

/// A `__aligned_u64` field (pointer, flags) at 32-bit word `word`, as the kernel reads it:
/// in native byte order (its low half first only on a little-endian host).
fn set_ptr(attr: &mut BpfAttr, word: usize, ptr: u64) {
    let b = ptr.to_ne_bytes();
    attr.0[word] = u32::from_ne_bytes([b[0], b[1], b[2], b[3]]);
    attr.0[word + 1] = u32::from_ne_bytes([b[4], b[5], b[6], b[7]]);
}

/// Loads a program of `prog_type` for `expected_attach_type` from raw instructions (`struct
/// bpf_insn` each, as the kernel reads them), licensed GPL: a feature probe. When the
/// verifier refuses it, its log is in `log` (level 1).
pub fn prog_load(
    prog_type: u32,
    expected_attach_type: u32,
    insns: &[u64],
    log: &mut [u8],
) -> io::Result<OwnedFd> {
    let license = c"GPL";
    let mut attr = BpfAttr([0; 32]);
    attr.0[0] = prog_type;
    attr.0[1] = insns.len() as u32;
    set_ptr(&mut attr, 2, insns.as_ptr() as u64);
    set_ptr(&mut attr, 4, license.as_ptr() as u64);
    if !log.is_empty() {
        attr.0[6] = 1; // log_level
        attr.0[7] = log.len() as u32;
        set_ptr(&mut attr, 8, log.as_mut_ptr() as u64);
    }
    attr.0[17] = expected_attach_type;
    let fd = bpf(BPF_PROG_LOAD, &mut attr)?;
    // SAFETY: the kernel returned a new file descriptor that we now own.
    Ok(unsafe { OwnedFd::from_raw_fd(fd as i32) })
}

/// Whether the kernel has BPF_LINK_CREATE: asked with no program, it answers EBADF when it
/// knows the command and EINVAL when it does not.
pub fn link_create_known() -> io::Result<bool> {
    let mut attr = BpfAttr([0; 32]);
    attr.0[0] = u32::MAX; // prog_fd -1
    attr.0[1] = u32::MAX; // target_fd -1
    match bpf(BPF_LINK_CREATE, &mut attr) {
        Ok(fd) => {
            // Not expected with no program; close whatever came back.
            // SAFETY: the kernel returned a new file descriptor that we now own.
            drop(unsafe { OwnedFd::from_raw_fd(fd as i32) });
            Ok(true)
        }
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
        let mut attr = BpfAttr([0; 32]);
        set_ptr(
            &mut attr,
            0,
            start.as_ref().map_or(0, |s| s as *const u64 as u64),
        );
        set_ptr(&mut attr, 2, &raw mut next as u64);
        set_ptr(&mut attr, 4, keys[entries * key_size..].as_mut_ptr() as u64);
        set_ptr(
            &mut attr,
            6,
            values[entries * value_size..].as_mut_ptr() as u64,
        );
        attr.0[8] = per_call as u32;
        attr.0[9] = map.as_raw_fd() as u32;
        let result = bpf(BPF_MAP_LOOKUP_BATCH, &mut attr);
        // The kernel writes back how many entries it filled.
        entries += attr.0[8] as usize;
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

/// The key after `key` in the map's own order (its first key for `None`, or when `key` is
/// not in it any more); `Ok(None)` after the last. Each call is one bpf call, whatever the
/// size of the map.
pub fn next_key<K: bytemuck::Pod>(map: BorrowedFd<'_>, key: Option<&K>) -> io::Result<Option<K>> {
    let mut next = K::zeroed();
    let mut attr = BpfAttr([0; 32]);
    attr.0[0] = map.as_raw_fd() as u32;
    set_ptr(&mut attr, 2, key.map_or(0, |k| k as *const K as u64));
    set_ptr(&mut attr, 4, &raw mut next as u64);
    match bpf(BPF_MAP_GET_NEXT_KEY, &mut attr) {
        Ok(_) => Ok(Some(next)),
        Err(err) if err.raw_os_error() == Some(libc::ENOENT) => Ok(None),
        Err(err) => Err(err),
    }
}

/// The key after `key` (the first for `None`) as bytes: `key_size` of them.
pub fn next_key_bytes(
    map: BorrowedFd<'_>,
    key: Option<&[u8]>,
    key_size: usize,
) -> io::Result<Option<Vec<u8>>> {
    let mut next = vec![0u8; key_size];
    let mut attr = BpfAttr([0; 32]);
    attr.0[0] = map.as_raw_fd() as u32;
    set_ptr(&mut attr, 2, key.map_or(0, |k| k.as_ptr() as u64));
    set_ptr(&mut attr, 4, next.as_mut_ptr() as u64);
    match bpf(BPF_MAP_GET_NEXT_KEY, &mut attr) {
        Ok(_) => Ok(Some(next)),
        Err(err) if err.raw_os_error() == Some(libc::ENOENT) => Ok(None),
        Err(err) => Err(err),
    }
}

/// The value of `key` into `value`, which holds the map's whole value (every CPU's, for a
/// per-CPU map); `Ok(false)` when the key is not in the map. The key must be the map's key
/// size.
pub fn lookup_bytes(map: BorrowedFd<'_>, key: &[u8], value: &mut [u8]) -> io::Result<bool> {
    let mut attr = BpfAttr([0; 32]);
    attr.0[0] = map.as_raw_fd() as u32;
    set_ptr(&mut attr, 2, key.as_ptr() as u64);
    set_ptr(&mut attr, 4, value.as_mut_ptr() as u64);
    match bpf(BPF_MAP_LOOKUP_ELEM, &mut attr) {
        Ok(_) => Ok(true),
        Err(err) if err.raw_os_error() == Some(libc::ENOENT) => Ok(false),
        Err(err) => Err(err),
    }
}

/// Write `value` (the map's whole value) at `key`, with `BPF_ANY`/`BPF_EXIST`-style flags.
///
/// ENOMEM is tried again a few times, a little later each: a map without preallocation
/// takes a new entry from the kernel's BPF allocator, whose caches (per-CPU values from the
/// percpu allocator's atomic pool) are refilled in the background, and a run of thousands
/// of adds can find them empty for a moment with plenty of memory free.
pub fn update_bytes(map: BorrowedFd<'_>, key: &[u8], value: &[u8], flags: u64) -> io::Result<()> {
    let mut attr = BpfAttr([0; 32]);
    attr.0[0] = map.as_raw_fd() as u32;
    set_ptr(&mut attr, 2, key.as_ptr() as u64);
    set_ptr(&mut attr, 4, value.as_ptr() as u64);
    set_ptr(&mut attr, 6, flags);
    let mut wait = std::time::Duration::from_micros(50);
    for _ in 0..ENOMEM_RETRIES {
        match bpf(BPF_MAP_UPDATE_ELEM, &mut attr) {
            Err(err) if err.raw_os_error() == Some(libc::ENOMEM) => {
                std::thread::sleep(wait);
                wait *= 2;
            }
            other => return other.map(drop),
        }
    }
    bpf(BPF_MAP_UPDATE_ELEM, &mut attr).map(drop)
}

/// How many times [`update_bytes`] tries again after ENOMEM (about 400 ms in all).
const ENOMEM_RETRIES: u32 = 13;

/// Remove `key`; NotFound when it was not there.
pub fn delete_bytes(map: BorrowedFd<'_>, key: &[u8]) -> io::Result<()> {
    let mut attr = BpfAttr([0; 32]);
    attr.0[0] = map.as_raw_fd() as u32;
    set_ptr(&mut attr, 2, key.as_ptr() as u64);
    bpf(BPF_MAP_DELETE_ELEM, &mut attr).map(drop)
}

/// Detach a link from its hook now; the link object lives on until its last reference goes.
pub fn link_detach(link: BorrowedFd<'_>) -> io::Result<()> {
    let mut attr = BpfAttr([0; 32]);
    attr.0[0] = link.as_raw_fd() as u32;
    bpf(BPF_LINK_DETACH, &mut attr).map(drop)
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
pub fn obj_pin(fd: BorrowedFd<'_>, path: &Path) -> io::Result<()> {
    let path = c_path(path)?;
    let mut attr = BpfAttr([0; 32]);
    set_ptr(&mut attr, 0, path.as_ptr() as u64);
    attr.0[2] = fd.as_raw_fd() as u32;
    bpf(BPF_OBJ_PIN, &mut attr).map(drop)
}

/// Open the BPF object pinned at `path`.
pub fn obj_get(path: &Path) -> io::Result<OwnedFd> {
    let path = c_path(path)?;
    let mut attr = BpfAttr([0; 32]);
    set_ptr(&mut attr, 0, path.as_ptr() as u64);
    let fd = bpf(BPF_OBJ_GET, &mut attr)?;
    // SAFETY: the kernel returned a new file descriptor that we now own.
    Ok(unsafe { OwnedFd::from_raw_fd(fd as i32) })
}

/// The programs attached directly at `cgroup` for `attach_type` (not its ancestors'), and
/// the flags they were attached with (`BPF_F_ALLOW_OVERRIDE`, `BPF_F_ALLOW_MULTI`).
pub fn cgroup_programs(cgroup: BorrowedFd<'_>, attach_type: u32) -> io::Result<(u32, Vec<u32>)> {
    const MOST: usize = 64;
    let mut ids = [0u32; MOST];
    let mut attr = BpfAttr([0; 32]);
    attr.0[0] = cgroup.as_raw_fd() as u32;
    attr.0[1] = attach_type;
    set_ptr(&mut attr, 4, ids.as_mut_ptr() as u64);
    attr.0[6] = MOST as u32;
    bpf(BPF_PROG_QUERY, &mut attr)?;
    let count = (attr.0[6] as usize).min(MOST);
    Ok((attr.0[3], ids[..count].to_vec()))
}

/// `BPF_F_ALLOW_MULTI`: a cgroup's programs for one hook run together, and with its
/// ancestors' (nearest the socket first).
pub const BPF_F_ALLOW_MULTI: u32 = 1 << 1;
const BPF_F_REPLACE: u32 = 1 << 2;

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
    let mut attr = BpfAttr([0; 32]);
    attr.0[0] = cgroup.as_raw_fd() as u32;
    attr.0[1] = prog.as_raw_fd() as u32;
    attr.0[2] = attach_type;
    attr.0[3] = BPF_F_ALLOW_MULTI;
    if let Some(old) = replace {
        attr.0[3] |= BPF_F_REPLACE;
        attr.0[4] = old.as_raw_fd() as u32;
    }
    bpf(BPF_PROG_ATTACH, &mut attr).map(drop)
}

/// Detach `prog`, attached at `cgroup` with [`prog_attach`].
pub fn prog_detach(
    prog: BorrowedFd<'_>,
    cgroup: BorrowedFd<'_>,
    attach_type: u32,
) -> io::Result<()> {
    let mut attr = BpfAttr([0; 32]);
    attr.0[0] = cgroup.as_raw_fd() as u32;
    attr.0[1] = prog.as_raw_fd() as u32;
    attr.0[2] = attach_type;
    bpf(BPF_PROG_DETACH, &mut attr).map(drop)
}

/// Attach `prog` to `target` (a cgroup or network namespace fd) with a BPF link; the link
/// lives as long as its fd or its pin.
pub fn link_create(
    prog: BorrowedFd<'_>,
    target: BorrowedFd<'_>,
    attach_type: u32,
) -> io::Result<OwnedFd> {
    let mut attr = BpfAttr([0; 32]);
    attr.0[0] = prog.as_raw_fd() as u32;
    attr.0[1] = target.as_raw_fd() as u32;
    attr.0[2] = attach_type;
    let fd = bpf(BPF_LINK_CREATE, &mut attr)?;
    // SAFETY: the kernel returned a new file descriptor that we now own.
    Ok(unsafe { OwnedFd::from_raw_fd(fd as i32) })
}

/// Replace the program of `link` with `prog` in place: atomic, the hook never runs without
/// a program.
pub fn link_update(link: BorrowedFd<'_>, prog: BorrowedFd<'_>) -> io::Result<()> {
    let mut attr = BpfAttr([0; 32]);
    attr.0[0] = link.as_raw_fd() as u32;
    attr.0[1] = prog.as_raw_fd() as u32;
    bpf(BPF_LINK_UPDATE, &mut attr).map(drop)
}

/// `struct bpf_link_info` of a link, as 64-bit words: type and id, prog_id and padding,
/// then the per-type union (BPF_OBJ_GET_INFO_BY_FD).
fn link_info(link: BorrowedFd<'_>) -> io::Result<[u64; 8]> {
    let mut info = [0u64; 8];
    let mut attr = BpfAttr([0; 32]);
    attr.0[0] = link.as_raw_fd() as u32;
    attr.0[1] = size_of_val(&info) as u32;
    set_ptr(&mut attr, 2, info.as_mut_ptr() as u64);
    bpf(BPF_OBJ_GET_INFO_BY_FD, &mut attr)?;
    Ok(info)
}

/// The `__u32` field at byte `offset` of a [`link_info`]: by its bytes, not by truncating
/// a word, which would read the field's neighbour on a big-endian host.
fn link_info_u32(info: &[u64; 8], offset: usize) -> u32 {
    let bytes = bytemuck::bytes_of(info);
    u32::from_ne_bytes(bytes[offset..offset + 4].try_into().expect("4 bytes"))
}

/// The program with kernel id `id`, as a new file descriptor (BPF_PROG_GET_FD_BY_ID).
pub fn program_by_id(id: u32) -> io::Result<OwnedFd> {
    const BPF_PROG_GET_FD_BY_ID: libc::c_long = 13;
    let mut attr = BpfAttr([0; 32]);
    attr.0[0] = id;
    let fd = bpf(BPF_PROG_GET_FD_BY_ID, &mut attr)?;
    // SAFETY: the kernel returned a new file descriptor that we now own.
    Ok(unsafe { OwnedFd::from_raw_fd(fd as i32) })
}

/// A program's kernel id and the name it was loaded with (`struct bpf_prog_info`'s `id`
/// and `name`: at most 15 bytes).
pub fn program_id_and_name(prog: BorrowedFd<'_>) -> io::Result<(u32, String)> {
    // type, id, tag[8], two lengths, two pointers, load time, uid, map count, map ids:
    // the name follows, at byte 64.
    let mut info = [0u8; 80];
    let mut attr = BpfAttr([0; 32]);
    attr.0[0] = prog.as_raw_fd() as u32;
    attr.0[1] = info.len() as u32;
    set_ptr(&mut attr, 2, info.as_mut_ptr() as u64);
    bpf(BPF_OBJ_GET_INFO_BY_FD, &mut attr)?;
    let id = u32::from_ne_bytes([info[4], info[5], info[6], info[7]]);
    let name = &info[64..];
    let end = name.iter().position(|b| *b == 0).unwrap_or(name.len());
    Ok((id, String::from_utf8_lossy(&name[..end]).into_owned()))
}

/// The program a link runs, as a new file descriptor (BPF_OBJ_GET_INFO_BY_FD for its
/// program id, then BPF_PROG_GET_FD_BY_ID).
pub fn link_program_fd(link: BorrowedFd<'_>) -> io::Result<OwnedFd> {
    const BPF_PROG_GET_FD_BY_ID: libc::c_long = 13;
    let info = link_info(link)?;
    let mut attr = BpfAttr([0; 32]);
    attr.0[0] = link_info_u32(&info, 8); // prog_id
    let fd = bpf(BPF_PROG_GET_FD_BY_ID, &mut attr)?;
    // SAFETY: the kernel returned a new file descriptor that we now own.
    Ok(unsafe { OwnedFd::from_raw_fd(fd as i32) })
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
}

/// The target of a link, from the kernel (BPF_OBJ_GET_INFO_BY_FD).
pub fn link_target(link: BorrowedFd<'_>) -> io::Result<LinkTarget> {
    let info = link_info(link)?;
    // type at 0; the union at 16: cgroup.cgroup_id (u64) or netns.netns_ino (u32).
    Ok(match link_info_u32(&info, 0) {
        BPF_LINK_TYPE_CGROUP => LinkTarget::Cgroup(info[2]),
        BPF_LINK_TYPE_NETNS => LinkTarget::Netns(link_info_u32(&info, 16)),
        _ => LinkTarget::Other,
    })
}

/// The target of the link pinned at `path`.
pub fn pinned_link_target(path: &Path) -> io::Result<LinkTarget> {
    link_target(obj_get(path)?.as_fd())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn u64_fields_are_written_and_u32_fields_read_in_native_byte_order() {
        let mut attr = BpfAttr([0; 32]);
        set_ptr(&mut attr, 2, 0x0102_0304_0506_0708);
        let bytes = bytemuck::bytes_of(&attr.0);
        assert_eq!(bytes[8..16], 0x0102_0304_0506_0708_u64.to_ne_bytes());

        let mut info = [0u64; 8];
        bytemuck::bytes_of_mut(&mut info)[16..20].copy_from_slice(&0xabcd_u32.to_ne_bytes());
        assert_eq!(link_info_u32(&info, 16), 0xabcd);
        assert_eq!(link_info_u32(&info, 20), 0);
    }
}
