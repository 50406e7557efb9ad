//! The switch behind `redirector trace`: the `TRACE` bit in pod configurations, and the
//! marker of the tracer that set it.
//!
//! One tracer at a time per pin root: the programs of an object share one trace ring, so
//! two readers would each get a part. The tracer's marker is a directory named by its pid under
//! `<pin-root>/tracers/`; a tracer that was killed leaves it behind, and the next `trace`
//! or `gc` (also the daemon's) clears the bits it left set.

use std::{fs, io, path::PathBuf};

use redirector_common::{pod_flags, NetnsCookie};

use crate::{
    store::{NodeLock, NodeMaps, OpenMapError, PinRoot},
    sys::fs_error::{fs_err, FsError},
};

/// `BPF_EXIST`: update only; a pod removed meanwhile is not brought back.
const BPF_EXIST: u64 = 2;

#[derive(Debug, thiserror::Error)]
pub enum TraceError {
    #[error(transparent)]
    Fs(#[from] FsError),
    #[error(transparent)]
    OpenMap(#[from] OpenMapError),
    #[error("another `redirector trace` (pid {0}) is tracing under this pin root")]
    Busy(u32),
    #[error("writing the configuration of pod {cookie}: {source}")]
    Write {
        cookie: NetnsCookie,
        source: aya::maps::MapError,
    },
}

/// Which pods a tracer watches.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Traced {
    All,
    One(NetnsCookie),
}

/// A running tracer: its pods' switches are on until [`Tracer::stop`].
pub struct Tracer {
    root: PinRoot,
    traced: Traced,
    marker: PathBuf,
}

fn tracers_dir(root: &PinRoot) -> PathBuf {
    root.path().join("tracers")
}

/// Whether `pid` is a live `redirector` process.
fn is_tracer(pid: u32) -> bool {
    fs::read_to_string(format!("/proc/{pid}/comm"))
        .is_ok_and(|comm| comm.trim_end() == "redirector")
}

/// Remove the markers of tracers that are gone and, if none is left, clear every pod's
/// switch. Returns the pid of a live tracer, if any. The caller holds the node lock (`gc`
/// calls it too).
pub fn clear_stale_locked(root: &PinRoot) -> Result<Option<u32>, TraceError> {
    let dir = tracers_dir(root);
    let entries = match fs::read_dir(&dir) {
        Ok(entries) => entries,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(fs_err("listing", &dir)(e).into()),
    };
    let mut live = None;
    let mut stale = false;
    for entry in entries {
        let entry = entry.map_err(fs_err("listing", &dir))?;
        let pid = entry
            .file_name()
            .to_str()
            .and_then(|n| n.parse::<u32>().ok());
        match pid {
            // This process too: the daemon's own gc must not clear the trace it streams.
            Some(pid) if is_tracer(pid) => live = Some(pid),
            _ => {
                fs::remove_dir(entry.path()).map_err(fs_err("removing", &entry.path()))?;
                stale = true;
            }
        }
    }
    if live.is_none() {
        if stale {
            switch(root, Traced::All, false)?;
        }
        let _ = fs::remove_dir(&dir);
    }
    Ok(live)
}

/// Set (`on`) or clear the `TRACE` bit of the traced pods, under every object (set only
/// under objects with a trace ring: an earlier release's programs would log to a ring no
/// one reads). Writes only the configurations whose bit differs.
fn switch(root: &PinRoot, traced: Traced, on: bool) -> Result<(), TraceError> {
    for object in root
        .objects()
        .map_err(fs_err("listing", &root.objects_dir()))?
    {
        if on && !object.has_trace_ring() {
            continue;
        }
        let mut maps = NodeMaps::open(&object)?;
        let cookies: Vec<NetnsCookie> = match traced {
            Traced::One(cookie) => vec![cookie],
            Traced::All => maps.pod_config.keys().filter_map(Result::ok).collect(),
        };
        for cookie in cookies {
            let Ok(mut config) = maps.pod_config.get(&cookie, 0) else {
                continue;
            };
            if (config.flags & pod_flags::TRACE != 0) == on {
                continue;
            }
            config.flags ^= pod_flags::TRACE;
            match maps.pod_config.insert(cookie, config, BPF_EXIST) {
                Ok(()) => {}
                // Removed meanwhile.
                Err(aya::maps::MapError::SyscallError(e))
                    if e.io_error.kind() == io::ErrorKind::NotFound => {}
                Err(source) => return Err(TraceError::Write { cookie, source }),
            }
        }
    }
    Ok(())
}

impl Tracer {
    /// Switch tracing on for `traced`. Refused while another tracer is live.
    pub fn start(root: &PinRoot, traced: Traced) -> Result<Self, TraceError> {
        let _lock = NodeLock::acquire(root)?;
        if let Some(pid) = clear_stale_locked(root)? {
            return Err(TraceError::Busy(pid));
        }
        let marker = tracers_dir(root).join(std::process::id().to_string());
        fs::create_dir_all(&marker).map_err(fs_err("creating", &marker))?;
        let tracer = Tracer {
            root: root.clone(),
            traced,
            marker,
        };
        if let Err(err) = switch(root, traced, true) {
            let _ = switch(root, traced, false);
            let _ = fs::remove_dir(&tracer.marker);
            return Err(err);
        }
        Ok(tracer)
    }

    /// Set the switch again where it is missing: a pod applied again gets its planned
    /// configuration (without the bit), and with [`Traced::All`] new pods join.
    pub fn refresh(&self) -> Result<(), TraceError> {
        let _lock = NodeLock::acquire(&self.root)?;
        switch(&self.root, self.traced, true)
    }

    /// Switch tracing off and remove the marker.
    pub fn stop(self) -> Result<(), TraceError> {
        let _lock = NodeLock::acquire(&self.root)?;
        // Only this tracer's pods carry the bit: one tracer at a time.
        switch(&self.root, Traced::All, false)?;
        fs::remove_dir(&self.marker).map_err(fs_err("removing", &self.marker))?;
        let _ = fs::remove_dir(tracers_dir(&self.root));
        Ok(())
    }
}
