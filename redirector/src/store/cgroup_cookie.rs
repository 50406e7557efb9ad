//! The pod's netns cookie stamped on its cgroup, for the program variants that read it
//! there (`*_cgroup_cookie`: sock_ops and getsockopt programs cannot call
//! `bpf_get_netns_cookie` before 5.15). The kernel makes the `POD_COOKIE` cgroup-storage
//! entry when such a program is attached at a cgroup and frees it at detach; user space
//! fills it in after each attach, before the pod's configuration makes any connection of
//! it redirected.

use std::{
    fs, io,
    os::fd::{AsFd, BorrowedFd, OwnedFd},
    os::unix::fs::MetadataExt,
};

use redirector_common::{names, NetnsCookie};

use super::ObjectPins;
use crate::sys::bpf_sys;
use crate::sys::fs_error::FsError;

/// The object's `POD_COOKIE` map, open.
pub struct CookieStamps(OwnedFd);

impl CookieStamps {
    pub fn open(object: &ObjectPins) -> Result<Self, FsError> {
        let path = object.map(names::POD_COOKIE);
        bpf_sys::obj_get(&path)
            .map(CookieStamps)
            .map_err(|e| FsError::new("opening pinned map", path.display(), e))
    }

    fn map(&self) -> BorrowedFd<'_> {
        self.0.as_fd()
    }

    /// Stamp `cookie` on the entry of the program attached at `cgroup` with `attach_type`.
    pub fn write(
        &self,
        cgroup: &fs::File,
        attach_type: u32,
        cookie: NetnsCookie,
    ) -> io::Result<()> {
        let key = key(cgroup, attach_type)?;
        bpf_sys::update_bytes(self.map(), &key, &cookie.get().to_ne_bytes(), 0)
    }

    /// The cookie stamped for the program attached at `cgroup` with `attach_type`.
    pub fn read(&self, cgroup: &fs::File, attach_type: u32) -> io::Result<NetnsCookie> {
        let key = key(cgroup, attach_type)?;
        let mut value = [0u8; 8];
        if !bpf_sys::lookup_bytes(self.map(), &key, &mut value)? {
            return Err(io::Error::new(
                io::ErrorKind::NotFound,
                "no cookie stamped on the cgroup for this program",
            ));
        }
        Ok(NetnsCookie(u64::from_ne_bytes(value)))
    }
}

/// `struct bpf_cgroup_storage_key`: the cgroup's id (its directory's inode) and the attach
/// type, padded to 16 bytes.
fn key(cgroup: &fs::File, attach_type: u32) -> io::Result<[u8; 16]> {
    let mut key = [0u8; 16];
    key[..8].copy_from_slice(&cgroup.metadata()?.ino().to_ne_bytes());
    key[8..12].copy_from_slice(&attach_type.to_ne_bytes());
    Ok(key)
}
