//! Per-pod setup: one pod with the object already loaded — `redirector istio-iptables`
//! against `iptables-restore` of istio's rules and a bare `nsenter true`, each started the
//! way an init container is (entering a fresh netns); the first pod on a node (the object
//! load); and N pods in sequence, init-container mode and through the daemon (its state
//! directory on a tmpfs, as `/run/redirector` is on a node), with the kernel memory they add.

use std::any::Any;
use std::process::Command;
use std::time::Instant;

use redirector_tests::cgroup::Cgroup;
use redirector_tests::churn::churn;
use redirector_tests::daemon::{Daemon, StateDir};
use redirector_tests::iptables::standard_injection;
use redirector_tests::redirector::{
    map_fill, pins_under, redirector_bin, status, PinRoot, STANDARD_INJECTION,
};
use redirector_tests::test_node::{CniCaller, CniPod};
use redirector_tests::NetNs;

use crate::memory;
use crate::sequence::{Api, MemoryMarks, Sequence, API_MODE};
use crate::stats::median;
use crate::timed::{nsenter, timed};

/// `redirector istio-iptables` as an init container runs it: inside the pod's netns.
fn init_container(netns: &NetNs, cgroup: &Cgroup, root: &PinRoot) -> Command {
    let mut cmd = nsenter(netns);
    cmd.arg(redirector_bin())
        .arg("istio-iptables")
        .args(STANDARD_INJECTION)
        .arg("--cgroup")
        .arg(cgroup.path())
        .arg("--pin-root")
        .arg(root.path());
    cmd
}

#[derive(Debug, Default, serde::Serialize)]
pub struct OnePod {
    pub samples: usize,
    pub redirector_ms: Vec<f64>,
    pub iptables_restore_ms: Vec<f64>,
    pub iptables_restore_v4_v6_ms: Vec<f64>,
    pub nsenter_true_ms: Vec<f64>,
    /// `true` started directly: one process start, the floor of `redirector pod add` and
    /// of the CNI plugin, which start no second process as an init container's nsenter does.
    pub true_ms: Vec<f64>,
    pub first_pod_ms: Vec<f64>,
}

/// Init-container pods set up one after another, `alive` at a time, each deleted without a
/// cleanup (namespace and cgroup removed) once `alive` newer ones are up.
#[derive(Debug, Default, serde::Serialize)]
pub struct Churn {
    pub pods: usize,
    pub alive: usize,
    /// Wall time of each pod's setup, in order.
    pub per_pod_ms: Vec<f64>,
    /// Pods installed under the pin root after every 100 deletions.
    pub installed_every_100: Vec<u64>,
    /// After the last pod: pods installed, files pinned, and each map's entries.
    pub installed_after: u64,
    pub pins_after: usize,
    pub map_fill_after: Vec<(String, u64)>,
    /// The same once `redirector gc` has removed every pod that is gone (what the live
    /// pods need, and any pod deleted too recently for the kernel to have detached its
    /// links).
    pub installed_needed: u64,
    pub pins_needed: usize,
    pub map_fill_needed: Vec<(String, u64)>,
}

impl Churn {
    /// The first pod (0-based) whose setup meets pods deleted before it: from pod
    /// `alive + 1` on each setup deletes one, and each setup also collects a few that are
    /// gone, while the kernel tears their namespaces down in the background. The pods
    /// before run on a node with nothing to collect (about 0.4 ms faster each, 6.18), so
    /// they are not the baseline for growth.
    pub fn steady_start(&self) -> usize {
        2 * self.alive
    }

    /// Medians of the setup times of the first 10 pods from [`Self::steady_start`] and of
    /// the last 10.
    pub fn steady_and_last(&self) -> (f64, f64) {
        let n = self.per_pod_ms.len();
        let start = self.steady_start().min(n.saturating_sub(10));
        (
            median(&self.per_pod_ms[start..(start + 10).min(n)]),
            median(&self.per_pod_ms[n.saturating_sub(10)..]),
        )
    }
}

#[derive(Debug, Default, serde::Serialize)]
pub struct Setup {
    pub one_pod: OnePod,
    pub sequences: Vec<Sequence>,
    pub churn: Churn,
    /// `--scale`: 10,000 pods through the daemon's API.
    pub scale: Option<crate::scale::Scale>,
    /// Pod adds under concurrent `/metrics` scrapes.
    pub scrapes: Option<crate::scrapes::Scrapes>,
    /// Istio ambient pods enrolled one at a time, istio-cni's way and redirector's.
    pub ambient: crate::ambient::Enrollment,
    pub object_memlock: u64,
    pub map_memlock: Vec<(String, u64)>,
    pub map_fill: serde_json::Value,
}

fn one_pod(samples: usize) -> OnePod {
    let (v4, v6) = standard_injection();
    let root = PinRoot::new("benchone");
    let mut out = OnePod {
        samples,
        ..OnePod::default()
    };
    // Load the object once, outside the samples.
    {
        let (ns, cg) = (NetNs::new("bwarm"), Cgroup::new("bwarm"));
        timed(&mut init_container(&ns, &cg, &root), None);
    }
    let mut pods = Vec::new();
    for _ in 0..samples {
        let (ns, cg) = (NetNs::new("bone"), Cgroup::new("bone"));
        out.redirector_ms
            .push(timed(&mut init_container(&ns, &cg, &root), None));
        pods.push((ns, cg));
        let ns = NetNs::new("bipt");
        out.iptables_restore_ms
            .push(timed(nsenter(&ns).arg("iptables-restore"), Some(&v4)));
        let ns = NetNs::new("bipt6");
        let both = timed(nsenter(&ns).arg("iptables-restore"), Some(&v4))
            + timed(nsenter(&ns).arg("ip6tables-restore"), Some(&v6));
        out.iptables_restore_v4_v6_ms.push(both);
        let ns = NetNs::new("btrue");
        out.nsenter_true_ms
            .push(timed(nsenter(&ns).arg("true"), None));
        out.true_ms.push(timed(&mut Command::new("true"), None));
    }
    // The first pod on a node loads the object: a fresh pin root each time.
    for _ in 0..samples.min(5) {
        let fresh = PinRoot::new("bfirst");
        let (ns, cg) = (NetNs::new("bfirst"), Cgroup::new("bfirst"));
        out.first_pod_ms
            .push(timed(&mut init_container(&ns, &cg, &fresh), None));
    }
    drop(pods);
    out
}

/// What the sequences made, kept until all of them are measured: the kernel frees a
/// network namespace (about 200 KiB) or an object in the background, for seconds, and a
/// sequence measured while the last one's 1,000 namespaces go would read megabytes less.
type Kept = Vec<Box<dyn Any>>;

/// `pods` pods set up one after another by init containers, under one pin root.
fn init_sequence(pods: usize, kept: &mut Kept) -> (Sequence, PinRoot) {
    let root = PinRoot::new("bseq");
    let made: Vec<(NetNs, Cgroup)> = (0..pods)
        .map(|_| (NetNs::new("bseq"), Cgroup::new("bseq")))
        .collect();
    let mut seq = Sequence {
        mode: "init-container",
        pods,
        ..Sequence::default()
    };
    // Pod 0 loads the object; the sequence counts the pods after it.
    let mut marks = MemoryMarks::start(None);
    let start = Instant::now();
    for (i, (ns, cg)) in made.iter().enumerate() {
        seq.per_pod_ms
            .push(timed(&mut init_container(ns, cg, &root), None));
        marks.after(i + 1, &mut seq);
    }
    seq.total_s = marks.seconds_since(start);
    kept.push(Box::new(made));
    (seq, root)
}

/// How pods reach the daemon.
#[derive(Clone, Copy)]
enum Client {
    /// One `redirector pod add` process per pod.
    PodAdd,
    /// The CNI plugin, as a container runtime runs it: env, config on stdin, one process each.
    CniAdd,
    /// One API connection for all pods (the daemon's own cost per pod).
    Api,
}

impl Client {
    fn name(self) -> &'static str {
        match self {
            Client::PodAdd => "daemon: `redirector pod add`",
            Client::CniAdd => "daemon: CNI ADD",
            Client::Api => API_MODE,
        }
    }
}

/// `pods` pods added through a daemon.
fn daemon_sequence(pods: usize, client: Client, kept: &mut Kept) -> Sequence {
    let root = PinRoot::new("bdseq");
    let node = Cgroup::new("bdnode");
    let state = StateDir::on_tmpfs("bdstate");
    let daemon = Daemon::start(&root, &node, &state);
    let socket = state.path().join("redirector.sock");
    let made: Vec<NetNs> = (0..pods).map(|_| NetNs::new("bdseq")).collect();
    // Each pod's cgroup, made by kubelet before the sandbox (and before the memory marks):
    // the programs are attached there, named by the pod's UID to the plugin.
    let uids: Vec<String> = (0..pods)
        .map(|i| format!("00000000-0000-4000-8000-{i:012x}"))
        .collect();
    let cgroups: Vec<Cgroup> = uids
        .iter()
        .map(|uid| Cgroup::named_under(&node, &format!("pod{uid}")))
        .collect();
    let cni = CniCaller::new(&root, &state, &socket);
    let mut api = matches!(client, Client::Api).then(|| Api::connect(&socket));
    let mut seq = Sequence {
        mode: client.name(),
        pods,
        ..Sequence::default()
    };
    let mut marks = MemoryMarks::start(Some(state.path()));
    let start = Instant::now();
    for (i, ns) in made.iter().enumerate() {
        let name = format!("bench/p{i}");
        let ms = match (client, api.as_mut()) {
            (Client::PodAdd, _) => {
                let mut cmd = Command::new(redirector_bin());
                cmd.arg("pod")
                    .arg("--socket")
                    .arg(&socket)
                    .args(["add", "--netns"])
                    .arg(ns.path())
                    .arg("--cgroup")
                    .arg(cgroups[i].path())
                    .args(["--name", &name, "--"])
                    .args(STANDARD_INJECTION);
                timed(&mut cmd, None)
            }
            (Client::CniAdd, _) => {
                let pod = CniPod {
                    uid: uids[i].clone(),
                    ..CniPod::numbered("bench", i, ns.path())
                };
                let (mut cmd, conf) = cni.command("ADD", &pod);
                timed(&mut cmd, Some(&conf))
            }
            (Client::Api, Some(api)) => {
                let req = serde_json::json!({
                    "op": "add", "netns": ns.path(), "name": name, "args": STANDARD_INJECTION,
                    "cgroup": cgroups[i].path(),
                });
                let t = Instant::now();
                api.ask(&req, "\"ok\":true");
                t.elapsed().as_secs_f64() * 1e3
            }
            (Client::Api, None) => unreachable!("the API client connects first"),
        };
        seq.per_pod_ms.push(ms);
        marks.after(i + 1, &mut seq);
    }
    seq.total_s = marks.seconds_since(start);
    if let Some(api) = api.as_mut() {
        let start = Instant::now();
        for i in 0..pods {
            let req = serde_json::json!({"op": "del", "name": format!("bench/p{i}")});
            api.ask(&req, "\"removed\"");
        }
        seq.removal_s = Some(start.elapsed().as_secs_f64());
    }
    drop(api);
    kept.push(Box::new((daemon, made, cgroups, root, node, state, cni)));
    seq
}

/// [`Churn`] of `pods` pods, 10 alive at a time, under a pin root of its own.
pub fn churn_sequence(pods: usize) -> Churn {
    const ALIVE: usize = 10;
    let root = PinRoot::new("bchurn");
    let installed = |root: &PinRoot| {
        status(root)["objects"][0]["pods"]
            .as_array()
            .map_or(0, |p| p.len() as u64)
    };
    let mut out = Churn {
        pods,
        alive: ALIVE,
        ..Churn::default()
    };
    let run = churn(&root, pods, ALIVE, |_| {
        out.installed_every_100.push(installed(&root));
    });
    out.installed_after = installed(&root);
    out.pins_after = pins_under(root.path()).len();
    out.map_fill_after = map_fill(&root);
    // About what the live pods need: what is left once `redirector gc` removed every pod
    // that is gone.
    let mut gc = Command::new(redirector_bin());
    gc.arg("gc").arg("--pin-root").arg(root.path());
    timed(&mut gc, None);
    out.installed_needed = installed(&root);
    out.pins_needed = pins_under(root.path()).len();
    out.map_fill_needed = map_fill(&root);
    out.per_pod_ms = run.setup_ms;
    let (steady, last) = out.steady_and_last();
    eprintln!(
        "bench: {pods} pods of churn, {ALIVE} alive: {} installed after, setup {steady:.2} ms (pods {}–{}) and {last:.2} ms (last 10)",
        out.installed_after,
        out.steady_start() + 1,
        out.steady_start() + 10
    );
    out
}

pub fn run(samples: usize, pods: usize) -> Setup {
    let mut out = Setup {
        one_pod: one_pod(samples),
        ..Setup::default()
    };
    eprintln!(
        "bench: one pod: redirector {:.2} ms, iptables-restore {:.2} ms, nsenter true {:.2} ms (medians)",
        median(&out.one_pod.redirector_ms),
        median(&out.one_pod.iptables_restore_ms),
        median(&out.one_pod.nsenter_true_ms)
    );
    out.ambient = crate::ambient::run(samples);
    eprintln!(
        "bench: ambient enrollment: istio-cni's way {:.2} ms, redirector {:.2} ms (medians)",
        median(&out.ambient.istio_cni_ms),
        median(&out.ambient.redirector_ms)
    );
    let mut kept = Kept::new();
    let (seq, root) = init_sequence(pods, &mut kept);
    eprintln!(
        "bench: {pods} pods (init containers) in {:.2} s",
        seq.total_s
    );
    out.sequences.push(seq);
    let status = status(&root);
    if let Some(object) = status["objects"].get(0) {
        out.map_fill = object["maps"].clone();
        let id = object["id"].as_str().unwrap_or_default();
        let (total, maps) = memory::object_memlock(&root.path().join("objects").join(id));
        out.object_memlock = total;
        out.map_memlock = maps;
    }
    kept.push(Box::new(root));
    for client in [Client::Api, Client::PodAdd, Client::CniAdd] {
        let seq = daemon_sequence(pods, client, &mut kept);
        eprintln!("bench: {pods} pods ({}) in {:.2} s", seq.mode, seq.total_s);
        out.sequences.push(seq);
    }
    out
}
