//! Account names to ids, read from `/etc/passwd` and `/etc/group` as istio's own binaries
//! read them (Go's `os/user` without cgo reads only these files).
//!
//! Never through NSS (`getpwnam`): the binary ships statically linked, and a static glibc
//! asked for a name its files lack loads the host's NSS modules (`libnss_systemd` where
//! nsswitch.conf names systemd), built for another libc, and crashes. The CNI plugin runs
//! on the host, so that crash would fail every pod's setup on such a node.

use std::path::Path;

const PASSWD: &str = "/etc/passwd";
const GROUP: &str = "/etc/group";

/// The uid of user `name`, `None` if /etc/passwd has no such user or cannot be read.
pub(crate) fn uid_by_name(name: &str) -> Option<u32> {
    id_in_file(Path::new(PASSWD), name, PASSWD_FIELDS)
}

/// The gid of group `name`, `None` if /etc/group has no such group or cannot be read.
pub(crate) fn gid_by_name(name: &str) -> Option<u32> {
    id_in_file(Path::new(GROUP), name, GROUP_FIELDS)
}

/// `name:password:uid:gid:gecos:home:shell`.
const PASSWD_FIELDS: usize = 7;
/// `name:password:gid:members`.
const GROUP_FIELDS: usize = 4;

fn id_in_file(path: &Path, name: &str, fields: usize) -> Option<u32> {
    id_in(&std::fs::read_to_string(path).ok()?, name, fields)
}

/// The id (third field) of the first entry named `name` in the text of a passwd or group
/// file whose entries have `fields` fields. As glibc's and Go's parsers: blank space at a
/// line's start and `#` comments are skipped; an entry with too few fields or an id that
/// is not a number is passed over.
fn id_in(text: &str, name: &str, fields: usize) -> Option<u32> {
    if name.is_empty() {
        return None;
    }
    text.lines()
        .map(str::trim_start)
        .filter(|line| !line.starts_with('#'))
        .map(|line| line.split(':').collect::<Vec<_>>())
        .filter(|entry| entry.len() >= fields && entry[0] == name)
        .find_map(|entry| entry[2].parse().ok())
}

#[cfg(test)]
mod tests {
    use super::*;

    const PASSWD_TEXT: &str = "\
root:x:0:0:root:/root:/bin/bash
# istio-proxy:x:1:1:a comment:/:/bin/false
  proxy:x:13:13:proxy:/bin:/usr/sbin/nologin
short:x:5
bad:x:not-a-number:7::/:/bin/false
bad:x:42:7::/:/bin/false
istio-proxy:x:1337:1337::/home/istio-proxy:/bin/sh
";

    #[test]
    fn names_resolve_to_the_id_of_their_first_complete_entry() {
        assert_eq!(id_in(PASSWD_TEXT, "root", PASSWD_FIELDS), Some(0));
        assert_eq!(id_in(PASSWD_TEXT, "proxy", PASSWD_FIELDS), Some(13));
        assert_eq!(id_in(PASSWD_TEXT, "istio-proxy", PASSWD_FIELDS), Some(1337));
        assert_eq!(id_in(PASSWD_TEXT, "bad", PASSWD_FIELDS), Some(42));
        let group = "wheel:x:10:alice,bob\nnobody:x:65534:\n";
        assert_eq!(id_in(group, "nobody", GROUP_FIELDS), Some(65534));
        assert_eq!(id_in(group, "wheel", GROUP_FIELDS), Some(10));
    }

    #[test]
    fn comments_short_entries_and_unknown_names_resolve_to_none() {
        assert_eq!(id_in(PASSWD_TEXT, "short", PASSWD_FIELDS), None);
        assert_eq!(id_in(PASSWD_TEXT, "# istio-proxy", PASSWD_FIELDS), None);
        assert_eq!(id_in(PASSWD_TEXT, "nobody", PASSWD_FIELDS), None);
        assert_eq!(id_in(PASSWD_TEXT, "", PASSWD_FIELDS), None);
        assert_eq!(id_in("::7::::", "", PASSWD_FIELDS), None);
    }

    #[test]
    fn this_machines_files_resolve_root() {
        assert_eq!(uid_by_name("root"), Some(0));
        assert_eq!(gid_by_name("root"), Some(0));
        assert_eq!(uid_by_name("no-such-user-redirector-test"), None);
        assert_eq!(gid_by_name("no-such-group-redirector-test"), None);
        assert_eq!(uid_by_name("nul\0byte"), None);
    }
}
