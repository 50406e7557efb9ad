//! Where the workspace, its build output and the istio reference rules are.

use std::path::{Path, PathBuf};
use std::sync::OnceLock;

/// The workspace root: the parent of this crate's directory.
pub fn workspace_root() -> PathBuf {
    let manifest_dir = Path::new(env!("CARGO_MANIFEST_DIR"));
    manifest_dir
        .parent()
        .expect("the tests crate lives inside the workspace")
        .to_path_buf()
}

/// Cargo's target directory: `CARGO_TARGET_DIR` if set, else `<workspace>/target`.
pub fn target_dir() -> PathBuf {
    match std::env::var_os("CARGO_TARGET_DIR") {
        Some(dir) if !dir.is_empty() => PathBuf::from(dir),
        _ => workspace_root().join("target"),
    }
}

/// A workspace binary such as `probe` or `redirector`.
///
/// Env `<NAME>_BIN` (e.g. `PROBE_BIN`, `REDIRECTOR_BIN`) wins. Otherwise the candidates are
/// `<target>/release/<name>` and `<target>/debug/<name>`; when both exist the newer one is
/// taken, so a stale release build never shadows the debug build `cargo test` just made
/// (and the other way round). Panics, naming the paths tried, when there is none.
pub fn bin_path(name: &str) -> PathBuf {
    let var = format!("{}_BIN", name.to_ascii_uppercase().replace('-', "_"));
    if let Some(path) = std::env::var_os(&var).filter(|p| !p.is_empty()) {
        let path = PathBuf::from(path);
        assert!(path.is_file(), "{var}={} is not a file", path.display());
        return path;
    }
    let target = target_dir();
    let candidates = [
        target.join("release").join(name),
        target.join("debug").join(name),
    ];
    candidates
        .iter()
        .filter_map(|p| Some((p.metadata().ok()?.modified().ok()?, p)))
        .max_by_key(|(modified, _)| *modified)
        .map(|(_, p)| p.clone())
        .unwrap_or_else(|| {
            panic!(
                "binary `{name}` not found: set {var} or build it (`cargo build -p <crate>`); tried {} and {}",
                candidates[0].display(),
                candidates[1].display()
            )
        })
}

/// Which build of a kit binary (`probe`, `dnsprobe`) the kit runs, held in a static: the path
/// given to [`use_bin`](Self::use_bin), else [`bin_path`]'s choice.
pub struct BinChoice {
    name: &'static str,
    chosen: OnceLock<PathBuf>,
}

impl BinChoice {
    pub const fn new(name: &'static str) -> Self {
        BinChoice {
            name,
            chosen: OnceLock::new(),
        }
    }

    /// Makes the kit use this binary. The first call wins (later calls with another path
    /// panic), so parallel tests agree.
    pub fn use_bin(&self, path: impl Into<PathBuf>) {
        let path = path.into();
        let chosen = self.chosen.get_or_init(|| path.clone());
        assert_eq!(*chosen, path, "{} binary already chosen", self.name);
    }

    /// The binary given to [`use_bin`](Self::use_bin), else env `<NAME>_BIN`, else the newest
    /// build in the target dir.
    pub fn path(&self) -> PathBuf {
        self.chosen
            .get()
            .cloned()
            .unwrap_or_else(|| bin_path(self.name))
    }
}

/// Directory of istio's reference rule sets (`*.golden`): env `ISTIO_GOLDEN_DIR`, else
/// `<workspace>/tests/istio-golden` (istio's own test data, Apache-2.0; see its CASES.md).
pub fn golden_dir() -> PathBuf {
    match std::env::var_os("ISTIO_GOLDEN_DIR") {
        Some(dir) if !dir.is_empty() => PathBuf::from(dir),
        _ => workspace_root().join("tests").join("istio-golden"),
    }
}
