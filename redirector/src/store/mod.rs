//! The node's kernel-side store: the eBPF object loaded once and pinned, its maps, the
//! pin layout on bpffs, the node lock, and the few raw bpf(2) calls aya lacks.

pub mod cgroup_cookie;
pub mod growing;
pub mod lock;
pub mod node_maps;
pub mod object;
pub mod pins;
pub mod programs;
pub mod sizing;

pub use lock::{DirLock, NodeLock};
pub use node_maps::{NodeMaps, OpenMapError, OpenMaps};
pub use object::{
    ensure_loaded, ensure_loaded_sharing, open_program, EbpfObject, ObjectError,
    OBJECT_OVERRIDE_ENV,
};
pub use pins::{ObjectId, ObjectPins, PinRoot, PodPins};
pub use sizing::PodCapacity;
