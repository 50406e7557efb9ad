//! `redirector explain`: which rule decides a connection of a pod and where it lands,
//! computed by the decision functions the kernel programs run, over the pod's live maps.

use std::{
    collections::HashSet,
    net::{IpAddr, SocketAddr},
    path::PathBuf,
};

use anyhow::{bail, Context as _};
use redirector_common::{
    decide_inbound, decide_outbound, InboundAttempt, OutboundAttempt, PodLookups, PortSet,
    Protocol, Reason, Verdict, DNS_CAPTURE_PORT,
};

use crate::{
    engine::facts::{interfaces, local_addresses},
    engine::live_pod::LivePod,
    sys::netns::Netns,
};

#[derive(clap::Args, Debug)]
pub struct ExplainArgs {
    /// The pod's network namespace (default: the current one).
    #[arg(long, value_name = "PATH")]
    netns: Option<PathBuf>,
    #[command(flatten)]
    pin_root: super::pin_root::PinRootArg,
    /// Explain a connection arriving at the pod instead of one it makes.
    #[arg(long)]
    inbound: bool,
    /// Destination address and port (outbound; inbound: a pod address).
    #[arg(long, value_name = "IP:PORT")]
    dst: Option<SocketAddr>,
    /// Inbound destination port, to the pod's first address.
    #[arg(long, value_name = "PORT")]
    dst_port: Option<u16>,
    /// Caller's uid (outbound).
    #[arg(long, default_value_t = 0)]
    uid: u32,
    /// Caller's gid (outbound; default: the uid).
    #[arg(long)]
    gid: Option<u32>,
    /// Address the socket is bound to (outbound), e.g. 127.0.0.6.
    #[arg(long, value_name = "IP")]
    src: Option<IpAddr>,
    /// Explain a UDP datagram (DNS) instead of a TCP connection (outbound).
    #[arg(long)]
    udp: bool,
    /// Interface the connection arrives on (inbound; default eth0).
    #[arg(long, value_name = "NAME", default_value = "eth0")]
    iface: String,
}

/// The istio-iptables rule behind a decision, in words.
fn rule(reason: Reason, lookups: &LivePod, port: u16) -> &'static str {
    match reason {
        Reason::Redirected if lookups.port_in(PortSet::OutboundInclude, port) => {
            "-q/--istio-outbound-ports includes the port"
        }
        Reason::Redirected => "-i/--istio-service-cidr includes the destination",
        Reason::RedirectedInbound => {
            "the proxy calling its own pod through a local address goes to the inbound port"
        }
        Reason::PassedExcludedPort => "-o/--istio-local-outbound-ports-exclude excludes the port",
        Reason::PassedInboundPassthrough => {
            "source 127.0.0.6/::6 is the proxy's inbound passthrough"
        }
        Reason::PassedLocalNotProxy => "a local destination, from a process that is not the proxy",
        Reason::PassedProxyOwner => "the caller is the proxy (-u/--proxy-uid or -g/--proxy-gid)",
        Reason::PassedOwnerGroup => {
            "ISTIO_OUTBOUND_OWNER_GROUPS(_EXCLUDE) leaves the caller's group out"
        }
        Reason::PassedLoopback => {
            "the destination is in the loopback CIDR (ISTIO_OUTBOUND_IPV4_LOOPBACK_CIDR, ::1)"
        }
        Reason::PassedExcludedCidr => "-x/--istio-service-exclude-cidr excludes the destination",
        Reason::PassedNotIncluded => "the destination is not in -i and the port is not in -q",
        Reason::SteeredInbound => "-b/--istio-inbound-ports captures the port",
        Reason::PassedInboundPort => {
            "the port is not captured inbound (not in -b, in -d, or the tunnel port -e)"
        }
        Reason::PassedInterface => {
            "the interface is excluded (-c), or virtual (-k) with a destination outside -i"
        }
        Reason::RedirectedDns => {
            "--redirect-dns: port 53 of a resolv.conf server (any server with --capture-all-dns)"
        }
        Reason::PassedNotTcp => "only TCP is captured, apart from DNS",
        Reason::FailedClosed | Reason::OrigDstAnswered | Reason::NoInboundListener => "",
    }
}

pub fn run(args: &ExplainArgs) -> anyhow::Result<()> {
    let netns = match &args.netns {
        Some(path) => Netns::open(path)?,
        None => Netns::current()?,
    };
    let cookie = netns.cookie();
    let live = LivePod::open(&args.pin_root.root(), cookie)?;
    let cfg = live.config;
    println!("pod netns cookie {cookie} (object {})", live.object.id());
    if args.inbound {
        let dst = match (args.dst, args.dst_port) {
            (Some(dst), _) => dst,
            (None, Some(port)) => {
                let addr = *netns
                    .run(local_addresses)??
                    .first()
                    .context("the pod has no address")?;
                SocketAddr::new(addr, port)
            }
            (None, None) => bail!("--inbound needs --dst IP:PORT or --dst-port PORT"),
        };
        let ifindex = netns
            .run(interfaces)??
            .into_iter()
            .find(|(name, _)| *name == args.iface)
            .map(|(_, index)| index)
            .with_context(|| format!("--iface {}: no such interface in the pod", args.iface))?;
        let unspecified = match dst {
            SocketAddr::V4(_) => IpAddr::from([0, 0, 0, 0]),
            SocketAddr::V6(_) => IpAddr::from([0u16; 8]),
        };
        let attempt = InboundAttempt {
            dst: dst.ip(),
            src: args.src.unwrap_or(unspecified),
            dst_port: dst.port(),
            ifindex,
        };
        let verdict = decide_inbound(&cfg, &attempt, &live);
        println!("inbound TCP to {dst} on {}", args.iface);
        report(verdict, &live, dst, &cfg);
    } else {
        let dst = args.dst.context("--dst IP:PORT is required")?;
        let gid = args.gid.unwrap_or(args.uid);
        let src = args.src.unwrap_or(IpAddr::from([0, 0, 0, 0]));
        let protocol = if args.udp {
            Protocol::Udp
        } else {
            Protocol::Tcp
        };
        let attempt = OutboundAttempt {
            protocol,
            dst: dst.ip(),
            dst_port: dst.port(),
            src,
            uid: args.uid,
            gid,
        };
        let verdict = decide_outbound(&cfg, &attempt, &live);
        let name = if args.udp { "UDP" } else { "TCP" };
        println!("outbound {name} to {dst} from uid {} gid {gid}", args.uid);
        report(verdict, &live, dst, &cfg);
    }
    report_neighbours(&netns, &live);
    Ok(())
}

/// Other programs on the hooks of the pod's cgroup path: a socket load-balancer rewrites
/// what the proxy dials after redirector's programs ran (they are nearer the pod), and one
/// attached without BPF_F_ALLOW_MULTI keeps pods below it from being set up.
fn report_neighbours(netns: &Netns, live: &LivePod) {
    let Some(id) = crate::sys::pod_cgroup::ns_id(netns.path()) else {
        return;
    };
    let Some(cgroup) = crate::sys::pod_cgroup::cgroups_of(&HashSet::from([id])).remove(&id) else {
        println!("other programs on the pod's cgroup path: unknown (no process of the pod found)");
        return;
    };
    let ours = crate::engine::neighbours::object_program_ids(&live.object);
    let foreign = crate::engine::neighbours::foreign_on_path(&cgroup, &ours);
    if foreign.is_empty() {
        println!("other programs on the pod's cgroup path: none");
        return;
    }
    println!("other programs on the pod's cgroup path:");
    for program in foreign {
        println!("  {program}");
    }
}

fn report(verdict: Verdict, live: &LivePod, dst: SocketAddr, cfg: &redirector_common::PodConfig) {
    let reason = verdict.reason();
    println!(
        "decided by: {} ({})",
        rule(reason, live, dst.port()),
        reason.name()
    );
    match verdict {
        Verdict::Capture => println!(
            "lands on: the proxy's outbound listener, port {} (-p); SO_ORIGINAL_DST = {dst}",
            cfg.outbound_port
        ),
        Verdict::CaptureInbound => println!(
            "lands on: the proxy's inbound listener, port {} (-z); SO_ORIGINAL_DST = {dst}",
            cfg.inbound_port
        ),
        Verdict::CaptureDns => println!(
            "lands on: the DNS proxy, port {DNS_CAPTURE_PORT}; replies come back from {dst}"
        ),
        Verdict::Pass(_) => println!("lands on: {dst} directly (not captured)"),
    }
}
