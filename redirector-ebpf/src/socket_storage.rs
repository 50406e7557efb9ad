//! A redirected connection's original destination kept in its sockets' own storage
//! (`BPF_MAP_TYPE_SK_STORAGE`, kernel 5.2; its helpers in sock_addr, sock_ops and sockopt
//! programs on every kernel this object supports). The kernel frees it with the socket, so
//! no program watches sockets close: sock_ops asks for no state callbacks.

use core::ptr;

use aya_ebpf::{
    bindings::{bpf_sock, BPF_SK_STORAGE_GET_F_CREATE},
    btf_maps::SkStorage,
    helpers::generated::bpf_sk_storage_get,
    macros::btf_map,
};
use redirector_common::{OrigDst, SocketOrigDst};

/// socket → its original destination and which end of the connection it is. A BTF map:
/// the kernel creates socket storage only with BTF for its key and value.
#[btf_map]
pub static ORIG_DST_BY_SOCKET: SkStorage<SocketOrigDst> = SkStorage::new();

#[inline(always)]
fn map_ptr() -> *mut core::ffi::c_void {
    ptr::from_ref(&ORIG_DST_BY_SOCKET).cast_mut().cast()
}

/// The socket's entry, if it has one.
///
/// # Safety
/// `sk` is a non-null socket pointer from the program's context.
#[inline(always)]
pub unsafe fn get(sk: *mut bpf_sock) -> Option<SocketOrigDst> {
    // SAFETY: the caller passes the context's socket; the value is copied out at once.
    unsafe {
        let value = bpf_sk_storage_get(map_ptr(), sk.cast(), ptr::null_mut(), 0);
        (value as *const SocketOrigDst).as_ref().copied()
    }
}

/// Give the socket `orig`, as `side` of its connection. False when the kernel could not
/// allocate the entry.
///
/// # Safety
/// `sk` is a non-null socket pointer from the program's context.
#[inline(always)]
pub unsafe fn set(sk: *mut bpf_sock, orig: OrigDst, side: u32) -> bool {
    // SAFETY: the caller passes the context's socket; the entry is this socket's own and
    // written through the pointer the helper returns, checked for null first.
    unsafe {
        let value = bpf_sk_storage_get(
            map_ptr(),
            sk.cast(),
            ptr::null_mut(),
            u64::from(BPF_SK_STORAGE_GET_F_CREATE),
        ) as *mut SocketOrigDst;
        if value.is_null() {
            return false;
        }
        // Written whole even when the entry was there: a refused connect may be retried.
        *value = SocketOrigDst { orig, side };
        true
    }
}
