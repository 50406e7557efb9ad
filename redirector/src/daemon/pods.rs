//! The daemon's handling of each request, on the engine: blocking work, run off the
//! async threads.

use std::{
    collections::{BTreeMap, HashSet},
    path::{Path, PathBuf},
    sync::{Mutex, MutexGuard, PoisonError},
};

use redirector_common::{NetnsCookie, PodConfig, Reason, COUNTER_SLOTS};

use super::{
    api::{PodInfo, PodRef, Request, Response},
    records::{CniAttachment, PodRecord, Records},
};
use crate::{
    engine::apply::{apply, is_installed, Outcome},
    engine::diff::Mode,
    engine::facts::PodFacts,
    engine::gc::teardown,
    engine::live_pod::LivePod,
    engine::loopback,
    engine::plan::{plan_pod, PodPlan},
    engine::pod_keys::PodKeys,
    istio::{parse_istio_iptables, IstioConfig},
    store::{EbpfObject, ObjectPins, OpenMaps, PinRoot},
    sys::netns::Netns,
};

/// The node state the daemon owns.
pub struct Node {
    pub root: PinRoot,
    pub object: EbpfObject,
    pub records: Records,
    /// The object's maps, open from one request to the next.
    maps: Mutex<OpenMaps>,
    /// The node cgroup the programs are attached at, to name it (the daemon's `--cgroup`).
    node_cgroup: Option<PathBuf>,
    /// Pods whose processes run outside the node cgroup, by netns cookie: their cgroup.
    outside: Mutex<BTreeMap<u64, PathBuf>>,
}

/// Whether a flag was given.
type Given = fn(&IstioConfig) -> bool;

/// Flags that make no sense for a pod the daemon manages.
const NOT_FOR_THE_DAEMON: [(&str, Given); 5] = [
    ("--cleanup-only (use `pod del`)", |c| c.run.cleanup_only),
    ("--dry-run", |c| c.run.dry_run),
    ("--run-validation", |c| c.run.run_validation),
    (
        "--network-namespace (the request names the pod's namespace)",
        |c| c.run.network_namespace.is_some(),
    ),
    (
        "--cgroup (the daemon's programs are attached at the node cgroup)",
        |c| c.run.cgroup.is_some(),
    ),
];

/// Parse istio-iptables flags exactly as `redirector istio-iptables` does, with no env
/// vars: a pod's settings come from its request alone.
pub fn parse_flags(args: &[String]) -> Result<IstioConfig, String> {
    let argv = std::iter::once("istio-iptables".to_owned()).chain(args.iter().cloned());
    let cfg = parse_istio_iptables(argv, &std::collections::HashMap::<String, String>::new())
        .map_err(|err| err.to_string().trim().to_owned())?;
    if let Some((flag, _)) = NOT_FOR_THE_DAEMON.iter().find(|(_, given)| given(&cfg)) {
        return Err(format!("{flag} is not accepted by the daemon"));
    }
    Ok(cfg)
}

/// Why [`Node::add`] set nothing up.
#[derive(Debug, thiserror::Error)]
pub enum AddError {
    /// The node holds a newer format than this release writes ([`Node::format_skew`]):
    /// a newer release will set the pod up.
    #[error("{0}")]
    NewerFormat(String),
    #[error("{0}")]
    Failed(String),
}

impl From<String> for AddError {
    fn from(why: String) -> Self {
        AddError::Failed(why)
    }
}

impl From<AddError> for String {
    fn from(err: AddError) -> Self {
        err.to_string()
    }
}

impl Node {
    pub fn new(root: PinRoot, object: EbpfObject, records: Records) -> Self {
        Node {
            root,
            object,
            records,
            maps: Mutex::default(),
            node_cgroup: None,
            outside: Mutex::default(),
        }
    }

    /// Name the node cgroup in what is reported of pods outside it.
    pub fn with_node_cgroup(mut self, cgroup: PathBuf) -> Self {
        self.node_cgroup = Some(cgroup);
        self
    }

    /// The pins of the node's object.
    pub fn pins(&self) -> ObjectPins {
        self.root.object(self.object.id())
    }

    /// Why this release must not write for the pod with `cookie`: the node's pinned
    /// programs read a newer format of entries than it writes (a newer release's daemon
    /// upgraded the node, and this plugin or daemon is the older one), or the pod's record
    /// shard holds newer records. Checked before anything is written.
    pub fn format_skew(&self, cookie: NetnsCookie) -> Result<Option<String>, String> {
        let pinned = self.pins().format();
        if pinned > redirector_common::FORMAT {
            return Ok(Some(format!(
                "the node's programs (object {}) read entries of format {pinned}, and this redirector writes format {}: it will not write a layout they do not read; retry once this node runs the newer release's plugin",
                self.object.id(),
                redirector_common::FORMAT
            )));
        }
        self.records.newer_format(cookie).map_err(|e| e.to_string())
    }

    /// The node cgroup's inode, from the node's links.
    fn node_cgroup_id(&self) -> Option<u64> {
        crate::engine::node::node_cgroup_id(&self.pins())
    }

    fn describe_node_cgroup(&self, id: u64) -> String {
        match &self.node_cgroup {
            Some(path) => path.display().to_string(),
            None => format!("with inode {id}"),
        }
    }

    /// Find the pods whose processes run outside the node cgroup (one pass over /proc),
    /// log the ones newly found, and keep them for `list` and the metrics. How many.
    pub fn find_outside(&self) -> Result<usize, String> {
        let Some(node) = self.node_cgroup_id() else {
            return Ok(0);
        };
        let records = self.records.all().map_err(|e| e.to_string())?;
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
    fn maps(&self) -> MutexGuard<'_, OpenMaps> {
        self.maps.lock().unwrap_or_else(PoisonError::into_inner)
    }

    pub fn handle(&self, request: Request) -> Response {
        let result = match request {
            Request::Add {
                netns,
                name,
                args,
                annotations,
            } => {
                // The API is asked for this pod by name: only an explicit opt-out holds.
                let rules = crate::istio::annotations::Rules {
                    require_status: false,
                    exclude_namespaces: &[],
                };
                if let Some(why) = crate::istio::annotations::left_alone(rules, None, &annotations)
                {
                    return Response::done(format!("not captured: {why}"), Vec::new());
                }
                let args = crate::istio::annotations::flags(&args, &annotations);
                self.add(&netns, name, args, None).map_err(String::from)
            }
            Request::Del(pod) => self.del(&pod),
            Request::List => self.list(),
            Request::Check(pod) => self.check(&pod),
            // A stream, not one answer: the connection runs it (`super::trace`).
            Request::Trace(_) => Err("trace is answered as a stream".into()),
        };
        result.unwrap_or_else(Response::failed)
    }

    fn plan(&self, netns: &Netns, cfg: &IstioConfig) -> Result<PodPlan, String> {
        let facts =
            PodFacts::gather(netns, None, &cfg.run.resolv_conf).map_err(|e| e.to_string())?;
        Ok(plan_pod(&cfg.capture, &facts))
    }

    /// Capture the pod in `netns_path` with istio-iptables flags `args`.
    pub fn add(
        &self,
        netns_path: &Path,
        name: Option<String>,
        args: Vec<String>,
        cni: Option<CniAttachment>,
    ) -> Result<Response, AddError> {
        let started = std::time::Instant::now();
        let cfg = parse_flags(&args)?;
        let (netns, facts) = PodFacts::open_and_gather(
            netns_path,
            cfg.run.allow_host_netns,
            None,
            &cfg.run.resolv_conf,
        )
        .map_err(|e| e.to_string())?;
        if let Some(skew) = self.format_skew(netns.cookie())? {
            return Err(AddError::NewerFormat(skew));
        }
        let plan = plan_pod(&cfg.capture, &facts);
        if plan.config.flags & redirector_common::pod_flags::IPV6 != 0 {
            loopback::add_inbound_passthrough(&netns).map_err(|e| e.to_string())?;
        }
        let cookie = netns.cookie();
        let keys = PodKeys::of(&plan);
        let mut maps = self.maps();
        let known = self.note_keys(cookie, &keys)?;
        let outcome = apply(
            &self.root,
            &self.object,
            &plan,
            &netns,
            Mode::Changes,
            &mut maps,
            known.as_ref(),
        )
        .map_err(|e| format!("setting up pod netns {cookie}: {e}"))?;
        drop(maps);
        let record = PodRecord {
            netns_cookie: cookie.get(),
            netns: netns_path.to_path_buf(),
            name,
            args,
            container_id: cni.as_ref().map(|c| c.container_id.clone()),
            network: cni.and_then(|c| c.network),
            format: redirector_common::FORMAT,
            keys: Some(keys),
        };
        self.records.save(&record).map_err(|e| e.to_string())?;
        let took = started.elapsed();
        let (what, info) = match outcome {
            // Just written: the plan's config, and counters that start at zero.
            Outcome::New(_) => (
                "captured",
                pod_info(&record, Some(&plan.config), &[0; COUNTER_SLOTS]),
            ),
            Outcome::Replaced(_) => ("updated", self.info(&record)),
            Outcome::Unchanged => ("unchanged", self.info(&record)),
        };
        tracing::info!(
            "pod {} (netns cookie {}) {what} in {:.2} ms",
            record.name.as_deref().unwrap_or("-"),
            record.netns_cookie,
            took.as_secs_f64() * 1e3
        );
        Ok(Response::done(what, vec![info]))
    }

    /// The keys the pod's record says its applies may have written, with `planned` added
    /// to the record first if it lacks any of them: an apply killed after writing them
    /// then leaves nothing the record does not name. `None` when the pod has no record, or
    /// one of an earlier release: what is installed is then read through.
    fn note_keys(&self, cookie: NetnsCookie, planned: &PodKeys) -> Result<Option<PodKeys>, String> {
        let Some(record) = self.records.get(cookie).map_err(|e| e.to_string())? else {
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
            self.records.save(&ahead).map_err(|e| e.to_string())?;
        }
        Ok(Some(known))
    }

    /// The cookie of a pod named by request: its record's, else its namespace's.
    fn find(&self, pod: &PodRef) -> Result<(Option<PodRecord>, Option<NetnsCookie>), String> {
        if pod.netns.is_none() && pod.name.is_none() {
            return Err("name the pod with netns or name".into());
        }
        let record = self
            .records
            .find(pod.name.as_deref(), pod.netns.as_deref())
            .map_err(|e| e.to_string())?;
        let cookie = match (&record, &pod.netns) {
            (Some(record), _) => Some(record.cookie()),
            (None, Some(path)) => Netns::open(path).ok().map(|n| n.cookie()),
            (None, None) => None,
        };
        Ok((record, cookie))
    }

    /// What a `trace` request watches, and the names of the pods it may report.
    pub fn trace_target(
        &self,
        pod: &PodRef,
    ) -> Result<(crate::trace::Traced, BTreeMap<u64, String>), String> {
        let names = self
            .records
            .all()
            .map_err(|e| e.to_string())?
            .into_iter()
            .filter_map(|r| Some((r.netns_cookie, r.name?)))
            .collect();
        if pod.netns.is_none() && pod.name.is_none() {
            return Ok((crate::trace::Traced::All, names));
        }
        match self.find(pod)? {
            (_, Some(cookie)) if LivePod::open(&self.root, cookie).is_ok() => {
                Ok((crate::trace::Traced::One(cookie), names))
            }
            _ => Err("no such pod".into()),
        }
    }

    fn del(&self, pod: &PodRef) -> Result<Response, String> {
        let (record, cookie) = self.find(pod)?;
        self.remove(record, cookie)
    }

    /// Remove the pod of a record or with a cookie; nothing to remove is not an error.
    pub fn remove(
        &self,
        record: Option<PodRecord>,
        cookie: Option<NetnsCookie>,
    ) -> Result<Response, String> {
        remove_pod(&self.root, &self.records, record, cookie, &mut self.maps())
    }

    fn check(&self, pod: &PodRef) -> Result<Response, String> {
        let (Some(record), _) = self.find(pod)? else {
            return Err("no such pod".into());
        };
        self.check_record(&record)
    }

    /// Whether the pod of `record` is installed exactly as its flags plan it.
    pub fn check_record(&self, record: &PodRecord) -> Result<Response, String> {
        let cfg = parse_flags(&record.args)?;
        let netns = Netns::open(&record.netns).map_err(|e| e.to_string())?;
        if netns.cookie() != record.cookie() {
            return Err(format!(
                "{} is another network namespace now (cookie {}, the pod's was {})",
                record.netns.display(),
                netns.cookie(),
                record.netns_cookie
            ));
        }
        let plan = self.plan(&netns, &cfg)?;
        let same = is_installed(
            &self.root,
            &self.object,
            &plan,
            &netns,
            &mut self.maps(),
            record.keys.as_ref(),
        )
        .map_err(|e| e.to_string())?;
        if let Some(node) = self.node_cgroup_id() {
            if let Some(cgroup) = crate::sys::pod_cgroup::outside(&record.netns, node) {
                return Err(format!(
                    "the pod runs in cgroup {}, outside the node cgroup {}: none of the node's programs runs on its sockets",
                    cgroup.display(),
                    self.describe_node_cgroup(node)
                ));
            }
        }
        if same {
            Ok(Response::done(
                "captured as planned",
                vec![self.info(record)],
            ))
        } else {
            Err("the installed state differs from the pod's plan".into())
        }
    }

    fn list(&self) -> Result<Response, String> {
        let records = self.records.all().map_err(|e| e.to_string())?;
        let pods = records.iter().map(|r| self.info(r)).collect();
        Ok(Response::done(format!("{} pod(s)", records.len()), pods))
    }

    fn info(&self, record: &PodRecord) -> PodInfo {
        let mut info = match LivePod::open(&self.root, record.cookie()) {
            Ok(live) => pod_info(record, Some(&live.config), &live.counters()),
            Err(_) => pod_info(record, None, &[0; COUNTER_SLOTS]),
        };
        info.outside_node_cgroup = self
            .outside
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .get(&record.netns_cookie)
            .cloned();
        info
    }

    /// Start-up reconcile: remove pods whose namespace (and cgroup) are gone, and the
    /// records of pods that are no longer installed. Live pods are left exactly as they are.
    pub fn reconcile(&self) -> Result<(Vec<NetnsCookie>, usize), String> {
        let removed = crate::engine::gc::collect_stale(&self.root).map_err(|e| e.to_string())?;
        let mut kept = 0;
        for record in self.records.all().map_err(|e| e.to_string())? {
            let installed = LivePod::open(&self.root, record.cookie()).is_ok();
            if installed {
                kept += 1;
            } else {
                self.records
                    .remove(record.cookie())
                    .map_err(|e| e.to_string())?;
            }
        }
        self.find_outside()?;
        Ok((removed, kept))
    }
}

/// Remove the pod of a record or with a cookie, and its record; nothing to remove is not
/// an error (removal is idempotent).
pub fn remove_pod(
    root: &PinRoot,
    records: &Records,
    record: Option<PodRecord>,
    cookie: Option<NetnsCookie>,
    maps: &mut OpenMaps,
) -> Result<Response, String> {
    let Some(cookie) = cookie else {
        return Ok(Response::done("no such pod", Vec::new()));
    };
    let known = record.as_ref().and_then(|r| r.keys.as_ref());
    let removed = teardown(root, cookie, maps, known).map_err(|e| e.to_string())?;
    records.remove(cookie).map_err(|e| e.to_string())?;
    let message = if removed.is_empty() && record.is_none() {
        "no such pod"
    } else {
        "removed"
    };
    Ok(Response::done(message, Vec::new()))
}

/// What the API reports of a pod: its record, its installed config, its non-zero counters.
fn pod_info(
    record: &PodRecord,
    config: Option<&PodConfig>,
    counters: &[u64; COUNTER_SLOTS],
) -> PodInfo {
    PodInfo {
        name: record.name.clone(),
        netns: record.netns.clone(),
        netns_cookie: record.netns_cookie,
        args: record.args.clone(),
        config: config.map(|c| {
            format!(
                "-p {} -z {} -e {} flags {:#x}",
                c.outbound_port, c.inbound_port, c.tunnel_port, c.flags
            )
        }),
        counters: Reason::ALL
            .iter()
            .filter(|r| counters[**r as usize] != 0)
            .map(|r| (r.name().to_owned(), counters[*r as usize]))
            .collect(),
        outside_node_cgroup: None,
    }
}
