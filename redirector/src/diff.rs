//! From a plan and what is installed to the operations that turn one into the other.
//!
//! Pure: the caller observes ([`crate::observe`]) and executes ([`crate::apply`]). An
//! empty diff means the pod is exactly as planned.

use redirector_common::{Cidr4Key, Cidr6Key, ConnKey, ListenerKey, PodAddrKey, PodConfig, PortKey};

use crate::{
    observe::{Installation, PodState},
    plan::{CidrEntry, PodPlan},
    store::{
        bpf_sys::LinkTarget,
        programs::{AttachTarget, ProgramSpec},
        ObjectId, ObjectPins,
    },
};

/// A write into the target object, in the order it is made: sets first and the
/// configuration last (a pod with a configuration is live, and must never be live with
/// half its sets), then links, which are staged and swapped in together.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Write {
    Port(PortKey),
    Cidr4(CidrEntry<Cidr4Key>),
    Cidr6(CidrEntry<Cidr6Key>),
    Addr(PodAddrKey),
    /// Zeroed per-CPU counters; existing counters are never reset.
    Counters,
    Config(PodConfig),
    Attach(&'static ProgramSpec),
}

/// A removal, made after the writes are in place: links first (the programs stop seeing
/// the pod), then the configuration, then the entries.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Removal {
    Detach(String),
    Config,
    Counters,
    Port(PortKey),
    Cidr4(CidrEntry<Cidr4Key>),
    Cidr6(CidrEntry<Cidr6Key>),
    Addr(PodAddrKey),
    Listener(ListenerKey),
    Connection(ConnKey),
}

/// What to do under one object.
#[derive(Clone, Debug)]
pub struct ObjectOps {
    pub object: ObjectPins,
    pub writes: Vec<Write>,
    pub removals: Vec<Removal>,
}

impl ObjectOps {
    fn is_empty(&self) -> bool {
        self.writes.is_empty() && self.removals.is_empty()
    }
}

/// The operations for a pod: those under the object the plan uses, and the removal of
/// the pod from every other object.
#[derive(Clone, Debug)]
pub struct PodDiff {
    pub target: Option<ObjectOps>,
    pub retire: Vec<ObjectOps>,
}

impl PodDiff {
    pub fn is_empty(&self) -> bool {
        self.target.as_ref().is_none_or(ObjectOps::is_empty) && self.retire.is_empty()
    }

    /// The objects the pod is removed from.
    pub fn retired_objects(&self) -> Vec<ObjectId> {
        self.retire.iter().map(|o| o.object.id().clone()).collect()
    }
}

/// What the plan's links must be attached to: the pod's cgroup (by id, the inode of its
/// directory) and network namespace (by inode).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct AttachTargets {
    pub cgroup_id: u64,
    pub netns_inode: u64,
}

impl AttachTargets {
    fn of(&self, spec: &ProgramSpec) -> LinkTarget {
        match spec.target {
            AttachTarget::Cgroup => LinkTarget::Cgroup(self.cgroup_id),
            AttachTarget::Netns => LinkTarget::Netns(self.netns_inode as u32),
        }
    }
}

/// Whether to rewrite what is already in place.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Mode {
    /// Only what differs.
    Changes,
    /// Every entry and link again (`--force-apply`); counters are kept.
    Everything,
}

/// The operations that make `state` what `plan` describes under `target`.
pub fn diff(
    plan: &PodPlan,
    target: &ObjectPins,
    targets: AttachTargets,
    state: &PodState,
    mode: Mode,
) -> PodDiff {
    let current = state
        .installations
        .iter()
        .find(|i| i.object.id() == target.id());
    let empty = Installation::empty(target.clone());
    let have = current.unwrap_or(&empty);
    let everything = mode == Mode::Everything;
    let mut writes = Vec::new();
    let mut removals = Vec::new();

    // Additions and changes, in the order they must be made.
    let missing = |present: bool| everything || !present;
    writes.extend(
        plan.ports
            .iter()
            .filter(|k| missing(have.ports.contains(k)))
            .map(|k| Write::Port(*k)),
    );
    writes.extend(
        plan.cidrs_v4
            .iter()
            .filter(|e| missing(have.cidrs_v4.contains(e)))
            .map(|e| Write::Cidr4(*e)),
    );
    writes.extend(
        plan.cidrs_v6
            .iter()
            .filter(|e| missing(have.cidrs_v6.contains(e)))
            .map(|e| Write::Cidr6(*e)),
    );
    writes.extend(
        plan.addrs
            .iter()
            .filter(|a| missing(have.addrs.contains(a)))
            .map(|a| Write::Addr(*a)),
    );
    if !have.counters {
        writes.push(Write::Counters);
    }
    if missing(have.config == Some(plan.config)) {
        writes.push(Write::Config(plan.config));
    }
    // Links: all of them anew once anything differs, swapped in together, so that a
    // pod's links always come from one apply.
    let links_in_place = plan.programs.iter().all(|spec| {
        have.links
            .iter()
            .any(|l| l.hook == spec.hook && l.target == Some(targets.of(spec)))
    });

    // What the plan no longer has.
    removals.extend(
        have.links
            .iter()
            .filter(|l| !plan.programs.iter().any(|p| p.hook == l.hook))
            .map(|l| Removal::Detach(l.hook.clone())),
    );
    removals.extend(
        have.ports
            .iter()
            .filter(|k| !plan.ports.contains(k))
            .map(|k| Removal::Port(*k)),
    );
    // A CIDR entry is keyed by prefix and data; a changed value is a write, not a removal.
    removals.extend(
        have.cidrs_v4
            .iter()
            .filter(|e| !plan.cidrs_v4.iter().any(|p| same_key(p, e)))
            .map(|e| Removal::Cidr4(*e)),
    );
    removals.extend(
        have.cidrs_v6
            .iter()
            .filter(|e| !plan.cidrs_v6.iter().any(|p| same_key(p, e)))
            .map(|e| Removal::Cidr6(*e)),
    );
    removals.extend(
        have.addrs
            .iter()
            .filter(|a| !plan.addrs.contains(a))
            .map(|a| Removal::Addr(*a)),
    );

    if !writes.is_empty() || !removals.is_empty() || !links_in_place || everything {
        writes.extend(plan.programs.iter().map(Write::Attach));
    }

    let retire = state
        .installations
        .iter()
        .filter(|i| i.object.id() != target.id())
        .map(removal)
        .collect();
    PodDiff {
        target: Some(ObjectOps {
            object: target.clone(),
            writes,
            removals,
        }),
        retire,
    }
}

/// The operations that remove the pod from every object.
pub fn remove_all(state: &PodState) -> PodDiff {
    PodDiff {
        target: None,
        retire: state.installations.iter().map(removal).collect(),
    }
}

fn same_key<K: PartialEq>(a: &CidrEntry<K>, b: &CidrEntry<K>) -> bool {
    a.prefix_len == b.prefix_len && a.data == b.data
}

/// Everything an installation holds, to remove.
pub fn removal(install: &Installation) -> ObjectOps {
    let mut removals: Vec<Removal> = install
        .links
        .iter()
        .map(|l| Removal::Detach(l.hook.clone()))
        .collect();
    if install.config.is_some() {
        removals.push(Removal::Config);
    }
    if install.counters {
        removals.push(Removal::Counters);
    }
    removals.extend(install.ports.iter().map(|k| Removal::Port(*k)));
    removals.extend(install.cidrs_v4.iter().map(|e| Removal::Cidr4(*e)));
    removals.extend(install.cidrs_v6.iter().map(|e| Removal::Cidr6(*e)));
    removals.extend(install.addrs.iter().map(|a| Removal::Addr(*a)));
    removals.extend(install.listeners.iter().map(|k| Removal::Listener(*k)));
    removals.extend(install.connections.iter().map(|k| Removal::Connection(*k)));
    ObjectOps {
        object: install.object.clone(),
        writes: Vec::new(),
        removals,
    }
}
