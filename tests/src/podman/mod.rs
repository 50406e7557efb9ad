//! A private podman for one test: its own configuration, storage, state and OCI runtime
//! state, all in one directory (`$TMPDIR/rdt-<pid>-<n>-<hint>`) that is removed on drop.
//!
//! Settings measured to work here (podman 4.3, root, hybrid cgroup layout, no systemd):
//! runc (crun refuses the hybrid layout), cgroupfs, the CNI backend, ulimits below the hard
//! limits (root lacks CAP_SYS_RESOURCE), and the vfs storage driver: containers use a local
//! root filesystem (`--rootfs`), so storage only holds the pause image podman builds for a
//! pod's infra container, and vfs needs no mounts and works on any filesystem. The runtime is
//! a wrapper that gives runc a `--root` inside the directory, so /run/runc is never used, and
//! `tmp_dir` keeps podman's own state out of /run/libpod.

pub mod cgroup;
pub mod host;
pub mod net;
pub mod pod;
pub mod rootfs;

use std::fs;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};

use crate::podman::cgroup::CgroupParent;
use crate::podman::host::RemoveIfCreated;
use crate::stale::is_stale;
use crate::unique_name;

/// c/image writes its blob-info cache here when podman builds the pause image (root's fixed
/// path, no setting moves it).
const IMAGE_CACHE_DIR: &str = "/var/lib/containers";
/// Present in an installation's directory when [`IMAGE_CACHE_DIR`] did not exist before it,
/// so that the cleanup of a killed test's leftovers knows to remove it too.
const IMAGE_CACHE_MARKER: &str = "image-cache-created-here";

/// A podman installation of the test's own, and the cgroup parent its pods live under.
/// Drop removes every pod and container in it, then the directory, then the cgroups.
#[derive(Debug)]
pub struct Podman {
    dir: PathBuf,
    cgroup_parent: CgroupParent,
    image_cache: RemoveIfCreated,
    /// podman's own `libpod_parent` (where it puts conmon), in the hierarchies where it did
    /// not exist before: removed on drop.
    libpod_parent: Vec<PathBuf>,
}

impl Podman {
    pub fn new(hint: &str) -> Self {
        require_binary("podman");
        let name = unique_name(hint);
        let dir = std::env::temp_dir().join(&name);
        let podman = Podman {
            cgroup_parent: CgroupParent::new(&name),
            image_cache: RemoveIfCreated::new(IMAGE_CACHE_DIR, &["cache"]),
            libpod_parent: CgroupParent::new(LIBPOD_PARENT)
                .dirs()
                .into_iter()
                .filter(|d| !d.exists())
                .collect(),
            dir,
        };
        for sub in ["cni", "storage", "run", "tmp", "runc"] {
            fs::create_dir_all(podman.dir.join(sub))
                .unwrap_or_else(|e| panic!("cannot create {}: {e}", podman.dir.display()));
        }
        podman.write_config();
        if !podman.image_cache.existed() {
            write(&podman.dir.join(IMAGE_CACHE_MARKER), "");
        }
        podman
    }

    fn write_config(&self) {
        let path = |sub: &str| toml_string(&self.dir.join(sub));
        let runc = require_binary("runc");
        let wrapper = self.dir.join("runc-wrapper");
        write(
            &wrapper,
            &format!(
                "#!/bin/sh\nexec {} --root {} \"$@\"\n",
                shell_quote(&runc),
                shell_quote(&self.dir.join("runc"))
            ),
        );
        fs::set_permissions(&wrapper, fs::Permissions::from_mode(0o755))
            .unwrap_or_else(|e| panic!("chmod {}: {e}", wrapper.display()));
        write(
            &self.containers_conf(),
            &format!(
                r#"[containers]
default_ulimits = ["nofile=20000:20000", "nproc=32768:32768"]

[network]
network_backend = "cni"
cni_plugin_dirs = [{cni_own}, "/usr/lib/cni"]
network_config_dir = {cni_own}

[engine]
cgroup_manager = "cgroupfs"
runtime = "runc"
tmp_dir = {tmp}
events_logger = "file"

[engine.runtimes]
runc = [{wrapper}]
"#,
                cni_own = path("cni"),
                tmp = path("tmp"),
                wrapper = toml_string(&wrapper),
            ),
        );
        write(
            &self.storage_conf(),
            &format!(
                "[storage]\ndriver = \"vfs\"\ngraphroot = {}\nrunroot = {}\n",
                path("storage"),
                path("run")
            ),
        );
    }

    fn containers_conf(&self) -> PathBuf {
        self.dir.join("containers.conf")
    }

    fn storage_conf(&self) -> PathBuf {
        self.dir.join("storage.conf")
    }

    /// The test directory: put files containers need (root filesystems, logs) here.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    pub fn cgroup_parent(&self) -> &CgroupParent {
        &self.cgroup_parent
    }

    /// `podman <args>` with this installation's configuration.
    pub fn command<S: AsRef<std::ffi::OsStr>>(&self, args: &[S]) -> Command {
        let mut cmd = Command::new("podman");
        cmd.env("CONTAINERS_CONF", self.containers_conf())
            .env("CONTAINERS_STORAGE_CONF", self.storage_conf())
            .args(args)
            .stdin(Stdio::null());
        cmd
    }

    /// Runs `podman <args>` and returns its output, whatever the exit status.
    pub fn try_run<S: AsRef<std::ffi::OsStr>>(&self, args: &[S]) -> Output {
        self.command(args)
            .output()
            .unwrap_or_else(|e| panic!("cannot run podman: {e}"))
    }

    /// Runs `podman <args>`, returns its trimmed stdout; panics with stderr on failure.
    pub fn run<S: AsRef<std::ffi::OsStr>>(&self, args: &[S]) -> String {
        let out = self.try_run(args);
        let shown: Vec<_> = args.iter().map(|a| a.as_ref().to_string_lossy()).collect();
        assert!(
            out.status.success(),
            "`podman {}` failed ({}): {}",
            shown.join(" "),
            out.status,
            String::from_utf8_lossy(&out.stderr).trim()
        );
        String::from_utf8_lossy(&out.stdout).trim().to_owned()
    }

    /// Processes that belong to this installation: their command line names its directory
    /// (conmon, `podman container cleanup`, runc).
    pub fn processes(&self) -> Vec<String> {
        processes_mentioning(&self.dir)
    }

    /// Mount points under the directory.
    pub fn mounts(&self) -> Vec<PathBuf> {
        mounts_under(&self.dir)
    }

    /// Removes what tests killed before their guards ran left behind: the directories of
    /// dead test processes (`rdt-<pid>-…` with no such pid), after removing their pods with
    /// their own configuration. Returns what it removed. Cgroup parents carry the same name
    /// and are removed too.
    pub fn remove_stale() -> Vec<String> {
        let mut removed = Vec::new();
        let Ok(entries) = fs::read_dir(std::env::temp_dir()) else {
            return removed;
        };
        for entry in entries.flatten() {
            let Ok(name) = entry.file_name().into_string() else {
                continue;
            };
            let path = entry.path();
            if is_stale(&name) && path.join("containers.conf").is_file() {
                // Adopt it: the same layout as `new`, so Drop cleans it like any other.
                let created_cache = path.join(IMAGE_CACHE_MARKER).exists();
                drop(Podman {
                    cgroup_parent: CgroupParent::new(&name),
                    image_cache: RemoveIfCreated::adopt(
                        IMAGE_CACHE_DIR,
                        &["cache"],
                        !created_cache,
                    ),
                    // Whether podman's own parent predates that run is not known: kept.
                    libpod_parent: Vec::new(),
                    dir: path.clone(),
                });
                removed.push(path.display().to_string());
            }
        }
        removed
    }
}

impl Drop for Podman {
    fn drop(&mut self) {
        // Never panic here. Everything in this storage is ours; -t 0: SIGKILL at once (a
        // container's pid 1 ignores SIGTERM without a handler, podman would wait 10 s).
        let everything: [&[&str]; 2] = [
            &["pod", "rm", "-a", "-f", "-t", "0"],
            &["rm", "-a", "-f", "-t", "0"],
        ];
        for args in everything {
            match self.command(args).output() {
                Ok(out) if out.status.success() => {}
                Ok(out) => eprintln!(
                    "warning: podman {}: {}",
                    args.join(" "),
                    String::from_utf8_lossy(&out.stderr).trim()
                ),
                Err(e) => eprintln!("warning: cannot run podman: {e}"),
            }
        }
        for mount in self.mounts().iter().rev() {
            let Ok(c) = std::ffi::CString::new(mount.as_os_str().as_encoded_bytes()) else {
                continue;
            };
            // SAFETY: a NUL-terminated path; MNT_DETACH never blocks.
            if unsafe { libc::umount2(c.as_ptr(), libc::MNT_DETACH) } != 0 {
                eprintln!(
                    "warning: umount {}: {}",
                    mount.display(),
                    std::io::Error::last_os_error()
                );
            }
        }
        // remove_dir_all does not cross into mounts it cannot see as such: refuse outright
        // while anything is still mounted below.
        if !self.mounts().is_empty() {
            eprintln!("warning: leaving {}: still mounted", self.dir.display());
        } else if let Err(e) = fs::remove_dir_all(&self.dir) {
            eprintln!("warning: cannot remove {}: {e}", self.dir.display());
        }
        for dir in &self.libpod_parent {
            if let Err(e) = cgroup::rmdir_tree(dir) {
                eprintln!("warning: cannot remove {}: {e}", dir.display());
            }
        }
    }
}

/// The cgroup podman creates for its conmon processes, in every hierarchy.
const LIBPOD_PARENT: &str = "libpod_parent";

/// Absolute path of `name` on PATH (or in /usr/sbin, /sbin); panics naming the package.
fn require_binary(name: &str) -> PathBuf {
    let path = std::env::var_os("PATH").unwrap_or_default();
    std::env::split_paths(&path)
        .chain(["/usr/sbin", "/sbin", "/usr/bin"].map(PathBuf::from))
        .map(|dir| dir.join(name))
        .find(|p| p.is_file())
        .unwrap_or_else(|| {
            panic!(
                "`{name}` not found: `cargo xtask bootstrap` installs it (Debian package {name})"
            )
        })
}

fn write(path: &Path, text: &str) {
    fs::write(path, text).unwrap_or_else(|e| panic!("cannot write {}: {e}", path.display()));
}

/// A TOML basic string.
fn toml_string(path: &Path) -> String {
    let text = path.to_string_lossy();
    format!("\"{}\"", text.replace('\\', "\\\\").replace('"', "\\\""))
}

fn shell_quote(path: &Path) -> String {
    format!("'{}'", path.to_string_lossy().replace('\'', "'\\''"))
}

/// Mount points at or below `dir` (from /proc/self/mountinfo), parents before children.
pub fn mounts_under(dir: &Path) -> Vec<PathBuf> {
    let info = fs::read_to_string("/proc/self/mountinfo").unwrap_or_default();
    let mut mounts: Vec<PathBuf> = info
        .lines()
        .filter_map(|line| line.split(' ').nth(4).map(PathBuf::from))
        .filter(|mount| mount.starts_with(dir))
        .collect();
    mounts.sort();
    mounts.dedup();
    mounts
}

/// `pid: cmdline` of every process whose command line contains `needle`.
pub fn processes_mentioning(needle: &Path) -> Vec<String> {
    let needle = needle.to_string_lossy().into_owned();
    let me = std::process::id().to_string();
    let mut found = Vec::new();
    for entry in fs::read_dir("/proc").into_iter().flatten().flatten() {
        let pid = entry.file_name().to_string_lossy().into_owned();
        if !pid.bytes().all(|b| b.is_ascii_digit()) || pid == me {
            continue;
        }
        let Ok(raw) = fs::read(entry.path().join("cmdline")) else {
            continue;
        };
        let cmdline = String::from_utf8_lossy(&raw).replace('\0', " ");
        if cmdline.contains(&needle) {
            found.push(format!("{pid}: {}", cmdline.trim()));
        }
    }
    found
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::stale::is_alive;

    #[test]
    fn stale_only_for_kit_names_with_a_dead_owner() {
        assert!(!is_stale(&format!("rdt-{}-0-podman", std::process::id())));
        assert!(!is_stale("podman"));
        assert!(!is_stale("rdt-x-0-podman"));
        assert!(is_alive(std::process::id()));
    }

    #[test]
    fn quoting() {
        assert_eq!(toml_string(Path::new("/tmp/a\"b")), r#""/tmp/a\"b""#);
        assert_eq!(shell_quote(Path::new("/tmp/it's")), r"'/tmp/it'\''s'");
    }
}
