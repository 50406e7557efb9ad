//! `redirector install-cni`: the plugin binary into the node's CNI bin dir, and
//! redirector's entry chained into the cluster network's configuration — the file the
//! container runtime loads — read and written as JSON, atomically, mode kept. Network
//! plugins rewrite that file when they restart or upgrade, which drops the entry and
//! leaves every later pod uncaptured: [`watch`] puts it back.

mod conflist;
mod files;
pub mod readiness;
mod watch;

use std::{
    fs, io,
    path::{Path, PathBuf},
};

use serde_json::{json, Value};

pub use self::{conflist::PLUGIN_TYPE, watch::watch};
use self::{
    conflist::{is_config_file, runtime_pick, ConfError, Edit},
    files::{install_binary, mode_of, replace},
};
use crate::mesh::Dialect;
use crate::sys::fs_error::{fs_err, gone_ok, FsError};

/// Where container runtimes read network configurations from by default.
pub const DEFAULT_CONF_DIR: &str = "/etc/cni/net.d";
/// Where container runtimes look for plugin binaries by default.
pub const DEFAULT_BIN_DIR: &str = "/opt/cni/bin";

/// The plugin's file name in the CNI bin dir (the `type` of its entry).
pub const PLUGIN_FILE: &str = PLUGIN_TYPE;

/// How often a write that lost a race with another writer is tried again at once.
const RACE_RETRIES: usize = 5;

#[derive(Debug, thiserror::Error)]
pub enum InstallError {
    #[error(
        "no network configuration (*.conflist, *.conf, *.json) in {0} yet: is the cluster network installed?"
    )]
    NoConfig(PathBuf),
    #[error("{0} (the file is left as it is)")]
    Conf(#[from] ConfError),
    #[error(transparent)]
    Fs(#[from] FsError),
    #[error("{0} kept changing while being edited")]
    Contended(PathBuf),
}

/// What redirector's entry says: the plugin's keys (see `cni::conf`).
#[derive(Debug, Clone)]
pub struct Entry {
    /// Which mesh's flags `args` are, and whose rules choose the pods.
    pub dialect: Dialect,
    /// The flags for the network's pods, in `dialect`.
    pub args: Vec<String>,
    pub require_sidecar_status: bool,
    pub exclude_namespaces: Vec<String>,
    pub pin_root: Option<PathBuf>,
    pub state_dir: Option<PathBuf>,
    /// An ambient network's own keys.
    pub ambient: Option<AmbientEntry>,
}

/// The keys of an ambient network's entry.
#[derive(Debug, Clone, Default)]
pub struct AmbientEntry {
    /// `ambientNamespaces`: every pod of these is enrolled.
    pub namespaces: Vec<String>,
    /// `criSocket`, where the plugin reads a pod's labels, when not containerd's.
    pub cri_socket: Option<PathBuf>,
    /// `socket`, the daemon's API, when not the default.
    pub daemon_socket: Option<PathBuf>,
}

impl Entry {
    pub fn to_json(&self) -> Value {
        let mut entry = json!({
            "type": PLUGIN_TYPE,
            "args": self.args,
            "requireSidecarStatus": self.require_sidecar_status,
            "excludeNamespaces": self.exclude_namespaces,
        });
        if !self.dialect.is_istio() {
            entry["dialect"] = json!(self.dialect);
        }
        if let Some(root) = &self.pin_root {
            entry["pinRoot"] = json!(root);
        }
        if let Some(dir) = &self.state_dir {
            entry["stateDir"] = json!(dir);
        }
        if let Some(ambient) = &self.ambient {
            // Enrolled by label or namespace, never by the injector's mark.
            if let Some(keys) = entry.as_object_mut() {
                keys.remove("requireSidecarStatus");
            }
            entry["ambientNamespaces"] = json!(ambient.namespaces);
            if let Some(socket) = &ambient.cri_socket {
                entry["criSocket"] = json!(socket);
            }
            if let Some(socket) = &ambient.daemon_socket {
                entry["socket"] = json!(socket);
            }
        }
        entry["capabilities"] = json!({"io.kubernetes.cri.pod-annotations": true});
        entry
    }
}

/// One node's CNI directories and what goes into them.
#[derive(Debug, Clone)]
pub struct Installer {
    pub conf_dir: PathBuf,
    pub bin_dir: PathBuf,
    /// The binary installed as [`PLUGIN_FILE`].
    pub plugin: PathBuf,
    pub entry: Value,
}

impl Installer {
    /// Where the plugin binary goes.
    pub fn plugin_path(&self) -> PathBuf {
        self.bin_dir.join(PLUGIN_FILE)
    }

    /// Copy the plugin binary in; whether it was written.
    pub fn install_plugin(&self) -> Result<bool, FsError> {
        install_binary(&self.plugin, &self.plugin_path())
    }

    /// Whether the plugin binary is in the bin dir.
    pub fn plugin_installed(&self) -> bool {
        self.plugin_path().exists()
    }

    /// Remove the plugin binary; whether it was there.
    pub fn remove_plugin(&self) -> Result<bool, FsError> {
        let path = self.plugin_path();
        let existed = path.exists();
        gone_ok(fs::remove_file(&path)).map_err(fs_err("removing", &path))?;
        Ok(existed)
    }

    /// Whether [`Installer::chain`] can succeed now (a configuration file to chain into,
    /// which parses), with nothing written: checked before the plugin binary goes in, so
    /// that bad input leaves the node as it was.
    pub fn check(&self) -> Result<(), InstallError> {
        let file = runtime_pick(config_files(&self.conf_dir)?)
            .ok_or_else(|| InstallError::NoConfig(self.conf_dir.clone()))?;
        let path = self.conf_dir.join(&file);
        if let Some(text) = read(&path)? {
            conflist::chain(&file, &String::from_utf8_lossy(&text), &self.entry)?;
        }
        Ok(())
    }

    /// Chain the entry into the file the runtime loads. What changed, if anything.
    pub fn chain(&self) -> Result<Option<String>, InstallError> {
        for _ in 0..RACE_RETRIES {
            let file = runtime_pick(config_files(&self.conf_dir)?)
                .ok_or_else(|| InstallError::NoConfig(self.conf_dir.clone()))?;
            let path = self.conf_dir.join(&file);
            let Some(text) = read(&path)? else {
                continue; // removed since it was listed
            };
            let edit = conflist::chain(&file, &String::from_utf8_lossy(&text), &self.entry)?;
            if let Some(outcome) = apply(&self.conf_dir, &path, &text, edit)? {
                return Ok(outcome);
            }
        }
        Err(InstallError::Contended(self.conf_dir.clone()))
    }

    /// Take the entry out of every configuration file that has it. What changed.
    pub fn unchain_all(&self) -> Result<Vec<String>, InstallError> {
        unchain_all(&self.conf_dir)
    }
}

/// A file's bytes; `None` if it is gone.
fn read(path: &Path) -> Result<Option<Vec<u8>>, FsError> {
    match fs::read(path) {
        Ok(text) => Ok(Some(text)),
        Err(err) if err.kind() == io::ErrorKind::NotFound => Ok(None),
        Err(err) => Err(fs_err("reading", path)(err)),
    }
}

/// Take redirector's entry out of every configuration file of `conf_dir` that has one (a
/// file that sorted first earlier may still have one). What changed.
pub fn unchain_all(conf_dir: &Path) -> Result<Vec<String>, InstallError> {
    let mut changes = Vec::new();
    if !conf_dir.exists() {
        return Ok(changes);
    }
    for file in config_files(conf_dir)? {
        let path = conf_dir.join(&file);
        for attempt in 0.. {
            let Some(text) = read(&path)? else {
                break;
            };
            let text_str = String::from_utf8_lossy(&text);
            let edit = match conflist::unchain(&file, &text_str) {
                Ok(edit) => edit,
                // Someone else's broken file that does not name the plugin: not ours to fix.
                Err(_) if !text_str.contains(PLUGIN_TYPE) => break,
                Err(err) => return Err(err.into()),
            };
            match apply(conf_dir, &path, &text, edit)? {
                Some(change) => {
                    changes.extend(change);
                    break;
                }
                None if attempt + 1 >= RACE_RETRIES => {
                    return Err(InstallError::Contended(path));
                }
                None => {}
            }
        }
    }
    Ok(changes)
}

/// Carry out `edit` of `path` (read as `original`). `None` when `path` changed since it
/// was read (nothing is written); else what changed, if anything.
fn apply(
    conf_dir: &Path,
    path: &Path,
    original: &[u8],
    edit: Edit,
) -> Result<Option<Option<String>>, InstallError> {
    let Edit::Write {
        file,
        contents,
        replaces,
        what,
    } = edit
    else {
        return Ok(Some(None));
    };
    let target = conf_dir.join(&file);
    let mut text = serde_json::to_string_pretty(&contents).unwrap_or_default();
    text.push('\n');
    if !replace(
        &target,
        text.as_bytes(),
        mode_of(path)?,
        Some((path, original)),
    )? {
        return Ok(None);
    }
    let mut change = format!("{what} {}", target.display());
    if let Some(old) = replaces {
        let old = conf_dir.join(old);
        gone_ok(fs::remove_file(&old)).map_err(fs_err("removing", &old))?;
        change.push_str(&format!(" (was {})", old.display()));
    }
    Ok(Some(Some(change)))
}

/// redirector's entry in the configuration the runtime loads from `conf_dir`, as the
/// runtime hands it to the plugin; `None` when it has none.
pub fn chained_entry(conf_dir: &Path) -> Result<Option<Value>, InstallError> {
    let Some(name) = runtime_pick(config_files(conf_dir)?) else {
        return Ok(None);
    };
    let path = conf_dir.join(&name);
    let text = fs::read_to_string(&path).map_err(fs_err("reading", &path))?;
    Ok(conflist::entry(&name, &text)?)
}

/// The configuration file the runtime loads from `conf_dir`, if any.
pub fn runtime_file(conf_dir: &Path) -> Result<Option<String>, FsError> {
    Ok(runtime_pick(config_files(conf_dir)?))
}

/// The configuration files of `dir`, in the order the runtime tries them.
fn config_files(dir: &Path) -> Result<Vec<String>, FsError> {
    let entries = fs::read_dir(dir).map_err(fs_err("listing", dir))?;
    let mut names: Vec<String> = entries
        .filter_map(Result::ok)
        .filter(|e| e.file_type().is_ok_and(|t| !t.is_dir()))
        .filter_map(|e| e.file_name().into_string().ok())
        .filter(|n| is_config_file(n))
        .collect();
    names.sort();
    Ok(names)
}

#[cfg(test)]
mod tests;
