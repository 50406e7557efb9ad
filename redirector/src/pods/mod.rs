//! Pods on a node, set up, checked and removed through the engine, with their records:
//! the front the daemon and the CNI plugin share. Blocking work; the daemon runs it off
//! its async threads.

mod error;
pub mod records;

use std::{
    collections::{BTreeMap, HashSet},
    path::{Path, PathBuf},
    sync::{Arc, Mutex, MutexGuard, PoisonError},
};

use redirector_common::{NetnsCookie, PodConfig};

use crate::{
    engine::apply::{is_installed, Outcome},
    engine::capture::capture,
    engine::diff::Mode,
    engine::error::EngineError,
    engine::facts::PodFacts,
    engine::gc::teardown,
    engine::live_pod::LivePod,
    engine::plan::PodPlan,
    engine::pod_cgroup::NodePrograms,
    engine::pod_keys::PodKeys,
    engine::setup::Planned,
    engine::spec::PodSpec,
    mesh::PodFlags,
    store::{EbpfObject, ObjectPins, OpenMaps, PinRoot},
    sys::netns::Netns,
};
pub use error::PodError;
use records::{CniAttachment, PodRecord, Records};

/// The node state the daemon owns.
pub struct Pods {
    pub root: PinRoot,
    pub object: EbpfObject,
    pub records: Records,
    /// The object's maps, open from one request to the next.
    maps: Mutex<OpenMaps>,
    /// The node cgroup the programs are attached at, to name it (the daemon's `--cgroup`).
    node_cgroup: Option<PathBuf>,
    /// Pods whose processes run outside the node cgroup, by netns cookie: their cgroup.
    outside: Mutex<BTreeMap<u64, PathBuf>>,
    /// The object's node programs, opened for the first pod attached at its own cgroup.
    programs: Mutex<Option<Arc<NodePrograms>>>,
}

/// What [`Pods::add`] did to the pod.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Change {
    Captured,
    Updated,
    Unchanged,
}

impl Change {
    pub fn as_str(self) -> &'static str {
        match self {
            Change::Captured => "captured",
            Change::Updated => "updated",
            Change::Unchanged => "unchanged",
        }
    }
}

/// A pod [`Pods::add`] set up: what changed, its record, and for a new pod the
/// configuration just written (its counters start at zero).
#[derive(Debug)]
pub struct Added {
    pub change: Change,
    pub record: PodRecord,
    pub config: Option<PodConfig>,
}

/// What [`Pods::remove`] found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Removed {
    Removed,
    NoSuchPod,
}

impl Removed {
    pub fn as_str(self) -> &'static str {
        match self {
            Removed::Removed => "removed",
            Removed::NoSuchPod => "no such pod",
        }
    }
}

impl Pods {
    pub fn new(root: PinRoot, object: EbpfObject, records: Records) -> Self {
        Pods {
            root,
            object,
            records,
            maps: Mutex::default(),
            node_cgroup: None,
            outside: Mutex::default(),
            programs: Mutex::default(),
        }
    }

    /// The node cgroup: where pods' cgroups are found, and where the programs are attached
    /// for pods whose own cgroup is not found.
    pub fn with_node_cgroup(mut self, cgroup: PathBuf) -> Self {
        self.node_cgroup = Some(cgroup);
        self
    }

    /// The pod's own cgroup: `given` (the caller knows it), else the one it had, else the
    /// cgroup of a process in its namespace below the node cgroup. `None`: the pod relies
    /// on the programs at the node cgroup.
    fn pod_cgroup(
        &self,
        given: Option<PathBuf>,
        previous: Option<&PodRecord>,
        netns: &Path,
    ) -> Option<PathBuf> {
        given
            .or_else(|| previous.and_then(|r| r.cgroup.clone()))
            .filter(|c| c.is_dir())
            .or_else(|| {
                let node = self.node_cgroup.as_deref()?;
                let ino = std::os::unix::fs::MetadataExt::ino(&std::fs::metadata(node).ok()?);
                crate::sys::pod_cgroup::of_netns(netns, ino)
            })
    }

    /// The object's node programs, open.
    fn node_programs(&self) -> Result<Arc<NodePrograms>, EngineError> {
        let mut programs = self.programs.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some(open) = programs.as_ref() {
            return Ok(Arc::clone(open));
        }
        let open = Arc::new(NodePrograms::open(&self.pins())?);
        *programs = Some(Arc::clone(&open));
        Ok(open)
    }

    /// The programs for the pod of `record`: at its own cgroup (the UDP DNS ones when it
    /// captures DNS), or at the node cgroup.
    fn attach_programs(&self, record: &PodRecord, dns: bool) -> Result<(), PodError> {
        let failed = |source| PodError::Apply {
            cookie: record.cookie(),
            source: Box::new(source),
        };
        match &record.cgroup {
            Some(cgroup) => self
                .node_programs()
                .and_then(|programs| {
                    crate::engine::pod_cgroup::attach(&programs, cgroup, dns, record.cookie())
                })
                .map(drop)
                .map_err(failed),
            None => {
                let node = self.node_cgroup.as_deref().ok_or_else(|| {
                    PodError::NoCgroup(
                        "no cgroup of the pod's is known (no pod UID, no process in its namespace) and no node cgroup is noted to attach its programs at: start the daemon"
                            .into(),
                    )
                })?;
                crate::engine::node::attach_node(&self.root, &self.object, node)
                    .map(drop)
                    .map_err(failed)
            }
        }
    }

    /// The pins of the node's object.
    pub fn pins(&self) -> ObjectPins {
        self.root.object(self.object.id())
    }

    /// Why this release must not write for the pod with `cookie`: the node's pinned
    /// programs read a newer format of entries than it writes (a newer release's daemon
    /// upgraded the node, and this plugin or daemon is the older one), or the pod's record
    /// shard holds newer records. Checked before anything is written.
    pub fn format_skew(&self, cookie: NetnsCookie) -> Result<Option<String>, PodError> {
        let pinned = self.pins().format();
        if pinned > redirector_common::FORMAT {
            return Ok(Some(format!(
                "the node's programs (object {}) read entries of format {pinned}, and this redirector writes format {}: it will not write a layout they do not read; retry once this node runs the newer release's plugin",
                self.object.id(),
                redirector_common::FORMAT
            )));
        }
        Ok(self.records.newer_format(cookie)?)
    }

    /// The node cgroup's inode, from the node's links.
    pub(crate) fn node_cgroup_id(&self) -> Option<u64> {
        crate::engine::node::node_cgroup_id(&self.pins())
    }

    pub(crate) fn describe_node_cgroup(&self, id: u64) -> String {
        match &self.node_cgroup {
            Some(path) => path.display().to_string(),
            None => format!("with inode {id}"),
        }
    }

    /// Find the pods whose processes run outside the node cgroup (one pass over /proc),
    /// log the ones newly found, and keep them for `list` and the metrics. How many.
    pub fn find_outside(&self) -> Result<usize, PodError> {
        let Some(node) = self.node_cgroup_id() else {
            return Ok(0);
        };
        let records: Vec<_> = self
            .records
            .all()?
            .into_iter()
            .filter(|r| r.cgroup.is_none())
            .collect();
        let ids: Vec<_> = records
            .iter()
            .map(|r| crate::sys::pod_cgroup::ns_id(&r.netns))
            .collect();
        let wanted: HashSet<_> = ids.iter().flatten().copied().collect();
        let cgroups = crate::sys::pod_cgroup::cgroups_of(&wanted);
        let mut found = BTreeMap::new();
        for (record, id) in records.iter().zip(ids) {
            let Some(cgroup) = id.and_then(|id| cgroups.get(&id)) else {
                continue;
            };
            if !crate::sys::pod_cgroup::is_below(cgroup, node) {
                found.insert(record.netns_cookie, cgroup.clone());
            }
        }
        let mut outside = self.outside.lock().unwrap_or_else(PoisonError::into_inner);
        for (cookie, cgroup) in &found {
            if !outside.contains_key(cookie) {
                let name = records
                    .iter()
                    .find(|r| r.netns_cookie == *cookie)
                    .and_then(|r| r.name.as_deref())
                    .unwrap_or("-");
                tracing::warn!(
                    "pod {name} (netns cookie {cookie}) runs in cgroup {}, outside the node cgroup {}: none of the node's programs runs on its sockets, so it is not captured",
                    cgroup.display(),
                    self.describe_node_cgroup(node)
                );
            }
        }
        *outside = found;
        Ok(outside.len())
    }

    /// How many pods were last found outside the node cgroup.
    pub fn outside_count(&self) -> usize {
        self.outside
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .len()
    }

    /// The open maps; a request that panicked holding them left nothing half-written in
    /// them that the next apply's observe does not read again.
    pub(crate) fn maps(&self) -> MutexGuard<'_, OpenMaps> {
        self.maps.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn plan(&self, netns: &Netns, spec: &PodSpec) -> Result<PodPlan, PodError> {
        let facts = PodFacts::gather(netns, None, &spec.resolv_conf)
            .map_err(|e| PodError::Namespace(e.to_string()))?;
        Ok(Planned::of(&spec.capture, &facts).plan)
    }

    /// Capture the pod in `netns_path` as `spec` says; `flags`: what the spec was read
    /// from (`crate::mesh::pod_spec`), kept in its record; `cgroup`: the pod's own
    /// cgroup, where the caller knows it.
    pub fn add(
        &self,
        netns_path: &Path,
        name: Option<String>,
        (flags, spec): (PodFlags, &PodSpec),
        cni: Option<CniAttachment>,
        cgroup: Option<PathBuf>,
    ) -> Result<Added, PodError> {
        let started = std::time::Instant::now();
        if let Some(given) = cgroup.as_ref().filter(|c| !c.is_dir()) {
            return Err(PodError::NoCgroup(format!(
                "cgroup {}: not a cgroup directory",
                given.display()
            )));
        }
        let (netns, facts) =
            PodFacts::open_and_gather(netns_path, spec.allow_host_netns, None, &spec.resolv_conf)
                .map_err(|e| PodError::Namespace(e.to_string()))?;
        if let Some(skew) = self.format_skew(netns.cookie())? {
            return Err(PodError::NewerFormat(skew));
        }
        let Planned { plan, notes } = Planned::of(&spec.capture, &facts);
        for note in notes {
            tracing::info!("pod {}: {note}", name.as_deref().unwrap_or("-"));
        }
        let cookie = netns.cookie();
        let keys = PodKeys::of(&plan);
        let previous = self.records.get(cookie)?;
        let cgroup = self.pod_cgroup(cgroup, previous.as_ref(), netns_path);
        if cgroup.is_none() && self.pins().reads_cgroup_cookie() {
            // Before anything is written: the node cgroup cannot carry this pod's cookie.
            return Err(PodError::Apply {
                cookie,
                source: Box::new(EngineError::SharedCgroup {
                    cgroup: self.node_cgroup.as_deref().map_or_else(
                        || "the node cgroup".to_owned(),
                        |node| node.display().to_string(),
                    ),
                }),
            });
        }
        let new_pod = previous.is_none();
        let mut maps = self.maps();
        let known = self.note_keys(previous, &keys)?;
        let outcome = capture(
            &self.root,
            &self.object,
            &plan,
            &netns,
            Mode::Changes,
            &mut maps,
            known.as_ref(),
        )
        .map_err(|source| PodError::Apply {
            cookie,
            source: Box::new(source),
        })?;
        drop(maps);
        let record = PodRecord {
            netns_cookie: cookie.get(),
            netns: netns_path.to_path_buf(),
            name,
            args: flags.args,
            dialect: flags.dialect,
            container_id: cni.as_ref().map(|c| c.container_id.clone()),
            network: cni.and_then(|c| c.network),
            format: redirector_common::FORMAT,
            keys: Some(keys),
            cgroup,
        };
        // Saved first: a pod whose programs are attached is always one the record names.
        self.records.save(&record)?;
        if let Err(err) = self.attach_programs(&record, captures_dns(&plan.config)) {
            // A new pod goes again rather than stay half set up (its entries with no
            // program); one set up before keeps what it had attached.
            if new_pod {
                let removed = remove_pod(
                    &self.root,
                    &self.records,
                    Some(record),
                    Some(cookie),
                    &mut self.maps(),
                );
                if let Err(undo) = removed {
                    tracing::warn!("removing the pod whose programs were not attached: {undo}");
                }
            }
            return Err(err);
        }
        let took = started.elapsed();
        let (change, config) = match outcome {
            // Just written: the plan's config.
            Outcome::New(_) => (Change::Captured, Some(plan.config)),
            Outcome::Replaced(_) => (Change::Updated, None),
            Outcome::Unchanged => (Change::Unchanged, None),
        };
        tracing::info!(
            "pod {} (netns cookie {}) {} in {:.2} ms",
            record.name.as_deref().unwrap_or("-"),
            record.netns_cookie,
            change.as_str(),
            took.as_secs_f64() * 1e3
        );
        Ok(Added {
            change,
            record,
            config,
        })
    }

    /// The keys the pod's record says its applies may have written, with `planned` added
    /// to the record first if it lacks any of them: an apply killed after writing them
    /// then leaves nothing the record does not name. `None` when the pod has no record, or
    /// one of an earlier release: what is installed is then read through.
    fn note_keys(
        &self,
        previous: Option<PodRecord>,
        planned: &PodKeys,
    ) -> Result<Option<PodKeys>, PodError> {
        let Some(record) = previous else {
            return Ok(None);
        };
        let Some(known) = record.keys.clone() else {
            return Ok(None);
        };
        if !known.covers(planned) {
            let ahead = PodRecord {
                keys: Some(known.union(planned)),
                ..record
            };
            self.records.save(&ahead)?;
        }
        Ok(Some(known))
    }

    /// Remove the pod of a record or with a cookie; nothing to remove is not an error.
    pub fn remove(
        &self,
        record: Option<PodRecord>,
        cookie: Option<NetnsCookie>,
    ) -> Result<Removed, PodError> {
        remove_pod(&self.root, &self.records, record, cookie, &mut self.maps())
    }

    /// Whether the pod of `record` is installed exactly as `spec` (its flags') plans it.
    pub fn check_record(&self, record: &PodRecord, spec: &PodSpec) -> Result<(), PodError> {
        let netns = Netns::open(&record.netns).map_err(|e| PodError::Namespace(e.to_string()))?;
        if netns.cookie() != record.cookie() {
            return Err(PodError::NamespaceReused {
                path: record.netns.clone(),
                now: netns.cookie(),
                was: record.netns_cookie,
            });
        }
        let plan = self.plan(&netns, spec)?;
        let same = is_installed(
            &self.root,
            &self.object,
            &plan,
            &netns,
            &mut self.maps(),
            record.keys.as_ref(),
        )?;
        match &record.cgroup {
            Some(cgroup) => {
                let hooks =
                    crate::engine::pod_cgroup::attached_hooks(&*self.node_programs()?, cgroup)?;
                let dns = captures_dns(&plan.config);
                let wanted = crate::store::programs::NODE_PROGRAMS
                    .iter()
                    .filter(|p| crate::engine::pod_cgroup::wanted(p, dns))
                    .count();
                if hooks.len() != wanted {
                    return Err(PodError::NotAttached {
                        cgroup: cgroup.clone(),
                        attached: hooks.len(),
                    });
                }
            }
            None => match self.node_cgroup_id() {
                Some(node) => {
                    if let Some(cgroup) = crate::sys::pod_cgroup::outside(&record.netns, node) {
                        return Err(PodError::OutsideNodeCgroup {
                            cgroup,
                            node: self.describe_node_cgroup(node),
                        });
                    }
                }
                None => return Err(PodError::NoNodeLinks),
            },
        }
        if same {
            Ok(())
        } else {
            Err(PodError::Differs)
        }
    }

    /// The cgroup a pod was last found in outside the node cgroup, if it was.
    pub fn outside_of(&self, cookie: u64) -> Option<PathBuf> {
        self.outside
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .get(&cookie)
            .cloned()
    }

    /// Start-up reconcile: remove pods whose namespace (and cgroup) are gone, and the
    /// records of pods that are no longer installed. Live pods are left exactly as they are.
    pub fn reconcile(&self) -> Result<(Vec<NetnsCookie>, usize), PodError> {
        let removed = crate::engine::gc::collect_stale(&self.root)?;
        let mut kept = Vec::new();
        for record in self.records.all()? {
            let installed = LivePod::open(&self.root, record.cookie()).is_ok();
            if installed {
                kept.push(record);
            } else {
                self.records.remove(record.cookie())?;
            }
        }
        let count = kept.len();
        self.settle_attachments(kept)?;
        self.find_outside()?;
        Ok((removed, count))
    }

    /// Pods that rely on the programs at the node cgroup get them at their own cgroup where
    /// one is found now (a process runs in their namespace: pods a release before set up, or
    /// a bare namespace the API was given); then the programs stay at the node cgroup only
    /// while a pod still relies on them, and are attached there if one does.
    fn settle_attachments(&self, records: Vec<PodRecord>) -> Result<(), PodError> {
        let recorded: HashSet<u64> = records.iter().map(|r| r.netns_cookie).collect();
        let mut relying = Vec::new();
        for record in records {
            if record.cgroup.is_some() {
                continue;
            }
            match self.pod_cgroup(None, None, &record.netns) {
                Some(cgroup) => {
                    let moved = PodRecord {
                        cgroup: Some(cgroup),
                        ..record
                    };
                    // Attached at its cgroup before the node's programs may go.
                    self.records.save(&moved)?;
                    // Its DNS programs as its live configuration says (all when unread).
                    let dns = LivePod::open(&self.root, moved.cookie())
                        .map_or(true, |live| captures_dns(&live.config));
                    self.attach_programs(&moved, dns)?;
                    tracing::info!(
                        "pod {} (netns cookie {}): programs attached at its cgroup {}",
                        moved.name.as_deref().unwrap_or("-"),
                        moved.netns_cookie,
                        moved.cgroup.as_deref().unwrap_or(Path::new("?")).display()
                    );
                }
                None => relying.push(record.netns_cookie),
            }
        }
        let init_pods = crate::engine::node::pods_covered_without_links(&self.pins(), &recorded)?;
        if relying.is_empty() && init_pods == 0 {
            let detached = crate::engine::node::detach_node_links(&self.root)?;
            if detached > 0 {
                tracing::info!(
                    "no pod relies on the programs at the node cgroup: {detached} link(s) removed there"
                );
            }
        } else if let Some(node) = &self.node_cgroup {
            crate::engine::node::attach_node(&self.root, &self.object, node)?;
        }
        Ok(())
    }
}

/// Whether a pod's configuration captures DNS (its UDP DNS programs are attached).
fn captures_dns(config: &PodConfig) -> bool {
    config.flags & redirector_common::pod_flags::DNS_CAPTURE != 0
}

/// Remove the pod of a record or with a cookie, and its record; nothing to remove is not
/// an error (removal is idempotent).
pub fn remove_pod(
    root: &PinRoot,
    records: &Records,
    record: Option<PodRecord>,
    cookie: Option<NetnsCookie>,
    maps: &mut OpenMaps,
) -> Result<Removed, PodError> {
    let Some(cookie) = cookie else {
        return Ok(Removed::NoSuchPod);
    };
    if let Some(cgroup) = record.as_ref().and_then(|r| r.cgroup.as_ref()) {
        crate::engine::pod_cgroup::detach_ours(cgroup)?;
    }
    let known = record.as_ref().and_then(|r| r.keys.as_ref());
    let removed = teardown(root, cookie, maps, known)?;
    records.remove(cookie)?;
    Ok(if removed.is_empty() && record.is_none() {
        Removed::NoSuchPod
    } else {
        Removed::Removed
    })
}
