//! Which filesystem a path is on (cgroup2, bpffs), from statfs.

use std::path::Path;

/// The filesystem magic number of the filesystem holding `path`.
fn fs_magic(path: &Path) -> Option<i64> {
    let c = std::ffi::CString::new(path.as_os_str().as_encoded_bytes()).ok()?;
    // SAFETY: statfs into a zeroed struct we own, with a NUL-terminated path.
    let mut st: libc::statfs = unsafe { std::mem::zeroed() };
    // SAFETY: as above; the kernel writes only into `st`.
    (unsafe { libc::statfs(c.as_ptr(), &mut st) } == 0).then_some(st.f_type as i64)
}

pub fn is_cgroup2_dir(path: &Path) -> bool {
    const CGROUP2_SUPER_MAGIC: i64 = 0x6367_7270;
    path.is_dir() && fs_magic(path) == Some(CGROUP2_SUPER_MAGIC)
}

const BPF_FS_MAGIC: i64 = 0xcafe_4a11;
const TMPFS_MAGIC: i64 = 0x0102_1994;

/// The filesystem magic of `path`, or of the nearest of its ancestors that exists; `None`
/// when none can be read. A directory removed while this looks (a cleanup racing an apply
/// removes an empty pin root) hands the question to its parent.
fn nearest_magic(path: &Path) -> Option<i64> {
    path.ancestors().find_map(fs_magic)
}

/// Whether `path` (or the nearest ancestor that exists) is on a mounted bpffs.
pub fn nearest_is_bpffs(path: &Path) -> Option<bool> {
    nearest_magic(path).map(|magic| magic == BPF_FS_MAGIC)
}

/// Whether `path` (or the nearest ancestor that exists) is on a tmpfs.
pub fn nearest_is_tmpfs(path: &Path) -> Option<bool> {
    nearest_magic(path).map(|magic| magic == TMPFS_MAGIC)
}
