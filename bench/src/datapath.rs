//! The data path: the same service, sidecar and load in every mode, the modes interleaved
//! round by round, so that drift of the machine hits every mode alike.
//!
//! ```text
//!  pod netns + cgroup                               service netns
//!  wrk (uid 1000, CPU 0) ──> capture? ──> sidecar   nginx :80 (CPU 1)
//!                                       (uid 1337, CPU 1) ──────────^
//! ```
//! The eBPF profile also runs with the sidecar answering itself: requests to the service's
//! port [`ANSWERED_PORT`], which nothing serves, are answered by the sidecar with no
//! upstream connection, as a proxy answers what it serves locally.

use std::net::Ipv4Addr;
use std::path::PathBuf;
use std::time::Duration;

use redirector::sys::kernel::FORCE_FALLBACKS_ENV;
use redirector::zds::{agent::Workload, wire::WorkloadInfo};
use redirector_tests::bpftool::{program_runs, BpfStats};
use redirector_tests::cgroup::Cgroup;
use redirector_tests::daemon::{Daemon, StateDir};
use redirector_tests::dns::protocol::DnsOutcome;
use redirector_tests::dns::{DnsClient, DnsMode, DnsServer};
use redirector_tests::iptables::{apply_golden, standard_injection};
use redirector_tests::istio_cni;
use redirector_tests::linkerd::{cases::LINKERD_PROXY_UID, linkerd_proxy_init_command};
use redirector_tests::redirector::{
    install, istio_iptables_command, redirector_bin, run_ok, wait_for_trace_switch, PinRoot,
    STANDARD_INJECTION,
};
use redirector_tests::ztunnel::{StandInProcess, TestAgent};
use redirector_tests::{
    bin_path, wait_tcp_listening, ChildGuard, Spawn, Topology, APP_UID, PROXY_UID,
};

use crate::cpu;
use crate::wrk::{self, Load, LOADS};

#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Mode {
    /// The app dials the service; no proxy.
    Direct,
    /// The app dials its sidecar itself: the floor of any transparent redirection.
    Explicit,
    /// istio's nat rules for the standard injection, with conntrack.
    Iptables,
    /// `redirector istio-iptables` (init-container mode).
    Redirector,
    /// The node daemon, the pod added with `redirector pod add`.
    RedirectorDaemon,
    /// `redirector` with `redirector trace` following the pod (its output discarded): what
    /// tracing a pod costs.
    RedirectorTraced,
    /// `redirector istio-iptables` with every kernel fallback forced
    /// (`REDIRECTOR_FORCE_FALLBACKS=all`), as on a kernel before 5.14: what an old node's
    /// kernel costs.
    RedirectorFallbacks,
    /// `redirector linkerd-proxy-init` with Linkerd's injector defaults: the sidecar as
    /// Linkerd's proxy (uid 2102, outbound on 4140).
    RedirectorLinkerd,
    /// A pod on a daemon node (inside the daemon's `--cgroup`) that the daemon does not
    /// capture, dialling the service directly: what a pod outside the mesh pays, against
    /// `direct` (the same pod on a node without redirector).
    Bystander,
    /// Istio ambient under istio-cni's in-pod rules: the stand-in ztunnel, from its own
    /// namespace and cgroup, proxies the pod's connections from its 15001 in the pod's
    /// namespace (the bench plays the node agent).
    AmbientIptables,
    /// The same pod and stand-in ztunnel, the pod enrolled through the daemon's API
    /// (`pod add --dialect ambient`) and captured by redirector's programs.
    AmbientRedirector,
}

impl Mode {
    pub const ALL: [Mode; 11] = [
        Mode::Direct,
        Mode::Explicit,
        Mode::Iptables,
        Mode::Redirector,
        Mode::RedirectorDaemon,
        Mode::RedirectorTraced,
        Mode::RedirectorFallbacks,
        Mode::RedirectorLinkerd,
        Mode::Bystander,
        Mode::AmbientIptables,
        Mode::AmbientRedirector,
    ];

    pub fn name(self) -> &'static str {
        match self {
            Mode::Direct => "direct",
            Mode::Explicit => "explicit",
            Mode::Iptables => "iptables",
            Mode::Redirector => "redirector",
            Mode::RedirectorDaemon => "redirector-daemon",
            Mode::RedirectorTraced => "redirector-traced",
            Mode::RedirectorFallbacks => "redirector-fallbacks",
            Mode::RedirectorLinkerd => "redirector-linkerd",
            Mode::Bystander => "daemon-bystander",
            Mode::AmbientIptables => "ambient-iptables",
            Mode::AmbientRedirector => "ambient-redirector",
        }
    }

    /// Whether the sidecar captures this mode's connections (its eBPF profile includes
    /// requests the sidecar answers itself).
    pub fn proxied(self) -> bool {
        !matches!(self, Mode::Direct | Mode::Bystander) && !self.ambient()
    }

    /// Whether ztunnel proxies the pod (no sidecar).
    pub fn ambient(self) -> bool {
        matches!(self, Mode::AmbientIptables | Mode::AmbientRedirector)
    }
}

/// The service port whose requests the sidecar answers itself.
const ANSWERED_PORT: u16 = 81;

/// One mode's pod, service and sidecar. Fields drop in order: processes, then the daemon,
/// then namespaces and cgroups, then pins.
struct Bed {
    mode: Mode,
    _tracer: Option<ChildGuard>,
    _nginx: ChildGuard,
    _sidecar: Option<ChildGuard>,
    _ztunnel: Option<StandInProcess>,
    _agent: Option<TestAgent>,
    daemon: Option<Daemon>,
    topo: Topology,
    _node: Option<Cgroup>,
    _state: Option<StateDir>,
    root: Option<PinRoot>,
    base: String,
    /// The URL the sidecar answers itself (profiled in the redirected modes).
    answered: String,
}

/// Where nginx keeps its config, temp files and the bulk file.
pub struct Site {
    dir: PathBuf,
}

impl Site {
    pub fn new(bulk_bytes: usize) -> Site {
        let dir = std::env::temp_dir().join(format!("redirector-bench-{}", std::process::id()));
        std::fs::create_dir_all(dir.join("www")).unwrap();
        std::fs::create_dir_all(dir.join("tmp")).unwrap();
        std::fs::write(dir.join("www/bulk"), vec![0x5a; bulk_bytes]).unwrap();
        let d = dir.display();
        let conf = format!(
            "daemon off;\nmaster_process off;\nworker_processes 1;\npid {d}/nginx-$pid.pid;\n\
             error_log stderr error;\nevents {{ worker_connections 8192; }}\n\
             http {{\n  access_log off;\n  sendfile on;\n  keepalive_requests 10000000;\n\
             client_body_temp_path {d}/tmp; proxy_temp_path {d}/tmp; fastcgi_temp_path {d}/tmp;\n\
             uwsgi_temp_path {d}/tmp; scgi_temp_path {d}/tmp;\n  default_type application/octet-stream;\n\
             server {{\n    listen 80 backlog=4096;\n    location = / {{ return 200 \"ok\\n\"; }}\n\
             location /bulk {{ root {d}/www; }}\n  }}\n}}\n"
        );
        std::fs::write(dir.join("nginx.conf"), conf).unwrap();
        Site { dir }
    }

    fn conf(&self, pidfile: &str) -> PathBuf {
        // One config per server, so their pid files differ.
        let text = std::fs::read_to_string(self.dir.join("nginx.conf"))
            .unwrap()
            .replace("$pid", pidfile);
        let path = self.dir.join(format!("nginx-{pidfile}.conf"));
        std::fs::write(&path, text).unwrap();
        path
    }
}

impl Drop for Site {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// Socket settings both the pod and the service namespace get: a wide port range and
/// reuse of TIME_WAIT ports, so that a new connection per request never runs out of ports.
fn tune(netns: &redirector_tests::NetNs) {
    netns.run(&[
        "sysctl",
        "-q",
        "-w",
        "net.ipv4.ip_local_port_range=1024 65000",
    ]);
    netns.run(&["sysctl", "-q", "-w", "net.ipv4.tcp_tw_reuse=1"]);
    netns.run(&["sysctl", "-q", "-w", "net.core.somaxconn=4096"]);
}

/// The ambient pod's uid, as ztunnel is told of it.
const AMBIENT_UID: &str = "bench-app-uid";

/// The ambient pod as the bench's agent tells ztunnel of it.
fn ambient_workload(topo: &Topology) -> Workload {
    Workload {
        uid: AMBIENT_UID.to_owned(),
        info: WorkloadInfo {
            name: "app".to_owned(),
            namespace: "bench".to_owned(),
            service_account: "default".to_owned(),
        },
        netns: topo.pod.path(),
    }
}

/// `redirector trace` of the pod on the servers' CPU, its lines discarded, once the pod's
/// trace switch is on.
fn trace(topo: &Topology, root: &PinRoot) -> ChildGuard {
    let command = format!(
        "exec taskset -c 1 {} trace --netns {} --pin-root {} > /dev/null",
        redirector_bin().display(),
        topo.pod.path().display(),
        root.path().display()
    );
    let tracer = Spawn::new("sh").args(["-c", &command]).spawn();
    wait_for_trace_switch(root, &tracer);
    tracer
}

impl Bed {
    fn new(mode: Mode, site: &Site) -> Bed {
        let hint = format!("b{}", mode.name());
        let (node, state, root, topo) = match mode {
            Mode::AmbientIptables => (
                None,
                Some(StateDir::on_tmpfs("benchzds")),
                None,
                Topology::new(&hint),
            ),
            Mode::RedirectorDaemon | Mode::Bystander | Mode::AmbientRedirector => {
                let node = Cgroup::new("benchnode");
                let topo = Topology::under(&node, &hint);
                (
                    Some(node),
                    Some(StateDir::on_tmpfs("benchstate")),
                    Some(PinRoot::new(&hint)),
                    topo,
                )
            }
            Mode::Redirector
            | Mode::RedirectorTraced
            | Mode::RedirectorFallbacks
            | Mode::RedirectorLinkerd => {
                (None, None, Some(PinRoot::new(&hint)), Topology::new(&hint))
            }
            _ => (None, None, None, Topology::new(&hint)),
        };
        tune(&topo.pod);
        tune(&topo.service);
        let nginx = Spawn::new("taskset")
            .args(["-c", "1", "nginx", "-e", "stderr", "-c"])
            .arg(site.conf(mode.name()))
            .netns(&topo.service)
            .spawn();
        wait_tcp_listening(&topo.service, 80, Duration::from_secs(10));
        let service = topo.service_addr(false, 80);
        // Linkerd's proxy listens on 4140 as uid 2102; istio's on 15001 as 1337.
        let (listen, proxy_uid) = match mode {
            Mode::RedirectorLinkerd => ("127.0.0.1:4140", LINKERD_PROXY_UID),
            _ => ("127.0.0.1:15001", PROXY_UID),
        };
        let sidecar = (!mode.ambient()).then(|| {
            let sidecar = Spawn::new("taskset")
                .args(["-c", "1"])
                .arg(bin_path("sidecar"))
                .args(["--listen", listen, "--upstream"])
                .arg(service.to_string())
                .args(["--answer-port", &ANSWERED_PORT.to_string()])
                .netns(&topo.pod)
                .cgroup(&topo.pod_cgroup)
                .user(proxy_uid, proxy_uid)
                .spawn();
            sidecar.wait_line("sidecar listening", Duration::from_secs(10), |l| {
                l.starts_with("listening")
            });
            sidecar
        });
        let mut daemon = None;
        let mut tracer = None;
        let (mut ztunnel, mut agent) = (None, None);
        match mode {
            Mode::Direct | Mode::Explicit => {}
            Mode::AmbientIptables => {
                istio_cni::apply(&topo.pod);
                let socket = state.as_ref().unwrap().path().join("ztunnel.sock");
                agent = Some(TestAgent::start(
                    &socket,
                    vec![ambient_workload(&topo)],
                    Duration::from_secs(10),
                ));
                // On the servers' CPU, as the sidecar is.
                let z = StandInProcess::start_for_load(&format!("{hint}zt"), &socket, 1);
                z.wait_line("the pod in the snapshot", &format!("added {AMBIENT_UID}"));
                ztunnel = Some(z);
            }
            Mode::AmbientRedirector => {
                let state = state.as_ref().unwrap();
                let socket = state.path().join("ztunnel.sock");
                let socket_flag = socket.display().to_string();
                let d = Daemon::start_with(
                    root.as_ref().unwrap(),
                    node.as_ref().unwrap(),
                    state,
                    &["--ztunnel-socket", &socket_flag],
                );
                let z = StandInProcess::start_for_load(&format!("{hint}zt"), &socket, 1);
                let out = d.add_ambient(&topo.pod, &topo.pod_cgroup, "bench/app", AMBIENT_UID);
                assert!(
                    out.status.success(),
                    "pod add --dialect ambient: {}",
                    String::from_utf8_lossy(&out.stderr)
                );
                z.wait_line("the pod enrolled", &format!("added {AMBIENT_UID}"));
                daemon = Some(d);
                ztunnel = Some(z);
            }
            Mode::Bystander => {
                daemon = Some(Daemon::start(
                    root.as_ref().unwrap(),
                    node.as_ref().unwrap(),
                    state.as_ref().unwrap(),
                ));
            }
            Mode::Iptables => {
                let (v4, v6) = standard_injection();
                apply_golden(&topo.pod, &v4, Some(&v6));
            }
            Mode::Redirector => {
                install(
                    &topo.pod,
                    &topo.pod_cgroup,
                    root.as_ref().unwrap(),
                    &STANDARD_INJECTION,
                );
            }
            Mode::RedirectorTraced => {
                let root = root.as_ref().unwrap();
                install(&topo.pod, &topo.pod_cgroup, root, &STANDARD_INJECTION);
                tracer = Some(trace(&topo, root));
            }
            Mode::RedirectorFallbacks => {
                run_ok(
                    istio_iptables_command(&topo.pod, &topo.pod_cgroup, root.as_ref().unwrap())
                        .args(STANDARD_INJECTION)
                        .env(FORCE_FALLBACKS_ENV, "all"),
                );
            }
            Mode::RedirectorLinkerd => {
                let defaults = redirector::mesh::linkerd::INJECTOR_DEFAULTS.map(String::from);
                run_ok(&mut linkerd_proxy_init_command(
                    &defaults,
                    &topo.pod,
                    &topo.pod_cgroup,
                    root.as_ref().unwrap(),
                ));
            }
            Mode::RedirectorDaemon => {
                let d = Daemon::start(
                    root.as_ref().unwrap(),
                    node.as_ref().unwrap(),
                    state.as_ref().unwrap(),
                );
                d.add(&topo.pod, "bench/app", &STANDARD_INJECTION);
                daemon = Some(d);
            }
        }
        let base = match mode {
            Mode::Explicit => "http://127.0.0.1:15001".to_string(),
            _ => format!("http://{service}"),
        };
        let answered = format!("http://{}", topo.service_addr(false, ANSWERED_PORT));
        Bed {
            mode,
            _tracer: tracer,
            _nginx: nginx,
            _sidecar: sidecar,
            _ztunnel: ztunnel,
            _agent: agent,
            daemon,
            topo,
            _node: node,
            _state: state,
            root,
            base,
            answered,
        }
    }

    /// The object's programs pinned for this bed (redirector modes only).
    fn program_pins(&self) -> Vec<PathBuf> {
        let Some(root) = &self.root else {
            return Vec::new();
        };
        let mut out = Vec::new();
        for obj in std::fs::read_dir(root.path().join("objects"))
            .into_iter()
            .flatten()
            .flatten()
        {
            for p in std::fs::read_dir(obj.path().join("progs"))
                .into_iter()
                .flatten()
                .flatten()
            {
                out.push(p.path());
            }
        }
        out.sort();
        out
    }
}

/// One measured run.
#[derive(Clone, Debug, serde::Serialize)]
pub struct Sample {
    pub mode: Mode,
    pub load: &'static str,
    pub round: u32,
    #[serde(flatten)]
    pub wrk: wrk::Report,
    /// Busy CPU time of all cores during the run, per request.
    pub cpu_us_per_req: f64,
}

/// In-kernel run time of one program, per request of a new-connection load.
#[derive(Clone, Debug, serde::Serialize)]
pub struct ProgramCost {
    pub mode: Mode,
    /// Whether the sidecar answered each request itself (no upstream connection) rather
    /// than forwarding it to the service.
    pub proxy_answers: bool,
    pub program: String,
    pub runs_per_req: f64,
    pub ns_per_run: f64,
    pub ns_per_req: f64,
}

#[derive(Debug, Default, serde::Serialize)]
pub struct DataPath {
    pub seconds: u32,
    pub rounds: u32,
    pub samples: Vec<Sample>,
    /// Programs that ran for a profiled mode (none at all is a reading too).
    pub programs: Vec<ProgramCost>,
    pub profiled: Vec<Mode>,
    /// Programs that ran per UDP request/response of the bystander pod.
    pub udp_programs: Vec<ProgramCost>,
}

fn measure(bed: &Bed, load: Load, seconds: u32) -> (wrk::Report, f64) {
    let before = cpu::busy_us();
    let report = wrk::run(&bed.topo, &bed.base, load, seconds);
    let cpu = cpu::busy_us() - before;
    let per_req = cpu / report.requests.max(1) as f64;
    (report, per_req)
}

/// Each program's runs and run time over `work` (which returns how many requests it made),
/// with `kernel.bpf_stats_enabled` on for it alone: a separate run, so the stats' own cost
/// stays out of the rounds. Programs that did not run are left out.
fn with_bpf_stats(bed: &Bed, proxy_answers: bool, work: impl FnOnce() -> u64) -> Vec<ProgramCost> {
    let pins = bed.program_pins();
    let stats = BpfStats::on();
    let before: Vec<_> = pins.iter().map(|p| program_runs(p)).collect();
    let requests = work();
    let after: Vec<_> = pins.iter().map(|p| program_runs(p)).collect();
    drop(stats);
    let reqs = requests.max(1) as f64;
    pins.iter()
        .zip(before.iter().zip(&after))
        .filter(|(_, (b, a))| a.0 > b.0)
        .map(|(pin, (b, a))| {
            let runs = (a.0 - b.0) as f64;
            let ns = (a.1 - b.1) as f64;
            ProgramCost {
                mode: bed.mode,
                proxy_answers,
                program: pin
                    .file_name()
                    .unwrap_or_default()
                    .to_string_lossy()
                    .into_owned(),
                runs_per_req: runs / reqs,
                ns_per_run: ns / runs,
                ns_per_req: ns / reqs,
            }
        })
        .collect()
}

/// Each program's runs and time per request of `load`, forwarded by the sidecar or
/// answered by it (`proxy_answers`).
fn profile(bed: &Bed, load: Load, seconds: u32, proxy_answers: bool) -> Vec<ProgramCost> {
    let base = if proxy_answers {
        &bed.answered
    } else {
        &bed.base
    };
    with_bpf_stats(bed, proxy_answers, || {
        let report = wrk::run(&bed.topo, base, load, seconds);
        if report.errors > 0 {
            eprintln!(
                "bench: {} errors profiling {} at {base}",
                report.errors,
                bed.mode.name()
            );
        }
        report.requests
    })
}

/// DNS queries over UDP (`sendto` on an unconnected socket, as CoreDNS clients and CoreDNS
/// itself use it) in a profiled UDP exchange.
const UDP_EXCHANGES: u64 = 200;

/// Each program's runs and time per UDP request/response: the pod's app queries a DNS
/// server in the service namespace [`UDP_EXCHANGES`] times.
fn udp_profile(bed: &Bed) -> Vec<ProgramCost> {
    let server_addr = bed.topo.service_addr(false, 53);
    let _server = DnsServer::server(
        &bed.topo.service,
        "bench",
        Ipv4Addr::new(192, 0, 2, 1),
        None,
    )
    .listen(server_addr)
    .start();
    let client = DnsClient::new(&bed.topo, Some(&bed.topo.pod_cgroup), APP_UID, APP_UID);
    with_bpf_stats(bed, false, || {
        for _ in 0..UDP_EXCHANGES {
            let answer = client.query(server_addr, DnsMode::Udp);
            assert!(
                matches!(answer, DnsOutcome::Reply { .. }),
                "a DNS query of the {} pod: {answer:?}",
                bed.mode.name()
            );
        }
        UDP_EXCHANGES
    })
}

pub fn run(rounds: u32, seconds: u32, modes: &[Mode]) -> DataPath {
    let site = Site::new(8 << 20);
    let beds: Vec<Bed> = modes.iter().map(|m| Bed::new(*m, &site)).collect();
    eprintln!("bench: data path: {} modes ready", beds.len());
    // Warm every path up (object caches, conntrack, nginx) before anything counts.
    for bed in &beds {
        for load in LOADS {
            wrk::run(&bed.topo, &bed.base, load, 1);
        }
    }
    let mut out = DataPath {
        seconds,
        rounds,
        ..DataPath::default()
    };
    for round in 0..rounds {
        for load in LOADS {
            // A different mode goes first each round.
            for i in 0..beds.len() {
                let bed = &beds[(i + round as usize) % beds.len()];
                let (wrk, cpu_us_per_req) = measure(bed, load, seconds);
                eprintln!(
                    "bench: round {} {:<12} {:<18} {:>9.0} req/s  p99 {:>7.0} us  {:>6.1} us CPU/req",
                    round + 1,
                    load.name,
                    bed.mode.name(),
                    wrk.rps,
                    wrk.p99_us,
                    cpu_us_per_req
                );
                out.samples.push(Sample {
                    mode: bed.mode,
                    load: load.name,
                    round,
                    wrk,
                    cpu_us_per_req,
                });
            }
        }
    }
    for bed in beds.iter().filter(|b| b.root.is_some()) {
        let answers: &[bool] = if bed.mode.proxied() {
            &[false, true]
        } else {
            &[false]
        };
        out.profiled.push(bed.mode);
        for &proxy_answers in answers {
            out.programs
                .extend(profile(bed, LOADS[0], seconds, proxy_answers));
        }
        if bed.mode == Mode::Bystander {
            out.udp_programs = udp_profile(bed);
        }
    }
    // Daemons first (SIGTERM leaves their pins; PinRoot removes them).
    for mut bed in beds {
        if let Some(d) = bed.daemon.take() {
            let _ = d.terminate();
        }
    }
    out
}
