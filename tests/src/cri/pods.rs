//! Pods of a mesh on the tests' containerd ([`crate::cri::Containerd`]): the node's
//! primary network, a service, an app, the stand-in sidecar, and where an app's
//! connection lands.

use std::net::SocketAddr;
use std::time::Duration;

use serde_json::json;

use crate::cri::{Containerd, Sandbox};
use crate::daemon::StateDir;
use crate::probe::protocol::parse_listening;
use crate::process::within;
use crate::proxied_pod::assert_on_proxy;
use crate::{words, ConnOutcome, APP_UID, PROXY_UID};

/// The annotation istio's injector sets on every pod it injected a sidecar into.
pub const STATUS: &str = "sidecar.istio.io/status";

/// The second field of the node's pod networks: one per test process, very likely.
fn network_field() -> u32 {
    200 + (std::process::id() % 50)
}

/// The node's own network at `cni_version`: ptp with host-local addresses in
/// 10.x.`third_octet`.0/24.
pub fn primary_network(cni_version: &str, third_octet: u8, ipam: &StateDir) -> serde_json::Value {
    let subnet = format!("10.{}.{third_octet}.0/24", network_field());
    json!({
        "cniVersion": cni_version,
        "name": "rdtcri",
        "plugins": [
            {"type": "ptp", "ipam": {"type": "host-local", "subnet": subnet, "dataDir": ipam.path()}},
        ]
    })
}

/// [`primary_network`] at CNI 1.0.0 with IPv6 too: host-local's ranges 10.x.`third_octet`.0/24
/// and fd00:x:`third_octet`::/64 (ptp turns on the host's IPv6 forwarding as well).
pub fn dual_stack_network(third_octet: u8, ipam: &StateDir) -> serde_json::Value {
    let mut network = primary_network("1.0.0", third_octet, ipam);
    let ipam = network["plugins"][0]["ipam"].as_object_mut().unwrap();
    let v4 = ipam.remove("subnet").unwrap();
    let v6 = format!("fd00:{}:{third_octet}::/64", network_field());
    ipam.insert("ranges".into(), json!([[{"subnet": v4}], [{"subnet": v6}]]));
    network
}

/// The service: `probe serve` on 8080 in `sandbox`, once it listens; the container and
/// its address.
pub fn serve(cri: &mut Containerd, sandbox: &Sandbox) -> (String, SocketAddr) {
    let server = probe_container(
        cri,
        sandbox,
        "svc",
        "serve --listen 0.0.0.0:8080 --name svc",
        0,
    );
    (server, SocketAddr::new(cri.sandbox_ip(&sandbox.0), 8080))
}

/// A container `name` in `sandbox` running `probe <args>` as `uid`, once it listens on
/// each of its `--listen` addresses: a started container is not yet a listening one.
pub fn probe_container(
    cri: &mut Containerd,
    sandbox: &Sandbox,
    name: &str,
    args: &str,
    uid: u32,
) -> String {
    let command = format!("probe {args}");
    let id = cri.start_container(sandbox, name, &words(&command), i64::from(uid));
    wait_listening(cri, &id, args.matches("--listen").count());
    id
}

/// A pod `namespace/name` with `annotations` under the cgroup `parent`, with an app
/// container (uid 1000) that only sleeps, to connect from: the sandbox and the container.
pub fn app_pod(
    cri: &mut Containerd,
    namespace: &str,
    name: &str,
    annotations: &[(&str, &str)],
    parent: &str,
) -> (Sandbox, String) {
    let sandbox = cri.run_sandbox_in(namespace, name, annotations, &format!("{parent}/{name}"));
    let app = cri.start_container(&sandbox, "app", &["sleep", "100000"], i64::from(APP_UID));
    (sandbox, app)
}

/// The meshed pod `web` with `annotations` under `parent`: an app serving on 8080 (uid
/// 1000) and the stand-in proxy `sidecar` starts, no init container. The sandbox, the app,
/// the proxy and the app's address.
pub fn meshed_web(
    cri: &mut Containerd,
    parent: &str,
    annotations: &[(&str, &str)],
    sidecar: fn(&mut Containerd, &Sandbox) -> String,
) -> (Sandbox, String, String, SocketAddr) {
    let web = cri.run_sandbox("web", annotations, &format!("{parent}/web"));
    let serve = words("probe serve --listen 0.0.0.0:8080 --name app");
    let app = cri.start_container(&web, "app", &serve, i64::from(APP_UID));
    let proxy = sidecar(cri, &web);
    let addr = SocketAddr::new(cri.sandbox_ip(&web.0), 8080);
    (web, app, proxy, addr)
}

/// A connection from the container `client` to `dst` lands on the proxy's inbound listener
/// with `dst` as its original destination.
#[track_caller]
pub fn assert_inbound_on_proxy(cri: &mut Containerd, client: &str, dst: SocketAddr) {
    assert_on_proxy(&connect(cri, client, dst), "proxy", dst);
}

/// The stand-in sidecar in `sandbox`: `probe proxy` on 15001 and 15006, as uid 1337, once
/// it listens on both.
pub fn sidecar(cri: &mut Containerd, sandbox: &Sandbox) -> String {
    let listen = ["127.0.0.1:15001", "0.0.0.0:15006"];
    proxy_container(cri, sandbox, "proxy", listen, PROXY_UID)
}

/// Linkerd's proxy stand-in in `sandbox`: `probe proxy` on 127.0.0.1:4140 (outbound) and
/// 0.0.0.0:4143 (inbound), as uid 2102, once it listens on both. It reports itself as
/// `proxy`, so [`assert_lands_on_proxy`] reads it.
pub fn linkerd_sidecar(cri: &mut Containerd, sandbox: &Sandbox) -> String {
    let listen = ["127.0.0.1:4140", "0.0.0.0:4143"];
    let uid = crate::linkerd::cases::LINKERD_PROXY_UID;
    proxy_container(cri, sandbox, "linkerd-proxy", listen, uid)
}

/// A container `name` in `sandbox` running `probe proxy` named `proxy` on `listen`, as
/// `uid`, once it listens on both.
fn proxy_container(
    cri: &mut Containerd,
    sandbox: &Sandbox,
    name: &str,
    [outbound, inbound]: [&str; 2],
    uid: u32,
) -> String {
    let args = format!("proxy --listen {outbound} --listen {inbound} --name proxy");
    probe_container(cri, sandbox, name, &args, uid)
}

/// Waits until the probe in `container` logged `listeners` `listening` lines.
fn wait_listening(cri: &mut Containerd, container: &str, listeners: usize) {
    // A process start: milliseconds here, 30 s is room for a loaded machine.
    let ready = within(Duration::from_secs(30), || {
        let log = cri.container_log(container);
        log.lines().filter(|l| parse_listening(l).is_some()).count() >= listeners
    });
    assert!(
        ready.is_some(),
        "{container}: {listeners} `listening` lines expected; its log:\n{}",
        cri.container_log(container)
    );
}

/// Where `app`'s connection to `dst` lands.
pub fn connect(cri: &mut Containerd, app: &str, dst: SocketAddr) -> ConnOutcome {
    let (_, out) = cri.exec(app, &["probe", "connect", &dst.to_string()]);
    ConnOutcome::parse(&out)
}

/// Whether `outcome` is the sidecar's, with `dst` as the original destination.
pub fn on_proxy(outcome: &ConnOutcome, dst: SocketAddr) -> bool {
    matches!(outcome, ConnOutcome::Proxied { name, orig, .. } if name == "proxy" && *orig == Some(dst))
}

/// `app` connects to `dst`: it lands on its pod's proxy with `dst` as original destination.
#[track_caller]
pub fn assert_lands_on_proxy(cri: &mut Containerd, app: &str, dst: SocketAddr) {
    let outcome = connect(cri, app, dst);
    assert!(
        on_proxy(&outcome, dst),
        "{app} -> {dst}: expected the proxy with {dst} as original destination, got {outcome:?}\n{}",
        cri.log()
    );
}

/// `app` connects to `dst`: it reaches the service directly.
#[track_caller]
pub fn assert_reaches_service(cri: &mut Containerd, app: &str, dst: SocketAddr) {
    assert_served_by(cri, app, dst, "svc");
}

/// `client` connects to `dst`: the server named `server` answers it, no proxy between.
#[track_caller]
pub fn assert_served_by(cri: &mut Containerd, client: &str, dst: SocketAddr, server: &str) {
    let outcome = connect(cri, client, dst);
    assert!(
        matches!(outcome, ConnOutcome::Served { ref name, .. } if name == server),
        "{client} -> {dst}: expected {server} directly, got {outcome:?}"
    );
}

/// Pods the plugin must leave alone, each with an app container to connect from: one with
/// no sidecar annotations, and a kube-system pod the injector marked.
pub struct LeftAlone {
    pub plain: (Sandbox, String),
    pub system: (Sandbox, String),
}

impl LeftAlone {
    /// Both pods under `parent`, named `plain{suffix}` and `system{suffix}`.
    pub fn start(cri: &mut Containerd, parent: &str, suffix: &str) -> Self {
        let plain = app_pod(cri, "default", &format!("plain{suffix}"), &[], parent);
        let system = format!("system{suffix}");
        let system = app_pod(cri, "kube-system", &system, &[(STATUS, "{}")], parent);
        LeftAlone { plain, system }
    }

    /// Both apps reach the service at `svc` directly.
    #[track_caller]
    pub fn assert_direct(&self, cri: &mut Containerd, svc: SocketAddr) {
        assert_reaches_service(cri, &self.plain.1, svc);
        assert_reaches_service(cri, &self.system.1, svc);
    }

    /// StopPodSandbox + RemovePodSandbox of both.
    pub fn remove(self, cri: &mut Containerd) {
        cri.remove_sandbox(&self.plain.0 .0);
        cri.remove_sandbox(&self.system.0 .0);
    }
}
