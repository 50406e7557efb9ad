//! `redirector status`: what is attached and pinned, each map's fill, and each pod's
//! decision counters — read from bpffs and the kernel, not from any record of ours.

use std::{fs, path::PathBuf};

use redirector_common::{names, Reason};

use crate::{
    apply::installed_objects,
    live_pod::LivePod,
    node_maps::NodeMaps,
    pins::{ObjectPins, PinRoot},
    pod,
};

#[derive(clap::Args, Debug)]
pub struct StatusArgs {
    /// Only the pod in this network namespace (default: every pod).
    #[arg(long, value_name = "PATH")]
    netns: Option<PathBuf>,
    #[arg(long, value_name = "PATH", env = "REDIRECTOR_PIN_ROOT", default_value = crate::pins::DEFAULT_ROOT)]
    pin_root: PathBuf,
}

fn names_in(dir: &std::path::Path) -> Vec<String> {
    let mut names: Vec<String> = fs::read_dir(dir)
        .map(|d| {
            d.filter_map(Result::ok)
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .collect()
        })
        .unwrap_or_default();
    names.sort();
    names
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
        Some(ns) => {
            pod::enter_netns(ns)?;
            Some(pod::netns_cookie()?)
        }
        None => None,
    };
    let root = PinRoot::new(&args.pin_root);
    let objects = installed_objects(&root)?;
    println!(
        "pin root {}: {} object(s)",
        root.path().display(),
        objects.len()
    );
    for object in objects {
        println!("object {}", object.id());
        println!("  programs: {}", names_in(&object.progs_dir()).join(" "));
        for (name, entries, capacity) in map_fill(&object)? {
            println!("  map {name}: {entries}/{capacity}");
        }
        for cookie in names_in(&object.pods_dir())
            .iter()
            .filter_map(|c| c.parse::<u64>().ok())
        {
            if only.is_some_and(|o| o != cookie) {
                continue;
            }
            println!("  pod netns cookie {cookie}");
            println!(
                "    links: {}",
                names_in(object.pod(cookie).dir()).join(" ")
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
