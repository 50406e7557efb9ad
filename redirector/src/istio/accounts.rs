//! Account names to ids, the way iptables' owner match resolves them.
//!
//! The re-entrant `get*nam_r` calls are used because tests resolve names from many threads.

use std::{ffi::CString, mem::MaybeUninit, ptr};

/// Largest buffer offered to NSS before giving up; a passwd or group entry never needs more.
const MAX_BUFFER: usize = 1 << 20;

/// The uid of user `name`, `None` if there is no such user or the lookup fails.
pub(crate) fn uid_by_name(name: &str) -> Option<u32> {
    id_by_name(name, libc::getpwnam_r, |entry: &libc::passwd| entry.pw_uid)
}

/// The gid of group `name`, `None` if there is no such group or the lookup fails.
pub(crate) fn gid_by_name(name: &str) -> Option<u32> {
    id_by_name(name, libc::getgrnam_r, |entry: &libc::group| entry.gr_gid)
}

/// The shape shared by `getpwnam_r` and `getgrnam_r`.
type GetByName<E> = unsafe extern "C" fn(
    *const libc::c_char,
    *mut E,
    *mut libc::c_char,
    libc::size_t,
    *mut *mut E,
) -> libc::c_int;

/// Looks `name` up with a `get*nam_r` call and reads the id out of the entry found.
fn id_by_name<E>(name: &str, get: GetByName<E>, id: fn(&E) -> u32) -> Option<u32> {
    let name = CString::new(name).ok()?;
    with_growing_buffer(|buf| {
        let mut entry = MaybeUninit::<E>::uninit();
        let mut found: *mut E = ptr::null_mut();
        // SAFETY: every pointer is valid for the call and `buf.len()` is the buffer's real size.
        let rc = unsafe {
            get(
                name.as_ptr(),
                entry.as_mut_ptr(),
                buf.as_mut_ptr(),
                buf.len(),
                &mut found,
            )
        };
        if rc != 0 {
            return Err(rc);
        }
        // SAFETY: on success `found` is either null or points to the now initialised `entry`.
        Ok((!found.is_null()).then(|| id(unsafe { &*found })))
    })
}

/// Calls `lookup` with a scratch buffer, doubling it while NSS answers `ERANGE`.
fn with_growing_buffer(
    mut lookup: impl FnMut(&mut [libc::c_char]) -> Result<Option<u32>, libc::c_int>,
) -> Option<u32> {
    let mut len = 1024;
    loop {
        let mut buf = vec![0; len];
        match lookup(&mut buf) {
            Ok(id) => return id,
            Err(libc::ERANGE) if len < MAX_BUFFER => len *= 2,
            // Some NSS modules report "no such name" as an errno (ENOENT, ESRCH, ...).
            Err(_) => return None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn root_resolves_to_zero() {
        assert_eq!(uid_by_name("root"), Some(0));
        assert_eq!(gid_by_name("root"), Some(0));
    }

    #[test]
    fn unknown_and_malformed_names_resolve_to_none() {
        assert_eq!(uid_by_name("no-such-user-redirector-test"), None);
        assert_eq!(gid_by_name("no-such-group-redirector-test"), None);
        assert_eq!(uid_by_name(""), None);
        assert_eq!(uid_by_name("nul\0byte"), None);
    }
}
