//! The kernels to boot: Debian's packages, fetched without installing, or a path.

use std::{
    fs,
    path::{Path, PathBuf},
    process::Command,
};

use anyhow::{bail, Context as _, Result};

use super::vm_dir;
use crate::arch::Arch;
use crate::workspace::{output, status};

/// Kernel specs `--kernel all` expands to.
pub(crate) const ALL: [&str; 4] = ["6.1", "6.1-cloud", "6.12", "6.12-rt"];

/// A kernel to boot.
pub(crate) struct Kernel {
    pub(crate) label: String,
    pub(crate) image: PathBuf,
    /// `lib/modules/<version>` of the package, when there is one.
    pub(crate) modules: Option<PathBuf>,
    pub(crate) arch: Arch,
}

/// Where Debian packages come from: the machine's own apt sources (for its own
/// architecture), or a private apt configuration under `target/vm/apt/<suite>-<arch>` —
/// another Debian suite (Debian 11's 5.10, where the programs run on their fallbacks), or
/// another architecture's packages (the guest's kernel and userland).
#[derive(Clone, Copy)]
pub(crate) struct Source {
    /// A suite other than the machine's (bookworm, with its updates and security suites).
    pub(crate) suite: Option<&'static str>,
    pub(crate) arch: Arch,
}

impl Source {
    pub(crate) fn system(arch: Arch) -> Self {
        Source { suite: None, arch }
    }

    /// `apt-get`/`apt-cache` with this source's options.
    pub(crate) fn command(self, program: &str) -> Result<Command> {
        let mut cmd = Command::new(program);
        if self.suite.is_none() && self.arch.is_host() {
            return Ok(cmd);
        }
        let arch = self.arch.name();
        let dir = vm_dir()
            .join("apt")
            .join(format!("{}-{arch}", self.suite.unwrap_or("bookworm")));
        let list = dir.join("sources.list");
        if !list.exists() {
            for sub in ["lists/partial", "cache/archives/partial"] {
                fs::create_dir_all(dir.join(sub))?;
            }
            let lines = match self.suite {
                Some(suite) => format!("deb [arch={arch}] http://deb.debian.org/debian {suite} main\n"),
                None => format!(
                    "deb [arch={arch}] http://deb.debian.org/debian bookworm main\n\
                     deb [arch={arch}] http://deb.debian.org/debian bookworm-updates main\n\
                     deb [arch={arch}] http://deb.debian.org/debian-security bookworm-security main\n"
                ),
            };
            fs::write(&list, lines)?;
        }
        cmd.arg("-o")
            .arg(format!("Dir::Etc::SourceList={}", list.display()))
            .args(["-o", "Dir::Etc::SourceParts=/nonexistent"])
            .arg("-o")
            .arg(format!("Dir::State::Lists={}", dir.join("lists").display()))
            .arg("-o")
            .arg(format!("Dir::Cache={}", dir.join("cache").display()))
            // Downloads land in our directories, which apt's own `_apt` user cannot write.
            .args(["-o", "APT::Sandbox::User=root"])
            .arg("-o")
            .arg(format!("APT::Architecture={arch}"))
            .arg("-o")
            .arg(format!("APT::Architectures={arch}"));
        Ok(cmd)
    }

    /// Runs `apt-cache`/`apt-get` with `args`, updating this source's lists first when
    /// `empty` says the answer is empty (a private source starts with none).
    pub(crate) fn query(
        self,
        program: &str,
        args: &[&str],
        empty: impl Fn(&str) -> bool,
    ) -> Result<String> {
        let run = || -> Result<String> {
            let mut cmd = self.command(program)?;
            cmd.args(args);
            output(cmd)
        };
        let first = run();
        if first.as_ref().is_ok_and(|out| !empty(out)) {
            return first;
        }
        let mut cmd = self.command("apt-get")?;
        cmd.args(["update", "-qq"]);
        status(cmd)?;
        run()
    }

    /// `apt-get download` of `packages` into `dir`.
    pub(crate) fn download(self, packages: &[String], dir: &Path) -> Result<()> {
        let mut dl = self.command("apt-get")?;
        dl.args(["download", "-qq"]).args(packages).current_dir(dir);
        status(dl)
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
    let found = source.query("apt-cache", &["search", "--names-only", regex], |out| {
        out.trim().is_empty()
    })?;
    found
        .lines()
        .filter_map(|l| l.split(" - ").next())
        .map(|s| s.trim().to_string())
        .filter(|s| !s.is_empty())
        .max_by_key(|n| version_key(n))
        .with_context(|| format!("no Debian package matches {regex}"))
}

/// The kernels `spec` names, for `arch`.
pub(crate) fn resolve(spec: &str, arch: Arch) -> Result<Vec<Kernel>> {
    let mut source = Source::system(arch);
    let a = arch.name();
    let regex = match spec {
        "all" => {
            let mut out = Vec::new();
            for s in ALL {
                out.extend(resolve(s, arch)?);
            }
            return Ok(out);
        }
        "5.10" => {
            source.suite = Some("bullseye");
            format!(r"^linux-image-5\.10\.0-[0-9]+-{a}$")
        }
        "6.1" => format!(r"^linux-image-6\.1\.0-[0-9]+-{a}$"),
        "6.1-cloud" => format!(r"^linux-image-6\.1\.0-[0-9]+-cloud-{a}$"),
        "6.12" => format!(r"^linux-image-6\.12\.[0-9]+\+deb12-{a}$"),
        "6.12-cloud" => format!(r"^linux-image-6\.12\.[0-9]+\+deb12-cloud-{a}$"),
        "6.12-rt" => format!(r"^linux-image-6\.12\.[0-9]+\+deb12-rt-{a}$"),
        path if Path::new(path).is_file() => {
            let image = fs::canonicalize(path)?;
            return Ok(vec![Kernel {
                label: image.display().to_string(),
                image,
                modules: None,
                arch,
            }]);
        }
        other => bail!(
            "unknown kernel `{other}`: use 6.1, 6.1-cloud, 6.12, 6.12-cloud, 6.12-rt, all, 5.10 \
             (Debian 11's: its probes find features missing, and redirector runs on its fallbacks), \
             or the path of a \
             kernel image (bzImage/vmlinux, or an arm64 Image with --arch arm64)"
        ),
    };
    let pkg = newest_package(&regex, source)?;
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
        arch,
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
    // Two runs side by side may want the same kernel: the second waits for the first.
    let lock = fs::File::create(dir.join(".lock"))?;
    lock.lock()
        .with_context(|| format!("locking {}", dir.display()))?;
    if done.exists() {
        return Ok(root);
    }
    eprintln!("xtask vm: fetching {pkg}");
    source.download(&[pkg.to_string()], &dir)?;
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
