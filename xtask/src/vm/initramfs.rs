//! The guest: an initramfs with busybox, the test binaries, the tools they call with
//! their shared libraries, the kernel modules they need, and `/init`.

use std::{
    collections::{BTreeSet, HashMap},
    fmt::Write as _,
    fs,
    os::unix::fs::symlink,
    path::{Path, PathBuf},
    process::Command,
};

use anyhow::{bail, Context as _, Result};

use super::{debug_dir, kernels::Kernel, qemu::SUITE_TIMEOUT, userland::foreign_userland, vm_dir};
use crate::workspace::{output, status, which, workspace_root};

/// Host tools the tests (and /init) call; copied with their shared libraries.
pub(crate) const TOOLS: &[&str] = &[
    "ip",
    "ss",
    "bpftool",
    "nsenter",
    "unshare",
    "sh",
    "mount",
    "umount",
    "iptables",
    "iptables-restore",
    "iptables-save",
    "ip6tables",
    "ip6tables-restore",
    "ip6tables-save",
    "nft",
];

/// The workspace's binaries the tests run: redirector and the test kit's own.
const GUEST_BINS: [&str; 4] = ["redirector", "probe", "dnsprobe", "standin-ztunnel"];

/// Modules the tests may need; each is loaded with its dependencies when the kernel package
/// has it as a module (built-in or absent ones are skipped).
pub(crate) const MODULES: &[&str] = &[
    "crc32c_generic",
    "veth",
    // sock_diag: how redirector finds a proxy listener that existed before the pod was set
    // up (a real node loads these on demand; the guest has no modprobe).
    "inet_diag",
    "tcp_diag",
    "nf_tables",
    // iptables-nft puts a counter on every rule; a module before 6.0 (Debian 11's 5.10).
    "nft_counter",
    "nft_chain_nat",
    "nft_compat",
    "nft_nat",
    "nft_redir",
    "nft_ct",
    "nft_tproxy",
    "nft_socket",
    "nf_nat",
    "nf_conntrack",
    "xt_owner",
    "xt_REDIRECT",
    "xt_CT",
    "xt_iprange",
    "xt_pkttype",
    "xt_state",
    "xt_tcpudp",
    "xt_multiport",
    "xt_mark",
    "xt_MARK",
    "xt_connmark",
    "xt_CONNMARK",
    "xt_conntrack",
    "xt_comment",
    "xt_TPROXY",
    "xt_socket",
    "xt_addrtype",
    "ip_tables",
    "iptable_nat",
    "iptable_mangle",
    "iptable_raw",
    "ip6_tables",
    "ip6table_nat",
    "ip6table_mangle",
    "ip6table_raw",
];

/// Where a host file goes inside the initramfs staging root.
pub(crate) fn staged(root: &Path, host: &Path) -> PathBuf {
    root.join(host.strip_prefix("/").unwrap_or(host))
}

pub(crate) fn copy_file(from: &Path, to: &Path) -> Result<()> {
    if let Some(parent) = to.parent() {
        fs::create_dir_all(parent)?;
    }
    fs::copy(from, to)
        .with_context(|| format!("copying {} to {}", from.display(), to.display()))?;
    Ok(())
}

/// Shared libraries (and the ELF interpreter) `ldd` names for `bin`; empty when static.
pub(crate) fn shared_libs(bin: &Path) -> Vec<PathBuf> {
    let Ok(out) = Command::new("ldd").arg(bin).output() else {
        return Vec::new();
    };
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter_map(|l| {
            let l = l.trim();
            let path = match l.split_once("=>") {
                Some((_, rest)) => rest.split_whitespace().next()?,
                None => l.split_whitespace().next()?,
            };
            path.starts_with('/').then(|| PathBuf::from(path))
        })
        .collect()
}

/// Copies a host binary to the same path (following symlinks: the target is copied to its
/// real path and the link recreated) plus its shared libraries.
pub(crate) fn add_host_binary(
    root: &Path,
    path: &Path,
    libs: &mut BTreeSet<PathBuf>,
) -> Result<()> {
    let real = fs::canonicalize(path)?;
    let dst = staged(root, &real);
    if !dst.exists() {
        copy_file(&real, &dst)?;
    }
    if real != path {
        let link = staged(root, path);
        if let Some(parent) = link.parent() {
            fs::create_dir_all(parent)?;
        }
        if fs::symlink_metadata(&link).is_err() {
            symlink(&real, &link)?;
        }
    }
    libs.extend(shared_libs(&real));
    Ok(())
}

/// Module name as modules.dep spells it, without directory and `.ko[.xz|.zst]`.
pub(crate) fn module_name(path: &str) -> String {
    let file = path.rsplit('/').next().unwrap_or(path);
    let stem = file.split(".ko").next().unwrap_or(file);
    stem.replace('-', "_")
}

/// All module files under `dir` (recursively), by module name, as paths relative to `base`.
pub(crate) fn index_modules(
    base: &Path,
    dir: &Path,
    out: &mut HashMap<String, String>,
) -> Result<()> {
    for e in fs::read_dir(dir)?.flatten() {
        let path = e.path();
        if e.file_type()?.is_dir() {
            index_modules(base, &path, out)?;
        } else if path.to_string_lossy().contains(".ko") {
            let rel = path.strip_prefix(base)?.to_string_lossy().into_owned();
            out.insert(module_name(&rel), rel);
        }
    }
    Ok(())
}

/// A module's contents, decompressed (`.ko`, `.ko.xz`, `.ko.zst`).
pub(crate) fn read_module(path: &Path) -> Result<Vec<u8>> {
    let s = path.to_string_lossy();
    let tool = if s.ends_with(".xz") {
        "xz"
    } else if s.ends_with(".zst") {
        "zstd"
    } else {
        return fs::read(path).with_context(|| format!("reading {}", path.display()));
    };
    let out = Command::new(tool)
        .arg("-dc")
        .arg(path)
        .output()
        .with_context(|| format!("running {tool}"))?;
    if !out.status.success() {
        bail!("{tool} -dc {} failed", path.display());
    }
    Ok(out.stdout)
}

/// The `depends=` entry of a module's `.modinfo` (what modinfo prints; modules.dep is only
/// made by depmod at install time, so the package does not have it).
pub(crate) fn module_depends(image: &[u8]) -> Vec<String> {
    let key = b"\0depends=";
    let Some(at) = image.windows(key.len()).position(|w| w == key) else {
        return Vec::new();
    };
    let rest = &image[at + key.len()..];
    let end = rest.iter().position(|&b| b == 0).unwrap_or(rest.len());
    String::from_utf8_lossy(&rest[..end])
        .split(',')
        .filter(|s| !s.is_empty())
        .map(|s| s.replace('-', "_"))
        .collect()
}

/// The modules to load, dependencies first: (path relative to `modules_dir`, decompressed
/// contents). Modules the package does not have (built in, or absent) are left out.
pub(crate) fn modules_to_load(modules_dir: &Path) -> Result<Vec<(String, Vec<u8>)>> {
    let mut index = HashMap::new();
    index_modules(modules_dir, &modules_dir.join("kernel"), &mut index)?;
    fn visit(
        name: &str,
        dir: &Path,
        index: &HashMap<String, String>,
        seen: &mut BTreeSet<String>,
        order: &mut Vec<(String, Vec<u8>)>,
    ) -> Result<()> {
        let Some(rel) = index.get(name) else {
            return Ok(());
        };
        if !seen.insert(name.to_string()) {
            return Ok(());
        }
        let image = read_module(&dir.join(rel))?;
        for dep in module_depends(&image) {
            visit(&dep, dir, index, seen, order)?;
        }
        order.push((rel.clone(), image));
        Ok(())
    }
    let mut seen = BTreeSet::new();
    let mut order = Vec::new();
    for m in MODULES {
        visit(m, modules_dir, &index, &mut seen, &mut order)?;
    }
    Ok(order)
}

pub(crate) fn shell_quote(s: &str) -> String {
    format!("'{}'", s.replace('\'', r"'\''"))
}

/// The guest's `/init`: set up the system, run every test binary, print a verdict, power off.
pub(crate) fn init_script(
    modules: &[String],
    tests: &[String],
    filter: &[String],
    debug: &Path,
) -> String {
    let filter: Vec<String> = filter.iter().map(|f| shell_quote(f)).collect();
    let filter = filter.join(" ");
    let mut s = String::from(
        r#"#!/bin/busybox sh
export PATH=/usr/sbin:/usr/bin:/sbin:/bin HOME=/root TERM=dumb
/bin/busybox mount -t proc proc /proc
/bin/busybox mount -t sysfs sysfs /sys
/bin/busybox mount -t devtmpfs devtmpfs /dev
# The initramfs is itself writable; no tmpfs over /tmp, which would hide a checkout that
# lives there (the binaries sit at their host paths).
/bin/busybox mkdir -p /tmp
/bin/busybox mount -t tmpfs tmpfs /run
/bin/busybox mount -t cgroup2 cgroup2 /sys/fs/cgroup
/bin/busybox mount -t bpf bpf /sys/fs/bpf
/bin/busybox mount -t debugfs debugfs /sys/kernel/debug 2>/dev/null
/bin/busybox mkdir -p /run/netns /var/run
echo "vm: init: kernel $(uname -r) up $(cut -d' ' -f1 /proc/uptime)s, $(nproc) cpus"
if grep -q vm.probe=1 /proc/cmdline; then echo "vm: probe ok"; poweroff -f; fi
if [ -w /sys/fs/cgroup/cgroup.subtree_control ]; then
  for c in $(cat /sys/fs/cgroup/cgroup.controllers); do echo "+$c" > /sys/fs/cgroup/cgroup.subtree_control 2>/dev/null; done
fi
"#,
    );
    for m in modules {
        let _ = writeln!(
            s,
            "insmod /lib/modules/vm/{m} || echo \"vm: insmod {m} failed\""
        );
    }
    // The binaries at their host paths: the kit finds the eBPF object beside them.
    let bin = debug.display().to_string();
    s.push_str(
        &r#"ip link set lo up
export REDIRECTOR_BIN=@BIN@/redirector PROBE_BIN=@BIN@/probe DNSPROBE_BIN=@BIN@/dnsprobe
export STANDIN_ZTUNNEL_BIN=@BIN@/standin-ztunnel
export ISTIO_GOLDEN_DIR=/istio-golden RUST_BACKTRACE=1
cd /tmp
failed=
# Every process with where it waits in the kernel, for a suite that ran out of time.
processes() {
  for p in /proc/[0-9]*; do
    echo "  ${p#/proc/} $(cat $p/comm 2>/dev/null) wchan=$(cat $p/wchan 2>/dev/null) $(tr '\0' ' ' <$p/cmdline 2>/dev/null | head -c 200)"
  done
}
"#
        .replace("@BIN@", &bin),
    );
    // The fallbacks forced on the host are forced in the guest.
    if let Some(forced) = crate::run::forced_fallbacks() {
        let _ = writeln!(
            s,
            "export {}={}",
            crate::run::FORCE_FALLBACKS_ENV,
            shell_quote(&forced)
        );
    }
    for t in tests {
        let _ = writeln!(
            s,
            r#"echo "vm: BEGIN {t}"
/tests/{t} --test-threads=1 {filter} &
pid=$!
( sleep {limit}; echo "vm: TIMEOUT {t} after {limit}s; the guest's processes:"; processes; kill -9 $pid ) &
watchdog=$!
wait $pid
rc=$?
kill $watchdog 2>/dev/null
echo "vm: END {t} rc=$rc"
[ $rc -eq 0 ] || failed="$failed {t}""#,
            limit = SUITE_TIMEOUT.as_secs()
        );
    }
    s.push_str(
        r#"if [ -z "$failed" ]; then echo "vm: PASS"; else echo "vm: FAIL (failed:$failed)"; fi
sync
poweroff -f
"#,
    );
    s
}

/// The host's own busybox and tools, with their shared libraries (collected in `libs`),
/// for a guest of the host's architecture.
fn host_userland(root: &Path, libs: &mut BTreeSet<PathBuf>) -> Result<()> {
    let busybox = which("busybox").context("busybox not found (apt-get install busybox-static)")?;
    copy_file(&busybox, &root.join("bin/busybox"))?;
    libs.extend(shared_libs(&busybox));
    // Host tools before busybox's applets, so they win over applets of the same name.
    let mut missing = Vec::new();
    for tool in TOOLS {
        match which(tool) {
            Some(path) => add_host_binary(root, &path, libs)?,
            None => missing.push(*tool),
        }
    }
    if !missing.is_empty() {
        eprintln!("xtask vm: not on this host, so not in the guest: {missing:?}");
    }
    // iptables' extensions are dlopen()ed: ldd does not see them.
    for dir in ["/usr/lib/x86_64-linux-gnu/xtables", "/usr/lib/xtables"] {
        if let Ok(entries) = fs::read_dir(dir) {
            for e in entries.flatten() {
                add_host_binary(root, &e.path(), libs)?;
            }
        }
    }
    Ok(())
}

/// Stages the initramfs tree for one kernel and packs it; returns the `.cpio.gz` path.
pub(crate) fn build_initramfs(
    name: &str,
    kernel: &Kernel,
    tests: &[(String, PathBuf)],
    filter: &[String],
) -> Result<PathBuf> {
    let dir = vm_dir().join("initramfs").join(name);
    let root = dir.join("root");
    if root.exists() {
        fs::remove_dir_all(&root)?;
    }
    for d in [
        "bin", "sbin", "dev", "proc", "sys", "tmp", "run", "root", "etc", "tests", "var",
    ] {
        fs::create_dir_all(root.join(d))?;
    }
    let arch = kernel.arch;
    let mut libs = BTreeSet::new();
    if arch.is_host() {
        host_userland(&root, &mut libs)?;
    } else {
        let userland = foreign_userland(arch)?;
        status({
            let mut c = Command::new("cp");
            c.arg("-a").arg(userland.join(".")).arg(&root);
            c
        })?;
    }
    // busybox's applets, only where nothing else lives.
    let applets = output({
        let mut c = arch.run(&root.join("bin/busybox"))?;
        c.arg("--list");
        c
    })?;
    for applet in applets.lines().map(str::trim).filter(|a| !a.is_empty()) {
        let in_bin = root.join("bin").join(applet);
        let exists = ["bin", "sbin", "usr/bin", "usr/sbin"]
            .iter()
            .any(|d| fs::symlink_metadata(root.join(d).join(applet)).is_ok());
        if !exists {
            symlink("busybox", &in_bin)?;
        }
    }
    // Workspace binaries (stripped of debug info: the debug builds are ~100 MB each).
    let debug = debug_dir(arch);
    let mut add_stripped = |from: &Path, to: &Path| -> Result<()> {
        copy_file(from, to)?;
        let _ = Command::new(arch.binutil("strip"))
            .arg("--strip-debug")
            .arg(to)
            .status();
        libs.extend(shared_libs(from));
        Ok(())
    };
    for bin in GUEST_BINS {
        add_stripped(&debug.join(bin), &root.join("bin").join(bin))?;
    }
    // The test binaries also have these paths compiled in (CARGO_BIN_EXE_*): same place.
    let guest_debug = staged(&root, &debug);
    fs::create_dir_all(&guest_debug)?;
    for bin in GUEST_BINS {
        symlink(Path::new("/bin").join(bin), guest_debug.join(bin))?;
    }
    // The eBPF object as the build left it (the kit reads `<profile>/build/redirector-*/out`).
    let object = fs::read_dir(debug.join("build"))?
        .filter_map(Result::ok)
        .filter(|e| e.file_name().to_string_lossy().starts_with("redirector-"))
        .map(|e| e.path().join("out").join("redirector"))
        .filter(|p| p.metadata().is_ok_and(|m| m.len() > 0))
        .max_by_key(|p| p.metadata().and_then(|m| m.modified()).ok());
    if let Some(object) = object {
        copy_file(&object, &staged(&root, &object))?;
    }
    let mut test_names = Vec::new();
    for (name, exe) in tests {
        add_stripped(exe, &root.join("tests").join(name))?;
        test_names.push(name.clone());
    }
    test_names.sort();
    // Shared libraries, at the paths ldd named (the loader looks there).
    for lib in &libs {
        let real = fs::canonicalize(lib).unwrap_or_else(|_| lib.clone());
        let dst = staged(&root, lib);
        if fs::symlink_metadata(&dst).is_err() {
            copy_file(&real, &dst)?;
        }
    }
    // Users and groups the tests run as (uid 1337 etc.), protocol names for iptables.
    // /etc/hosts and nsswitch.conf for getaddrinfo; resolv.conf must exist (tests bind-mount
    // over it).
    for f in [
        "/etc/passwd",
        "/etc/group",
        "/etc/protocols",
        "/etc/services",
        "/etc/hosts",
        "/etc/nsswitch.conf",
    ] {
        if Path::new(f).exists() {
            copy_file(Path::new(f), &staged(&root, Path::new(f)))?;
        }
    }
    // The host's nameservers: redirector plans DNS capture from the pod's resolv.conf.
    let resolv = fs::read_to_string("/etc/resolv.conf")
        .ok()
        .filter(|r| r.lines().any(|l| l.trim_start().starts_with("nameserver")))
        .unwrap_or_else(|| "nameserver 10.0.2.3\n".into());
    fs::write(root.join("etc/resolv.conf"), resolv)?;
    // glibc dlopen()s its NSS modules: ldd does not see them (a foreign userland has
    // its own, from its libc6).
    let nss_dirs: &[&str] = if arch.is_host() {
        &["/lib/x86_64-linux-gnu", "/usr/lib/x86_64-linux-gnu"]
    } else {
        &[]
    };
    for dir in nss_dirs {
        for e in fs::read_dir(dir).into_iter().flatten().flatten() {
            let n = e.file_name().to_string_lossy().into_owned();
            if n.starts_with("libnss_files")
                || n.starts_with("libnss_dns")
                || n.starts_with("libresolv")
            {
                let real = fs::canonicalize(e.path())?;
                let dst = staged(&root, &e.path());
                if fs::symlink_metadata(&dst).is_err() {
                    copy_file(&real, &dst)?;
                }
            }
        }
    }
    let golden = workspace_root().join("tests/istio-golden");
    if golden.is_dir() {
        status({
            let mut c = Command::new("cp");
            c.arg("-r").arg(&golden).arg(root.join("istio-golden"));
            c
        })?;
    }
    // Kernel modules, decompressed on the host (busybox insmod may not read .xz).
    let mut modules = Vec::new();
    if let Some(mdir) = &kernel.modules {
        for (rel, image) in modules_to_load(mdir)? {
            let plain = rel
                .strip_suffix(".xz")
                .or_else(|| rel.strip_suffix(".zst"))
                .unwrap_or(&rel)
                .to_string();
            let dst = root.join("lib/modules/vm").join(&plain);
            fs::create_dir_all(dst.parent().context("module path")?)?;
            fs::write(&dst, image)?;
            modules.push(plain);
        }
    }
    let init = root.join("init");
    fs::write(&init, init_script(&modules, &test_names, filter, &debug))?;
    status({
        let mut c = Command::new("chmod");
        c.arg("755").arg(&init);
        c
    })?;
    let image = dir.join("initramfs.cpio.gz");
    status({
        let mut c = Command::new("sh");
        c.arg("-c")
            .arg(format!(
                "find . -print0 | cpio --null -o -H newc --quiet | gzip -1 > {}",
                shell_quote(&image.display().to_string())
            ))
            .current_dir(&root);
        c
    })?;
    Ok(image)
}
