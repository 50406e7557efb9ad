//! `redirector pod add|del|list|check`: the client of the daemon's API.

use std::{
    collections::BTreeMap,
    path::{Path, PathBuf},
};

use anyhow::bail;

use crate::{
    api::{PodInfo, PodRef, Request, Response, DEFAULT_SOCKET},
    mesh::{pod_spec, requested, Dialect},
};

#[derive(clap::Args, Debug)]
pub struct PodArgs {
    /// The daemon's socket.
    #[arg(long, value_name = "PATH", default_value = DEFAULT_SOCKET, global = true)]
    socket: PathBuf,
    #[command(subcommand)]
    command: PodCommand,
}

#[derive(clap::Args, Debug)]
#[group(required = true, multiple = false)]
struct Which {
    /// The pod's network namespace.
    #[arg(long, value_name = "PATH")]
    netns: Option<PathBuf>,
    /// The pod's `namespace/name`.
    #[arg(long, value_name = "NS/NAME")]
    name: Option<String>,
}

#[derive(clap::Subcommand, Debug)]
enum PodCommand {
    /// Capture the pod in a network namespace: `pod add --netns PATH -- <istio-iptables flags>`.
    Add {
        #[arg(long, value_name = "PATH")]
        netns: PathBuf,
        #[arg(long, value_name = "NS/NAME")]
        name: Option<String>,
        /// Which command line the flags are: istio-iptables', Linkerd proxy-init's, or an
        /// Istio ambient pod's (enrolled with ztunnel; the daemon needs --ztunnel-socket).
        #[arg(long, value_enum, default_value = "istio")]
        dialect: Dialect,
        /// A pod annotation of the dialect's mesh, `KEY=VALUE` (repeatable), e.g.
        /// traffic.sidecar.istio.io/excludeOutboundPorts=3306 or
        /// config.linkerd.io/skip-outbound-ports=3306.
        #[arg(long = "annotation", value_name = "KEY=VALUE", value_parser = annotation)]
        annotations: Vec<(String, String)>,
        /// The pod's own cgroup (a cgroup2 directory), where its programs are attached.
        /// Without it: the cgroup of a process in the namespace below the daemon's
        /// `--cgroup`, else the programs at the node cgroup.
        #[arg(long, value_name = "PATH")]
        cgroup: Option<PathBuf>,
        /// With `--dialect ambient`: the pod's service account, as ztunnel is told of it.
        #[arg(long, value_name = "SA")]
        service_account: Option<String>,
        /// With `--dialect ambient`: the pod's uid, ztunnel's key for it.
        #[arg(long, value_name = "UID")]
        pod_uid: Option<String>,
        /// The flags, istio-iptables' or proxy-init's (after `--`).
        #[arg(last = true)]
        args: Vec<String>,
    },
    /// Remove a pod's capture.
    Del(Which),
    /// The pods the daemon manages.
    List {
        #[arg(long)]
        json: bool,
    },
    /// Whether a pod is captured exactly as planned.
    Check(Which),
}

fn annotation(text: &str) -> Result<(String, String), String> {
    text.split_once('=')
        .map(|(k, v)| (k.to_owned(), v.to_owned()))
        .ok_or_else(|| format!("{text:?} is not KEY=VALUE"))
}

/// The flags of the pod's dialect: an ambient pod's say who it is (its uid, name and
/// service account) from `pod add`'s own options, which no other dialect takes.
fn dialect_args(
    dialect: Dialect,
    name: &Option<String>,
    service_account: &Option<String>,
    pod_uid: &Option<String>,
    args: &[String],
) -> anyhow::Result<Vec<String>> {
    if dialect != Dialect::Ambient {
        if service_account.is_some() || pod_uid.is_some() {
            bail!("--service-account and --pod-uid are for --dialect ambient only");
        }
        return Ok(args.to_vec());
    }
    let (Some(name), Some(pod_uid)) = (name, pod_uid) else {
        bail!("--dialect ambient needs the pod's --name NS/NAME and --pod-uid UID");
    };
    let mut flags = vec![
        "--pod-uid".to_owned(),
        pod_uid.clone(),
        "--name".to_owned(),
        name.clone(),
    ];
    if let Some(sa) = service_account {
        flags.extend(["--service-account".to_owned(), sa.clone()]);
    }
    flags.extend(args.iter().cloned());
    Ok(flags)
}

fn pod_ref(which: &Which) -> PodRef {
    PodRef {
        netns: which.netns.clone(),
        name: which.name.clone(),
    }
}

/// One request, one response.
pub(super) fn call(socket: &Path, request: &Request) -> anyhow::Result<Response> {
    Ok(crate::api::client::call(socket, request, None)?)
}

fn summary(pod: &PodInfo) -> String {
    let counters: Vec<String> = pod
        .counters
        .iter()
        .map(|(r, n)| format!("{r}={n}"))
        .collect();
    let mut line = format!(
        "{}\tnetns cookie {}\t{}\t{}\t{}",
        pod.name.as_deref().unwrap_or("-"),
        pod.netns_cookie,
        pod.netns.display(),
        pod.config.as_deref().unwrap_or("(not installed)"),
        counters.join(" ")
    );
    match &pod.cgroup {
        Some(cgroup) => line.push_str(&format!("\tprograms at {}", cgroup.display())),
        None => line.push_str("\tprograms at the node cgroup"),
    }
    if let Some(cgroup) = &pod.outside_node_cgroup {
        line.push_str(&format!(
            "\tNOT CAPTURED: runs in {}, outside the node cgroup",
            cgroup.display()
        ));
    }
    line
}

pub fn run(args: &PodArgs) -> anyhow::Result<()> {
    let (request, json) = match &args.command {
        PodCommand::Add {
            netns,
            name,
            dialect,
            annotations,
            cgroup,
            service_account,
            pod_uid,
            args,
        } => {
            let annotations: BTreeMap<String, String> = annotations.iter().cloned().collect();
            let args = dialect_args(*dialect, name, service_account, pod_uid, args)?;
            let args = &args;
            // The daemon validates too; checking here gives the same message without a
            // round trip, and an invalid value never reaches the node.
            if let Ok(flags) = requested(*dialect, args, &annotations)? {
                pod_spec(&flags)?;
            }
            if let Some(cgroup) = cgroup.as_ref().filter(|c| !c.is_dir()) {
                anyhow::bail!("--cgroup {}: not a cgroup directory", cgroup.display());
            }
            let request = Request::Add {
                netns: netns.clone(),
                name: name.clone(),
                dialect: *dialect,
                args: args.clone(),
                annotations,
                cgroup: cgroup.clone(),
                cni: None,
            };
            (request, false)
        }
        PodCommand::Del(which) => (Request::Del(pod_ref(which)), false),
        PodCommand::List { json } => (Request::List, *json),
        PodCommand::Check(which) => (Request::Check(pod_ref(which)), false),
    };
    let response = call(&args.socket, &request)?;
    if json {
        println!("{}", serde_json::to_string_pretty(&response.pods)?);
    } else {
        if let Some(message) = &response.message {
            println!("{message}");
        }
        for pod in &response.pods {
            println!("{}", summary(pod));
        }
    }
    if !response.ok {
        bail!(response.error.unwrap_or_else(|| "the daemon failed".into()));
    }
    Ok(())
}
