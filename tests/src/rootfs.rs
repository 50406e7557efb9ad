//! A container root filesystem made from host files, since no image can be pulled here:
//! busybox-static with its applet links, plus the workspace's binaries. The tests'
//! containerd imports it as an image ([`crate::cri`]).
//!
//! The workspace binaries are dynamically linked. Their shared libraries (the `ldd` closure:
//! the ELF interpreter, libc, libgcc_s) are copied to the same paths inside the root, rather
//! than bind-mounting the host's /lib, /lib64 and /usr/lib: a copied closure is exactly what
//! the binaries need and nothing else of the host, it does not depend on the host's
//! merged-/usr symlinks (/lib → usr/lib, which a bind mount would resolve on the host side),
//! and every container gets it without extra mounts — as from a real image.

use std::fs;
use std::path::{Path, PathBuf};
use std::process::Command;

/// A root filesystem directory.
#[derive(Debug)]
pub struct Rootfs {
    path: PathBuf,
}

impl Rootfs {
    /// Busybox (from the host's `busybox`, normally busybox-static) at /bin/busybox with a
    /// link per applet, and empty mount points for the runtime.
    pub fn busybox(path: &Path) -> Self {
        let rootfs = Rootfs {
            path: path.to_path_buf(),
        };
        for dir in ["bin", "dev", "etc", "proc", "sys", "tmp", "usr/local/bin"] {
            mkdir(&rootfs.path.join(dir));
        }
        let busybox = which("busybox");
        rootfs.add_binary(&busybox, "/bin/busybox");
        let list = Command::new(&busybox)
            .arg("--list")
            .output()
            .unwrap_or_else(|e| panic!("running busybox --list: {e}"));
        for applet in String::from_utf8_lossy(&list.stdout).lines().map(str::trim) {
            // The list may name busybox itself, which must stay the binary.
            if applet.is_empty() || applet == "busybox" || applet.contains('/') {
                continue;
            }
            let link = rootfs.path.join("bin").join(applet);
            if !link.exists() {
                std::os::unix::fs::symlink("busybox", &link)
                    .unwrap_or_else(|e| panic!("symlink {}: {e}", link.display()));
            }
        }
        rootfs
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Copies `host` to `inside` (an absolute path in the root), with the shared libraries
    /// it needs. The name inside is what the program sees as argv[0]'s file name.
    pub fn add_binary(&self, host: &Path, inside: &str) {
        copy(host, &self.inside(inside));
        for lib in shared_libraries(host) {
            let dest = self.inside(&lib.to_string_lossy());
            if !dest.exists() {
                copy(&lib, &dest);
            }
        }
    }

    /// The host path of `inside` (an absolute path in the root).
    fn inside(&self, inside: &str) -> PathBuf {
        self.path.join(inside.trim_start_matches('/'))
    }
}

/// The absolute paths `ldd` resolves for `binary` (none for a static binary).
fn shared_libraries(binary: &Path) -> Vec<PathBuf> {
    let out = Command::new("ldd")
        .arg(binary)
        .output()
        .unwrap_or_else(|e| panic!("running ldd {}: {e}", binary.display()));
    // ldd exits 1 with "not a dynamic executable" for static binaries.
    if !out.status.success() {
        return Vec::new();
    }
    parse_ldd(&String::from_utf8_lossy(&out.stdout))
}

/// Lines are `name => /path (0x…)`, `/path (0x…)` (the interpreter) or `linux-vdso.so.1
/// (0x…)` (no file).
fn parse_ldd(output: &str) -> Vec<PathBuf> {
    output
        .lines()
        .filter_map(|line| {
            let target = line.split_once("=>").map_or(line, |(_, t)| t).trim();
            let path = target.split_whitespace().next()?;
            path.starts_with('/').then(|| PathBuf::from(path))
        })
        .collect()
}

fn which(name: &str) -> PathBuf {
    let path = std::env::var_os("PATH").unwrap_or_default();
    std::env::split_paths(&path)
        .chain([PathBuf::from("/bin"), PathBuf::from("/usr/bin")])
        .map(|dir| dir.join(name))
        .find(|p| p.is_file())
        .unwrap_or_else(|| panic!("`{name}` not found: apt-get install busybox-static"))
}

fn mkdir(path: &Path) {
    fs::create_dir_all(path).unwrap_or_else(|e| panic!("mkdir {}: {e}", path.display()));
}

/// Copies the file's content (following symlinks) and its mode.
fn copy(from: &Path, to: &Path) {
    if let Some(parent) = to.parent() {
        mkdir(parent);
    }
    fs::copy(from, to)
        .unwrap_or_else(|e| panic!("copy {} to {}: {e}", from.display(), to.display()));
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_ldd_output() {
        let out = "\
\tlinux-vdso.so.1 (0x00007ffd)
\tlibgcc_s.so.1 => /lib/x86_64-linux-gnu/libgcc_s.so.1 (0x00007f83)
\tlibc.so.6 => /lib/x86_64-linux-gnu/libc.so.6 (0x00007f83)
\t/lib64/ld-linux-x86-64.so.2 (0x00007f83)
";
        assert_eq!(
            parse_ldd(out),
            [
                "/lib/x86_64-linux-gnu/libgcc_s.so.1",
                "/lib/x86_64-linux-gnu/libc.so.6",
                "/lib64/ld-linux-x86-64.so.2"
            ]
            .map(PathBuf::from)
        );
    }
}
