//! The kubepods cgroup: the parent of every pod's cgroup, which kubelet names after its
//! cgroup driver — `kubepods.slice` with systemd's, `kubepods` with cgroupfs' — under the
//! cgroup2 mount, wherever that is mounted.

use std::path::{Path, PathBuf};

/// The kubepods cgroup's name under each cgroup driver, the more common first.
pub const NAMES: [(&str, &str); 2] = [("kubepods.slice", "systemd"), ("kubepods", "cgroupfs")];

/// The kubepods cgroup under `mount` and the driver its name says, if there is one.
pub fn find(mount: &Path) -> Option<(PathBuf, &'static str)> {
    NAMES.iter().find_map(|(name, driver)| {
        let path = mount.join(name);
        path.is_dir().then_some((path, *driver))
    })
}

/// The driver a kubepods cgroup's name says, for a path given by hand.
pub fn driver_of(path: &Path) -> Option<&'static str> {
    let name = path.file_name()?.to_str()?;
    NAMES
        .iter()
        .find(|(known, _)| *known == name)
        .map(|(_, driver)| *driver)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn either_driver_s_cgroup_is_found_systemd_s_first() {
        let mount = tempfile::tempdir().unwrap();
        assert_eq!(find(mount.path()), None);
        std::fs::create_dir(mount.path().join("kubepods")).unwrap();
        assert_eq!(
            find(mount.path()),
            Some((mount.path().join("kubepods"), "cgroupfs"))
        );
        std::fs::create_dir(mount.path().join("kubepods.slice")).unwrap();
        assert_eq!(
            find(mount.path()),
            Some((mount.path().join("kubepods.slice"), "systemd"))
        );
    }

    #[test]
    fn a_given_path_names_its_driver() {
        assert_eq!(
            driver_of(Path::new("/sys/fs/cgroup/kubepods.slice")),
            Some("systemd")
        );
        assert_eq!(
            driver_of(Path::new("/sys/fs/cgroup/unified/kubepods")),
            Some("cgroupfs")
        );
        assert_eq!(driver_of(Path::new("/sys/fs/cgroup/other")), None);
    }
}
