//! Map values that grow between releases, read and written at the pinned map's own size.
//!
//! A release changes a map's value only by appending fields, and a zero in an appended
//! field keeps what the shorter layout did; keys never change. So a value is written as
//! its fields followed by zeros when the map's values are longer (a newer layout), cut
//! when they are shorter (an older one), and read the same way; and an upgrade or a
//! rollback converts entries by the same rule ([`resize`]). User space and the pinned
//! programs then agree whichever release loaded the object: across an upgrade, after a
//! rollback, and with an object given by `REDIRECTOR_EBPF_OBJECT`.

use std::{borrow::Borrow, io, marker::PhantomData, os::fd::AsFd as _, path::Path};

use aya::{
    maps::{MapData, MapError, MapType, PerCpuValues},
    sys::SyscallError,
};

use crate::sys::bpf_sys;

/// Why one map's entries cannot go into another's.
#[derive(Debug, thiserror::Error)]
pub enum CopyError {
    #[error("copying map {map}: {source}")]
    Map { map: &'static str, source: MapError },
    #[error(
        "copying map {map}: its {what} changed from {from} to {to}; a release may only append fields to a map's values, so entries cannot be carried over (load the new object on a node with no pods)"
    )]
    Layout {
        map: &'static str,
        what: &'static str,
        from: String,
        to: String,
    },
}

/// The shape of a map's entries that a copy depends on.
struct Shape {
    key_size: usize,
    value_size: usize,
    per_cpu: bool,
}

fn shape(data: &MapData) -> Result<Shape, MapError> {
    let info = data.info()?;
    let per_cpu = matches!(
        info.map_type(),
        Ok(MapType::PerCpuHash | MapType::PerCpuArray | MapType::LruPerCpuHash)
    );
    Ok(Shape {
        key_size: info.key_size() as usize,
        value_size: info.value_size() as usize,
        per_cpu,
    })
}

/// A pinned map, open, with its shape.
type Opened = (MapData, Shape);

/// The maps pinned at `from` and `to`, opened, with their shapes.
fn open_pair(map: &'static str, from: &Path, to: &Path) -> Result<(Opened, Opened), CopyError> {
    let open = |path: &Path| {
        MapData::from_pin(path)
            .and_then(|data| shape(&data).map(|shape| (data, shape)))
            .map_err(|source| CopyError::Map { map, source })
    };
    let (a, b) = (open(from)?, open(to)?);
    let changed = |what, from: String, to: String| CopyError::Layout {
        map,
        what,
        from,
        to,
    };
    if a.1.key_size != b.1.key_size {
        return Err(changed(
            "key size",
            a.1.key_size.to_string(),
            b.1.key_size.to_string(),
        ));
    }
    if a.1.per_cpu != b.1.per_cpu {
        let kind = |per_cpu| if per_cpu { "per-CPU" } else { "shared" }.to_string();
        return Err(changed("kind", kind(a.1.per_cpu), kind(b.1.per_cpu)));
    }
    Ok((a, b))
}

/// The two maps' entries can be converted from one to the other: same key size, both
/// per-CPU or neither. Checked for every map before anything moves.
pub fn check_copy(map: &'static str, from: &Path, to: &Path) -> Result<(), CopyError> {
    open_pair(map, from, to).map(drop)
}

/// Every entry of the map pinned at `from` written into the one at `to`, each value
/// resized to `to`'s layout. Returns the entries copied. A write the map refuses fails the
/// copy unless `lossy` (connection state in LRU maps, where an entry that does not fit
/// would have been evicted anyway).
pub fn copy_map(
    map: &'static str,
    from: &Path,
    to: &Path,
    lossy: bool,
) -> Result<usize, CopyError> {
    let ((src, a), (dst, b)) = open_pair(map, from, to)?;
    let err = |source| CopyError::Map { map, source };
    let (slots, from_slot, to_slot) = if a.per_cpu {
        let cpus = possible_cpus().map_err(|e| err(syscall_err("reading the possible CPUs")(e)))?;
        (cpus, per_cpu_slot(a.value_size), per_cpu_slot(b.value_size))
    } else {
        (1, a.value_size, b.value_size)
    };
    // The source read through the slot codec, in the destination's layout.
    let source = Slots {
        data: src,
        slot: from_slot,
        slots,
        ours: to_slot,
    };
    let mut key: Option<Vec<u8>> = None;
    let mut copied = 0;
    loop {
        let next = bpf_sys::next_key_bytes(source.data.fd().as_fd(), key.as_deref(), a.key_size)
            .map_err(|e| err(syscall_err("bpf_map_get_next_key")(e)))?;
        let Some(next) = next else {
            return Ok(copied);
        };
        match source.get(&next) {
            Ok(converted) => match bpf_sys::update_bytes(dst.fd().as_fd(), &next, &converted, 0) {
                Ok(()) => copied += 1,
                Err(_) if lossy => {}
                Err(e) => return Err(err(syscall_err("bpf_map_update_elem")(e))),
            },
            // A key removed meanwhile is skipped, as the programs would have removed it.
            Err(MapError::KeyNotFound) => {}
            Err(e) => return Err(err(e)),
        }
        key = Some(next);
    }
}

/// `value` (`slots` slots of `from` bytes) as slots of `to` bytes: each slot's bytes cut
/// or followed by zeros.
pub fn resize(value: &[u8], from: usize, to: usize, slots: usize) -> Vec<u8> {
    let mut out = vec![0u8; to * slots];
    let kept = from.min(to);
    for (dst, src) in out.chunks_exact_mut(to).zip(value.chunks_exact(from)) {
        dst[..kept].copy_from_slice(&src[..kept]);
    }
    out
}

/// Where a per-CPU map keeps each CPU's value: the value size rounded up to 8 bytes.
pub fn per_cpu_slot(value_size: usize) -> usize {
    value_size.div_ceil(8) * 8
}

/// The CPUs a per-CPU map holds a value for.
pub fn possible_cpus() -> io::Result<usize> {
    aya::util::nr_cpus().map_err(|(_, error)| error)
}

fn syscall_err(call: &'static str) -> impl Fn(io::Error) -> MapError {
    move |io_error| MapError::SyscallError(SyscallError { call, io_error })
}

/// The key and value sizes of `data`, the key checked against `K`.
fn sizes<K>(data: &MapData) -> Result<usize, MapError> {
    let info = data.info()?;
    let (size, expected) = (info.key_size() as usize, size_of::<K>());
    if size != expected {
        return Err(MapError::InvalidKeySize { size, expected });
    }
    Ok(info.value_size() as usize)
}

/// A map's entries as bytes: values of `slots` slots (one, or one per CPU) of `slot`
/// bytes in the map, read and written as slots of `ours` bytes.
struct Slots {
    data: MapData,
    slot: usize,
    slots: usize,
    ours: usize,
}

impl Slots {
    fn get(&self, key: &[u8]) -> Result<Vec<u8>, MapError> {
        let mut value = vec![0u8; self.slot * self.slots];
        let found = bpf_sys::lookup_bytes(self.data.fd().as_fd(), key, &mut value)
            .map_err(syscall_err("bpf_map_lookup_elem"))?;
        if !found {
            return Err(MapError::KeyNotFound);
        }
        Ok(resize(&value, self.slot, self.ours, self.slots))
    }

    fn insert(&self, key: &[u8], ours: &[u8], flags: u64) -> Result<(), MapError> {
        let value = resize(ours, self.ours, self.slot, self.slots);
        bpf_sys::update_bytes(self.data.fd().as_fd(), key, &value, flags)
            .map_err(syscall_err("bpf_map_update_elem"))
    }

    fn remove(&self, key: &[u8]) -> Result<(), MapError> {
        bpf_sys::delete_bytes(self.data.fd().as_fd(), key)
            .map_err(syscall_err("bpf_map_delete_elem"))
    }
}

/// A hash map of `K` to `V` whose pinned values may be longer or shorter than `V`.
pub struct GrowingHash<K, V> {
    slots: Slots,
    _types: PhantomData<(K, V)>,
}

impl<K: bytemuck::Pod, V: bytemuck::Pod> GrowingHash<K, V> {
    pub fn new(data: MapData) -> Result<Self, MapError> {
        let slot = sizes::<K>(&data)?;
        Ok(GrowingHash {
            slots: Slots {
                data,
                slot,
                slots: 1,
                ours: size_of::<V>(),
            },
            _types: PhantomData,
        })
    }

    pub fn map(&self) -> &MapData {
        &self.slots.data
    }

    pub fn get(&self, key: &K, _flags: u64) -> Result<V, MapError> {
        let ours = self.slots.get(bytemuck::bytes_of(key))?;
        Ok(bytemuck::pod_read_unaligned(&ours))
    }

    pub fn insert(
        &mut self,
        key: impl Borrow<K>,
        value: impl Borrow<V>,
        flags: u64,
    ) -> Result<(), MapError> {
        let (key, value) = (key.borrow(), value.borrow());
        self.slots
            .insert(bytemuck::bytes_of(key), bytemuck::bytes_of(value), flags)
    }

    pub fn remove(&mut self, key: &K) -> Result<(), MapError> {
        self.slots.remove(bytemuck::bytes_of(key))
    }

    pub fn keys(&self) -> Keys<'_, K> {
        Keys::new(&self.slots.data)
    }

    /// Every entry; a key removed between the walk and its lookup is skipped.
    pub fn iter(&self) -> impl Iterator<Item = Result<(K, V), MapError>> + '_ {
        self.keys().filter_map(|key| match key {
            Err(err) => Some(Err(err)),
            Ok(key) => match self.get(&key, 0) {
                Ok(value) => Some(Ok((key, value))),
                Err(MapError::KeyNotFound) => None,
                Err(err) => Some(Err(err)),
            },
        })
    }
}

/// A per-CPU hash map of `K` to `V` whose pinned values may be longer or shorter than `V`.
pub struct GrowingPerCpuHash<K, V> {
    slots: Slots,
    _types: PhantomData<(K, V)>,
}

impl<K: bytemuck::Pod, V: bytemuck::Pod + aya::Pod> GrowingPerCpuHash<K, V> {
    pub fn new(data: MapData) -> Result<Self, MapError> {
        let value_size = sizes::<K>(&data)?;
        let cpus = possible_cpus().map_err(syscall_err("reading the possible CPUs"))?;
        Ok(GrowingPerCpuHash {
            slots: Slots {
                data,
                slot: per_cpu_slot(value_size),
                slots: cpus,
                ours: size_of::<V>(),
            },
            _types: PhantomData,
        })
    }

    pub fn get(&self, key: &K, _flags: u64) -> Result<PerCpuValues<V>, MapError> {
        let ours = self.slots.get(bytemuck::bytes_of(key))?;
        let values: Vec<V> = ours
            .chunks_exact(size_of::<V>())
            .map(bytemuck::pod_read_unaligned)
            .collect();
        PerCpuValues::try_from(values).map_err(syscall_err("reading per-CPU values"))
    }

    pub fn insert(
        &mut self,
        key: impl Borrow<K>,
        values: PerCpuValues<V>,
        flags: u64,
    ) -> Result<(), MapError> {
        let ours: Vec<u8> = values
            .iter()
            .flat_map(|v| bytemuck::bytes_of(v).iter().copied())
            .collect();
        self.slots
            .insert(bytemuck::bytes_of(key.borrow()), &ours, flags)
    }

    pub fn remove(&mut self, key: &K) -> Result<(), MapError> {
        self.slots.remove(bytemuck::bytes_of(key))
    }

    pub fn keys(&self) -> Keys<'_, K> {
        Keys::new(&self.slots.data)
    }
}

/// The keys of a map, walked one bpf call per key.
pub struct Keys<'a, K> {
    data: &'a MapData,
    last: Option<K>,
    done: bool,
}

impl<'a, K> Keys<'a, K> {
    fn new(data: &'a MapData) -> Self {
        Keys {
            data,
            last: None,
            done: false,
        }
    }
}

impl<K: bytemuck::Pod> Iterator for Keys<'_, K> {
    type Item = Result<K, MapError>;

    fn next(&mut self) -> Option<Self::Item> {
        if self.done {
            return None;
        }
        match bpf_sys::next_key(self.data.fd().as_fd(), self.last.as_ref()) {
            Ok(Some(key)) => {
                self.last = Some(key);
                Some(Ok(key))
            }
            Ok(None) => {
                self.done = true;
                None
            }
            Err(err) => {
                self.done = true;
                Some(Err(syscall_err("bpf_map_get_next_key")(err)))
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_longer_layout_gets_zeros_and_a_shorter_one_is_cut_slot_by_slot() {
        assert_eq!(resize(&[1, 2, 3, 4], 2, 3, 2), [1, 2, 0, 3, 4, 0]);
        assert_eq!(resize(&[1, 2, 0, 3, 4, 0], 3, 2, 2), [1, 2, 3, 4]);
        assert_eq!(resize(&[1, 2], 2, 2, 1), [1, 2]);
    }

    #[test]
    fn per_cpu_values_sit_in_8_byte_slots() {
        assert_eq!(per_cpu_slot(1), 8);
        assert_eq!(per_cpu_slot(8), 8);
        assert_eq!(per_cpu_slot(12), 16);
    }
}
