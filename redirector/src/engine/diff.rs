//! From a plan and what is installed to the operations that turn one into the other.
//!
//! Pure: the caller observes ([`crate::engine::observe`]) and executes ([`crate::engine::apply`]). An
//! empty diff means the pod is exactly as planned.

use redirector_common::{Cidr4Key, Cidr6Key, ConnKey, ListenerKey, PodAddrKey, PodConfig, PortKey};

use crate::sys::bpf_sys::LinkTarget;
use crate::{
    engine::observe::{Installation, PodState},
    engine::plan::{CidrEntry, PodPlan},
    store::{
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
    let ports = to_write(&plan.ports, &have.ports, everything);
    let cidrs_v4 = to_write(&plan.cidrs_v4, &have.cidrs_v4, everything);
    let cidrs_v6 = to_write(&plan.cidrs_v6, &have.cidrs_v6, everything);
    let addrs = to_write(&plan.addrs, &have.addrs, everything);
    writes.extend(ports.into_iter().map(Write::Port));
    writes.extend(cidrs_v4.into_iter().map(Write::Cidr4));
    writes.extend(cidrs_v6.into_iter().map(Write::Cidr6));
    writes.extend(addrs.into_iter().map(Write::Addr));
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

/// The planned entries to write: those not installed as they are, or all of them.
fn to_write<T: PartialEq + Copy>(planned: &[T], installed: &[T], everything: bool) -> Vec<T> {
    planned
        .iter()
        .filter(|e| everything || !installed.contains(e))
        .copied()
        .collect()
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

#[cfg(test)]
mod tests {
    use std::collections::HashMap;

    use redirector_common::{NetnsCookie, PortSet};

    use super::*;
    use crate::{
        engine::facts::PodFacts,
        engine::observe::ObservedLink,
        engine::plan::plan_pod,
        mesh::istio::parse_istio_iptables,
        store::{ObjectId, PinRoot},
    };

    const TARGETS: AttachTargets = AttachTargets {
        cgroup_id: 7,
        netns_inode: 9,
    };

    fn plan(args: &[&str]) -> PodPlan {
        let argv = std::iter::once("istio-iptables").chain(args.iter().copied());
        let cfg = parse_istio_iptables(argv, &HashMap::<String, String>::new()).unwrap();
        let facts = PodFacts {
            netns_cookie: NetnsCookie(42),
            local_addrs: vec!["10.244.1.5".parse().unwrap()],
            cgroup: Some("/sys/fs/cgroup/pod".into()),
            interfaces: vec![("lo".into(), 1), ("eth0".into(), 2)],
            dns_servers: Vec::new(),
            routes: Vec::new(),
            ids: None,
        };
        plan_pod(&cfg.capture, &facts)
    }

    fn object(name: &[u8]) -> ObjectPins {
        PinRoot::new("/sys/fs/bpf/redirector-unit").object(&ObjectId::of(name))
    }

    /// What an apply of `plan` under `object` leaves behind.
    fn installed(plan: &PodPlan, object: ObjectPins) -> Installation {
        Installation {
            config: Some(plan.config),
            counters: true,
            ports: plan.ports.clone(),
            cidrs_v4: plan.cidrs_v4.clone(),
            cidrs_v6: plan.cidrs_v6.clone(),
            addrs: plan.addrs.clone(),
            links: plan
                .programs
                .iter()
                .map(|p| ObservedLink {
                    hook: p.hook.to_owned(),
                    target: Some(TARGETS.of(p)),
                })
                .collect(),
            ..Installation::empty(object)
        }
    }

    fn state(installations: Vec<Installation>) -> PodState {
        PodState {
            netns_cookie: NetnsCookie(42),
            installations,
        }
    }

    const STANDARD: [&str; 6] = ["-p", "15001", "-u", "1337", "-d", "15090,15021"];

    #[test]
    fn a_new_pod_gets_every_entry_and_link_with_the_config_after_the_sets() {
        let plan = plan(&STANDARD);
        let d = diff(&plan, &object(b"a"), TARGETS, &state(vec![]), Mode::Changes);
        let ops = d.target.as_ref().unwrap();
        assert!(ops.removals.is_empty() && d.retire.is_empty());
        let config_at = ops
            .writes
            .iter()
            .position(|w| matches!(w, Write::Config(_)))
            .unwrap();
        let last_set = ops
            .writes
            .iter()
            .rposition(|w| matches!(w, Write::Port(_) | Write::Cidr4(_) | Write::Addr(_)))
            .unwrap();
        assert!(last_set < config_at);
        assert!(ops.writes.contains(&Write::Counters));
        let attached = ops
            .writes
            .iter()
            .filter(|w| matches!(w, Write::Attach(_)))
            .count();
        assert_eq!(attached, plan.programs.len());
    }

    #[test]
    fn the_installed_plan_diffs_to_nothing_unless_forced() {
        let plan = plan(&STANDARD);
        let obj = object(b"a");
        let have = state(vec![installed(&plan, obj.clone())]);
        assert!(diff(&plan, &obj, TARGETS, &have, Mode::Changes).is_empty());
        let forced = diff(&plan, &obj, TARGETS, &have, Mode::Everything);
        let writes = &forced.target.as_ref().unwrap().writes;
        assert!(writes.contains(&Write::Config(plan.config)));
        assert!(
            !writes.contains(&Write::Counters),
            "counters are never reset"
        );
    }

    #[test]
    fn a_link_attached_elsewhere_is_attached_again() {
        let plan = plan(&STANDARD);
        let obj = object(b"a");
        let moved = AttachTargets {
            cgroup_id: 8,
            ..TARGETS
        };
        let d = diff(
            &plan,
            &obj,
            moved,
            &state(vec![installed(&plan, obj.clone())]),
            Mode::Changes,
        );
        let ops = d.target.unwrap();
        assert!(ops.writes.iter().all(|w| matches!(w, Write::Attach(_))));
        assert_eq!(ops.writes.len(), plan.programs.len());
    }

    #[test]
    fn what_the_plan_no_longer_has_is_removed_and_what_changed_rewritten() {
        let old = plan(&["-o", "9000", "-d", "15090"]);
        let new = plan(&["-d", "15090,15021"]);
        let obj = object(b"a");
        let mut have = installed(&old, obj.clone());
        have.links.push(ObservedLink {
            hook: "sendmsg4".into(),
            target: Some(LinkTarget::Cgroup(7)),
        });
        let d = diff(&new, &obj, TARGETS, &state(vec![have]), Mode::Changes);
        let ops = d.target.unwrap();
        let stale = PortKey::new(42, PortSet::OutboundExclude, 9000);
        assert!(ops.removals.contains(&Removal::Port(stale)));
        assert!(ops.removals.contains(&Removal::Detach("sendmsg4".into())));
        let added = PortKey::new(42, PortSet::InboundExclude, 15021);
        assert!(ops.writes.contains(&Write::Port(added)));
        assert!(!ops.writes.contains(&Write::Port(PortKey::new(
            42,
            PortSet::InboundExclude,
            15090
        ))));
    }

    #[test]
    fn a_pod_under_another_object_moves_and_leaves_nothing_there() {
        let plan = plan(&STANDARD);
        let (old, new) = (object(b"old"), object(b"new"));
        let mut there = installed(&plan, old.clone());
        there.listeners.push(ListenerKey {
            netns_cookie: 42,
            port: 15006,
            family: 2,
            _pad: 0,
        });
        let d = diff(&plan, &new, TARGETS, &state(vec![there]), Mode::Changes);
        assert_eq!(d.retired_objects(), vec![old.id().clone()]);
        let removals = &d.retire[0].removals;
        assert!(removals.contains(&Removal::Config));
        assert!(removals.contains(&Removal::Counters));
        assert!(removals.iter().any(|r| matches!(r, Removal::Listener(_))));
        assert_eq!(
            removals
                .iter()
                .filter(|r| matches!(r, Removal::Detach(_)))
                .count(),
            plan.programs.len()
        );
        assert!(d
            .target
            .unwrap()
            .writes
            .contains(&Write::Config(plan.config)));
    }
}
