//! Files replaced whole, so that a container runtime reading the directory at any moment
//! sees the old file or the new one, never half of one: written beside the target under a
//! name the runtime does not load, flushed, then renamed over it.

use std::{
    fs::{self, File, OpenOptions},
    io::Write,
    os::unix::fs::{OpenOptionsExt, PermissionsExt},
    path::{Path, PathBuf},
};

use crate::sys::fs_error::{fs_err, FsError};

/// The staging name for `path`: hidden and not ending in a configuration extension.
fn staging(path: &Path) -> PathBuf {
    let name = path.file_name().unwrap_or_default().to_string_lossy();
    path.with_file_name(format!(".{name}.redirector-tmp"))
}

/// Replace `path` with `contents` (mode `mode`), unless `guard`'s file no longer holds
/// `guard`'s text: then nothing is written and `Ok(false)` says the caller read an older
/// version (another writer got there first; its change is looked at again).
pub fn replace(
    path: &Path,
    contents: &[u8],
    mode: u32,
    guard: Option<(&Path, &[u8])>,
) -> Result<bool, FsError> {
    let tmp = staging(path);
    let written = (|| {
        let mut file = OpenOptions::new()
            .write(true)
            .create(true)
            .truncate(true)
            .mode(mode)
            .open(&tmp)
            .map_err(fs_err("creating", &tmp))?;
        file.write_all(contents).map_err(fs_err("writing", &tmp))?;
        // The umask may have narrowed the mode.
        file.set_permissions(fs::Permissions::from_mode(mode))
            .map_err(fs_err("setting the mode of", &tmp))?;
        file.sync_all().map_err(fs_err("flushing", &tmp))?;
        if let Some((file, text)) = guard {
            if fs::read(file).ok().as_deref() != Some(text) {
                return Ok(false);
            }
        }
        fs::rename(&tmp, path).map_err(fs_err("replacing", path))?;
        Ok(true)
    })();
    if !matches!(written, Ok(true)) {
        let _ = fs::remove_file(&tmp);
    }
    let written = written?;
    if written {
        sync_dir(path);
    }
    Ok(written)
}

/// The directory entry made durable too; best effort (a failure loses nothing written).
fn sync_dir(path: &Path) {
    if let Some(dir) = path.parent() {
        if let Ok(dir) = File::open(dir) {
            let _ = dir.sync_all();
        }
    }
}

/// The permission bits of `path`.
pub fn mode_of(path: &Path) -> Result<u32, FsError> {
    fs::metadata(path)
        .map(|m| m.permissions().mode() & 0o7777)
        .map_err(fs_err("reading the mode of", path))
}

/// Copy `from` to `to` as an executable, unless `to` already holds the same bytes.
/// Whether it was written.
pub fn install_binary(from: &Path, to: &Path) -> Result<bool, FsError> {
    let bytes = fs::read(from).map_err(fs_err("reading", from))?;
    if fs::read(to).is_ok_and(|old| old == bytes) {
        return Ok(false);
    }
    replace(to, &bytes, 0o755, None)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_replaced_file_keeps_the_mode_given_and_leaves_no_staging_file() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("10-a.conflist");
        fs::write(&path, "old").unwrap();
        assert!(replace(&path, b"new", 0o600, Some((&path, b"old"))).unwrap());
        assert_eq!(fs::read_to_string(&path).unwrap(), "new");
        assert_eq!(mode_of(&path).unwrap(), 0o600);
        // Someone else wrote it since it was read: nothing is written.
        assert!(!replace(&path, b"newer", 0o600, Some((&path, b"old"))).unwrap());
        assert_eq!(fs::read_to_string(&path).unwrap(), "new");
        let names: Vec<_> = fs::read_dir(dir.path())
            .unwrap()
            .map(|e| e.unwrap().file_name())
            .collect();
        assert_eq!(names, ["10-a.conflist"]);
    }

    #[test]
    fn a_binary_is_copied_once() {
        let dir = tempfile::tempdir().unwrap();
        let from = dir.path().join("redirector");
        fs::write(&from, b"\x7fELF").unwrap();
        let to = dir.path().join("redirector-cni");
        assert!(install_binary(&from, &to).unwrap());
        assert_eq!(mode_of(&to).unwrap(), 0o755);
        assert!(!install_binary(&from, &to).unwrap());
    }
}
