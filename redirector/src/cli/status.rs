//! `redirector status`: what is attached and pinned, each map's fill, and each pod's
//! decision counters — read from bpffs and the kernel, not from any record of ours.

use std::path::PathBuf;

use anyhow::Context as _;
use redirector_common::{names, Reason};

use crate::{
    live_pod::LivePod,
    netns::Netns,
    store::{pins::names_in, NodeMaps, ObjectPins, PinRoot},
};

#[derive(clap::Args, Debug)]
pub struct StatusArgs {
    /// Only the pod in this network namespace (default: every pod).
    #[arg(long, value_name = "PATH")]
    netns: Option<PathBuf>,
    #[arg(long, value_name = "PATH", env = "REDIRECTOR_PIN_ROOT", default_value = crate::store::pins::DEFAULT_ROOT)]
    pin_root: PathBuf,
}

/// Entries in each map: (name, entries, capacity).
fn map_fill(object: &ObjectPins) -> anyhow::Result<Vec<(&'static str, usize, u32)>> {
    let maps = NodeMaps::open(object)?;
    let capacity = |name: &str| {
        aya::maps::MapData::from_pin(object.map(name))
            .ok()
            .and_then(|m| m.info().ok())
            .map_or(0, |i| i.max_entries())
    };
    Ok(vec![
        (
            names::POD_CONFIG,
            maps.pod_config.keys().count(),
            capacity(names::POD_CONFIG),
        ),
        (
            names::PORT_SETS,
            maps.port_sets.keys().count(),
            capacity(names::PORT_SETS),
        ),
        (
            names::CIDRS_V4,
            maps.cidrs_v4.keys().count(),
            capacity(names::CIDRS_V4),
        ),
        (
            names::CIDRS_V6,
            maps.cidrs_v6.keys().count(),
            capacity(names::CIDRS_V6),
        ),
        (
            names::POD_BY_ADDR,
            maps.pod_by_addr.keys().count(),
            capacity(names::POD_BY_ADDR),
        ),
        (
            names::LISTENERS,
            maps.listeners.keys().count(),
            capacity(names::LISTENERS),
        ),
        (
            names::ORIG_DST_BY_CONN,
            maps.orig_dst_by_conn.keys().count(),
            capacity(names::ORIG_DST_BY_CONN),
        ),
        (
            names::COUNTERS,
            maps.counters.keys().count(),
            capacity(names::COUNTERS),
        ),
    ])
}

pub fn run(args: &StatusArgs) -> anyhow::Result<()> {
    let only = match &args.netns {
        Some(path) => Some(Netns::open(path)?.cookie()),
        None => None,
    };
    let root = PinRoot::new(&args.pin_root);
    let objects = root.objects().context("listing pinned objects")?;
    println!(
        "pin root {}: {} object(s)",
        root.path().display(),
        objects.len()
    );
    for object in objects {
        println!("object {}", object.id());
        println!(
            "  programs: {}",
            names_in(&object.progs_dir())
                .context("listing programs")?
                .join(" ")
        );
        for (name, entries, capacity) in map_fill(&object)? {
            println!("  map {name}: {entries}/{capacity}");
        }
        for cookie in object.pods().context("listing pods")? {
            if only.is_some_and(|o| o != cookie) {
                continue;
            }
            println!("  pod netns cookie {cookie}");
            println!(
                "    links: {}",
                object
                    .pod(cookie)
                    .hooks()
                    .context("listing links")?
                    .join(" ")
            );
            match LivePod::open(&root, cookie) {
                Ok(live) => {
                    let c = live.config;
                    println!(
                        "    config: -p {} -z {} -e {} flags {:#x} proxy uids {:?} gids {:?}",
                        c.outbound_port,
                        c.inbound_port,
                        c.tunnel_port,
                        c.flags,
                        &c.proxy_uids[..c.proxy_uid_count as usize],
                        &c.proxy_gids[..c.proxy_gid_count as usize],
                    );
                    let counters = live.counters();
                    let shown: Vec<String> = Reason::ALL
                        .iter()
                        .filter(|r| counters[**r as usize] != 0)
                        .map(|r| format!("{}={}", r.name(), counters[*r as usize]))
                        .collect();
                    println!("    counters (non-zero): {}", shown.join(" "));
                }
                Err(err) => println!("    config: missing ({err})"),
            }
        }
    }
    Ok(())
}
