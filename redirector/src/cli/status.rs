//! `redirector status`: what is attached and pinned, each map's fill, and each pod's
//! decision counters — read from bpffs and the kernel, not from any record of ours.

use std::{collections::HashSet, path::PathBuf};

use anyhow::Context as _;
use redirector_common::{NetnsCookie, Reason};

use crate::{
    engine::live_pod::LivePod,
    pods::records::{Records, DEFAULT_STATE_DIR},
    store::{pins::names_in, programs::POD_PROGRAMS, NodeMaps, ObjectPins, PinRoot},
    sys::netns::Netns,
};

#[derive(clap::Args, Debug)]
pub struct StatusArgs {
    /// Only the pod in this network namespace (default: every pod).
    #[arg(long, value_name = "PATH")]
    netns: Option<PathBuf>,
    #[command(flatten)]
    pin_root: super::pin_root::PinRootArg,
    /// The daemon's state directory: where it notes that it found the node unservable.
    #[arg(long, value_name = "DIR", default_value = DEFAULT_STATE_DIR)]
    state_dir: PathBuf,
    /// Print JSON instead of text.
    #[arg(long)]
    json: bool,
}

/// What `status` shows, also its `--json` form.
#[derive(Debug, serde::Serialize)]
struct Status {
    /// Why the daemon found at its last start that this node cannot be served, if it did.
    unservable: Option<String>,
    kernel: KernelStatus,
    pin_root: PathBuf,
    objects: Vec<ObjectStatus>,
}

/// The running kernel and what its probes found, feature by feature.
#[derive(Debug, serde::Serialize)]
struct KernelStatus {
    release: String,
    features: Vec<crate::sys::kernel::Probed>,
}

#[derive(Debug, serde::Serialize)]
struct ObjectStatus {
    id: String,
    programs: Vec<String>,
    /// The programs loaded as their variant for a kernel without a feature (the variant's
    /// function), pinned under the program's name.
    variants: Vec<&'static str>,
    /// Daemon mode: the hooks attached once at the node cgroup.
    node_links: Vec<String>,
    /// Istio ambient: whether the object serves ambient pods (`None`), or why not.
    ambient_unsupported: Option<String>,
    /// The hooks attached at ztunnel's cgroup.
    ztunnel_links: Vec<String>,
    /// Other programs on the hooks of the cgroup paths this object's links are attached
    /// on (the node cgroup's, init-container pods' own), nearest first.
    neighbours: Vec<String>,
    maps: Vec<MapFill>,
    pods: Vec<PodStatus>,
}

#[derive(Debug, serde::Serialize)]
struct MapFill {
    name: &'static str,
    entries: usize,
    capacity: u32,
}

#[derive(Debug, serde::Serialize)]
struct PodStatus {
    netns_cookie: u64,
    links: Vec<String>,
    /// `None` when the pod has links but no configuration (see `error`).
    config: Option<PodConfigStatus>,
    /// Non-zero decision counters by reason name, in the order of the reasons.
    #[serde(serialize_with = "as_object")]
    counters: Vec<(&'static str, u64)>,
    error: Option<String>,
}

/// Name/count pairs as a JSON object.
fn as_object<S: serde::Serializer>(
    pairs: &[(&'static str, u64)],
    serializer: S,
) -> Result<S::Ok, S::Error> {
    serializer.collect_map(pairs.iter().map(|(k, v)| (k, v)))
}

#[derive(Debug, serde::Serialize)]
struct PodConfigStatus {
    outbound_port: u16,
    inbound_port: u16,
    tunnel_port: u16,
    flags: u32,
    proxy_uids: Vec<u32>,
    proxy_gids: Vec<u32>,
}

fn read_status(root: &PinRoot, only: Option<NetnsCookie>) -> anyhow::Result<Status> {
    let mut objects = Vec::new();
    for object in root.objects().context("listing pinned objects")? {
        let programs = names_in(&object.progs_dir()).context("listing programs")?;
        let variants = POD_PROGRAMS
            .iter()
            .filter(|spec| object.uses_variant(spec))
            .filter_map(|spec| spec.variant.map(|v| v.function))
            .collect();
        let maps = NodeMaps::fill(&object)?
            .into_iter()
            .map(|(name, entries, capacity)| MapFill {
                name,
                entries,
                capacity,
            })
            .collect();
        let mut pods = Vec::new();
        for cookie in object.pods().context("listing pods")? {
            if only.is_some_and(|o| o != cookie) {
                continue;
            }
            let links = object.pod(cookie).hooks().context("listing links")?;
            let mut pod = PodStatus {
                netns_cookie: cookie.get(),
                links,
                config: None,
                counters: Default::default(),
                error: None,
            };
            match LivePod::open(root, cookie) {
                Ok(live) => {
                    let c = live.config;
                    pod.config = Some(PodConfigStatus {
                        outbound_port: c.outbound_port,
                        inbound_port: c.inbound_port,
                        tunnel_port: c.tunnel_port,
                        flags: c.flags,
                        proxy_uids: c.proxy_uids[..c.proxy_uid_count as usize].to_vec(),
                        proxy_gids: c.proxy_gids[..c.proxy_gid_count as usize].to_vec(),
                    });
                    let counters = live.counters();
                    pod.counters = Reason::ALL
                        .iter()
                        .filter(|r| counters[**r as usize] != 0)
                        .map(|r| (r.name(), counters[*r as usize]))
                        .collect();
                }
                Err(err) => pod.error = Some(err.to_string()),
            }
            pods.push(pod);
        }
        let node_links = object.node().hooks().context("listing node links")?;
        let ztunnel_links = object
            .ztunnel()
            .hooks()
            .context("listing ztunnel's links")?;
        let ambient_unsupported = crate::engine::ztunnel_cgroup::check_served(&object)
            .err()
            .map(|e| e.to_string());
        let neighbours = neighbours_of(&object);
        objects.push(ObjectStatus {
            id: object.id().to_string(),
            programs,
            variants,
            node_links,
            ambient_unsupported,
            ztunnel_links,
            neighbours,
            maps,
            pods,
        });
    }
    Ok(Status {
        unservable: None,
        kernel: KernelStatus {
            release: crate::sys::kernel::running_release(),
            features: crate::sys::kernel::probe_running(),
        },
        pin_root: root.path().to_path_buf(),
        objects,
    })
}

/// The cgroups of processes in the namespaces of `object`'s pods (found by their netns
/// links), from one pass over /proc.
fn pod_process_cgroups(object: &ObjectPins) -> Vec<PathBuf> {
    use crate::sys::bpf_sys::{pinned_link_target, LinkTarget};
    use crate::sys::pod_cgroup::{cgroups_of, ns_id};
    let Some((nsfs, _)) = ns_id(std::path::Path::new("/proc/self/ns/net")) else {
        return Vec::new();
    };
    let pods = object.pods().unwrap_or_default();
    let wanted: HashSet<_> = pods
        .into_iter()
        .flat_map(|cookie| {
            let pins = object.pod(cookie);
            let hooks = pins.hooks().unwrap_or_default();
            hooks
                .into_iter()
                .filter_map(move |hook| match pinned_link_target(&pins.link(&hook)) {
                    Ok(LinkTarget::Netns(ino)) if ino != 0 => Some((nsfs, u64::from(ino))),
                    _ => None,
                })
                .collect::<Vec<_>>()
        })
        .collect();
    cgroups_of(&wanted).into_values().collect()
}

/// Other programs on the cgroup paths `object`'s programs are attached on, each listed
/// once.
fn neighbours_of(object: &ObjectPins) -> Vec<String> {
    use crate::engine::neighbours::{cgroup_paths, foreign_on_path, object_program_ids};
    use crate::engine::node::linked_cgroup;
    let pods = object.pods().unwrap_or_default();
    let cgroups: HashSet<u64> = std::iter::once(object.node())
        .chain(pods.into_iter().map(|cookie| object.pod(cookie)))
        .filter_map(|pins| linked_cgroup(&pins))
        .collect();
    let ours = object_program_ids(object);
    let mut listed = Vec::new();
    // A daemon pod's programs at its own cgroup have no link: its cgroup is the one its
    // processes run in.
    let paths = cgroup_paths(&cgroups)
        .into_values()
        .chain(pod_process_cgroups(object));
    for path in paths {
        for program in foreign_on_path(&path, &ours) {
            let line = program.to_string();
            if !listed.contains(&line) {
                listed.push(line);
            }
        }
    }
    listed
}

pub fn run(args: &StatusArgs) -> anyhow::Result<()> {
    let only = match &args.netns {
        Some(path) => Some(Netns::open(path)?.cookie()),
        None => None,
    };
    let mut status = read_status(&args.pin_root.root(), only)?;
    status.unservable = Records::new(&args.state_dir).unservable();
    if args.json {
        println!("{}", serde_json::to_string_pretty(&status)?);
        return Ok(());
    }
    if let Some(why) = &status.unservable {
        println!("node: {why}");
    }
    println!("kernel {}: features as probed", status.kernel.release);
    for probed in &status.kernel.features {
        let found = match (probed.present, probed.fallback, &probed.error) {
            (Some(true), _, _) => "yes".to_owned(),
            (Some(false), Some(fallback), _) => format!("no; instead: {fallback}"),
            (Some(false), None, _) => "no".to_owned(),
            (None, _, error) => format!("unknown ({})", error.as_deref().unwrap_or("")),
        };
        println!("  {} (Linux {}): {found}", probed.feature, probed.since);
    }
    println!(
        "pin root {}: {} object(s)",
        status.pin_root.display(),
        status.objects.len()
    );
    for object in &status.objects {
        println!("object {}", object.id);
        println!("  programs: {}", object.programs.join(" "));
        if !object.variants.is_empty() {
            println!(
                "  loaded as variants for this kernel: {}",
                object.variants.join(" ")
            );
        }
        for program in &object.neighbours {
            println!("  other program on a linked cgroup path: {program}");
        }
        if !object.node_links.is_empty() {
            println!(
                "  node links (while a pod relies on them: a daemon pod whose own cgroup was not found, as `pod list` shows, or an init container's pod they cover): {}",
                object.node_links.join(" ")
            );
        }
        match &object.ambient_unsupported {
            None if object.ztunnel_links.is_empty() => {
                println!("  ambient: served (ztunnel has not connected)")
            }
            None => println!(
                "  ambient: served; at ztunnel's cgroup: {}",
                object.ztunnel_links.join(" ")
            ),
            Some(why) => println!("  ambient: not served: {why}"),
        }
        for map in &object.maps {
            println!("  map {}: {}/{}", map.name, map.entries, map.capacity);
        }
        for pod in &object.pods {
            println!("  pod netns cookie {}", pod.netns_cookie);
            println!("    links: {}", pod.links.join(" "));
            match (&pod.config, &pod.error) {
                (Some(c), _) => {
                    println!(
                        "    config: -p {} -z {} -e {} flags {:#x} proxy uids {:?} gids {:?}",
                        c.outbound_port,
                        c.inbound_port,
                        c.tunnel_port,
                        c.flags,
                        c.proxy_uids,
                        c.proxy_gids,
                    );
                    let shown: Vec<String> = pod
                        .counters
                        .iter()
                        .map(|(r, n)| format!("{r}={n}"))
                        .collect();
                    println!("    counters (non-zero): {}", shown.join(" "));
                }
                (None, err) => println!("    config: missing ({})", err.as_deref().unwrap_or("")),
            }
        }
    }
    Ok(())
}
