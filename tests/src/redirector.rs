//! Running the `redirector` binary against a test pod, with a pin root of the test's own
//! so that what a test checks in bpffs is exactly what it installed.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use crate::{bin_path, unique_name, Cgroup, ChildGuard, NetNs};

pub use redirector::mesh::istio::annotations::STANDARD_INJECTION;

/// A bpffs directory for one test's pins; removed (with anything left in it) on drop.
pub struct PinRoot {
    path: PathBuf,
}

impl PinRoot {
    pub fn new(hint: &str) -> Self {
        mount_bpffs_if_missing();
        PinRoot {
            path: Path::new("/sys/fs/bpf").join(unique_name(hint)),
        }
    }

    pub fn path(&self) -> &Path {
        &self.path
    }
}

impl Drop for PinRoot {
    fn drop(&mut self) {
        // Unpinning detaches links and frees programs and maps with no other users.
        let _ = std::fs::remove_dir_all(&self.path);
    }
}

fn mount_bpffs_if_missing() {
    let mounts = std::fs::read_to_string("/proc/self/mounts").unwrap_or_default();
    if !mounts
        .lines()
        .any(|l| l.split_whitespace().nth(2) == Some("bpf"))
    {
        let st = Command::new("mount")
            .args(["-t", "bpf", "bpf", "/sys/fs/bpf"])
            .status();
        assert!(st.is_ok_and(|s| s.success()), "mounting bpffs failed");
    }
}

pub fn redirector_bin() -> PathBuf {
    bin_path("redirector")
}

/// `redirector` with the arguments `line` holds ([`crate::words`]), to run or spawn.
pub fn redirector(line: &str) -> crate::Spawn {
    crate::Spawn::new(redirector_bin()).args(crate::words(line))
}

/// `redirector istio-iptables` for the pod in `netns` with cgroup `cgroup` and pins under
/// `root`, to add flags to. Runs from the host namespace; the binary enters the pod's.
pub fn istio_iptables_command(netns: &NetNs, cgroup: &Cgroup, root: &PinRoot) -> Command {
    let mut cmd = Command::new(redirector_bin());
    cmd.arg("istio-iptables")
        .arg("--network-namespace")
        .arg(netns.path())
        .arg("--cgroup")
        .arg(cgroup.path())
        .arg("--pin-root")
        .arg(root.path());
    cmd
}

/// [`istio_iptables_command`] plus `args`, run.
pub fn istio_iptables(netns: &NetNs, cgroup: &Cgroup, root: &PinRoot, args: &[&str]) -> Output {
    let mut cmd = istio_iptables_command(netns, cgroup, root);
    cmd.args(args);
    cmd.output()
        .unwrap_or_else(|e| panic!("running {cmd:?}: {e}"))
}

/// Like [`istio_iptables`], panicking with the log unless it exits 0.
pub fn install(netns: &NetNs, cgroup: &Cgroup, root: &PinRoot, args: &[&str]) -> Output {
    run_ok(istio_iptables_command(netns, cgroup, root).args(args))
}

/// Every file under `dir`, recursively (pins are files on bpffs).
pub fn pins_under(dir: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    let Ok(entries) = std::fs::read_dir(dir) else {
        return out;
    };
    for entry in entries.flatten() {
        let path = entry.path();
        if path.is_dir() {
            out.extend(pins_under(&path));
        } else {
            out.push(path);
        }
    }
    out.sort();
    out
}

/// Entries per map of the (first) object under `root`, by map name, from `status --json`.
pub fn map_fill(root: &PinRoot) -> Vec<(String, u64)> {
    status(root)["objects"][0]["maps"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|m| Some((m["name"].as_str()?.to_owned(), m["entries"].as_u64()?)))
        .collect()
}

/// `redirector status --json` over the pins under `root`: what the tests ask about
/// objects, pods and links, instead of reading the pin layout.
pub fn status(root: &PinRoot) -> serde_json::Value {
    let out = run_ok(
        Command::new(redirector_bin())
            .args(["status", "--json", "--pin-root"])
            .arg(root.path()),
    );
    serde_json::from_slice(&out.stdout).expect("status --json prints JSON")
}

/// The pod of netns cookie `cookie` as `status --json` shows it, of whichever object.
pub fn status_pod(root: &PinRoot, cookie: u64) -> Option<serde_json::Value> {
    let status = status(root);
    let objects = status["objects"].as_array().into_iter().flatten();
    let mut pods = objects.flat_map(|o| o["pods"].as_array().into_iter().flatten());
    pods.find(|p| p["netns_cookie"] == cookie).cloned()
}

/// Whether tracing is switched on (`pod_flags::TRACE`) for the one pod under `root`, as
/// `status --json` reports its configuration.
pub fn trace_switch_on(root: &PinRoot) -> bool {
    let status = status(root);
    let flags = status["objects"][0]["pods"][0]["config"]["flags"]
        .as_u64()
        .unwrap_or_else(|| panic!("a pod with a config in {status}"));
    flags & u64::from(redirector_common::pod_flags::TRACE) != 0
}

/// Wait (up to [`EVENTUALLY`](crate::EVENTUALLY)) until `tracer`, a `redirector trace` just
/// started, has switched the trace on under `root`; panics with the tracer's stderr
/// otherwise.
pub fn wait_for_trace_switch(root: &PinRoot, tracer: &ChildGuard) {
    let on = crate::process::within(crate::EVENTUALLY, || trace_switch_on(root));
    assert!(
        on.is_some(),
        "the trace switch did not come on: {}",
        tracer.stderr()
    );
}

/// Run `cmd`, panicking with its log unless it exits 0.
pub fn run_ok(cmd: &mut Command) -> Output {
    let out = cmd
        .output()
        .unwrap_or_else(|e| panic!("running {cmd:?}: {e}"));
    assert!(
        out.status.success(),
        "{cmd:?} failed ({}):\n{}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    out
}

/// The ids of the objects loaded under `root`, sorted.
pub fn object_ids(root: &PinRoot) -> Vec<String> {
    let status = status(root);
    let mut ids: Vec<String> = status["objects"]
        .as_array()
        .expect("objects")
        .iter()
        .map(|o| o["id"].as_str().expect("object id").to_owned())
        .collect();
    ids.sort();
    ids
}

/// The hooks a pod has links for under any object, or `None` when no object has the pod.
pub fn pod_links(root: &PinRoot, netns_cookie: u64) -> Option<Vec<String>> {
    let status = status(root);
    let pods = status["objects"]
        .as_array()
        .expect("objects")
        .iter()
        .flat_map(|o| o["pods"].as_array().expect("pods").clone())
        .filter(|p| p["netns_cookie"].as_u64() == Some(netns_cookie))
        .collect::<Vec<_>>();
    (!pods.is_empty()).then(|| {
        pods.iter()
            .flat_map(|p| p["links"].as_array().expect("links").clone())
            .map(|l| l.as_str().expect("hook").to_owned())
            .collect()
    })
}

/// The eBPF object of the redirector binary under test, as its build left it.
pub fn built_object() -> PathBuf {
    let profile_dir = redirector_bin()
        .parent()
        .expect("the binary's directory")
        .to_path_buf();
    std::fs::read_dir(profile_dir.join("build"))
        .expect("the build directory beside the binary")
        .filter_map(Result::ok)
        .filter(|e| e.file_name().to_string_lossy().starts_with("redirector-"))
        .map(|e| e.path().join("out").join("redirector"))
        .filter(|p| p.metadata().is_ok_and(|m| m.len() > 0))
        .max_by_key(|p| p.metadata().and_then(|m| m.modified()).ok())
        .expect("a built eBPF object")
}

/// A copy of the built object with different bytes (one more at the end): a new kernel
/// side to roll a node to, as a rebuilt binary would bring. Removed on drop.
pub struct NextObject {
    pub path: PathBuf,
}

impl NextObject {
    pub fn new() -> Self {
        let path = std::env::temp_dir().join(format!("{}-object", unique_name("next")));
        let mut bytes = std::fs::read(built_object()).expect("reading the built object");
        bytes.push(0);
        std::fs::write(&path, bytes).expect("writing the next object");
        NextObject { path }
    }
}

/// A change to one map's definition in a [`NextObject`].
#[derive(Clone, Copy, Debug)]
pub enum MapChange {
    /// The map holds this many entries at most.
    Capacity(&'static str, u32),
    /// The map's values are this many bytes longer: fields appended, as a later release
    /// adds them (the programs read and write only the fields they know).
    LongerValues(&'static str, u32),
}

impl NextObject {
    /// A copy of the built object whose map definitions differ as `changes` say, so that
    /// an upgrade to it copies those maps' entries (and converts them, for longer values).
    pub fn with_changes(changes: &[MapChange]) -> Self {
        let next = Self::new();
        let mut bytes = std::fs::read(&next.path).expect("reading the next object");
        for change in changes {
            // `struct bpf_map_def`: type, key_size, value_size, max_entries, …
            let (map, field) = match *change {
                MapChange::Capacity(map, _) => (map, 12),
                MapChange::LongerValues(map, _) => (map, 8),
            };
            let at = map_def_offset(&bytes, map)
                .unwrap_or_else(|| panic!("no map {map} in the object"))
                + field;
            let old = u32::from_le_bytes(bytes[at..at + 4].try_into().unwrap());
            let new = match *change {
                MapChange::Capacity(_, entries) => entries,
                MapChange::LongerValues(_, more) => old + more,
            };
            bytes[at..at + 4].copy_from_slice(&new.to_le_bytes());
        }
        std::fs::write(&next.path, bytes).expect("writing the next object");
        next
    }
}

/// The file offset of map `name`'s definition in an eBPF ELF object (aya-ebpf places each
/// `#[map]` as a `bpf_map_def` in the `maps` section, named by a symbol).
fn map_def_offset(elf: &[u8], name: &str) -> Option<usize> {
    let u16_at = |at: usize| u16::from_le_bytes(elf[at..at + 2].try_into().unwrap()) as usize;
    let u32_at = |at: usize| u32::from_le_bytes(elf[at..at + 4].try_into().unwrap()) as usize;
    let u64_at = |at: usize| u64::from_le_bytes(elf[at..at + 8].try_into().unwrap()) as usize;
    let (shoff, shentsize, shnum) = (u64_at(0x28), u16_at(0x3a), u16_at(0x3c));
    let section = |i: usize| shoff + i * shentsize;
    // Section header: sh_type at 4, sh_offset at 0x18, sh_size at 0x20, sh_link at 0x28.
    let symtab = (0..shnum).find(|&i| u32_at(section(i) + 4) == 2)?;
    let (syms, size) = (
        u64_at(section(symtab) + 0x18),
        u64_at(section(symtab) + 0x20),
    );
    let strtab = u64_at(section(u32_at(section(symtab) + 0x28)) + 0x18);
    // Symbol: st_name (4), st_info, st_other, st_shndx (2), st_value (8), st_size (8).
    (0..size / 24).map(|i| syms + i * 24).find_map(|sym| {
        let start = strtab + u32_at(sym);
        let end = start + elf[start..].iter().position(|b| *b == 0)?;
        (&elf[start..end] == name.as_bytes()).then(|| {
            let shndx = u16_at(sym + 6);
            u64_at(section(shndx) + 0x18) + u64_at(sym + 8)
        })
    })
}

impl Default for NextObject {
    fn default() -> Self {
        Self::new()
    }
}

impl Drop for NextObject {
    fn drop(&mut self) {
        if let Err(err) = std::fs::remove_file(&self.path) {
            eprintln!("warning: removing {}: {err}", self.path.display());
        }
    }
}

/// Whether redirector uses the fallback for `feature` (its name as `status` prints it) on
/// this kernel: the kernel lacks it, or `REDIRECTOR_FORCE_FALLBACKS` (inherited by every
/// redirector a test runs) forces it. Asked of `status --json` once per test binary.
pub fn fallback_in_use(feature: &str) -> bool {
    static STATUS: std::sync::OnceLock<serde_json::Value> = std::sync::OnceLock::new();
    let status = STATUS.get_or_init(|| {
        let out = run_ok(Command::new(redirector_bin()).args(["status", "--json"]));
        serde_json::from_slice(&out.stdout).expect("status --json prints JSON")
    });
    let features = status["kernel"]["features"]
        .as_array()
        .unwrap_or_else(|| panic!("kernel features in {status}"));
    let found = features
        .iter()
        .find(|f| f["feature"] == feature)
        .unwrap_or_else(|| panic!("no feature {feature:?} in {status}"));
    !found["fallback"].is_null()
}

/// The name `status` gives sk_lookup's `ingress_ifindex`, without which -c and -k are
/// refused.
pub const INGRESS_IFINDEX: &str = "ingress_ifindex in sk_lookup programs";

/// [`install`] for `args` that give the interface list `flag` (`-c` or `-k`): `true` when
/// installed; where the programs do without `ingress_ifindex`, `false` once the refusal is
/// checked: exit 1, the message naming the flag and the feature, and no link of the pod's
/// left under `root`.
pub fn install_with_interfaces(
    netns: &NetNs,
    cgroup: &Cgroup,
    root: &PinRoot,
    args: &[&str],
    flag: &str,
) -> bool {
    if !fallback_in_use(INGRESS_IFINDEX) {
        install(netns, cgroup, root, args);
        return true;
    }
    let before = pins_under(root.path());
    let out = istio_iptables(netns, cgroup, root, args);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "refused with exit 1:\n{stderr}");
    assert!(
        stderr.contains(&format!("{flag} (")) && stderr.contains("ingress_ifindex"),
        "the refusal names {flag} and ingress_ifindex:\n{stderr}"
    );
    let links = |pins: &[PathBuf]| -> Vec<PathBuf> {
        pins.iter()
            .filter(|p| p.components().any(|c| c.as_os_str() == "links"))
            .cloned()
            .collect()
    };
    assert_eq!(
        links(&pins_under(root.path())),
        links(&before),
        "the refused setup changed no link"
    );
    false
}
