//! The kernels to boot: Debian's packages, fetched without installing, or a path.

use std::{
    fs,
    path::{Path, PathBuf},
    process::Command,
};

use anyhow::{bail, Context as _, Result};

use super::vm_dir;
use crate::workspace::{output, status};

/// Kernel specs `--kernel all` expands to.
pub(crate) const ALL: [&str; 4] = ["6.1", "6.1-cloud", "6.12", "6.12-rt"];

/// A kernel to boot.
pub(crate) struct Kernel {
    pub(crate) label: String,
    pub(crate) image: PathBuf,
    /// `lib/modules/<version>` of the package, when there is one.
    pub(crate) modules: Option<PathBuf>,
}

/// Where a kernel package comes from: the machine's own apt sources, or another Debian
/// suite read through a private apt configuration under `target/vm/apt/<suite>` (for a
/// kernel older than the supported minimum, to see it refused).
#[derive(Clone, Copy)]
pub(crate) enum Source {
    System,
    Suite(&'static str),
}

impl Source {
    /// `apt-get`/`apt-cache` with this source's options.
    fn command(self, program: &str) -> Result<Command> {
        let mut cmd = Command::new(program);
        if let Source::Suite(suite) = self {
            let dir = vm_dir().join("apt").join(suite);
            let list = dir.join("sources.list");
            if !list.exists() {
                for sub in ["lists/partial", "cache/archives/partial"] {
                    fs::create_dir_all(dir.join(sub))?;
                }
                fs::write(
                    &list,
                    format!("deb http://deb.debian.org/debian {suite} main\n"),
                )?;
            }
            cmd.arg("-o")
                .arg(format!("Dir::Etc::SourceList={}", list.display()))
                .args(["-o", "Dir::Etc::SourceParts=/nonexistent"])
                .arg("-o")
                .arg(format!("Dir::State::Lists={}", dir.join("lists").display()))
                .arg("-o")
                .arg(format!("Dir::Cache={}", dir.join("cache").display()));
        }
        Ok(cmd)
    }
}

/// Numeric parts of a package name, for "newest" ordering.
pub(crate) fn version_key(name: &str) -> Vec<u64> {
    name.split(|c: char| !c.is_ascii_digit())
        .filter(|s| !s.is_empty())
        .filter_map(|s| s.parse().ok())
        .collect()
}

/// The newest package whose name matches the anchored `regex` (apt-cache's ERE).
pub(crate) fn newest_package(regex: &str, source: Source) -> Result<String> {
    let search = || -> Result<Vec<String>> {
        let mut cmd = source.command("apt-cache")?;
        cmd.args(["search", "--names-only", regex]);
        Ok(output(cmd)?
            .lines()
            .filter_map(|l| l.split(" - ").next())
            .map(|s| s.trim().to_string())
            .filter(|s| !s.is_empty())
            .collect())
    };
    let mut names = search()?;
    if names.is_empty() {
        let mut cmd = source.command("apt-get")?;
        cmd.args(["update", "-qq"]);
        status(cmd)?;
        names = search()?;
    }
    names
        .into_iter()
        .max_by_key(|n| version_key(n))
        .with_context(|| format!("no Debian package matches {regex}"))
}

pub(crate) fn resolve(spec: &str) -> Result<Vec<Kernel>> {
    let mut source = Source::System;
    let regex = match spec {
        "all" => {
            let mut out = Vec::new();
            for s in ALL {
                out.extend(resolve(s)?);
            }
            return Ok(out);
        }
        "5.10" => {
            source = Source::Suite("bullseye");
            r"^linux-image-5\.10\.0-[0-9]+-amd64$"
        }
        "6.1" => r"^linux-image-6\.1\.0-[0-9]+-amd64$",
        "6.1-cloud" => r"^linux-image-6\.1\.0-[0-9]+-cloud-amd64$",
        "6.12" => r"^linux-image-6\.12\.[0-9]+\+deb12-amd64$",
        "6.12-cloud" => r"^linux-image-6\.12\.[0-9]+\+deb12-cloud-amd64$",
        "6.12-rt" => r"^linux-image-6\.12\.[0-9]+\+deb12-rt-amd64$",
        path if Path::new(path).is_file() => {
            let image = fs::canonicalize(path)?;
            return Ok(vec![Kernel {
                label: image.display().to_string(),
                image,
                modules: None,
            }]);
        }
        other => bail!(
            "unknown kernel `{other}`: use 6.1, 6.1-cloud, 6.12, 6.12-cloud, 6.12-rt, all, 5.10 \
             (Debian 11's, older than the minimum: redirector must refuse it), or the path of a \
             bzImage/vmlinux"
        ),
    };
    let pkg = newest_package(regex, source)?;
    let root = fetch_kernel(&pkg, source)?;
    let boot = root.join("boot");
    let image = fs::read_dir(&boot)
        .with_context(|| format!("reading {}", boot.display()))?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .find(|p| {
            p.file_name()
                .is_some_and(|n| n.to_string_lossy().starts_with("vmlinuz-"))
        })
        .with_context(|| format!("no vmlinuz-* in {}", boot.display()))?;
    let modules = fs::read_dir(root.join("lib/modules"))
        .ok()
        .and_then(|mut d| d.next())
        .and_then(|e| e.ok())
        .map(|e| e.path());
    Ok(vec![Kernel {
        label: format!("{spec} ({pkg})"),
        image,
        modules,
    }])
}

/// `apt-get download` + `dpkg -x` into `target/vm/kernels/<pkg>/root`, once.
pub(crate) fn fetch_kernel(pkg: &str, source: Source) -> Result<PathBuf> {
    let dir = vm_dir().join("kernels").join(pkg);
    let root = dir.join("root");
    let done = dir.join(".extracted");
    if done.exists() {
        return Ok(root);
    }
    fs::create_dir_all(&dir)?;
    eprintln!("xtask vm: fetching {pkg}");
    let mut dl = source.command("apt-get")?;
    dl.args(["download", "-qq", pkg]).current_dir(&dir);
    status(dl)?;
    let deb = fs::read_dir(&dir)?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .find(|p| p.extension().is_some_and(|e| e == "deb"))
        .with_context(|| format!("apt-get download {pkg} left no .deb in {}", dir.display()))?;
    let mut x = Command::new("dpkg");
    x.arg("-x").arg(&deb).arg(&root);
    status(x)?;
    fs::remove_file(&deb)?;
    fs::write(&done, "")?;
    Ok(root)
}
