//! The front door for setting a pod up, below every way in. A pod is planned with
//! [`Planned::of`] and captured with [`capture`] whichever way it comes: the init
//! container (or a command given the pod's namespace) through [`set_up_in_pod`], the
//! node (the daemon's API, the chained plugin) through `pods::Pods::add`. They differ on
//! purpose in two things only: where the pod's cgroup programs go (an init container
//! links them at its pod's cgroup and pins the links; the node attaches them without a
//! link) and what is kept (the node records the pod and the keys it wrote).

use std::path::{Path, PathBuf};

use super::{
    apply::Outcome,
    capture::capture,
    diff::Mode,
    error::EngineError,
    facts::{FactsError, PodFacts},
    node::covering,
    plan::{dns_capture_enabled, plan_pod, PodPlan},
    spec::CaptureConfig,
};
use crate::{
    store::{pins::BPFFS_MOUNT, EbpfObject, ObjectId, OpenMaps, PinRoot},
    sys::{fs_kind::nearest_is_bpffs, netns::Netns},
};

/// What an operator should know of a plan: it changes nothing.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PlanNote {
    /// DNS capture was asked for, but not for every server, and resolv.conf names none:
    /// DNS is not captured (as istio-iptables does).
    DnsCaptureOff,
    /// A rule names an interface the pod does not have: it applies to nothing until the
    /// pod is set up again once it exists.
    MissingInterface(String),
}

impl std::fmt::Display for PlanNote {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            PlanNote::DnsCaptureOff => f.write_str(
                "DNS capture is asked for, but no DNS server is known: DNS is not captured",
            ),
            PlanNote::MissingInterface(name) => write!(
                f,
                "interface {name} does not exist in the pod: its rule applies to nothing"
            ),
        }
    }
}

/// A pod's plan, and the notes on it.
#[derive(Debug)]
pub struct Planned {
    pub plan: PodPlan,
    pub notes: Vec<PlanNote>,
}

impl Planned {
    /// `capture` for the pod `facts` describe.
    pub fn of(capture: &CaptureConfig, facts: &PodFacts) -> Self {
        let plan = plan_pod(capture, facts);
        let mut notes = Vec::new();
        if capture.redirect_dns && !dns_capture_enabled(capture, facts) {
            notes.push(PlanNote::DnsCaptureOff);
        }
        for name in capture
            .exclude_interfaces
            .iter()
            .chain(&capture.kube_virt_interfaces)
        {
            if !facts.interfaces.iter().any(|(n, _)| n == name) {
                notes.push(PlanNote::MissingInterface(name.clone()));
            }
        }
        Planned { plan, notes }
    }
}

/// A set-up from inside the pod: the pod is in `netns`, its programs go to its `cgroup`.
pub struct InPod<'a> {
    pub root: &'a PinRoot,
    pub netns: &'a Netns,
    pub capture: &'a CaptureConfig,
    /// The pod's cgroup.
    pub cgroup: Option<PathBuf>,
    pub resolv_conf: &'a Path,
    /// Plan only.
    pub dry_run: bool,
    /// Apply even when exactly the plan is installed.
    pub force_apply: bool,
}

/// What [`set_up_in_pod`] did.
#[derive(Debug)]
pub struct InPodOutcome {
    pub planned: Planned,
    /// The node daemon's object whose programs already cover the pod's cgroup: the pod
    /// got only its entries there and its namespace's link.
    pub covered_by: Option<ObjectId>,
    /// `None` for a dry run.
    pub applied: Option<Outcome>,
}

#[derive(Debug, thiserror::Error)]
pub enum SetupError {
    #[error(transparent)]
    Facts(#[from] FactsError),
    #[error(transparent)]
    Engine(Box<EngineError>),
    #[error("{} is not on a bpffs mount: mount one with `mount -t bpf bpf {BPFFS_MOUNT}` (in a container, mount the host's {BPFFS_MOUNT})", .0.display())]
    NotOnBpffs(PathBuf),
    #[error("{} has no existing ancestor", .0.display())]
    NoPinRootAncestor(PathBuf),
}

// Boxed: the engine's error is large, and every result of this module carries it.
impl From<EngineError> for SetupError {
    fn from(err: EngineError) -> Self {
        SetupError::Engine(Box::new(err))
    }
}

/// Set the pod in `req.netns` up as `req.capture` asks, or only plan it (`dry_run`).
pub fn set_up_in_pod(req: InPod<'_>) -> Result<InPodOutcome, SetupError> {
    // A node daemon's programs may already cover this pod's cgroup: then the pod gets only
    // its entries (in the daemon's object) and its namespace's link, so that no program
    // runs twice on its sockets.
    let node_object = match &req.cgroup {
        Some(cgroup) if cgroup.exists() => covering(req.root, cgroup)?,
        _ => None,
    };
    let covered_by = node_object.as_ref().map(|node| node.id().clone());
    let pod_cgroup = req.cgroup.filter(|_| covered_by.is_none());
    let facts = PodFacts::gather(req.netns, pod_cgroup, req.resolv_conf)?;
    let planned = Planned::of(req.capture, &facts);
    if req.dry_run {
        return Ok(InPodOutcome {
            planned,
            covered_by,
            applied: None,
        });
    }
    require_bpffs(req.root.path())?;
    let object = match &covered_by {
        Some(id) => EbpfObject::pinned(id.clone()),
        None => EbpfObject::configured().map_err(EngineError::from)?,
    };
    let mode = if req.force_apply {
        Mode::Everything
    } else {
        Mode::Changes
    };
    let outcome = capture(
        req.root,
        &object,
        &planned.plan,
        req.netns,
        mode,
        &mut OpenMaps::default(),
        None,
    )?;
    Ok(InPodOutcome {
        planned,
        covered_by,
        applied: Some(outcome),
    })
}

/// The pin root must be on a bpffs mount: pins can be made nowhere else.
pub fn require_bpffs(root: &Path) -> Result<(), SetupError> {
    match nearest_is_bpffs(root) {
        None => Err(SetupError::NoPinRootAncestor(root.to_path_buf())),
        Some(false) => Err(SetupError::NotOnBpffs(root.to_path_buf())),
        Some(true) => Ok(()),
    }
}
